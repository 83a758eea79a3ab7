//! The acquisition engine: how a [`LockRequest`](crate::LockRequest) becomes a
//! [`LockGuard`]. This module resolves the request's options against the locker's, bounds the
//! whole acquisition by the wait, and runs the default mode (one attempt, then the local
//! queue); [`once`] is one acquire round trip, [`queued`] a waiter with a ticket in the
//! backend's queue (the default mode's queue head, and fair mode).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::LockError;
use crate::engine::held::Held;
use crate::engine::wait::{Arrival, Local, Receives};
use crate::guard::LockGuard;
use crate::key::LockKey;
use crate::locker::{LockerInner, MAX_LEASE, validate_lease, validate_wait};
use crate::observe;
use tracing::Instrument;

mod once;
mod queued;

use once::attempt;
use queued::{QueuedWaiter, acquire_fair};

/// How far past its wait a request may return: time for a healthy backend to take a timed-out
/// waiter's ticket out of the queue before the caller hears of the timeout (so the next release
/// does not hand the lock to a waiter that is gone). A backend that has not answered by then is
/// left to finish in the background.
const DEADLINE_SLACK: Duration = Duration::from_millis(20);

/// The answer to one attempt that reached the backend.
pub(super) enum Outcome {
    /// The lock is ours.
    Acquired(LockGuard),
    /// Someone else holds it (or an acquisition came too late to use): how long the holder's
    /// lease still runs, when known.
    Busy(Option<Duration>),
}

impl Outcome {
    /// The guard, or [`LockError::Busy`] for a request that does not wait.
    fn or_busy(self, key: &LockKey) -> Result<LockGuard, LockError> {
        match self {
            Outcome::Acquired(guard) => Ok(guard),
            Outcome::Busy(retry_after) => Err(LockError::Busy {
                key: key.user().to_owned(),
                retry_after,
            }),
        }
    }
}

/// What one request asks for; `None` takes the locker's default.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Options {
    pub(crate) wait: Option<Duration>,
    pub(crate) lease: Option<Duration>,
    pub(crate) fenced: bool,
    pub(crate) watchdog: Option<bool>,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) fair: bool,
    /// The class of its metrics and spans (see `LockRequest::class`).
    pub(crate) class: Option<&'static str>,
}

#[derive(Debug, Clone, Copy)]
struct Spec {
    wait: Duration,
    lease: Duration,
    fenced: bool,
    watchdog: bool,
    max_hold: Option<Duration>,
    fair: bool,
    class: &'static str,
}

/// Checks a request for the lock on `key` (before any I/O) and returns its acquisition, which
/// acquires the lock for real (the caller checked it is not held by the current scope) within
/// the request's wait. The acquisition owns what it needs: the caller keeps its key.
pub(crate) fn acquire_owned(
    inner: &Arc<LockerInner>,
    key: &str,
    options: Options,
) -> Result<impl Future<Output = Result<LockGuard, LockError>> + Send + 'static, LockError> {
    let class = options.class.unwrap_or(observe::DEFAULT_CLASS);
    let checked = check(inner, key, options, class);
    let (key, spec) = checked.inspect_err(|_| observe::refused(inner, class))?;
    let observed = observe::Acquiring::new(inner, &key, class);
    let inner = inner.clone();
    Ok(async move {
        // Not entered and left at every poll when nobody listens (about 250 instructions a
        // lock).
        let result = if observed.span.is_disabled() {
            within_wait(&inner, &key, spec).await
        } else {
            let span = observed.span.clone();
            within_wait(&inner, &key, spec).instrument(span).await
        };
        observed.finish(&result);
        result
    })
}

