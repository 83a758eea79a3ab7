//! One acquire round trip without a queue, and what turns a successful attempt into a guard.

use std::sync::Arc;

use tokio::time::Instant;

use super::{Outcome, Spec};
use crate::LockError;
use crate::backend::{Attempt, AttemptOptions};
use crate::engine::held::{Acquisition, Held};
use crate::guard::LockGuard;
use crate::key::LockKey;
use crate::locker::LockerInner;
use crate::token::Token;

/// One plain acquire round trip (no queue).
pub(super) async fn attempt(
    inner: &Arc<LockerInner>,
    key: &LockKey,
    spec: &Spec,
    waited: bool,
) -> Result<Outcome, LockError> {
    let token = inner.new_token();
    let sent_at = Instant::now();
    // If this future is dropped mid-flight, or the answer is lost, the lock may be ours in the
    // backend without our knowing: release it in the background rather than block the key
    // for a whole lease (the release script only deletes a key holding this token).
    let mut in_flight = InFlight {
        inner,
        key,
        token: Some(&token),
    };
    let answer = inner
        .call()
        .acquire(
            key,
            &token,
            spec.lease,
            AttemptOptions {
                fenced: spec.fenced,
                ticket: None,
                remaining: spec.wait.is_zero(),
                unrenewed: !spec.watchdog,
                holder: &inner.config.holder,
                // A request that waits is under its wait's bound (`within_wait`).
                bounded: !spec.wait.is_zero(),
            },
        )
        .await?;
    in_flight.token = None;
    drop(in_flight);
    match answer {
        Attempt::Acquired { fence } => {
            let acquisition = Acquisition {
                key: key.clone(),
                token,
                fence,
                lease: spec.lease,
                first_lease: spec.lease,
                sent_at,
                received_at: sent_at,
                max_hold: spec.max_hold,
                waited,
            };
            Ok(guard_for(inner, acquisition, spec.watchdog, spec.fair)
                .map_or(Outcome::Busy(None), Outcome::Acquired))
        }
        Attempt::Busy { remaining } => Ok(Outcome::Busy(remaining)),
    }
}

/// The guard for an acquisition, or `None` when its lease had already run out by the time the
/// answer came (a slow network, a pause): the lock may be someone else's already, so it is not
/// a success, and it is released in the background in case it is still ours.
pub(super) fn guard_for(
    inner: &Arc<LockerInner>,
    acquisition: Acquisition,
    watchdog: bool,
    fair: bool,
) -> Option<LockGuard> {
    let held = Held::new(inner.clone(), acquisition);
    if !held.is_held() {
        tracing::debug!(key = %held.key.display(), "acquired too late: the lease ran out before the answer came");
        drop(LockGuard::owned(held));
        return None;
    }
    if watchdog {
        inner.watchdog.add(inner, &held);
    }
    if inner.config.local.on {
        inner.queues.note_holder(&held, !fair);
    }
    tracing::trace!(key = %held.key.display(), fence = held.fence, "lock acquired");
    Some(LockGuard::owned(held))
}

pub(super) struct InFlight<'a> {
    pub(super) inner: &'a Arc<LockerInner>,
    pub(super) key: &'a LockKey,
    pub(super) token: Option<&'a Token>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        // A backend that takes back its own failed attempts (Redlock) has done so already: a
        // release here would announce a lock nobody held.
        if self.inner.backend.takes_back_failed_attempts() {
            return;
        }
        if let Some(token) = self.token {
            self.inner.release_later(self.key.clone(), token.clone());
        }
    }
}
