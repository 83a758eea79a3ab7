//! What the people on call ask of the etcd backend: a lock's state (one range read of its
//! contender keys), a lock freed whoever holds it (its holder key deleted in a transaction
//! conditioned on that very key), and the held locks under a pattern (a key-ordered range of
//! the prefix, a page at a time).
//!
//! What each field means on etcd:
//! - `held`, `holder`, `fence`, `waiters`: the contender key with the lowest create revision is
//!   the holder; the fence is its create revision (what `guard.fence()` gave its holder);
//!   every other key waits. Once released, nothing keeps the revision: a free lock shows no
//!   fence (the next holder's is larger all the same: revisions only grow).
//! - `held_for`: from the holder key's stamp (`backend::stamp`), the taker's clock at its
//!   acquire (a skew between hosts shifts it); for a waiter handed the lock, from when its
//!   process learned it (the stamp is rewritten then, in the background: until it lands, no
//!   age is shown rather than one counting the wait).
//! - `remaining`: the time to live of the holder key's etcd lease, in whole seconds, less the
//!   second this backend adds to every lease: how long etcd keeps the lock if its holder stops
//!   renewing now. A lock taken without the watchdog ends sooner, at its own lease (its
//!   holder's process deletes it).

use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse,
};

use super::EtcdBackend;
use crate::LockError;
use crate::backend::stamp;
use crate::backend::{KeyPattern, ListPage};
use crate::inspect::LockState;
use crate::key::LockKey;

/// How many etcd keys one listing page reads (contender keys and records, of every lock under
/// the prefix): a page holds at most this many names, and the states of the locks among them.
const PAGE_KEYS: i64 = 500;

/// Locks inspected in one transaction of a listing page: one range each, within etcd's
/// default `--max-txn-ops` of 128.
const PER_TXN: usize = 128;

/// What one try of a force unlock's delete did.
#[derive(Debug, PartialEq)]
pub(super) enum Removal {
    /// The holder key read was removed: its state from just before.
    Removed(LockState),
    /// It was gone (its holder left): nothing removed.
    Gone,
    /// It is still there, moved to another etcd lease: to be read again.
    Moved,
}

/// What one read of a lock's contenders found: the holder key, and how many keys there are.
pub(super) struct Found {
    holder: Option<KeyValue>,
    count: i64,
}

