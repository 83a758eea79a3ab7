//! Waiting: a bounded wait ends in `Timeout`, a release hands the lock to the queued waiter,
//! and a waiter that timed out leaves nothing behind.

use std::time::{Duration, Instant};

use crate::{LockError, LockGuard, Locker};

use super::fixture::{Fixture, SOON, eventually};

// ---------------------------------------------------------------------------------------------
// Bounded waits

const WAITED: &str = "waited";

/// A lock on [`WAITED`] held (30 s lease) by one locker, and a second locker whose default
/// wait is 250 ms: the holder, its guard, the second locker.
async fn held_with_waiter(fx: &Fixture) -> (Locker, LockGuard, Locker) {
    let a = fx.locker().await;
    let b = fx.builder().await.wait(Duration::from_millis(250)).build();
    let holder = a
        .lock(WAITED)
        .lease(Duration::from_secs(30))
        .await
        .expect("acquire");
    (a, holder, b)
}

/// How a wait of `wait` ended, and after how long.
struct Timed {
    result: Result<LockGuard, LockError>,
    wait: Duration,
    elapsed: Duration,
}

async fn timed(r: impl IntoFuture<Output = Result<LockGuard, LockError>>, wait: Duration) -> Timed {
    let start = Instant::now();
    let result = r.await;
    Timed {
        result,
        wait,
        elapsed: start.elapsed(),
    }
}

/// Asserts a `Timeout` on [`WAITED`] that reports at least the wait, returned not before the
/// wait elapsed and within a generous bound after it.
#[track_caller]
fn assert_timed_out(t: &Timed) {
    let (wait, elapsed) = (t.wait, t.elapsed);
    match &t.result {
        Err(LockError::Timeout { key, waited, .. }) => {
            assert_eq!(key, WAITED);
            assert!(*waited >= wait, "reported {waited:?} for a {wait:?} wait");
        }
        other => panic!("expected Timeout after {wait:?}, got {other:?}"),
    }
    assert!(
        elapsed >= wait,
        "returned after {elapsed:?}, before the {wait:?} wait"
    );
    assert!(
        elapsed < wait + Duration::from_secs(2),
        "returned after {elapsed:?} for a {wait:?} wait"
    );
}

/// Two waits of 300 and 500 ms queued together, then a plain `lock` with the locker's default
/// wait (250 ms).
async fn waits(b: &Locker) -> [Timed; 3] {
    let first = Duration::from_millis(300);
    let second = Duration::from_millis(500);
    let (first, second) = tokio::join!(
        timed(b.lock(WAITED).wait(first), first),
        timed(b.lock(WAITED).wait(second), second),
    );
    let default = timed(b.lock(WAITED), Duration::from_millis(250)).await;
    [first, second, default]
}

/// A bounded wait on a held key ends in `Timeout`: not before the wait elapsed, within a
/// generous bound after it.
async fn bounded_wait_on_a_held_key_times_out(fx: Fixture) {
    let (_a, _holder, b) = held_with_waiter(&fx).await;
    let wait = Duration::from_millis(300);
    assert_timed_out(&timed(b.lock(WAITED).wait(wait), wait).await);
}

/// Two waiters queued together each time out on their own bound (300 and 500 ms), the second
/// behind the first.
async fn queued_waiters_each_time_out_on_their_own_bound(fx: Fixture) {
    let (_a, _holder, b) = held_with_waiter(&fx).await;
    let [first, second, _] = waits(&b).await;
    assert_timed_out(&first);
    assert_timed_out(&second);
}

/// The locker's default wait (250 ms) bounds a plain `lock`.
async fn lockers_default_wait_bounds_a_plain_lock(fx: Fixture) {
    let (_a, _holder, b) = held_with_waiter(&fx).await;
    assert_timed_out(&timed(b.lock(WAITED), Duration::from_millis(250)).await);
}

/// Waiters that timed out leave their locker's queue.
async fn timed_out_waiters_leave_the_lockers_queue(fx: Fixture) {
    let (_a, _holder, b) = held_with_waiter(&fx).await;
    waits(&b).await;
    assert_eq!(b.stats().waiters, 0, "timed-out waiters leave the queue");
}

