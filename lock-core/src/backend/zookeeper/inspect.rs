//! What the people on call ask of the ZooKeeper backend: a lock's state (its container's
//! children, then its holder node's data), a lock freed whoever holds it (the holder node
//! deleted on the data version read), and the held locks under a pattern (the root's children
//! a page at a time).
//!
//! What each field means on ZooKeeper:
//! - `held`, `fence`, `waiters`: the contender node with the lowest sequence is the holder;
//!   the fence is its czxid (what `guard.fence()` gave its holder); the waiters' nodes behind
//!   it are counted (a single attempt's, deleted before it answers, is not). Once released,
//!   nothing keeps the czxid: a free lock shows no fence (the next is larger all the same).
//! - `holder`, `held_for`: from the holder node's stamp (`backend::stamp`), the taker's clock;
//!   a waiter handed the lock rewrites it when its process learns it (until then, no age).
//! - `remaining`: the lease the holder took the lock with, as its stamp records it. Nothing in
//!   ZooKeeper counts a lock's lease down: the holder's watchdog renews by reading its node, and
//!   its session by pings. A live holder's lock runs at most this long past its last renewal
//!   (a later `extend` is not recorded); a holder whose process died keeps the node until its
//!   session expires, at most the session timeout it was granted (at least 4/3 of the lease).

use std::time::Duration;

use zookeeper_client as zk;

use super::lock::queue;
use super::session::Session;
use super::{ZooKeeperBackend, backend_error, timed_out};
use crate::LockError;
use crate::backend::stamp;
use crate::backend::{KeyPattern, ListPage};
use crate::inspect::LockState;
use crate::key::LockKey;

/// Locks one listing page reads at most: one multi-read of their children, one of their
/// holders' data (each answer within the servers' request size, 1 MiB by default, while the
/// locks average fewer than some fifty waiters).
const PAGE: usize = 100;

/// A holder node read: its path, its data version, and the lock's state.
pub(super) struct Holder {
    path: String,
    version: i32,
    state: LockState,
}

/// What one try of a force unlock's delete did.
enum Removal {
    Removed,
    /// The node was gone (its holder left), or is another: nothing removed.
    Gone,
    /// The node's data changed (its stamp was rewritten): the same node, read again.
    Rewritten,
}

impl ZooKeeperBackend {
    pub(super) async fn inspect_lock(&self, key: &LockKey) -> Result<LockState, LockError> {
        let session = self.inner.sessions.current().await?;
        let held = self.read_holder(&session, key, "inspect").await?;
        Ok(held.map_or_else(|| LockState::free(key.user()), |h| h.state))
    }

    /// The holder node of `key` and the lock's state: the container's children, then the
    /// first one's data (looked for again when it went in between).
    pub(super) async fn read_holder(
        &self,
        session: &Session,
        key: &LockKey,
        operation: &'static str,
    ) -> Result<Option<Holder>, LockError> {
        let dir = self.lock_path(key);
        for _ in 0..5 {
            let children = match self.within(session.client.list_children(&dir)).await {
                Some(Ok(children)) => children,
                Some(Err(zk::Error::NoNode)) => return Ok(None),
                Some(Err(e)) => return Err(backend_error(operation, Some(key.user()), e)),
                None => return Err(timed_out(operation, Some(key.user()))),
            };
            let nodes = queue(&children);
            let Some(first) = nodes.first() else {
                return Ok(None);
            };
            let waiters = waiters_behind(nodes.iter().skip(1).map(|n| n.name));
            let path = format!("{dir}/{}", first.name);
            match self.within(session.client.get_data(&path)).await {
                Some(Ok((data, stat))) => {
                    return Ok(Some(Holder {
                        path,
                        version: stat.version,
                        state: state_of(key, &data, &stat, waiters, stamp::now_ms()),
                    }));
                }
                // The holder left between the two reads: the queue is read again.
                Some(Err(zk::Error::NoNode)) => {}
                Some(Err(e)) => return Err(backend_error(operation, Some(key.user()), e)),
                None => return Err(timed_out(operation, Some(key.user()))),
            }
        }
        Err(LockError::backend(
            operation,
            Some(key.user()),
            std::io::Error::other("the lock's holder kept changing while it was read"),
        ))
    }

    /// Deletes `key`'s holder node on the data version read (a `delete` conditioned on the
    /// very node: its path names the holder's token, the version its data as read), and
    /// returns its state from just before. The waiter behind it watches it and is handed the
    /// lock at once; the evicted holder finds its node gone at its next renewal. A delete sent
    /// again after a connection loss keeps the condition, so it can never remove the next
    /// holder; if it then finds no node, the first may have removed it: an error says so.
    /// The lock's node records the removed node's name in the same `multi` (see
    /// `lock::FORCED`): the evicted holder's release sent again reads it there.
    pub(super) async fn force_unlock_lock(
        &self,
        key: &LockKey,
    ) -> Result<Option<LockState>, LockError> {
        let session = self.inner.sessions.current().await?;
        let Some(holder) = self.read_holder(&session, key, "force_unlock").await? else {
            return Ok(None);
        };
        self.remove_holder(&session, key, holder).await
    }

