//! Leases: a lock whose lease runs out is free, the watchdog keeps a short lease alive, and
//! `max_hold` bounds a hold (from when a handed-over lock arrives).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::{LockError, LockGuard, Locker};

use super::fixture::{EXPIRING_LEASE, Fixture, SOON, assert_invalid_config, eventually};
use super::helpers;

/// `watchdog(false)` renews nothing.
async fn watchdog_off_renews_nothing(fx: Fixture) {
    let a = fx.locker().await;
    let _guard = a
        .lock("expiring")
        .lease(fx.short_lease(EXPIRING_LEASE).lease())
        .watchdog(false)
        .await
        .expect("acquire");
    assert_eq!(a.stats().renewed_locks, 0, "watchdog(false) renews nothing");
}

/// Without renewal a lock lasts one lease: then another locker waiting for the key gets it.
async fn expired_lease_frees_the_key(fx: Fixture) {
    let expired = fx.expire_and_retake("expiring").await;
    assert!(expired.fresh.is_held());
    expired.fresh.release().await.expect("release");
}

/// The key is not free before the lease ran out (a correctness bound, not speed: 10 ms of
/// slack for the millisecond clocks of the backends).
async fn expiring_key_is_not_free_before_the_lease_runs_out(fx: Fixture) {
    let expired = fx.expire_and_retake("expiring").await;
    let lease = expired.lease.lease();
    assert!(
        expired.freed_after + Duration::from_millis(10) >= lease,
        "freed after {:?}, before the {lease:?} lease ran out",
        expired.freed_after
    );
}

/// Once the lease ran out, the old guard no longer holds and has no time left.
async fn expired_guard_is_no_longer_held(fx: Fixture) {
    let expired = fx.expire_and_retake("expiring").await;
    assert!(!expired.stale.is_held());
    assert_eq!(expired.stale.remaining(), Duration::ZERO);
}

/// Once the lease ran out, the old guard's `lost()` resolves.
async fn expired_guard_reports_the_loss(fx: Fixture) {
    let expired = fx.expire_and_retake("expiring").await;
    expired
        .lease
        .soon("lost() after expiry", expired.stale.lost())
        .await;
}

/// The lease of the renewal checks (or the backend's floor).
const RENEWED_LEASE: Duration = Duration::from_millis(600);

/// With the watchdog on (a lease of [`RENEWED_LEASE`], or the backend's floor), what a second
/// locker's wait of 2.5 leases for the key returned, the first locker and its guard.
async fn renewed(fx: &Fixture) -> (Result<LockGuard, LockError>, Locker, LockGuard) {
    let (a, b) = (fx.locker().await, fx.locker().await);
    let lease = fx.short_lease(RENEWED_LEASE).lease();
    let (waited, guard) = helpers::renewed(&a, &b, lease).await;
    (waited, a, guard)
}

/// With the watchdog on, a short lease is renewed and the lock outlives it many times over: a
/// wait of 2.5 leases times out and the guard still holds.
async fn watchdog_keeps_a_short_lease_alive(fx: Fixture) {
    let (waited, _a, guard) = renewed(&fx).await;
    match waited {
        Err(LockError::Timeout { .. }) => {}
        other => panic!("a renewed lock must stay held past 2.5 leases, got {other:?}"),
    }
    assert!(guard.is_held());
    guard.release().await.expect("release");
}

/// The watchdog renews the lock again and again: one renewed lock, at least two renewals in
/// 2.5 leases.
async fn watchdog_renews_repeatedly(fx: Fixture) {
    let (_, a, guard) = renewed(&fx).await;
    let stats = a.stats();
    assert_eq!(stats.renewed_locks, 1);
    assert!(stats.renewal_calls >= 2, "{stats:?}");
    guard.release().await.expect("release");
}

/// A released lock is no longer renewed: once the watchdog has renewed it, its release takes
/// it off the renewals.
async fn released_lock_is_no_longer_renewed(fx: Fixture) {
    let a = fx.locker().await;
    let lease = fx.short_lease(RENEWED_LEASE);
    let guard = a
        .lock("renewed")
        .lease(lease.lease())
        .await
        .expect("acquire");
    eventually("a renewal", lease.soon_after(), async || {
        a.stats().renewal_calls >= 1
    })
    .await;
    assert_eq!(a.stats().renewed_locks, 1);
    guard.release().await.expect("release");
    assert_eq!(a.stats().renewed_locks, 0);
}