/// Waiters that timed out leave the holder alone: it still holds.
async fn timed_out_waiters_leave_the_holder_alone(fx: Fixture) {
    let (_a, holder, b) = held_with_waiter(&fx).await;
    waits(&b).await;
    assert!(holder.is_held());
    holder.release().await.expect("release");
}

// ---------------------------------------------------------------------------------------------
// Handover

const HANDOVER: &str = "handover";

/// A release while another locker's waiter queues for the key (fenced both, or in fair mode
/// unfenced both), and a newcomer's `try_lock` right after the release returned.
struct Handover {
    /// The releasing holder's fence (fenced mode).
    first: Option<u64>,
    /// The newcomer's attempt.
    newcomer: Result<LockGuard, LockError>,
    /// What the waiter got.
    waiter: LockGuard,
    /// The newcomer's locker.
    c: Locker,
    _lockers: [Locker; 2],
}

async fn handover(fx: &Fixture, fair: bool) -> Handover {
    let (a, b, c) = (fx.locker().await, fx.locker().await, fx.locker().await);
    let holder = if fair {
        a.lock(HANDOVER).await
    } else {
        a.lock(HANDOVER).fenced().await
    }
    .expect("acquire");
    let first = holder.fence();
    let waiter = tokio::spawn({
        let b = b.clone();
        async move {
            let request = b.lock(HANDOVER).wait(SOON);
            if fair {
                request.fair().await
            } else {
                request.fenced().await
            }
        }
    });
    fx.until_queued(HANDOVER, 1).await;
    holder.release().await.expect("release");
    let newcomer = c.try_lock(HANDOVER).await;
    let waiter = waiter.await.expect("join").expect("handed over");
    Handover {
        first,
        newcomer,
        waiter,
        c,
        _lockers: [a, b],
    }
}

/// When a release returns, the lock is already the queued waiter's: a newcomer finds it busy,
/// so nobody slips in between.
async fn release_lets_no_newcomer_slip_in_before_the_waiter(fx: Fixture) {
    let h = handover(&fx, false).await;
    assert!(
        matches!(h.newcomer, Err(LockError::Busy { .. })),
        "{}: the lock went to the queued waiter, not to a newcomer: {:?}",
        fx.name(),
        h.newcomer
    );
}

/// The queued waiter gets the released lock, and knows it waited for it.
async fn queued_waiter_gets_the_released_lock(fx: Fixture) {
    let h = handover(&fx, false).await;
    assert!(h.waiter.is_held());
    assert!(h.waiter.waited());
}

/// The handed-over lock carries the next fencing token (the very next one where fences count
/// up by one; Redis tokens follow the server's clock, so they rise across data loss).
async fn handed_over_lock_carries_the_next_fence(fx: Fixture) {
    let h = handover(&fx, false).await;
    let first = h.first.expect("fenced");
    if fx.consecutive_fences() {
        assert_eq!(h.waiter.fence(), Some(first + 1));
    } else {
        assert!(h.waiter.fence() > Some(first), "{:?}", h.waiter.fence());
    }
}

/// After the handover nobody queues for the key.
async fn handover_empties_the_queue(fx: Fixture) {
    handover(&fx, false).await;
    assert_eq!(fx.queued(HANDOVER).await, 0);
}

/// A lock is handed over with a lease of at most 3 s (tests/handoff.rs sees it on a waiter
/// killed before it could renew); the watchdog extends it to the 30 s default as it arrives
/// (where the probe reads it, the stored lease too).
async fn watchdog_extends_a_handed_over_lease(fx: Fixture) {
    let h = handover(&fx, false).await;
    eventually(
        &format!("{}: the handed-over lease extended", fx.name()),
        SOON,
        async || h.waiter.remaining() > Duration::from_secs(3),
    )
    .await;
    if let Some(stored) = fx.stored(HANDOVER).await {
        assert!(
            stored.remaining > Some(Duration::from_secs(3)),
            "{stored:?}"
        );
    }
    h.waiter.release().await.expect("release");
}

/// Fair mode hands over the same way: a newcomer right after the release finds the key busy.
async fn fair_release_lets_no_newcomer_slip_in_before_the_waiter(fx: Fixture) {
    let h = handover(&fx, true).await;
    assert!(
        matches!(h.newcomer, Err(LockError::Busy { .. })),
        "{}: {:?}",
        fx.name(),
        h.newcomer
    );
}

