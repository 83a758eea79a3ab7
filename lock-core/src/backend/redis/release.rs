//! Releasing a lock on one server.
//!
//! Most releases find nobody waiting, and pay for a one-key compare-and-delete
//! (release_fast.lua), what a bare `GET`/`DEL` script costs the server. A waiter that queues
//! behind a holder marks the lock (its value becomes the token plus `'+'`), so the one-key
//! release can tell that the lock must be handed over rather than deleted: it then leaves the
//! lock as it is and the full release (release.lua: four keys, the queue read, the hand-over)
//! follows, one round trip later. Keys on which this backend met waiters in the last
//! [`WINDOW`] skip the one-key release and send the full one at once, so a contended key's
//! handoff pays no added round trip. Redlock's servers always send the full release: a Redlock
//! waiter's entry does not mark the lock (redlock_waiter.lua).

use std::hash::BuildHasher;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::{Script, Value};

use super::{RedisBackend, batch};
use crate::LockError;
use crate::key::LockKey;
use crate::token::Token;

/// The two scripts of a full release, `$plain` publishing with PUBLISH and `$sharded` with
/// SPUBLISH (one script per kind of pub/sub rather than one more argument on every release):
/// `$head` (the common path, before any function definition), the fencing and hand-over
/// code, then `$tail`, whose function `$call` the script's last line calls.
macro_rules! full_release {
    ($plain:ident, $sharded:ident, $head:literal, $tail:literal, $call:literal) => {
static $plain: LazyLock<Script> = full_release!(@one $head, $tail, $call, "0");
static $sharded: LazyLock<Script> = full_release!(@one $head, $tail, $call, "1");
    };
    (@one $head:literal, $tail:literal, $call:literal, $pubsub:literal) => {
        LazyLock::new(|| {
            Script::new(concat!(
                include_str!($head),
                include_str!("scripts/fence.lua"),
                include_str!("scripts/handoff.lua"),
                include_str!($tail),
                "return ",
                $call,
                "('",
                $pubsub,
                "')\n"
            ))
        })
    };
}

full_release!(
    RELEASE,
    RELEASE_SHARDED,
    "scripts/release.lua",
    "scripts/release_handover.lua",
    "release_handover"
);
// Batches of releases (batch.rs): many in one call. (A batch of acquires is a pipeline of
// native commands.)
full_release!(
    RELEASE_MANY,
    RELEASE_MANY_SHARDED,
    "scripts/release_many.lua",
    "scripts/release_many_handover.lua",
    "release_many_handover"
);
static RELEASE_FAST: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/release_fast.lua")));
static RELEASE_FAST_MANY: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/release_fast_many.lua")));

/// The release script: the one-key release when `fast`, else the full one publishing with
/// SPUBLISH when `sharded`; for a batch of locks when `many` (batch.rs).
pub(super) fn script(fast: bool, many: bool, sharded: bool) -> &'static Script {
    match (fast, many, sharded) {
        (true, false, _) => &RELEASE_FAST,
        (true, true, _) => &RELEASE_FAST_MANY,
        (false, false, false) => &RELEASE,
        (false, false, true) => &RELEASE_SHARDED,
        (false, true, false) => &RELEASE_MANY,
        (false, true, true) => &RELEASE_MANY_SHARDED,
    }
}

/// Whether a lock's value (as `SET ... GET` answered it) holds `token`: the token alone, or
/// followed by its stamp (`'|'...`) or the mark of a waiter (`'+'`; see release_fast.lua).
pub(super) fn holds(value: &[u8], token: &Token) -> bool {
    value
        .strip_prefix(token.as_str().as_bytes())
        .is_some_and(|rest| rest.is_empty() || rest[0] == b'|' || rest[0] == b'+')
}

/// How long after meeting waiters on a key its releases go straight to the full release. A
/// wrong "contended" costs a release about a microsecond of server time, a wrong "nobody
/// waits" a round trip on that hand-over: the window leans long.
const WINDOW: Duration = Duration::from_secs(5);