/// An absurd `max_hold`: a plain request and a `run`, each in a task of its own (so a panic
/// shows as a `JoinError`).
async fn absurd_max_hold_attempts(
    fx: &Fixture,
) -> [Result<Result<(), LockError>, tokio::task::JoinError>; 2] {
    let locker = fx.locker().await;
    let attempt = locker.clone();
    let plain =
        tokio::spawn(async move { attempt.lock("k").max_hold(Duration::MAX).await.map(drop) })
            .await;
    let run =
        tokio::spawn(async move { locker.lock("k").max_hold(Duration::MAX).run(async {}).await })
            .await;
    [plain, run]
}

/// An absurd `max_hold` is a configuration error like an absurd lease, not a panic.
async fn absurd_max_hold_is_invalid_config(fx: Fixture) {
    let [plain, _] = absurd_max_hold_attempts(&fx).await;
    match plain {
        Ok(r) => assert_invalid_config(r, "Duration::MAX max_hold"),
        Err(e) => panic!("max_hold(Duration::MAX) panicked: {e}"),
    }
}

/// In `run` too, an absurd `max_hold` is a configuration error, not a panic.
async fn absurd_max_hold_in_run_is_invalid_config(fx: Fixture) {
    let [_, run] = absurd_max_hold_attempts(&fx).await;
    match run {
        Ok(r) => assert_invalid_config(r, "Duration::MAX max_hold in run"),
        Err(e) => panic!("run with max_hold(Duration::MAX) panicked: {e}"),
    }
}

/// A request refused for an absurd `max_hold` leaves no lock behind in the backend.
async fn absurd_max_hold_leaves_nothing_behind(fx: Fixture) {
    let _ = absurd_max_hold_attempts(&fx).await;
    fx.assert_empty("a refused request must not leave a lock behind")
        .await;
    let newcomer = fx.locker().await;
    newcomer
        .try_lock("k")
        .await
        .expect("a refused request must not leave a lock behind")
        .release()
        .await
        .expect("release");
}

/// A lock handed over by a release counts `max_hold` from when it arrived, not from the
/// waiter's earlier attempt that the handover names (its lease, though, counts from there).
async fn max_hold_of_a_handed_over_lock_starts_when_it_arrives(fx: Fixture) {
    let (a, b) = (fx.locker().await, fx.locker().await);
    let holder = a.lock("capped").await.expect("acquire");
    let ran = Arc::new(AtomicUsize::new(0));
    let waiter = tokio::spawn({
        let ran = ran.clone();
        async move {
            b.lock("capped")
                .wait(SOON)
                .max_hold(Duration::from_millis(200))
                .run(async move {
                    ran.fetch_add(1, Ordering::SeqCst);
                })
                .await
        }
    });
    fx.until_queued("capped", 1).await;
    // The holder keeps the lock for longer than the waiter's max_hold (but less than the
    // waiter's ticket refresh interval, so the handover names the queuing attempt).
    tokio::time::sleep(Duration::from_millis(400)).await;
    holder.release().await.expect("release");
    waiter
        .await
        .expect("join")
        .expect("the body runs under the handed-over lock");
    assert_eq!(ran.load(Ordering::SeqCst), 1, "{}", fx.name());
}

checks!(
    watchdog_off_renews_nothing: [ShortLease],
    expired_lease_frees_the_key: [ShortLease],
    expiring_key_is_not_free_before_the_lease_runs_out: [ShortLease],
    expired_guard_is_no_longer_held: [ShortLease],
    expired_guard_reports_the_loss: [ShortLease],
    watchdog_keeps_a_short_lease_alive: [ShortLease],
    watchdog_renews_repeatedly: [ShortLease],
    released_lock_is_no_longer_renewed: [ShortLease],
    absurd_max_hold_is_invalid_config,
    absurd_max_hold_in_run_is_invalid_config,
    absurd_max_hold_leaves_nothing_behind,
    max_hold_of_a_handed_over_lock_starts_when_it_arrives: [Probe],
);
