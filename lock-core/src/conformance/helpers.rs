//! The kit's own set-ups and reads, for a harness's checks beside the kit (what its store keeps
//! beneath the kit's properties: names, TTLs, slots): the same odd keys, the same renewed lock,
//! the same reads of an idempotency state. Each panics, naming what it expected, when the
//! backend does not do what every backend must.
//!
//! ```
//! use lock_core::Locker;
//! use lock_core::conformance::helpers::{lock_fenced, odd_keys};
//!
//! # tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(async {
//! let locker = Locker::memory();
//! for key in &odd_keys() {
//!     let (guard, fence) = lock_fenced(&locker, key).await;
//!     assert!(fence > 0);
//!     // ... read what your store keeps for `key` here ...
//!     guard.release().await.unwrap();
//! }
//! # });
//! ```

use std::time::Duration;

use crate::{IdempotencyRecord, IdempotencyState, LockError, LockGuard, Locker, MAX_KEY_LEN};

use super::fixture::{SOON, eventually};

/// Keys with braces, multi-byte characters, control bytes and a NUL, and one of exactly
/// [`MAX_KEY_LEN`] bytes: the odd keys the kit's checks lock.
///
/// ```
/// let keys = lock_core::conformance::helpers::odd_keys();
/// assert!(keys.iter().any(|k| k.len() == lock_core::MAX_KEY_LEN));
/// ```
pub fn odd_keys() -> Vec<String> {
    let mut at_limit = String::from("{x}");
    while at_limit.len() + "é".len() <= MAX_KEY_LEN {
        at_limit.push('é');
    }
    while at_limit.len() < MAX_KEY_LEN {
        at_limit.push('}');
    }
    assert_eq!(at_limit.len(), MAX_KEY_LEN);
    vec![
        "a}b{c".to_owned(),
        "{order:42}".to_owned(),
        "}{".to_owned(),
        "{}".to_owned(),
        "ключ 🔒\t\r\n\0end".to_owned(),
        "line\nbreak{".to_owned(),
        at_limit,
    ]
}

/// A fenced lock on `key` through `locker`, and its fence.
///
/// # Panics
/// When the lock is not granted, or granted without a fence.
///
/// ```
/// # tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(async {
/// let locker = lock_core::Locker::memory();
/// let (guard, fence) = lock_core::conformance::helpers::lock_fenced(&locker, "a}b{c").await;
/// assert_eq!(guard.fence(), Some(fence));
/// # });
/// ```
pub async fn lock_fenced(locker: &Locker, key: &str) -> (LockGuard, u64) {
    let guard = locker
        .lock(key)
        .fenced()
        .await
        .unwrap_or_else(|e| panic!("{key:?}: {e}"));
    let fence = guard.fence().expect("fenced");
    (guard, fence)
}

/// `holder` locks `renewed` with `lease` and the watchdog on; then `waiter` waits 2.5 leases
/// for it. What the wait returned (a `Timeout` when the watchdog kept the lock), and the
/// holder's guard.
///
/// # Panics
/// When `holder` does not get the lock.
///
/// ```
/// use std::time::Duration;
/// # tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(async {
/// let store = lock_core::MemoryBackend::new();
/// let a = lock_core::Locker::builder(store.clone()).build();
/// let b = lock_core::Locker::builder(store).build();
/// let lease = Duration::from_millis(100);
/// let (waited, guard) = lock_core::conformance::helpers::renewed(&a, &b, lease).await;
/// assert!(waited.is_err() && guard.is_held());
/// # });
/// ```
pub async fn renewed(
    holder: &Locker,
    waiter: &Locker,
    lease: Duration,
) -> (Result<LockGuard, LockError>, LockGuard) {
    let guard = holder.lock("renewed").lease(lease).await.expect("acquire");
    let waited = waiter.lock("renewed").wait(lease.mul_f64(2.5)).await;
    (waited, guard)
}

/// The idempotency state of `key`, as `locker` reads it.
///
/// # Panics
/// When the read fails.
///
/// ```
/// use lock_core::IdempotencyState;
/// # tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(async {
/// let locker = lock_core::Locker::memory();
/// let state = lock_core::conformance::helpers::state(&locker, "pay:1").await;
/// assert_eq!(state, IdempotencyState::Absent);
/// # });
/// ```
pub async fn state(locker: &Locker, key: &str) -> IdempotencyState {
    locker
        .idempotency_state(key)
        .await
        .unwrap_or_else(|e| panic!("idempotency_state({key:?}): {e}"))
}

/// The state of `key` once no server shows its lock any more (on Redlock a release answers at
/// a quorum, and the last servers' releases may still be on their way): read again until it is
/// no longer in flight, up to 10 s.
///
/// # Panics
/// When a read fails, or the key is still in flight after 10 s.
///
/// ```
/// use lock_core::IdempotencyState;
/// # tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(async {
/// let locker = lock_core::Locker::memory();
/// locker.lock("pay:1").await.unwrap().release().await.unwrap();
/// let state = lock_core::conformance::helpers::settled(&locker, "pay:1").await;
/// assert_eq!(state, IdempotencyState::Absent);
/// # });
/// ```
pub async fn settled(locker: &Locker, key: &str) -> IdempotencyState {
    eventually("the released lock is gone everywhere", SOON, async || {
        state(locker, key).await != IdempotencyState::InFlight
    })
    .await;
    state(locker, key).await
}

/// The record of a `Completed` state.
///
/// # Panics
/// On any other state.
///
/// ```
/// # tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(async {
/// use lock_core::conformance::helpers::{completed, state};
/// let locker = lock_core::Locker::memory();
/// let guard = locker.lock("pay:1").await.unwrap();
/// guard.store_result("fp", b"receipt", std::time::Duration::from_secs(60)).await.unwrap();
/// assert_eq!(completed(state(&locker, "pay:1").await).result, b"receipt");
/// # });
/// ```
#[track_caller]
pub fn completed(state: IdempotencyState) -> IdempotencyRecord {
    match state {
        IdempotencyState::Completed(record) => record,
        other => panic!("expected Completed, got {other:?}"),
    }
}

/// The fingerprint and remaining time of a `Started` state (a mark without a result).
///
/// # Panics
/// On any other state.
///
/// ```should_panic
/// lock_core::conformance::helpers::started(lock_core::IdempotencyState::Absent);
/// ```
#[track_caller]
pub fn started(state: IdempotencyState) -> (String, Duration) {
    match state {
        IdempotencyState::Started {
            fingerprint,
            expires_in,
            ..
        } => (fingerprint, expires_in),
        other => panic!("expected Started, got {other:?}"),
    }
}
