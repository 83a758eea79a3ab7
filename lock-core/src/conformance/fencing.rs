//! Fencing tokens: they strictly increase, and owner tokens never show in debug output.

use std::time::Duration;

use crate::{LockGuard, Locker, current_fence, current_lock};

use super::fixture::{Fixture, SOON, ShortLease, has_hex_run};

// ---------------------------------------------------------------------------------------------
// Fences rise

const KEY: &str = "fenced";

/// A fenced acquire and release of `key` through `locker`: the fence it drew.
async fn fence_of(locker: &Locker, key: &str) -> u64 {
    let g = locker.lock(key).fenced().await.expect("acquire");
    let fence = g.fence().expect("a fenced lock has a token");
    g.release().await.expect("release");
    fence
}

/// An unfenced acquire of [`KEY`] through `locker`.
async fn unfenced(locker: &Locker) -> LockGuard {
    locker.lock(KEY).await.expect("unfenced acquire")
}

/// A fenced lock through `a` whose `lease` runs out unrenewed, then a fenced acquire through
/// `b` waiting for it: their two fences.
async fn fences_across_expiry(a: &Locker, b: &Locker, lease: ShortLease) -> [u64; 2] {
    let expiring = a
        .lock(KEY)
        .fenced()
        .lease(lease.lease())
        .watchdog(false)
        .await
        .expect("acquire");
    let first = expiring.fence().expect("token");
    let g = b
        .lock(KEY)
        .fenced()
        .wait(lease.soon_after())
        .await
        .expect("acquire after expiry");
    let second = g.fence().expect("token");
    g.release().await.expect("release");
    [first, second]
}

/// A fenced lock through `b` dropped (released in the background), then a fenced acquire
/// through `a` waiting for it: their two fences.
async fn fences_across_background_release(a: &Locker, b: &Locker) -> [u64; 2] {
    let g = b.lock(KEY).fenced().await.expect("acquire");
    let first = g.fence().expect("token");
    drop(g);
    let g = a
        .lock(KEY)
        .fenced()
        .wait(SOON)
        .await
        .expect("acquire after drop");
    let second = g.fence().expect("token");
    g.release().await.expect("release");
    [first, second]
}

/// `current_fence()` inside a fenced `run` on [`KEY`].
async fn fence_inside_run(locker: &Locker) -> Option<u64> {
    locker
        .lock(KEY)
        .fenced()
        .run(async { current_fence() })
        .await
        .expect("run")
}

#[track_caller]
fn assert_rising(fences: &[u64]) {
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens must strictly increase: {fences:?}"
    );
}

/// The fence of a lock taken again after a release (same locker) is larger.
async fn fences_rise_across_release(fx: Fixture) {
    let a = fx.locker().await;
    assert_rising(&[fence_of(&a, KEY).await, fence_of(&a, KEY).await]);
}

/// The fence of a lock taken by another locker after a release is larger.
async fn fences_rise_across_lockers(fx: Fixture) {
    let (a, b) = (fx.locker().await, fx.locker().await);
    assert_rising(&[fence_of(&a, KEY).await, fence_of(&b, KEY).await]);
}

/// An unfenced lock has no fence.
async fn unfenced_lock_has_no_fence(fx: Fixture) {
    let g = unfenced(&fx.locker().await).await;
    assert_eq!(g.fence(), None);
    g.release().await.expect("release");
}

/// Unfenced acquisitions between two fenced ones do not disturb the rise.
async fn unfenced_acquisitions_do_not_disturb_fences(fx: Fixture) {
    let (a, b) = (fx.locker().await, fx.locker().await);
    let first = fence_of(&a, KEY).await;
    unfenced(&b).await.release().await.expect("release");
    unfenced(&a).await.release().await.expect("release");
    assert_rising(&[first, fence_of(&a, KEY).await]);
}

/// The fence of a lock taken after the previous holder's lease (150 ms, or the backend's floor)
/// ran out is larger.
async fn fences_rise_across_expiry(fx: Fixture) {
    let (a, b) = (fx.locker().await, fx.locker().await);
    let lease = fx.short_lease(Duration::from_millis(150));
    assert_rising(&fences_across_expiry(&a, &b, lease).await);
}

/// The fence of a lock taken after a dropped guard's background release is larger.
async fn fences_rise_across_background_release(fx: Fixture) {
    let (a, b) = (fx.locker().await, fx.locker().await);
    assert_rising(&fences_across_background_release(&a, &b).await);
}

/// Inside a fenced `run`, `current_fence()` is the run's fence, larger than the one before.
async fn current_fence_inside_run_is_the_next_fence(fx: Fixture) {
    let a = fx.locker().await;
    let before = fence_of(&a, KEY).await;
    let inside = fence_inside_run(&a)
        .await
        .expect("current_fence inside a fenced run");
    assert_rising(&[before, inside]);
}