/// In fair mode the queued waiter gets the released lock.
async fn fair_waiter_gets_the_released_lock(fx: Fixture) {
    let h = handover(&fx, true).await;
    assert!(h.waiter.is_held());
    h.waiter.release().await.expect("release");
}

/// Once the waiter that was handed the lock releases it, the key is free.
async fn key_is_free_after_the_handed_over_lock_is_released(fx: Fixture) {
    let h = handover(&fx, true).await;
    h.waiter.release().await.expect("release");
    h.c.try_lock(HANDOVER)
        .await
        .expect("free after the last release")
        .release()
        .await
        .expect("release");
}

// ---------------------------------------------------------------------------------------------
// Timed-out waiters leave no trace

/// A 50 ms wait (fair or not) through `b` on `gone`, held by someone else.
async fn timed_out_wait(b: &Locker, fair: bool) -> Result<LockGuard, LockError> {
    let request = b.lock("gone").wait(Duration::from_millis(50));
    if fair {
        request.fair().await
    } else {
        request.await
    }
}

/// A waiter that times out leaves the backend's queue: before its `Timeout` returns when the
/// backend answers within the request's slack past its wait, else in the background at once
/// (the wait's bound comes first: a loaded etcd may take longer than the slack).
async fn timed_out_waiter_leaves_the_backend_queue(fx: Fixture) {
    let (a, b) = (fx.locker().await, fx.locker().await);
    let _holder = a.lock("gone").await.expect("acquire");
    let timed_out = timed_out_wait(&b, false).await;
    assert!(
        matches!(timed_out, Err(LockError::Timeout { .. })),
        "{timed_out:?}"
    );
    fx.until_queued("gone", 0).await;
}

/// In fair mode too, a waiter that times out leaves the backend's queue (as above).
async fn timed_out_fair_waiter_leaves_the_backend_queue(fx: Fixture) {
    let (a, b) = (fx.locker().await, fx.locker().await);
    let _holder = a.lock("gone").await.expect("acquire");
    let timed_out = timed_out_wait(&b, true).await;
    assert!(
        matches!(timed_out, Err(LockError::Timeout { .. })),
        "{timed_out:?}"
    );
    fx.until_queued("gone", 0).await;
}

/// The release after waiters (fair and not) timed out hands the lock to none of them: a
/// newcomer finds the key free at once.
async fn release_after_timed_out_waits_leaves_the_key_free(fx: Fixture) {
    let (a, b, c) = (fx.locker().await, fx.locker().await, fx.locker().await);
    let holder = a.lock("gone").await.expect("acquire");
    for fair in [false, true] {
        let _ = timed_out_wait(&b, fair).await;
    }
    holder.release().await.expect("release");
    c.try_lock("gone")
        .await
        .expect("free right after the release")
        .release()
        .await
        .expect("release");
}

checks!(
    bounded_wait_on_a_held_key_times_out,
    queued_waiters_each_time_out_on_their_own_bound,
    lockers_default_wait_bounds_a_plain_lock,
    timed_out_waiters_leave_the_lockers_queue,
    timed_out_waiters_leave_the_holder_alone,
    release_lets_no_newcomer_slip_in_before_the_waiter: [Handover, Fencing, Probe],
    queued_waiter_gets_the_released_lock: [Fencing, Probe],
    handed_over_lock_carries_the_next_fence: [Handover, Fencing, Probe],
    handover_empties_the_queue: [Handover, Fencing, Probe],
    watchdog_extends_a_handed_over_lease: [Handover, Fencing, Probe],
    fair_release_lets_no_newcomer_slip_in_before_the_waiter: [Handover, Fair, Probe],
    fair_waiter_gets_the_released_lock: [Fair, Probe],
    key_is_free_after_the_handed_over_lock_is_released: [Fair, Probe],
    timed_out_waiter_leaves_the_backend_queue: [Probe],
    timed_out_fair_waiter_leaves_the_backend_queue: [Fair, Probe],
    release_after_timed_out_waits_leaves_the_key_free,
);
