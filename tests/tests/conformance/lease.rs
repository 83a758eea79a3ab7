//! Leases: a lock whose lease runs out is free, the watchdog keeps a short lease alive, and
//! `max_hold` bounds a hold (from when a handed-over lock arrives).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lock_core::LockError;

use crate::fixture::{Fixture, SOON, assert_invalid_config, soon};

/// Without renewal a lock lasts one lease: then the key is free for others (not before), the
/// old guard reports the loss, and its release is `LeaseLost`.
async fn lease_expiry_frees_the_key(fx: Fixture) {
    let a = fx.locker().await;
    let b = fx.locker().await;
    let lease = Duration::from_millis(200);
    let t0 = Instant::now();
    let first = a
        .lock("expiring")
        .lease(lease)
        .watchdog(false)
        .await
        .expect("acquire");
    assert_eq!(a.stats().renewed_locks, 0, "watchdog(false) renews nothing");
    let first_token = fx.stored("expiring").await.and_then(|s| s.token);
    let second = b
        .lock("expiring")
        .wait(SOON)
        .await
        .expect("an expired lease frees the key");
    // Correctness bound, not speed: the key was not free before the lease ran out (10 ms of
    // slack for the millisecond clocks of the backends).
    assert!(
        t0.elapsed() + Duration::from_millis(10) >= lease,
        "freed after {:?}, before the {lease:?} lease ran out",
        t0.elapsed()
    );
    assert!(!first.is_held());
    assert_eq!(first.remaining(), Duration::ZERO);
    soon("lost() after expiry", first.lost()).await;
    if let Some(now) = fx.stored("expiring").await {
        assert!(first_token.is_some());
        assert_ne!(
            now.token, first_token,
            "the key now holds the second owner's token"
        );
        assert!(now.pttl > 0);
    }
    assert!(matches!(
        first.release().await,
        Err(LockError::LeaseLost { .. })
    ));
    assert!(second.is_held());
    second.release().await.expect("release");
}

/// With the watchdog on, a short lease is renewed and the lock outlives it many times over.
async fn watchdog_keeps_a_short_lease_alive(fx: Fixture) {
    let a = fx.locker().await;
    let b = fx.locker().await;
    let lease = Duration::from_millis(600);
    let guard = a.lock("renewed").lease(lease).await.expect("acquire");
    let wait = Duration::from_millis(1_500);
    match b.lock("renewed").wait(wait).await {
        Err(LockError::Timeout { .. }) => {}
        other => panic!("a renewed lock must stay held past 2.5 leases, got {other:?}"),
    }
    assert!(guard.is_held());
    let stats = a.stats();
    assert_eq!(stats.renewed_locks, 1);
    assert!(stats.renewal_calls >= 2, "{stats:?}");
    if let Some(s) = fx.stored("renewed").await {
        assert!(s.pttl > 0 && s.pttl <= 600, "{s:?}");
    }
    guard.release().await.expect("release");
    assert_eq!(a.stats().renewed_locks, 0);
}

/// An absurd `max_hold` is a configuration error like an absurd lease: no panic, and no lock
/// left behind in the backend.
async fn absurd_max_hold_is_rejected(fx: Fixture) {
    let locker = fx.locker().await;
    let attempt = locker.clone();
    let outcome =
        tokio::spawn(async move { attempt.lock("k").max_hold(Duration::MAX).await.map(drop) })
            .await;
    match outcome {
        Ok(r) => assert_invalid_config(r, "Duration::MAX max_hold"),
        Err(e) => panic!("max_hold(Duration::MAX) panicked: {e}"),
    }
    let run = locker.clone();
    let outcome =
        tokio::spawn(async move { run.lock("k").max_hold(Duration::MAX).run(async {}).await })
            .await;
    match outcome {
        Ok(r) => assert_invalid_config(r, "Duration::MAX max_hold in run"),
        Err(e) => panic!("run with max_hold(Duration::MAX) panicked: {e}"),
    }
    assert!(
        fx.is_empty().await,
        "a refused request must not leave a lock behind"
    );
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

conformance!(
    lease_expiry_frees_the_key,
    watchdog_keeps_a_short_lease_alive,
    absurd_max_hold_is_rejected,
    max_hold_of_a_handed_over_lock_starts_when_it_arrives,
);
