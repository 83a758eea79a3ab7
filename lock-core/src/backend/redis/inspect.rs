//! What the people on call ask of a Redis backend (one server, Cluster, Sentinel): a lock's
//! state (inspect.lua), a lock freed whoever holds it (force_unlock.lua), and the held locks
//! under a pattern (`SCAN` on the server, or on every primary of a cluster).

use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Script, Value};

use super::RedisBackend;
use super::permissions::is_refusal;
use crate::LockError;
use crate::backend::{KeyPattern, ListPage};
use crate::inspect::{LockState, Unlocked};
use crate::key::LockKey;

static INSPECT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/inspect.lua")));

/// force_unlock.lua with the hand-over, as release.rs builds the full release.
macro_rules! force_unlock_script {
    ($pubsub:literal) => {
        LazyLock::new(|| {
            Script::new(concat!(
                include_str!("scripts/force_unlock.lua"),
                include_str!("scripts/fence.lua"),
                include_str!("scripts/handoff.lua"),
                include_str!("scripts/force_unlock_handover.lua"),
                "return force_handover('",
                $pubsub,
                "')\n"
            ))
        })
    };
}

static FORCE_UNLOCK: LazyLock<Script> = force_unlock_script!("0");
static FORCE_UNLOCK_SHARDED: LazyLock<Script> = force_unlock_script!("1");

/// How many keys one `SCAN` step looks at (`COUNT`): a page holds at most the locks among them.
const SCAN_COUNT: usize = 500;

impl RedisBackend {
    pub(crate) async fn inspect_lock(&self, key: &LockKey) -> Result<LockState, LockError> {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(INSPECT.get_hash())
            .arg(3)
            .arg(key.name())
            .arg(key.fence())
            .arg(key.waiters());
        // Retried once after a dropped connection, as other reads are.
        let mut conn = self.inner.conn.clone();
        let answer = match super::evalsha_once(&mut conn, &INSPECT, &cmd).await {
            Err(e) if super::retriable(&e) => super::evalsha_once(&mut conn, &INSPECT, &cmd).await,
            answer => answer,
        };
        let reply = match answer {
            Ok(reply) => reply,
            Err(e) if is_refusal(&e) => {
                let prefix = key.name().split_once('{').map_or("", |(p, _)| p);
                return Err(self.explain_refusal(prefix, "inspect", &e).await);
            }
            Err(e) => return Err(LockError::backend("inspect", Some(key.user()), e)),
        };
        state_of(key, &reply).ok_or_else(|| {
            LockError::protocol(
                "inspect",
                key.user(),
                format!("the inspect script answered {reply:?}"),
            )
        })
    }

    pub(crate) async fn force_unlock_lock(
        &self,
        key: &LockKey,
    ) -> Result<Option<LockState>, LockError> {
        match self.force_unlock_of(key, None, None).await? {
            Unlocked::Removed(state) => Ok(Some(state)),
            Unlocked::NotHeld | Unlocked::ChangedHands(_) => Ok(None),
        }
    }

    pub(crate) async fn force_unlock_seen_lock(
        &self,
        key: &LockKey,
        seen: &LockState,
    ) -> Result<Unlocked, LockError> {
        self.force_unlock_of(key, None, Some(seen)).await
    }

    /// Removes `key`'s lock on this server only if it is the acquisition `digest` names (see
    /// [`Digest`]), as [`force_unlock_lock`](Self::force_unlock_lock) does otherwise: one of
    /// a Redlock's servers. Whether it removed it.
    #[cfg(feature = "redlock")]
    pub(crate) async fn redlock_force_unlock(
        &self,
        key: &LockKey,
        digest: &Digest,
    ) -> Result<bool, LockError> {
        Ok(matches!(
            self.force_unlock_of(key, Some(digest), None).await?,
            Unlocked::Removed(_)
        ))
    }