    /// The delete of [`force_unlock_lock`](Self::force_unlock_lock), of the node `holder`
    /// names (read before). A node whose stamp was rewritten meanwhile (by its holder, once
    /// handed the lock) is read again, by its path alone: the same node, never the next one.
    pub(super) async fn remove_holder(
        &self,
        session: &Session,
        key: &LockKey,
        mut holder: Holder,
    ) -> Result<Option<LockState>, LockError> {
        for _ in 0..3 {
            match self.delete_read(session, key, &holder).await? {
                Removal::Removed => {
                    // This process's listeners learn at once; others' waiters through their
                    // watches.
                    self.inner.listeners.lock().wake(key.name(), b"released");
                    return Ok(Some(holder.state));
                }
                Removal::Gone => return Ok(None),
                Removal::Rewritten => {
                    let read = self.within(session.client.get_data(&holder.path)).await;
                    match read {
                        Some(Ok((data, stat))) => {
                            let waiters = holder.state.waiters;
                            holder.version = stat.version;
                            holder.state = state_of(key, &data, &stat, waiters, stamp::now_ms());
                        }
                        Some(Err(zk::Error::NoNode)) => return Ok(None),
                        Some(Err(e)) => {
                            return Err(backend_error("force_unlock", Some(key.user()), e));
                        }
                        None => return Err(timed_out("force_unlock", Some(key.user()))),
                    }
                }
            }
        }
        Err(LockError::backend(
            "force_unlock",
            Some(key.user()),
            std::io::Error::other("the holder's node kept changing; nothing was removed"),
        ))
    }

    /// One conditioned delete of `holder`'s node, sent again once after a connection loss.
    async fn delete_read(
        &self,
        session: &Session,
        key: &LockKey,
        holder: &Holder,
    ) -> Result<Removal, LockError> {
        let mut resent = false;
        // With the delete, the lock's node records the removed node's name (see
        // `lock::FORCED`): the evicted holder's release, sent again after a lost connection
        // and finding its node gone, reads it there.
        let (dir, name) = holder.path.rsplit_once('/').unwrap_or_default();
        let mark = [super::lock::FORCED, name.as_bytes()].concat();
        let mut marked = true;
        loop {
            // `None`: refused for the mark alone (nothing done), to be sent without it.
            let sent = async {
                if !marked {
                    return Some(
                        session
                            .client
                            .delete(&holder.path, Some(holder.version))
                            .await,
                    );
                }
                let mut writer = session.client.new_multi_writer();
                let added = writer
                    .add_delete(&holder.path, Some(holder.version))
                    .and_then(|()| writer.add_set_data(dir, &mark, None));
                if let Err(e) = added {
                    return Some(Err(e));
                }
                match writer.commit().await {
                    Ok(_) => Some(Ok(())),
                    // The operator may delete the lock's nodes without writing its data
                    // (an ACL of its own): the removal goes on without the mark.
                    Err(zk::MultiWriteError::OperationFailed {
                        index: 1,
                        source: zk::Error::NoAuth,
                    }) => None,
                    Err(e) => Some(Err(e.into())),
                }
            };
            let sent = match tokio::time::timeout(self.inner.request_timeout, sent)
                .await
                .ok()
            {
                Some(None) => {
                    marked = false;
                    continue;
                }
                Some(Some(answer)) => Some(answer),
                None => None,
            };
            match sent {
                Some(Ok(())) => return Ok(Removal::Removed),
                Some(Err(zk::Error::NoNode)) if resent => {
                    return Err(LockError::backend(
                        "force_unlock",
                        Some(key.user()),
                        std::io::Error::other(
                            "the connection was lost and the delete sent again found the holder gone; the first may have removed it: inspect the lock",
                        ),
                    ));
                }
                Some(Err(zk::Error::NoNode)) => return Ok(Removal::Gone),
                Some(Err(zk::Error::BadVersion)) => return Ok(Removal::Rewritten),
                Some(Err(zk::Error::ConnectionLoss)) if !resent => resent = true,
                Some(Err(e)) => return Err(backend_error("force_unlock", Some(key.user()), e)),
                None => {
                    return Err(LockError::backend(
                        "force_unlock",
                        Some(key.user()),
                        std::io::Error::other(
                            "ZooKeeper did not answer the delete in time; it may have removed the holder: inspect the lock",
                        ),
                    ));
                }
            }
        }
    }