/// Each key counts its own fences: a fresh key after a history of another starts its own
/// counter (at 1 where fences count up by one; where the probe reads the store's counter, a
/// counter of its own holding that fence).
async fn each_key_has_its_own_fence_counter(fx: Fixture) {
    let a = fx.locker().await;
    fence_of(&a, KEY).await;
    fence_of(&a, KEY).await;
    let other = a.lock("fenced-other").fenced().await.expect("acquire");
    assert!(other.fence().is_some(), "a fenced lock has a fence");
    if fx.consecutive_fences() {
        assert_eq!(other.fence(), Some(1), "each key has its own counter");
    }
    if let Some(counter) = fx.fence_counter("fenced-other").await {
        assert_eq!(other.fence(), Some(counter), "each key has its own counter");
    }
    other.release().await.expect("release");
}

// ---------------------------------------------------------------------------------------------
// Tokens stay secret

/// Asserts that none of `texts` shows a token-like value, nor any of `tokens`.
#[track_caller]
fn assert_no_token(texts: &[String], tokens: &[&Option<String>]) {
    for text in texts {
        assert!(!has_hex_run(text, 32), "a token-like value leaked: {text}");
        for t in tokens.iter().copied().flatten() {
            assert!(!text.contains(t.as_str()), "the token leaked: {text}");
        }
    }
}

/// A fenced lock on `key` through `locker`, and its token as stored (when the probe reads it,
/// the token detector is checked on it).
async fn secret(fx: &Fixture, locker: &Locker, key: &str) -> (LockGuard, Option<String>) {
    let guard = locker.lock(key).fenced().await.expect("acquire");
    let token = fx.stored(key).await.and_then(|s| s.token);
    if let Some(t) = &token {
        assert!(has_hex_run(t, 32), "the detector recognises a real token");
    }
    (guard, token)
}

/// A lock through `locker` whose lease (50 ms, or the backend's floor) ran out unrenewed: the
/// guard, its token as stored (when the probe reads it) and its `Debug` taken while it held.
async fn stale_secret(fx: &Fixture, locker: &Locker) -> (LockGuard, Option<String>, String) {
    let lease = fx.short_lease(Duration::from_millis(50));
    let stale = locker
        .lock("secret-stale")
        .lease(lease.lease())
        .watchdog(false)
        .await
        .expect("acquire");
    let token = fx.stored("secret-stale").await.and_then(|s| s.token);
    let debug = format!("{stale:?}");
    lease.soon("stale lost", stale.lost()).await;
    (stale, token, debug)
}

/// Owner tokens never show in the `Debug` of guards (held or lost) and lock infos, nor of
/// `current_lock()` inside `run`.
async fn guards_and_lock_infos_never_show_the_token(fx: Fixture) {
    let a = fx.locker().await;
    let (guard, token) = secret(&fx, &a, "secret").await;
    let (_stale, stale_token, stale_debug) = stale_secret(&fx, &a).await;
    let inside = a
        .lock("secret-run")
        .run(async {
            format!(
                "{:?} {:?}",
                current_lock(),
                current_lock().map(|i| i.key().to_owned())
            )
        })
        .await
        .expect("run");
    let texts = [
        format!("{guard:?}"),
        format!("{guard:#?}"),
        format!("{:?}", guard.info()),
        stale_debug,
        inside,
    ];
    assert_no_token(&texts, &[&token, &stale_token]);
    guard.release().await.expect("release");
}

/// Owner tokens never show in the `Debug` of lockers and backends holding a lock.
async fn lockers_and_backends_never_show_the_token(fx: Fixture) {
    let a = fx.locker().await;
    let (guard, token) = secret(&fx, &a, "secret").await;
    let texts = [format!("{a:?}"), format!("{:#?}", a.backend())];
    assert_no_token(&texts, &[&token]);
    guard.release().await.expect("release");
}

/// Owner tokens never show in the `Debug` or `Display` of errors: `Busy`, `Timeout` and a
/// stale guard's `LeaseLost`.
async fn errors_never_show_the_token(fx: Fixture) {
    let (a, b) = (fx.locker().await, fx.locker().await);
    let (guard, token) = secret(&fx, &a, "secret").await;
    let busy = b.try_lock("secret").await.expect_err("busy");
    let timeout = b
        .lock("secret")
        .wait(Duration::from_millis(50))
        .await
        .expect_err("timeout");
    let (stale, stale_token, _) = stale_secret(&fx, &a).await;
    let lost = stale.release().await.expect_err("stale release");
    let texts = [
        format!("{busy:?} {busy}"),
        format!("{timeout:?} {timeout}"),
        format!("{lost:?} {lost}"),
    ];
    assert_no_token(&texts, &[&token, &stale_token]);
    guard.release().await.expect("release");
}

checks!(
    fences_rise_across_release: [Fencing],
    fences_rise_across_lockers: [Fencing],
    unfenced_lock_has_no_fence: [Fencing],
    unfenced_acquisitions_do_not_disturb_fences: [Fencing],
    fences_rise_across_expiry: [Fencing, ShortLease],
    fences_rise_across_background_release: [Fencing],
    current_fence_inside_run_is_the_next_fence: [Fencing],
    each_key_has_its_own_fence_counter: [Fencing],
    guards_and_lock_infos_never_show_the_token: [Fencing, ShortLease],
    lockers_and_backends_never_show_the_token: [Fencing],
    errors_never_show_the_token: [Fencing, ShortLease],
);