    /// force_unlock.lua: of whoever holds the lock, or only of the acquisition `digest`
    /// (Redlock), or only of the holding `seen` (its since and fence).
    async fn force_unlock_of(
        &self,
        key: &LockKey,
        digest: Option<&Digest>,
        seen: Option<&LockState>,
    ) -> Result<Unlocked, LockError> {
        // Once per prefix, as before a lock: the script deletes the lock before it pops the
        // queue and hands over; a command refused half-way would leave the lock deleted and
        // its waiters unwoken.
        self.check_permissions_of(key)
            .await
            .map_err(|e| super::permissions::for_operation(e, "nothing was removed"))?;
        let script: &Script = if self.inner.sharded {
            &FORCE_UNLOCK_SHARDED
        } else {
            &FORCE_UNLOCK
        };
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash())
            .arg(4)
            .arg(key.name())
            .arg(key.queue_name())
            .arg(key.fence())
            .arg(key.waiters());
        // ARGV: the digest ('' for any acquisition), then the holding seen's since and fence.
        if digest.is_some() || seen.is_some() {
            cmd.arg(digest.map_or("", |d| d.0.as_str()));
        }
        if let Some(seen) = seen {
            cmd.arg(seen.since.map(since_ms).unwrap_or_default())
                .arg(seen.fence.map(|f| f.to_string()).unwrap_or_default());
        }
        // Sent once, never again after a dropped connection or a timeout (as other calls
        // are): without a token to check, a second run would remove whoever holds the lock by
        // then (the waiter the first run handed it to).
        let mut conn = self.inner.conn.clone();
        let reply = super::evalsha_once(&mut conn, script, &cmd)
            .await
            .map_err(|e| {
                // Refused before it reached the server: nothing was removed. Anything else
                // (a timeout, a dropped connection, an error inside the script) may have
                // come after the removal.
                let lost = if e.is_connection_refusal() {
                    ""
                } else {
                    "; the outcome is unknown (the lock may have been removed before the answer was lost): inspect it"
                };
                LockError::backend(
                    "force_unlock",
                    Some(key.user()),
                    std::io::Error::other(format!("{e}{lost}")),
                )
            })?;
        let items = match &reply {
            Value::Int(0) => return Ok(Unlocked::NotHeld),
            Value::Array(items) if items.len() == 6 => {
                // Another holding than the one seen: nothing touched.
                let state = removed_state(key, [&items[0], &items[1], &items[2], &items[3]]);
                return Ok(Unlocked::ChangedHands(state));
            }
            Value::Array(items) if items.len() == 5 => items,
            _ => {
                return Err(LockError::protocol(
                    "force_unlock",
                    key.user(),
                    format!(
                        "the force_unlock script answered {reply:?}; the outcome is unknown (the lock may have been removed): inspect it"
                    ),
                ));
            }
        };
        // The lock is removed: what it held is read leniently (a field that does not parse is
        // left out), never turned into an error the caller would retry.
        let removed = removed_state(key, [&items[0], &items[1], &items[2], &items[3]]);
        let message = text(&items[4]).unwrap_or("released");
        // This process's waiters learn at once, as from a release (the subscriber delivers the
        // published message again: harmless).
        if message != "released" {
            self.inner.contention.note(key);
        }
        self.inner
            .subscriber
            .deliver(key.channel_name(), message.as_bytes());
        Ok(Unlocked::Removed(removed))
    }

    /// One `SCAN` step on the server (or on one primary of a cluster, the cursor naming it),
    /// and the state of each lock it found whose key matches.
    pub(crate) async fn list_locks(
        &self,
        prefix: &str,
        pattern: &KeyPattern,
        cursor: Option<&str>,
    ) -> Result<ListPage, LockError> {
        #[cfg(feature = "cluster")]
        if let Some(topology) = &self.inner.topology {
            return self.list_cluster(topology, prefix, pattern, cursor).await;
        }
        if self.inner.cluster {
            // A node of a cluster, reached as one server: its SCAN sees its own shard only.
            return Err(LockError::config(
                "the server is a node of a Redis Cluster: a listing of one node would miss the locks the other shards hold; connect with RedisClusterBackend (lock-admin: --url redis+cluster://h1:p1,h2:p2)",
            ));
        }
        let at = match cursor {
            None => 0,
            Some(c) => c.parse().map_err(|_| bad_cursor(c))?,
        };
        let mut conn = self.inner.conn.clone();
        let (next, locks) = self.scan_step(&mut conn, prefix, pattern, at).await?;
        Ok(ListPage::new(locks, (next != 0).then(|| next.to_string())))
    }

    /// The cluster's listing: every primary in turn (sorted by address), a `SCAN` step at a
    /// time; the cursor is `<primary> <scan cursor>`.
    #[cfg(feature = "cluster")]
    async fn list_cluster(
        &self,
        topology: &crate::backend::cluster::Topology,
        prefix: &str,
        pattern: &KeyPattern,
        cursor: Option<&str>,
    ) -> Result<ListPage, LockError> {
        let primaries = topology.primaries();
        let (addr, at) = match cursor {
            None => match primaries.first() {
                Some(first) => (first.clone(), 0),
                None => return Err(no_primary()),
            },
            Some(c) => {
                let (addr, at) = c.rsplit_once(' ').ok_or_else(|| bad_cursor(c))?;
                (
                    std::sync::Arc::from(addr),
                    at.parse().map_err(|_| bad_cursor(c))?,
                )
            }
        };
        let Some(mut conn) = topology.renewer(&addr).await else {
            return Err(LockError::backend(
                "list",
                None,
                std::io::Error::other(format!("cannot reach the primary at {addr}")),
            ));
        };
        let (next, locks) = self.scan_step(&mut conn, prefix, pattern, at).await?;
        let next = if next != 0 {
            Some(format!("{addr} {next}"))
        } else {
            // This primary is done: the next one by address, if any.
            primaries
                .iter()
                .find(|p| p.as_ref() > addr.as_ref())
                .map(|p| format!("{p} 0"))
        };
        Ok(ListPage::new(locks, next))
    }

    /// `SCAN at MATCH <prefix>* COUNT .. TYPE string` on `conn`, then the inspect script of
    /// every lock found whose key matches, in one pipeline. The next cursor, and the held
    /// locks.
    async fn scan_step<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        prefix: &str,
        pattern: &KeyPattern,
        at: u64,
    ) -> Result<(u64, Vec<LockState>), LockError> {
        let (next, keys) = match scan_keys(conn, prefix, pattern, at).await {
            Ok(page) => page,
            Err(e) => return Err(self.list_failure(prefix, e).await),
        };
        if keys.is_empty() {
            return Ok((next, Vec::new()));
        }
        let replies = match inspect_pipeline(conn, &keys, false).await {
            Ok(replies) => replies,
            Err(e) => return Err(self.list_failure(prefix, e).await),
        };
        let mut locks = Vec::with_capacity(keys.len());
        for (key, reply) in keys.iter().zip(&replies) {
            let state = state_of(key, reply).ok_or_else(|| {
                LockError::protocol(
                    "list",
                    key.user(),
                    format!("the inspect script answered {reply:?}"),
                )
            })?;
            // Released between the scan and the read: not listed.
            if state.held {
                locks.push(state);
            }
        }
        Ok((next, locks))
    }

    /// One `SCAN` step on this server for a Redlock listing: the next cursor, and the lock
    /// keys found under `prefix` that match `pattern`.
    #[cfg(feature = "redlock")]
    pub(crate) async fn redlock_scan(
        &self,
        prefix: &str,
        pattern: &KeyPattern,
        at: u64,
    ) -> Result<(u64, Vec<LockKey>), LockError> {
        let mut conn = self.inner.conn.clone();
        scan_keys(&mut conn, prefix, pattern, at)
            .await
            .map_err(|e| LockError::backend("list", None, e))
    }

    /// This server's view of each of `keys` for a Redlock (inspect.lua with the holder's
    /// digest), in one pipeline; read-only, so sent again once after a dropped connection.
    #[cfg(feature = "redlock")]
    pub(crate) async fn redlock_inspect(&self, keys: &[LockKey]) -> Result<Vec<Seen>, LockError> {
        let mut conn = self.inner.conn.clone();
        let replies = match inspect_pipeline(&mut conn, keys, true).await {
            Err(e) if super::retriable(&e) => inspect_pipeline(&mut conn, keys, true).await,
            answer => answer,
        }
        .map_err(|e| LockError::backend("inspect", None, e))?;
        keys.iter()
            .zip(&replies)
            .map(|(key, reply)| {
                seen_of(key, reply).ok_or_else(|| {
                    // Not the reply itself: it holds the digest.
                    LockError::protocol(
                        "inspect",
                        key.user(),
                        "the inspect script's answer is not the state of a lock".to_owned(),
                    )
                })
            })
            .collect()
    }
}