    /// A page of the held locks under `prefix` whose keys match `pattern`: the root's
    /// children (ZooKeeper lists them whole: the names of every lock under the root, about
    /// 40 bytes each, are in memory while a page is read), the [`PAGE`] first after `cursor`
    /// (the last name of the previous page) in name order, then one multi-read of their
    /// contenders and one of their holders' data.
    pub(super) async fn list_locks(
        &self,
        prefix: &str,
        pattern: &KeyPattern,
        cursor: Option<&str>,
    ) -> Result<ListPage, LockError> {
        let session = self.inner.sessions.current().await?;
        let root = &self.inner.root;
        let children = match self.within(session.client.list_children(root)).await {
            Some(Ok(children)) => children,
            Some(Err(e)) => return Err(backend_error("list", None, e)),
            None => return Err(timed_out("list", None)),
        };
        // Every lock name under the prefix starts with `prefix{` (a brace is kept as it is).
        let base = format!("{}{{", super::escape(prefix));
        let mut names: Vec<&str> = children
            .iter()
            .map(String::as_str)
            .filter(|c| c.starts_with(&base) && cursor.is_none_or(|cursor| *c > cursor))
            .collect();
        let more = names.len() > PAGE;
        if more {
            names.select_nth_unstable(PAGE - 1);
            names.truncate(PAGE);
        }
        names.sort_unstable();
        let next = if more {
            names.last().map(|n| (*n).to_owned())
        } else {
            None
        };
        let keys: Vec<LockKey> = names
            .iter()
            .filter_map(|n| unescape(n))
            .filter_map(|name| LockKey::from_name(prefix, &name))
            .filter(|key| pattern.matches(key.user()))
            .collect();
        if keys.is_empty() {
            return Ok(ListPage::new(Vec::new(), next));
        }
        let mut reader = session.client.new_multi_reader();
        for key in &keys {
            reader
                .add_get_children(&self.lock_path(key))
                .map_err(|e| backend_error("list", Some(key.user()), e))?;
        }
        let listed = self.bounded("list", None, reader.commit()).await?;
        // Each held lock's holder path and waiters.
        let mut held = Vec::new();
        for (key, result) in keys.iter().zip(listed) {
            let zk::MultiReadResult::Children { children } = result else {
                // Its container went (no contender left): not held.
                continue;
            };
            let nodes = queue(&children);
            if let Some(first) = nodes.first() {
                let waiters = waiters_behind(nodes.iter().skip(1).map(|n| n.name));
                held.push((
                    key,
                    format!("{}/{}", self.lock_path(key), first.name),
                    waiters,
                ));
            }
        }
        let mut reader = session.client.new_multi_reader();
        for (key, path, _) in &held {
            reader
                .add_get_data(path)
                .map_err(|e| backend_error("list", Some(key.user()), e))?;
        }
        let read = if held.is_empty() {
            Vec::new()
        } else {
            self.bounded("list", None, reader.commit()).await?
        };
        let now = stamp::now_ms();
        let locks = held
            .iter()
            .zip(read)
            .filter_map(|((key, _, waiters), result)| match result {
                zk::MultiReadResult::Data { data, stat } => {
                    Some(state_of(key, &data, &stat, *waiters, now))
                }
                // Released between the two reads: not listed.
                _ => None,
            })
            .collect();
        Ok(ListPage::new(locks, next))
    }
}

/// The waiters among the contender nodes behind the holder: a single attempt's node (`t-`) is
/// deleted before its attempt answers, and waits for nothing.
fn waiters_behind<'a>(names: impl Iterator<Item = &'a str>) -> usize {
    names.filter(|n| !n.starts_with("t-")).count()
}

/// The state of `key` held by the node of `data` and `stat`, with `waiters` behind it, at
/// `now` (ms since 1970): never the token, which is in the node's name.
fn state_of(key: &LockKey, data: &[u8], stat: &zk::Stat, waiters: usize, now: u64) -> LockState {
    let mut state = LockState::free(key.user());
    state.held = true;
    state.fence = u64::try_from(stat.czxid).ok().filter(|z| *z > 0);
    state.waiters = waiters;
    if let Some(stamp) = stamp::parse(data) {
        state.holder = stamp.shown_holder();
        state.held_for = stamp.held_for(now);
        state.remaining = Some(stamp.lease).filter(|l| *l > Duration::ZERO);
    }
    state
}

/// The lock name a container's node name escapes (see [`super::escape`]); `None` for a name
/// this backend did not make.
fn unescape(node: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(node.len());
    let mut rest = node.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        if b == b'%' {
            let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(b);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaped_names_come_back() {
        for name in ["lock:{a}", "p/x:{#0123456789abcdef}a{b}/q/ü %", "lock:{..}"] {
            assert_eq!(unescape(&super::super::escape(name)).as_deref(), Some(name));
        }
        assert_eq!(unescape("%4"), None);
        assert_eq!(unescape("%zz"), None);
        assert_eq!(unescape("%FF"), None);
        assert_eq!(waiters_behind(["q-a-1", "t-b-2", "f-c-3"].into_iter()), 2);
    }
}
