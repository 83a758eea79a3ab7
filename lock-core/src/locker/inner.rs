//! What the clones of one [`Locker`](crate::Locker) share: the backend, the configuration,
//! the watchdog, the local wait queues and the counters, with the few operations every part of
//! the engine needs (a new token, a counted backend call, a background release).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::LockError;
use crate::backend::Backend;
use crate::background;
use crate::engine::wait::WaitQueues;
use crate::engine::watchdog::Watchdog;
use crate::key::LockKey;
use crate::token::Token;

#[derive(Debug)]
pub(crate) struct LockerInner {
    pub(crate) id: u64,
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) config: Config,
    pub(crate) watchdog: Watchdog,
    pub(crate) queues: WaitQueues,
    /// Calls made to the backend (round trips on Redis).
    pub(crate) calls: AtomicU64,
    /// Locks received from a release that handed them over.
    pub(crate) handovers: AtomicU64,
    /// Locks passed between tasks of this locker without the backend.
    pub(crate) local_handoffs: AtomicU64,
    /// `force_unlock` calls of this locker that ended (see [`LockerInner::forced`]).
    forced: AtomicU64,
}

impl LockerInner {
    pub(crate) fn new(id: u64, backend: Arc<dyn Backend>, config: Config) -> Self {
        LockerInner {
            id,
            backend,
            config,
            watchdog: Watchdog::default(),
            queues: WaitQueues::default(),
            calls: AtomicU64::new(0),
            handovers: AtomicU64::new(0),
            local_handoffs: AtomicU64::new(0),
            forced: AtomicU64::new(0),
        }
    }

    /// The force generation: how many `force_unlock` calls of this locker have ended. Read
    /// before the backend is asked to vouch for a lock that local turns then pass on (see
    /// `WaitQueues::pass_on`): a lock the backend vouched for before a `force_unlock` of this
    /// locker ended may have been removed by it, and is passed on again only once the backend
    /// vouched for it anew.
    pub(crate) fn forced(&self) -> u64 {
        self.forced.load(Ordering::Acquire)
    }

    /// A `force_unlock` of this locker ended (answered, failed or dropped: it may have
    /// removed a lock): every lock vouched for before is asked about again before its next
    /// local turn.
    pub(crate) fn force_ended(&self) {
        self.forced.fetch_add(1, Ordering::AcqRel);
    }

    /// A new owner token, from the OS for a backend other processes share (fork-safe).
    pub(crate) fn new_token(&self) -> Token {
        Token::new(!self.backend.in_process())
    }

    /// Counts one call to the backend; returns `self` for chaining into it.
    pub(crate) fn call(&self) -> &dyn Backend {
        self.calls.fetch_add(1, Ordering::Relaxed);
        &*self.backend
    }

    /// Releases `key` if it still holds `token`, in the background (best effort: the lease is
    /// the backstop), then wakes the key's local waiters.
    pub(crate) fn release_later(self: &Arc<Self>, key: LockKey, token: Token) {
        let inner = self.clone();
        background::spawn(async move {
            match inner.call().release(&key, &token).await {
                // The release told this process's waiters itself.
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => {
                    tracing::debug!(key = %key.display(), error = %e, "background release failed; the lease will expire");
                }
            }
            inner.queues.wake_local(&key);
        });
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) prefix: String,
    pub(crate) lease: Duration,
    pub(crate) wait: Duration,
    pub(crate) watchdog: bool,
    pub(crate) local: LocalHandoff,
    /// Who this locker's locks say holds them (`LockerBuilder::holder`).
    pub(crate) holder: String,
    /// A builder value was out of range: every lock attempt reports it.
    pub(crate) error: Option<LockError>,
}

/// The local hand-off settings (see `LockerBuilder::local_handoff`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LocalHandoff {
    pub(crate) on: bool,
    /// Local turns in a row before the lock goes back to the backend.
    pub(crate) turns: u32,
    /// How long the locker may keep a lock through local turns, from its backend acquisition.
    pub(crate) hold: Duration,
    /// How long a hot lock released with no local waiter stays parked in the locker for the
    /// next local request (zero: never parked; see `LockerBuilder::local_grace`).
    pub(crate) grace: Duration,
}

/// The most local turns in a row [`LocalHandoff::turns`] may allow.
const MAX_LOCAL_TURNS: u32 = 100_000;

/// The default [`LocalHandoff::grace`] (see `LockerBuilder::local_grace` for the measurement).
/// Zero (no grace) until the grace has had a review of its own: opt in with
/// `local_grace(Duration::from_millis(1))`, the length the measurements suggest.
pub(crate) const DEFAULT_LOCAL_GRACE: Duration = Duration::ZERO;

impl Default for LocalHandoff {
    fn default() -> Self {
        LocalHandoff {
            on: true,
            turns: 64,
            hold: Duration::from_millis(50),
            grace: DEFAULT_LOCAL_GRACE,
        }
    }
}

impl LocalHandoff {
    pub(crate) fn validate(&self) -> Result<(), LockError> {
        if self.turns == 0 || self.turns > MAX_LOCAL_TURNS {
            return Err(LockError::config(format!(
                "local_turns {} is out of range: use 1 to {MAX_LOCAL_TURNS} (or local_handoff(false))",
                self.turns
            )));
        }
        if self.hold.is_zero() || self.hold > crate::locker::MAX_LEASE {
            return Err(LockError::config(format!(
                "local_hold {:?} is out of range: use above zero and at most {:?} (or local_handoff(false))",
                self.hold,
                crate::locker::MAX_LEASE
            )));
        }
        if self.grace > crate::locker::MAX_LOCAL_GRACE {
            return Err(LockError::config(format!(
                "local_grace {:?} is out of range: use zero (no grace) to {:?}",
                self.grace,
                crate::locker::MAX_LOCAL_GRACE
            )));
        }
        Ok(())
    }
}