/// `SCAN at MATCH <prefix>* COUNT .. TYPE string` on `conn`: the next cursor, and the lock keys
/// found whose keys match `pattern`.
async fn scan_keys<C: ConnectionLike + Send>(
    conn: &mut C,
    prefix: &str,
    pattern: &KeyPattern,
    at: u64,
) -> redis::RedisResult<(u64, Vec<LockKey>)> {
    // Names as bytes: a key of the prefix that is not UTF-8 is no lock of ours, skipped.
    let (next, names): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
        .arg(at)
        .arg("MATCH")
        .arg(format!("{}*", escape_glob(prefix)))
        .arg("COUNT")
        .arg(SCAN_COUNT)
        .arg("TYPE")
        .arg("string")
        .query_async(conn)
        .await?;
    let keys: Vec<LockKey> = names
        .iter()
        .filter_map(|name| std::str::from_utf8(name).ok())
        .filter_map(|name| LockKey::from_name(prefix, name))
        .filter(|key| pattern.matches(key.user()))
        .collect();
    Ok((next, keys))
}

/// inspect.lua for each of `keys` (with the holder's digest when `digest`), in one pipeline on
/// `conn`, loading the script after `NOSCRIPT`.
async fn inspect_pipeline<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &[LockKey],
    digest: bool,
) -> redis::RedisResult<Vec<Value>> {
    let mut pipe = redis::pipe();
    for key in keys {
        let cmd = pipe
            .cmd("EVALSHA")
            .arg(INSPECT.get_hash())
            .arg(3)
            .arg(key.name())
            .arg(key.fence())
            .arg(key.waiters());
        if digest {
            cmd.arg("1");
        }
    }
    match pipe.query_async(conn).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            INSPECT.prepare_invoke().load_async(conn).await?;
            pipe.query_async(conn).await
        }
        answer => answer,
    }
}

