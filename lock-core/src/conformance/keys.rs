//! Keys and options: invalid ones are refused with a typed error, odd ones work.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::{
    LockError, LockGuard, Locker, LockerBuilder, MAX_KEY_LEN, MAX_LEASE, MAX_PREFIX_LEN, MAX_WAIT,
    MIN_LEASE,
};

use super::fixture::{Fixture, assert_busy, assert_invalid_config, assert_invalid_key};
use super::helpers::{lock_fenced, odd_keys};

// ---------------------------------------------------------------------------------------------
// Invalid keys and options are refused

/// A key one byte over [`MAX_KEY_LEN`].
fn over_long_key() -> String {
    "k".repeat(MAX_KEY_LEN + 1)
}

/// A key of fewer than [`MAX_KEY_LEN`] characters but more bytes.
fn over_long_in_bytes() -> String {
    "é".repeat(MAX_KEY_LEN / 2 + 1)
}

/// Leases out of range, each with what is wrong with it.
fn bad_leases() -> [(&'static str, Duration); 4] {
    let ms = Duration::from_millis;
    [
        ("zero lease", Duration::ZERO),
        ("lease below MIN_LEASE", MIN_LEASE - ms(1)),
        ("lease above MAX_LEASE", MAX_LEASE + ms(1)),
        ("Duration::MAX lease", Duration::MAX),
    ]
}

/// Waits out of range, each with what is wrong with it.
fn bad_waits() -> [(&'static str, Duration); 2] {
    [
        ("wait above MAX_WAIT", MAX_WAIT + Duration::from_millis(1)),
        ("Duration::MAX wait", Duration::MAX),
    ]
}

type Configure = fn(LockerBuilder) -> LockerBuilder;

/// Locker options out of range, each with what is wrong with it.
fn bad_builders() -> [(&'static str, Configure); 6] {
    [
        ("zero lease", |b| b.lease(Duration::ZERO)),
        ("absurd lease", |b| b.lease(Duration::MAX)),
        ("absurd wait", |b| b.wait(Duration::MAX)),
        ("prefix with {", |b| b.prefix("shop{1}:")),
        ("prefix with }", |b| b.prefix("shop}")),
        ("prefix too long", |b| {
            b.prefix("p".repeat(MAX_PREFIX_LEN + 1))
        }),
    ]
}

/// An empty key through `lock`, `try_lock` and `run`.
async fn empty_key_attempts(locker: &Locker) -> [Result<(), LockError>; 3] {
    [
        locker.lock("").await.map(drop),
        locker.try_lock("").await.map(drop),
        locker.lock("").run(async {}).await,
    ]
}

/// A locker built with `configure`: its `try_build`, and a `lock` and a `run` through its
/// `build`.
async fn configured_attempts(fx: &Fixture, configure: Configure) -> [Result<(), LockError>; 3] {
    let built = configure(fx.builder().await).build();
    [
        configure(fx.builder().await).try_build().map(drop),
        built.lock("k").await.map(drop),
        built.try_lock("k").run(async {}).await,
    ]
}

/// A lock on `extend`, and its extensions by a zero and an absurd lease.
async fn bad_extends(locker: &Locker) -> (LockGuard, [Result<(), LockError>; 2]) {
    let guard = locker.lock("extend").await.expect("acquire");
    let zero = guard.extend(Duration::ZERO).await;
    let absurd = guard.extend(Duration::MAX).await;
    (guard, [zero, absurd])
}

/// An empty key is `InvalidKey` for `lock`, `try_lock` and `run`.
async fn empty_key_is_invalid_key(fx: Fixture) {
    for r in empty_key_attempts(&fx.locker().await).await {
        assert_invalid_key(r);
    }
}

/// A `run` refused for its key never runs its body.
async fn run_with_an_invalid_key_never_runs_its_body(fx: Fixture) {
    let ran = AtomicUsize::new(0);
    let r = fx
        .locker()
        .await
        .lock("")
        .run(async {
            ran.fetch_add(1, Ordering::SeqCst);
        })
        .await;
    assert_invalid_key(r);
    assert_eq!(ran.load(Ordering::SeqCst), 0);
}

/// A key over [`MAX_KEY_LEN`] bytes is `InvalidKey`, and the reason names the limit.
async fn over_long_key_is_invalid_key_naming_the_limit(fx: Fixture) {
    match fx.locker().await.lock(over_long_key()).await {
        Err(LockError::InvalidKey { reason, .. }) => {
            assert!(reason.contains(&MAX_KEY_LEN.to_string()), "{reason}");
        }
        other => panic!("expected InvalidKey, got {other:?}"),
    }
}

/// The `InvalidKey` of an over-long key carries a shortened key.
async fn invalid_key_error_shortens_a_long_key(fx: Fixture) {
    let long = over_long_key();
    match fx.locker().await.lock(&long).await {
        Err(LockError::InvalidKey { key, .. }) => {
            assert!(key.len() < long.len(), "the error shortens a long key");
        }
        other => panic!("expected InvalidKey, got {other:?}"),
    }
}

/// The key length limit counts bytes, not characters.
async fn key_limit_counts_bytes_not_chars(fx: Fixture) {
    assert_invalid_key(fx.locker().await.lock(over_long_in_bytes()).await);
}

/// A key of exactly [`MAX_KEY_LEN`] bytes is fine.
async fn key_of_exactly_max_key_len_bytes_locks(fx: Fixture) {
    fx.locker()
        .await
        .lock("k".repeat(MAX_KEY_LEN))
        .await
        .expect("a key of exactly MAX_KEY_LEN bytes is fine")
        .release()
        .await
        .expect("release");
}

/// A zero, too short or absurd lease on a request is `InvalidConfig`.
async fn out_of_range_leases_are_invalid_config(fx: Fixture) {
    let locker = fx.locker().await;
    for (what, lease) in bad_leases() {
        assert_invalid_config(locker.lock("k").lease(lease).await, what);
    }
}

/// An absurd wait on a request is `InvalidConfig`.
async fn out_of_range_waits_are_invalid_config(fx: Fixture) {
    let locker = fx.locker().await;
    for (what, wait) in bad_waits() {
        assert_invalid_config(locker.lock("k").wait(wait).await, what);
    }
}

/// A zero `max_hold` on a request is `InvalidConfig`.
async fn zero_max_hold_is_invalid_config(fx: Fixture) {
    let r = fx.locker().await.lock("k").max_hold(Duration::ZERO).await;
    assert_invalid_config(r, "zero max_hold");
}

/// A locker with a zero or absurd lease, an absurd wait, or a prefix with a brace or too long:
/// `try_build` says `InvalidConfig`.
async fn invalid_locker_options_fail_try_build(fx: Fixture) {
    for (what, configure) in bad_builders() {
        let [try_build, _, _] = configured_attempts(&fx, configure).await;
        assert_invalid_config(try_build, what);
    }
}

/// A locker built (with `build`) from the same invalid options reports `InvalidConfig` on every
/// attempt, `lock` and `run` alike.
async fn locker_built_from_invalid_options_refuses_every_attempt(fx: Fixture) {
    for (what, configure) in bad_builders() {
        let [_, lock, run] = configured_attempts(&fx, configure).await;
        assert_invalid_config(lock, what);
        assert_invalid_config(run, what);
    }
}

/// Extending with a zero or absurd lease is `InvalidConfig`.
async fn extend_with_an_invalid_lease_is_invalid_config(fx: Fixture) {
    let (guard, [zero, absurd]) = bad_extends(&fx.locker().await).await;
    assert_invalid_config(zero, "extend zero");
    assert_invalid_config(absurd, "extend absurd");
    guard.release().await.expect("release");
}

/// A refused extension leaves the lock held.
async fn invalid_extend_leaves_the_lock_held(fx: Fixture) {
    let (guard, _) = bad_extends(&fx.locker().await).await;
    assert!(guard.is_held());
    guard.release().await.expect("release");
}

/// Nothing refused above writes to the backend (nor do the lock of a key of exactly
/// [`MAX_KEY_LEN`] bytes and the lock refused an extension, once released): nothing panics
/// and the backend is empty afterwards.
async fn rejected_requests_leave_the_backend_empty(fx: Fixture) {
    let locker = fx.locker().await;
    let _ = empty_key_attempts(&locker).await;
    let _ = locker.lock(over_long_key()).await;
    let _ = locker.lock(over_long_in_bytes()).await;
    locker
        .lock("k".repeat(MAX_KEY_LEN))
        .await
        .expect("a key of exactly MAX_KEY_LEN bytes is fine")
        .release()
        .await
        .expect("release");
    for (_, lease) in bad_leases() {
        let _ = locker.lock("k").lease(lease).await;
    }
    for (_, wait) in bad_waits() {
        let _ = locker.lock("k").wait(wait).await;
    }
    let _ = locker.lock("k").max_hold(Duration::ZERO).await;
    for (_, configure) in bad_builders() {
        let _ = configured_attempts(&fx, configure).await;
    }
    let (guard, _) = bad_extends(&locker).await;
    guard.release().await.expect("release");
    fx.assert_empty("rejected requests must not write to the backend")
        .await;
}

// ---------------------------------------------------------------------------------------------
// Odd keys work

/// Every odd key locks, and its guard names it.
async fn odd_keys_lock(fx: Fixture) {
    let a = fx.locker().await;
    for key in &odd_keys() {
        let (guard, _) = lock_fenced(&a, key).await;
        assert_eq!(guard.key(), key);
        guard.release().await.expect("release");
    }
}

/// Every odd key excludes: another locker is refused while it is held.
async fn odd_keys_exclude(fx: Fixture) {
    let (a, b) = (fx.locker().await, fx.locker().await);
    for key in &odd_keys() {
        let (guard, _) = lock_fenced(&a, key).await;
        assert_busy(b.try_lock(key).await, key);
        guard.release().await.expect("release");
    }
}

/// Every odd key releases: another locker gets it right after.
async fn odd_keys_are_free_after_release(fx: Fixture) {
    let (a, b) = (fx.locker().await, fx.locker().await);
    for key in &odd_keys() {
        let (guard, _) = lock_fenced(&a, key).await;
        guard.release().await.expect("release");
        let again = b.try_lock(key).await.expect("free after release");
        again.release().await.expect("release");
    }
}

/// Every odd key starts a fence counter of its own (at 1 where fences count up by one; where
/// the probe reads the store's counter, one holding that fence).
async fn odd_keys_start_their_own_fence_counter(fx: Fixture) {
    let a = fx.locker().await;
    for key in &odd_keys() {
        let (guard, first) = lock_fenced(&a, key).await;
        if fx.consecutive_fences() {
            assert_eq!(first, 1, "{key:?}");
        }
        if let Some(counter) = fx.fence_counter(key).await {
            assert_eq!(counter, first, "{key:?}");
        }
        guard.release().await.expect("release");
    }
}

/// Keys differing only in braces or suffixes do not collide: these are all different locks,
/// held at once.
async fn keys_differing_in_braces_or_suffixes_do_not_collide(fx: Fixture) {
    let b = fx.locker().await;
    let distinct = ["a", "{a}", "a}", "a:fence", "{a}:fence", "#0", "{#0}"];
    let mut held = Vec::new();
    for key in distinct {
        held.push(
            b.try_lock(key)
                .await
                .unwrap_or_else(|e| panic!("{key:?}: {e}")),
        );
    }
    for g in held {
        g.release().await.expect("release");
    }
}

/// Released odd keys leave no lock behind: only their fence counters remain (as the probe
/// reads the store).
async fn released_odd_keys_leave_only_their_fence_counters(fx: Fixture) {
    let a = fx.locker().await;
    let keys = odd_keys();
    for key in &keys {
        let (guard, _) = lock_fenced(&a, key).await;
        guard.release().await.expect("release");
    }
    fx.assert_empty("a lock was left behind").await;
    for key in &keys {
        if let Some(counter) = fx.fence_counter(key).await {
            assert!(counter > 0, "{key:?}: the fence counter outlives the lock");
        }
    }
}

checks!(
    empty_key_is_invalid_key,
    run_with_an_invalid_key_never_runs_its_body,
    over_long_key_is_invalid_key_naming_the_limit,
    invalid_key_error_shortens_a_long_key,
    key_limit_counts_bytes_not_chars,
    key_of_exactly_max_key_len_bytes_locks,
    out_of_range_leases_are_invalid_config,
    out_of_range_waits_are_invalid_config,
    zero_max_hold_is_invalid_config,
    invalid_locker_options_fail_try_build,
    locker_built_from_invalid_options_refuses_every_attempt,
    extend_with_an_invalid_lease_is_invalid_config,
    invalid_extend_leaves_the_lock_held,
    rejected_requests_leave_the_backend_empty,
    odd_keys_lock: [Fencing],
    odd_keys_exclude: [Fencing],
    odd_keys_are_free_after_release: [Fencing],
    odd_keys_start_their_own_fence_counter: [Fencing],
    keys_differing_in_braces_or_suffixes_do_not_collide,
    released_odd_keys_leave_only_their_fence_counters: [Fencing],
);