impl EtcdBackend {
    /// The range of `key`'s contenders that reads the holder (the first created, with its
    /// value) and counts them all (the count ignores the limit).
    fn holder_range(&self, key: &LockKey) -> TxnOp {
        TxnOp::get(
            self.queue_prefix(key),
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Create, SortOrder::Ascend)
                    .with_limit(1),
            ),
        )
    }

    pub(super) async fn inspect_lock(&self, key: &LockKey) -> Result<LockState, LockError> {
        let found = self.read_holder(key, "inspect").await?;
        Ok(self.state(key, &found).await)
    }

    /// One linearizable read of `key`'s contenders.
    pub(super) async fn read_holder(
        &self,
        key: &LockKey,
        operation: &'static str,
    ) -> Result<Found, LockError> {
        let txn = Txn::new().and_then([self.holder_range(key)]);
        let answer = self.txn(operation, Some(key), txn).await?;
        found_in(answer.op_responses().into_iter().next()).ok_or_else(|| malformed(operation, key))
    }

    /// The state `found` says `key` is in, with its holder's lease read from etcd.
    async fn state(&self, key: &LockKey, found: &Found) -> LockState {
        let mut state = state_of(key, found, stamp::now_ms());
        if let Some(holder) = &found.holder {
            state.remaining = self.remaining(holder.lease()).await;
        }
        state
    }

    /// The time to live of etcd lease `lease` less the second this backend adds (see the
    /// module docs); `None` when etcd does not answer in time or the key has no lease.
    async fn remaining(&self, lease: i64) -> Option<Duration> {
        if lease == 0 {
            return None;
        }
        let mut client = self.inner.client.lease_client();
        let answer =
            tokio::time::timeout(self.inner.request_timeout, client.time_to_live(lease, None))
                .await
                .ok()?
                .ok()?;
        // -1: the lease is gone (the key goes with it at once).
        let secs = u64::try_from(answer.ttl()).unwrap_or(0);
        Some(Duration::from_secs(secs.saturating_sub(1)))
    }

    /// Deletes `key`'s holder key in one transaction conditioned on its create revision (the
    /// very key read, never one created after it), and returns its state from just before.
    /// The waiter behind it watches its deletion and is handed the lock at once; the evicted
    /// holder finds its key gone at its next renewal. A transaction sent again after a
    /// dropped connection keeps the condition, so it can never remove the next holder; if
    /// its answer says nothing was deleted, the first one may have been: an error says so.
    /// The same transaction leaves a mark on the holder key's lease (`lock::forced_key`) for
    /// the evicted holder's release.
    pub(super) async fn force_unlock_lock(
        &self,
        key: &LockKey,
    ) -> Result<Option<LockState>, LockError> {
        // A holder key moved to another lease (an `extend`) between the read and the delete is
        // read again: the same key (its create revision), never the next holder's.
        for _ in 0..3 {
            let found = self.read_holder(key, "force_unlock").await?;
            match self.remove_holder(key, &found).await? {
                Removal::Moved => {}
                Removal::Removed(state) => return Ok(Some(state)),
                Removal::Gone => return Ok(None),
            }
        }
        Err(LockError::backend(
            "force_unlock",
            Some(key.user()),
            std::io::Error::other(
                "the holder's key kept moving between leases; nothing was removed",
            ),
        ))
    }

    /// The delete of [`force_unlock_lock`](Self::force_unlock_lock), of the holder key `found`
    /// names (read before), on the lease read: with it, a mark on that lease (see
    /// `lock::forced_key`) tells the evicted holder's release that an operator removed its key.
    pub(super) async fn remove_holder(
        &self,
        key: &LockKey,
        found: &Found,
    ) -> Result<Removal, LockError> {
        let Some(holder) = &found.holder else {
            return Ok(Removal::Gone);
        };
        // Read before the delete: after it, the lease may be gone with it.
        let state = self.state(key, found).await;
        let ck = holder.key().to_vec();
        let mut ours = vec![Compare::create_revision(
            ck.clone(),
            CompareOp::Equal,
            holder.create_revision(),
        )];
        let mut removal = vec![TxnOp::delete(ck.clone(), None)];
        // The mark that tells the evicted holder's release (sent again after a dropped
        // connection, it finds its key gone) that an operator removed it: on the key's lease,
        // so it never outlives its holder (and the key still on that lease: else etcd would
        // refuse the mark's lease, or keep it past the holder's).
        if holder.lease() != 0 {
            ours.push(Compare::lease(ck.clone(), CompareOp::Equal, holder.lease()));
            let mark = super::lock::forced_key(&String::from_utf8_lossy(&ck));
            let on = PutOptions::new().with_lease(holder.lease());
            removal.push(TxnOp::put(mark, "", Some(on)));
        }
        let txn = Txn::new()
            .when(ours)
            .and_then(removal)
            .or_else([TxnOp::get(ck, Some(GetOptions::new().with_keys_only()))]);
        let (answer, resent) = self.txn_sent("force_unlock", Some(key), txn).await?;
        if answer.succeeded() {
            // This process's listeners learn at once; others' waiters through their watches.
            self.inner.listeners.lock().wake(key.name(), b"released");
            return Ok(Removal::Removed(state));
        }
        let kept = super::lock::ranges(&answer).into_iter().flatten().next();
        if let Some(kv) = kept
            && kv.create_revision() == holder.create_revision()
        {
            // The same key, on another lease now: read again.
            return Ok(Removal::Moved);
        }
        if resent {
            return Err(LockError::backend(
                "force_unlock",
                Some(key.user()),
                std::io::Error::other(
                    "the connection dropped and the delete was sent again, which found the holder gone; the first may have removed it: inspect the lock",
                ),
            ));
        }
        // The holder read left before the delete (released, or its lease ended): nothing was
        // removed, and whoever took the lock since is not removed either.
        Ok(Removal::Gone)
    }

    /// A page of the held locks under `prefix` whose keys match `pattern`: one key-ordered
    /// range of at most [`PAGE_KEYS`] keys from `cursor` (the name of the last lock of the
    /// previous page), the lock names among them, then each lock's holder read (in
    /// transactions of [`PER_TXN`]) and its lease.
    pub(super) async fn list_locks(
        &self,
        prefix: &str,
        pattern: &KeyPattern,
        cursor: Option<&str>,
    ) -> Result<ListPage, LockError> {
        let ns = &self.inner.namespace;
        // Every lock name under the prefix starts with `prefix{`.
        let base = format!("{ns}{prefix}{{");
        let start = match cursor {
            None => base.clone(),
            Some(c) if c.starts_with(prefix) && c[prefix.len()..].starts_with('{') => {
                // Past every key of lock `c` (`c/...`: '0' follows '/').
                format!("{ns}{c}0")
            }
            Some(c) => {
                return Err(LockError::config(format!(
                    "listing cursor {:?} was not made by this backend",
                    crate::key::display_key(c)
                )));
            }
        };
        let options = GetOptions::new()
            .with_range(prefix_end(base.as_bytes()))
            .with_limit(PAGE_KEYS)
            .with_keys_only();
        let mut kv = self.inner.client.kv_client();
        let answer = self
            .bounded("list", None, kv.get(start, Some(options)))
            .await?;
        let mut names: Vec<&str> = Vec::new();
        for kv in answer.kvs() {
            let Some(name) = std::str::from_utf8(kv.key())
                .ok()
                .and_then(|k| k.strip_prefix(ns.as_str()))
                .and_then(lock_name)
            else {
                continue;
            };
            if names.last() != Some(&name) {
                names.push(name);
            }
        }
        // The last lock's keys may go on past the page: it is read again on the next (unless
        // it is the page's only lock, whose other keys are skipped).
        let more = answer.more();
        if more && names.len() > 1 {
            names.pop();
        }
        let next = if more {
            names.last().map(|n| (*n).to_owned()).or_else(|| {
                // A page of records alone: on past its last key.
                answer
                    .kvs()
                    .last()
                    .and_then(|kv| std::str::from_utf8(kv.key()).ok())
                    .and_then(|k| k.strip_prefix(ns.as_str()))
                    .map(str::to_owned)
            })
        } else {
            None
        };
        let keys: Vec<LockKey> = names
            .iter()
            .filter_map(|name| LockKey::from_name(prefix, name))
            .filter(|key| pattern.matches(key.user()))
            .collect();
        let mut locks = Vec::new();
        for chunk in keys.chunks(PER_TXN) {
            let txn = Txn::new().and_then(
                chunk
                    .iter()
                    .map(|key| self.holder_range(key))
                    .collect::<Vec<_>>(),
            );
            let answer = self.txn("list", Some(&chunk[0]), txn).await?;
            let responses = answer.op_responses();
            if responses.len() != chunk.len() {
                return Err(malformed("list", &chunk[0]));
            }
            let found: Vec<(&LockKey, Found)> = chunk
                .iter()
                .zip(responses)
                .filter_map(|(key, response)| Some((key, found_in(Some(response))?)))
                .filter(|(_, found)| found.holder.is_some())
                .collect();
            let states = found.iter().map(|(key, found)| {
                Box::pin(self.state(key, found))
                    as std::pin::Pin<Box<dyn Future<Output = LockState> + Send + '_>>
            });
            locks.extend(crate::backend::join_all(states.collect()).await);
        }
        Ok(ListPage::new(locks, next))
    }
}