/// The digest of a lock's token as inspect.lua answers it for a Redlock (SHA-1 hex): the
/// servers that answer the same digest hold the same acquisition. Compared, and sent back to
/// force_unlock.lua, never shown: `Debug` prints no digit of it. (Without the `redlock`
/// feature only the type is used: the single-server removal passes none.)
#[cfg_attr(not(feature = "redlock"), allow(dead_code))]
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct Digest(String);

impl std::fmt::Debug for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Digest(<redacted>)")
    }
}

/// What one Redlock server holds for a key: the state as inspect.lua reads it, and the
/// holder's digest when held.
#[cfg(feature = "redlock")]
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub(crate) state: LockState,
    pub(crate) digest: Option<Digest>,
}

/// What inspect.lua answered for `key` with the digest: the state's six items, then the digest.
#[cfg(feature = "redlock")]
fn seen_of(key: &LockKey, reply: &Value) -> Option<Seen> {
    let Value::Array(items) = reply else {
        return None;
    };
    let [state @ .., digest] = items.as_slice() else {
        return None;
    };
    let state = parse_state(key, state)?;
    let digest = text(digest)?;
    let valid = digest.len() == 40 && digest.bytes().all(|b| b.is_ascii_hexdigit());
    let digest = match (state.held, digest.is_empty()) {
        (false, true) => None,
        (true, false) if valid => Some(Digest(digest.to_owned())),
        _ => return None,
    };
    Some(Seen { state, digest })
}

impl RedisBackend {
    /// A listing's failed read `e`: a permission Redis refused is named
    /// ([`explain_refusal`](RedisBackend::explain_refusal)), anything else is the backend's.
    async fn list_failure(&self, prefix: &str, e: redis::RedisError) -> LockError {
        if is_refusal(&e) {
            self.explain_refusal(prefix, "list", &e).await
        } else {
            LockError::backend("list", None, e)
        }
    }
}

/// The state inspect.lua answered for `key`: `{pttl, since, holder, fence, waiters, now}`.
fn state_of(key: &LockKey, reply: &Value) -> Option<LockState> {
    let Value::Array(items) = reply else {
        return None;
    };
    parse_state(key, items)
}

