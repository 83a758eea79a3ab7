//! Waiting: a bounded wait ends in `Timeout`, a release hands the lock to the queued waiter,
//! and a waiter that timed out leaves nothing behind.

use std::future::Future;
use std::time::{Duration, Instant};

use lock_core::LockError;

use crate::fixture::{Fixture, SOON};

/// A bounded wait on a held key ends in `Timeout`, not before the wait elapsed and within a
/// generous bound after it; also for a second waiter queued behind the first, and for the
/// locker's default wait. The holder is unaffected and the wait queue is empty afterwards.
async fn bounded_wait_returns_timeout(fx: Fixture) {
    let a = fx.locker().await;
    let b = fx.builder().await.wait(Duration::from_millis(250)).build();
    let holder = a
        .lock("waited")
        .lease(Duration::from_secs(30))
        .await
        .expect("acquire");

    async fn timed(
        r: impl Future<Output = Result<lock_core::LockGuard, LockError>>,
        wait: Duration,
    ) {
        let start = Instant::now();
        let result = r.await;
        let elapsed = start.elapsed();
        match result {
            Err(LockError::Timeout { key, waited, .. }) => {
                assert_eq!(key, "waited");
                assert!(waited >= wait, "reported {waited:?} for a {wait:?} wait");
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

    let first = Duration::from_millis(300);
    let second = Duration::from_millis(500);
    tokio::join!(
        timed(b.lock("waited").wait(first).into_future(), first),
        timed(b.lock("waited").wait(second).into_future(), second),
    );
    // The locker's default wait (250 ms) bounds a plain `lock`.
    timed(b.lock("waited").into_future(), Duration::from_millis(250)).await;
    assert_eq!(b.stats().waiters, 0, "timed-out waiters leave the queue");
    assert!(holder.is_held());
    holder.release().await.expect("release");
}

/// A release hands the lock straight to the waiter queued for it: when the release returns,
/// the lock is already the waiter's (a newcomer finds it busy, so nobody slips in between), with
/// the next fencing token; the handed-over lease is short and the watchdog takes it to the full
/// lease; a waiter that gives up after a handover passes the lock on.
async fn release_hands_the_lock_to_the_queued_waiter(fx: Fixture) {
    let (a, b, c) = (fx.locker().await, fx.locker().await, fx.locker().await);
    let holder = a.lock("handover").fenced().await.expect("acquire");
    let first = holder.fence().expect("fenced");
    let waiter = tokio::spawn({
        let b = b.clone();
        async move { b.lock("handover").fenced().wait(SOON).await }
    });
    fx.until_queued("handover", 1).await;
    holder.release().await.expect("release");
    let newcomer = c.try_lock("handover").await;
    assert!(
        matches!(newcomer, Err(LockError::Busy { .. })),
        "{}: the lock went to the queued waiter, not to a newcomer: {newcomer:?}",
        fx.name()
    );
    let guard = waiter.await.expect("join").expect("handed over");
    assert!(guard.is_held());
    assert!(guard.waited());
    match &fx {
        Fixture::Memory(_) => assert_eq!(guard.fence(), Some(first + 1)),
        // Redis tokens follow the server's clock (so they rise across data loss): above.
        Fixture::Redis(_) => assert!(guard.fence() > Some(first), "{:?}", guard.fence()),
    }
    assert_eq!(fx.queued("handover").await, 0);
    // Handed over with a lease of at most 3 s (tests/handoff.rs sees it on a waiter killed
    // before it could renew); the watchdog extends it to the 30 s default as it arrives.
    let deadline = Instant::now() + SOON;
    while guard.remaining() <= Duration::from_secs(3) {
        assert!(Instant::now() < deadline, "{}: never extended", fx.name());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if let Some(stored) = fx.stored("handover").await {
        assert!(stored.pttl > 3_000, "{stored:?}");
    }
    guard.release().await.expect("release");

    // Fair mode hands over the same way.
    let holder = a.lock("handover").await.expect("acquire");
    let waiter = tokio::spawn({
        let b = b.clone();
        async move { b.lock("handover").fair().wait(SOON).await }
    });
    fx.until_queued("handover", 1).await;
    holder.release().await.expect("release");
    assert!(matches!(
        c.try_lock("handover").await,
        Err(LockError::Busy { .. })
    ));
    waiter
        .await
        .expect("join")
        .expect("handed over in fair mode")
        .release()
        .await
        .expect("release");
    c.try_lock("handover")
        .await
        .expect("free after the last release")
        .release()
        .await
        .expect("release");
}

/// A waiter that times out has left the backend's queue by the time its `Timeout` returns: the
/// next release does not hand the lock to it, and a newcomer finds the key free at once.
async fn timed_out_waiter_leaves_no_trace(fx: Fixture) {
    let (a, b, c) = (fx.locker().await, fx.locker().await, fx.locker().await);
    let holder = a.lock("gone").await.expect("acquire");
    for fair in [false, true] {
        let mut request = b.lock("gone").wait(Duration::from_millis(50));
        if fair {
            request = request.fair();
        }
        let timed_out = request.await;
        assert!(
            matches!(timed_out, Err(LockError::Timeout { .. })),
            "{timed_out:?}"
        );
        assert_eq!(fx.queued("gone").await, 0, "{} fair={fair}", fx.name());
    }
    holder.release().await.expect("release");
    c.try_lock("gone")
        .await
        .expect("free right after the release")
        .release()
        .await
        .expect("release");
}

conformance!(
    bounded_wait_returns_timeout,
    release_hands_the_lock_to_the_queued_waiter,
    timed_out_waiter_leaves_no_trace,
);