/// The lock name of etcd key `key` (the namespace taken off) when it is a contender key
/// (`K/q/<token>`); `None` for a record, or a key this backend did not write.
fn lock_name(key: &str) -> Option<&str> {
    let (name, token) = key.rsplit_once("/q/")?;
    let token_like = !token.is_empty() && token.bytes().all(|b| b.is_ascii_hexdigit());
    token_like.then_some(name)
}

/// The first key after every key starting with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte 0xff: to the end of the keyspace.
    vec![0]
}

/// The holder and count a range answered.
fn found_in(response: Option<TxnOpResponse>) -> Option<Found> {
    match response? {
        TxnOpResponse::Get(mut range) => {
            let count = range.count();
            Some(Found {
                holder: range.take_kvs().into_iter().next(),
                count,
            })
        }
        _ => None,
    }
}

/// The state of `key` from its holder key and count (the lease's remaining time aside), at
/// `now` (ms since 1970): never the token, which is in the key's name.
fn state_of(key: &LockKey, found: &Found, now: u64) -> LockState {
    let mut state = LockState::free(key.user());
    let Some(holder) = &found.holder else {
        return state;
    };
    state.held = true;
    state.fence = u64::try_from(holder.create_revision()).ok();
    state.waiters = usize::try_from(found.count.saturating_sub(1)).unwrap_or(0);
    if let Some(stamp) = stamp::parse(holder.value()) {
        state.holder = stamp.shown_holder();
        state.held_for = stamp.held_for(now);
    }
    state
}

fn malformed(operation: &'static str, key: &LockKey) -> LockError {
    LockError::protocol(
        operation,
        key.user(),
        "etcd answered a transaction without its ranges",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contender_keys_name_their_lock_and_records_do_not() {
        assert_eq!(lock_name("lock:{a}/q/00ff"), Some("lock:{a}"));
        // A key holding `/q/` (hashed, as it holds a brace): the last one splits.
        assert_eq!(
            lock_name("lock:{#0123456789abcdef}a}/q/x/q/0a"),
            Some("lock:{#0123456789abcdef}a}/q/x")
        );
        assert_eq!(lock_name("lock:{a}/result"), None);
        assert_eq!(lock_name("lock:{a}/q/"), None);
        assert_eq!(lock_name("lock:{a}/q/not-a-token"), None);
        assert_eq!(prefix_end(b"lock:{"), b"lock:|");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), b"\0");
    }
}