/// The state of `{pttl, since, holder, fence, waiters, now}`.
fn parse_state(key: &LockKey, items: &[Value]) -> Option<LockState> {
    let [pttl, since, holder, fence, waiters, now] = items else {
        return None;
    };
    let mut state = LockState::free(key.user());
    let pttl = int(pttl)?;
    state.fence = number(fence)?;
    state.waiters = usize::try_from(int(waiters)?).ok()?;
    if pttl == -2 {
        return Some(state);
    }
    state.held = true;
    state.remaining = u64::try_from(pttl).ok().map(Duration::from_millis);
    state.holder = holder_of(holder);
    let since = number(since)?;
    state.since = since.map(from_ms);
    state.held_for = match (since, number(now)?) {
        (Some(since), Some(now)) => Some(Duration::from_millis(now.saturating_sub(since))),
        _ => None,
    };
    Some(state)
}

/// The state force_unlock.lua answered it removed: `{pttl, since, holder, fence}`, each
/// field that does not parse left out (`held_for` by this process's clock).
fn removed_state(key: &LockKey, [pttl, since, holder, fence]: [&Value; 4]) -> LockState {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let mut state = LockState::free(key.user());
    state.held = true;
    state.remaining = int(pttl)
        .and_then(|ms| u64::try_from(ms).ok())
        .map(Duration::from_millis);
    state.holder = holder_of(holder);
    let since = number(since).flatten();
    state.since = since.map(from_ms);
    state.held_for = since.map(|since| Duration::from_millis(now.saturating_sub(since)));
    state.fence = number(fence).flatten();
    state
}

/// A holder read back from the store, made safe to show (see
/// [`crate::inspect::shown_holder`]); `None` when empty.
fn holder_of(v: &Value) -> Option<String> {
    let bytes = match v {
        Value::BulkString(b) => b.as_slice(),
        Value::SimpleString(s) => s.as_bytes(),
        _ => return None,
    };
    (!bytes.is_empty()).then(|| crate::inspect::shown_holder(&String::from_utf8_lossy(bytes)))
}

/// A stamp's milliseconds since 1970 as a time.
fn from_ms(ms: u64) -> std::time::SystemTime {
    std::time::UNIX_EPOCH + Duration::from_millis(ms)
}

/// A time as a stamp writes it: milliseconds since 1970, in digits.
fn since_ms(at: std::time::SystemTime) -> String {
    at.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
        .to_string()
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(n) => Some(*n),
        _ => None,
    }
}

fn text(v: &Value) -> Option<&str> {
    match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok(),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

/// A number sent as a string: `Some(None)` for `''`, `None` for anything else but digits.
fn number(v: &Value) -> Option<Option<u64>> {
    let s = text(v)?;
    if s.is_empty() {
        return Some(None);
    }
    s.parse().ok().map(Some)
}

/// `prefix` with the glob characters of `SCAN MATCH` escaped.
fn escape_glob(prefix: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + 4);
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn bad_cursor(cursor: &str) -> LockError {
    LockError::config(format!(
        "listing cursor {cursor:?} was not made by this backend"
    ))
}

#[cfg(feature = "cluster")]
fn no_primary() -> LockError {
    LockError::backend(
        "list",
        None,
        std::io::Error::other("the cluster's slot map names no primary"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_escaped_for_scan_match() {
        assert_eq!(escape_glob("lock:"), "lock:");
        assert_eq!(escape_glob("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }

    #[test]
    fn inspect_answers_are_parsed_or_refused() {
        let key = LockKey::new("lock:", "job").unwrap();
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let held = Value::Array(vec![
            Value::Int(2500),
            bulk("1000"),
            bulk("web-1/pid 7"),
            bulk("42"),
            Value::Int(2),
            bulk("1750"),
        ]);
        let state = state_of(&key, &held).unwrap();
        assert!(state.held);
        assert_eq!(state.remaining, Some(Duration::from_millis(2500)));
        assert_eq!(state.holder.as_deref(), Some("web-1/pid 7"));
        assert_eq!(state.held_for, Some(Duration::from_millis(750)));
        assert_eq!((state.fence, state.waiters), (Some(42), 2));
        let free = Value::Array(vec![
            Value::Int(-2),
            bulk(""),
            bulk(""),
            bulk(""),
            Value::Int(0),
            bulk("1750"),
        ]);
        assert_eq!(state_of(&key, &free), Some(LockState::free("job")));
        for bad in [
            Value::Nil,
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![
                Value::Int(1),
                bulk("x"),
                bulk(""),
                bulk(""),
                Value::Int(0),
                bulk("1"),
            ]),
        ] {
            assert_eq!(state_of(&key, &bad), None, "{bad:?}");
        }
    }
}