/// How many keys the hint remembers (a key whose slot another key took gets the one-key
/// release first again: one round trip more when it is contended, never a lost hand-over).
const SLOTS: usize = 1024;

/// The keys of one backend on which waiters were met lately: a hint that only chooses which
/// release goes first (the lock's mark decides what is safe, not this).
pub(super) struct Contention {
    started: Instant,
    /// foldhash, not SipHash, seeded per process: a chosen collision costs a round trip at most.
    hasher: foldhash::fast::RandomState,
    slots: Box<[Slot]>,
}

#[derive(Default)]
struct Slot {
    /// The key's hash.
    key: AtomicU64,
    /// Until when (milliseconds since `started`) its releases go straight to the full release.
    until: AtomicU64,
}

impl Contention {
    pub(super) fn new() -> Self {
        Contention {
            started: Instant::now(),
            hasher: foldhash::fast::RandomState::default(),
            slots: (0..SLOTS).map(|_| Slot::default()).collect(),
        }
    }

    fn slot(&self, key: &LockKey) -> (&Slot, u64) {
        let hash = self.hasher.hash_one(key.name());
        let index = usize::try_from(hash % SLOTS as u64).unwrap_or(0);
        (&self.slots[index], hash)
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Waiters were met on `key` just now (a release found the lock marked or handed it over,
    /// this backend queued for it, the local hand-off gave it to a waiter of another process).
    pub(super) fn note(&self, key: &LockKey) {
        let (slot, hash) = self.slot(key);
        let until = self.now_ms().saturating_add(super::millis(WINDOW));
        slot.key.store(hash, Ordering::Relaxed);
        slot.until.store(until, Ordering::Relaxed);
    }

    /// Whether waiters were met on `key` within the last [`WINDOW`].
    fn recent(&self, key: &LockKey) -> bool {
        let (slot, hash) = self.slot(key);
        slot.key.load(Ordering::Relaxed) == hash
            && self.now_ms() < slot.until.load(Ordering::Relaxed)
    }
}

impl RedisBackend {
    /// Releases `key` if it still holds `token`: `Ok(false)` when it was not ours (expired or
    /// taken). Queued waiters get the lock handed over, or are told it is free.
    pub(crate) async fn release(&self, key: &LockKey, token: &Token) -> Result<bool, LockError> {
        let fast = self.inner.fast_release && !self.inner.contention.recent(key);
        match self.release_with(key, token, fast).await {
            Err(e) if fast => {
                // The one-key release may still run on the server (a timeout leaves it in the
                // connection), find the lock marked and answer nobody; or it answered "marked"
                // and the full release failed. The full release follows, in the background: it
                // hands the lock over if a waiter marked it, and answers "not ours" if the
                // one-key release deleted it (tokens are never reused).
                let (backend, name, token) = (self.clone(), key.clone(), token.clone());
                let follow_up = crate::background::spawn(async move {
                    if let Err(e) = backend.release_with(&name, &token, false).await {
                        tracing::debug!(key = %name.display(), error = %e, "the full release after a failed one-key release failed; the lease will expire");
                    }
                });
                if follow_up.is_none() {
                    tracing::debug!(key = %key.display(), "no runtime for the full release after a failed one-key release; the lease will expire");
                }
                Err(e)
            }
            answer => answer,
        }
    }

    /// [`release`](Self::release), the one-key release first when `fast`.
    async fn release_with(
        &self,
        key: &LockKey,
        token: &Token,
        fast: bool,
    ) -> Result<bool, LockError> {
        let contention = &self.inner.contention;
        let mut reply = self.release_call(key, token, fast).await?;
        if fast && reply == Value::Int(2) {
            // Ours, and a waiter queued behind us: the lock is still ours, untouched.
            contention.note(key);
            reply = self.release_call(key, token, false).await?;
        }
        let channel = key.channel_name();
        match reply {
            Value::Int(1) => {
                self.inner.subscriber.deliver(channel, b"released");
                Ok(true)
            }
            Value::BulkString(message) => {
                contention.note(key);
                // This process's waiters learn at once, without waiting for the message to come
                // back through the subscriber (which delivers it again: harmless).
                self.inner.subscriber.deliver(channel, &message);
                Ok(true)
            }
            // "Not ours", also on a retry after a dropped connection: the first call may have
            // deleted our lock and lost only its answer, but the server may equally have
            // restarted empty and the key be someone else's now. We cannot tell, so it is never
            // reported as a clean release (the caller gets `LeaseLost`).
            Value::Int(0) => Ok(false),
            other => Err(LockError::protocol(
                "release",
                key.user(),
                format!("release script answered {other:?}"),
            )),
        }
    }

    /// One release call, the one-key release when `fast`: alone while few releases are in
    /// flight, else in the next batch (batch.rs; never on a cluster node, whose batches would
    /// span slots). Answers `1` (released), `2` (ours and marked: `fast` only), the message
    /// published (handed over or announced) or `0` (not ours).
    async fn release_call(
        &self,
        key: &LockKey,
        token: &Token,
        fast: bool,
    ) -> Result<Value, LockError> {
        if self.inner.cluster {
            return self.release_one(key, token, fast).await;
        }
        let turn = batch::enter(
            self,
            batch::Kind::Release,
            batch::Entry {
                key,
                token,
                lease: Duration::ZERO,
                remaining: false,
                value: "",
                fast,
            },
        );
        match turn {
            batch::Turn::Direct(slot) => {
                let answer = self.release_one(key, token, fast).await;
                drop(slot);
                answer
            }
            batch::Turn::Queued(answer) => {
                batch::queued(self, answer, batch::Kind::Release, key, false).await
            }
        }
    }

    /// One release, alone in its call; answers as [`release_call`](Self::release_call).
    async fn release_one(
        &self,
        key: &LockKey,
        token: &Token,
        fast: bool,
    ) -> Result<Value, LockError> {
        let script = script(fast, false, self.inner.sharded);
        // Sized up front: built argument by argument, the buffer would grow (and copy) twice.
        let names = if fast {
            key.name().len()
        } else {
            key.name().len() + key.queue_name().len() + key.fence().len() + key.waiters().len()
        };
        let mut cmd = redis::Cmd::with_capacity(8, 48 + names + token.as_str().len());
        cmd.arg("EVALSHA").arg(script.get_hash());
        if fast {
            cmd.arg(1).arg(key.name());
        } else {
            cmd.arg(4)
                .arg(key.name())
                .arg(key.queue_name())
                .arg(key.fence())
                .arg(key.waiters());
        }
        cmd.arg(token.as_str());
        let reply = self
            .evalsha(script, &cmd, "release", Some(key.user()))
            .await?;
        match reply {
            Value::Array(items) => match <[Value; 2]>::try_from(items) {
                Ok([Value::Int(1), message @ Value::BulkString(_)]) => Ok(message),
                Ok(items) => Err(LockError::protocol(
                    "release",
                    key.user(),
                    format!("release script answered {items:?}"),
                )),
                Err(items) => Err(LockError::protocol(
                    "release",
                    key.user(),
                    format!("release script answered {items:?}"),
                )),
            },
            other => Ok(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_takes_the_token_alone_or_marked_and_nothing_else() {
        let token = Token::new(true);
        let t = token.as_str();
        assert!(holds(t.as_bytes(), &token));
        assert!(holds(format!("{t}+").as_bytes(), &token));
        assert!(holds(
            format!("{t}|1764000000000|web-1/pid 7|").as_bytes(),
            &token
        ));
        assert!(holds(
            format!("{t}|1764000000000|web-1/pid 7|+").as_bytes(),
            &token
        ));
        let cut = &t[..t.len() - 1];
        for other in [
            format!("{t}x"),
            format!("{t}0|1|h|"),
            format!("{cut}|1|h|"),
            format!("+{t}"),
            format!("{cut}+"),
            cut.to_owned(),
            String::new(),
            "+".to_owned(),
            Token::new(true).as_str().to_owned(),
        ] {
            assert!(!holds(other.as_bytes(), &token), "{other}");
        }
    }
}