/// The checks of [`acquire_owned`], before any I/O.
fn check(
    inner: &Arc<LockerInner>,
    key: &str,
    options: Options,
    class: &'static str,
) -> Result<(LockKey, Spec), LockError> {
    if let Some(e) = &inner.config.error {
        return Err(e.clone());
    }
    let key = LockKey::new(&inner.config.prefix, key)?;
    let spec = Spec {
        wait: options.wait.unwrap_or(inner.config.wait),
        lease: options.lease.unwrap_or(inner.config.lease),
        fenced: options.fenced,
        watchdog: options.watchdog.unwrap_or(inner.config.watchdog),
        max_hold: options.max_hold,
        fair: options.fair,
        class,
    };
    validate_lease(spec.lease)?;
    validate_wait(spec.wait)?;
    if let Some(m) = spec.max_hold.filter(|m| m.is_zero() || *m > MAX_LEASE) {
        return Err(LockError::config(format!(
            "max_hold {m:?} is out of range: use above zero and at most {MAX_LEASE:?}"
        )));
    }
    // Options the backend refuses are refused here, before any I/O and before the local
    // queue: a fenced request behind a local holder must not wait for it, a fair one must not
    // subscribe first.
    if let Some(why) = inner.backend.refuses(spec.fenced, spec.fair) {
        return Err(LockError::config(why));
    }
    Ok((key, spec))
}

/// The acquisition of [`acquire_owned`], bounded by the wait.
async fn within_wait(
    inner: &Arc<LockerInner>,
    key: &LockKey,
    spec: Spec,
) -> Result<LockGuard, LockError> {
    let start = Instant::now();
    // Whether the backend said, during the wait, that the key was busy (or a task of this
    // locker holds it): a wait that ends without that is a backend failure, not a timeout.
    let heard = AtomicBool::new(false);
    // A function making the future, not one future: each branch below then holds only the
    // future it awaits, instead of a future kept across both (twice its size in this one).
    let engine = || async {
        if spec.fair {
            let _waiting = observe::Waiting::new(inner, spec.class);
            // Boxed for the same reason as `acquire`'s wait in the queue.
            Box::pin(acquire_fair(inner, key, &spec, start, &heard)).await
        } else {
            acquire(inner, key, &spec, start, &heard).await
        }
    };
    if spec.wait.is_zero() {
        // One attempt: bounded by the backend's own response timeout.
        return engine().await;
    }
    // The wait is a bound, whatever the backend does: an attempt or a clean-up still in
    // flight at the deadline is dropped here and finished in the background (an attempt
    // that turns out to have taken the lock releases it; a queued ticket leaves), and a
    // lock granted after the bound is released, never returned.
    let bound = start + spec.wait + DEADLINE_SLACK;
    let outcome = match tokio::time::timeout_at(bound, engine()).await {
        Ok(Ok(guard)) if Instant::now() > bound => {
            drop(guard);
            Err(timed_out(key, start))
        }
        Ok(outcome) => outcome,
        Err(_) => Err(timed_out(key, start)),
    };
    match outcome {
        // Nothing said the key was held: the server did not answer within the wait (stalled,
        // or slower than the wait). `Timeout` would tell the caller that someone held it.
        Err(LockError::Timeout { waited, .. }) if !heard.load(Ordering::Relaxed) => {
            Err(no_answer(key, waited))
        }
        outcome => outcome,
    }
}

/// The backend did not answer within the wait: `Backend`, so that callers treat it as the
/// failure it is (lock-tower answers 503, or lets the request through when failing open).
fn no_answer(key: &LockKey, waited: Duration) -> LockError {
    LockError::Backend {
        operation: "acquire",
        key: Some(key.user().to_owned()),
        source: Arc::new(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("the lock server did not answer within the wait ({waited:?})"),
        )),
    }
}

/// Acquires `key`: one attempt; then, when waiting is allowed, a place in the local queue and,
/// as its head: while a task of this locker holds the key, a wait for it to pass the lock here
/// (local hand-off); otherwise a place in the backend's queue, where a release hands the lock
/// over directly; the head also tries again when the holder's lease runs out or a plain
/// release is announced.
async fn acquire(
    inner: &Arc<LockerInner>,
    key: &LockKey,
    spec: &Spec,
    start: Instant,
    heard: &AtomicBool,
) -> Result<LockGuard, LockError> {
    let deadline = start + spec.wait;
    let receives = receives(inner, spec);
    let busy = match inner.queues.arrive(inner, key, receives) {
        // Parked in this locker's grace: a local turn, no round trip.
        Arrival::Taken(held) => return Ok(received(held)),
        Arrival::GiveBack(parked) => {
            let valid = parked.is_held();
            // Its outcome is the parked lock's, not this request's.
            let _ = parked.release_in_backend(valid).await;
            false
        }
        Arrival::Busy => true,
        Arrival::Free => false,
    };
    // Nobody queues or holds it here: contend at once (the uncontended path is this one round
    // trip).
    if spec.wait.is_zero() || !busy {
        match attempt(inner, key, spec, false).await? {
            outcome if spec.wait.is_zero() => return outcome.or_busy(key),
            Outcome::Acquired(guard) => return Ok(guard),
            Outcome::Busy(_) => {}
        }
    }
    heard.store(true, Ordering::Relaxed);
    let _waiting = observe::Waiting::new(inner, spec.class);
    // Boxed: the wait's state (local queue ticket, subscription, queued attempts) is large;
    // inline, it would size every acquire's future, moved and copied on the uncontended path.
    Box::pin(wait_in_queue(inner, key, spec, receives, start, deadline)).await
}

/// What a request may receive by local hand-off (or take parked in the grace): a lock passed
/// on keeps the lease its giver had in the backend, so only a request the watchdog renews for
/// may take one, and only one without a fence (every holder of a fenced lock gets a new token
/// from the backend).
fn receives(inner: &LockerInner, spec: &Spec) -> Option<Receives> {
    (inner.config.local.on && spec.watchdog && !spec.fenced && !spec.fair).then_some(Receives {
        lease: spec.lease,
        max_hold: spec.max_hold,
        class: spec.class,
    })
}

/// The rest of [`acquire`] once its first attempt found the key busy (or queued for here).
async fn wait_in_queue(
    inner: &Arc<LockerInner>,
    key: &LockKey,
    spec: &Spec,
    receives: Option<Receives>,
    start: Instant,
    deadline: Instant,
) -> Result<LockGuard, LockError> {
    let ticket = inner.queues.join(inner, key, receives);
    // A lock handed over with a lease shorter than asked for is renewed soon after it comes
    // (one asked with at most the hand-over lease is renewed like any other).
    if spec.watchdog && queued::handover_lease(spec.lease) < spec.lease {
        inner.watchdog.expect_handovers(inner);
    }
    tokio::time::timeout_at(deadline, ticket.my_turn())
        .await
        .map_err(|_| timed_out(key, start))?;
    // The queue's first head is subscribed before its next attempt, so a release after it
    // cannot go unnoticed; and before a local hand-off, which needs to hear of fair waiters
    // joining the backend's queue. A later head finds the subscription made, or has it asked
    // for again in the background (local hand-off then asks the backend until it is confirmed).
    tokio::time::timeout_at(deadline, ticket.subscribe())
        .await
        .map_err(|_| timed_out(key, start))?;
    if receives.is_some() {
        match ticket.wait_local(deadline).await {
            Local::Handed(held) => return Ok(received(held)),
            Local::TimedOut => return Err(timed_out(key, start)),
            Local::NotHeldHere => {}
        }
    }
    let mut queued = QueuedWaiter::new(inner, key, spec, ticket.inbox(), false);
    queued
        .wait(deadline, start, false, Some(&ticket), None)
        .await
}

/// The guard of a lock passed by local hand-off (already renewed by the watchdog).
fn received(held: Arc<Held>) -> LockGuard {
    tracing::trace!(key = %held.key.display(), "lock passed on within the locker");
    LockGuard::owned(held)
}

/// The wait for `key`, begun at `start`, is over.
fn timed_out(key: &LockKey, start: Instant) -> LockError {
    LockError::Timeout {
        key: key.user().to_owned(),
        waited: start.elapsed(),
    }
}
