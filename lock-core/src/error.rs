//! The one error type of the crate.

use std::error::Error as StdError;
use std::sync::Arc;
use std::time::Duration;

/// A boxed, shareable source error (transport or server failure).
pub type BoxError = Arc<dyn StdError + Send + Sync + 'static>;

/// Everything that can go wrong when taking, holding or releasing a lock.
///
/// Every variant says which key it is about, where there is one ([`key`](Self::key)). Its
/// `Display` is one short sentence; what to do about each error is in the variant's docs.
/// The enum and each variant are `#[non_exhaustive]`: match the variants you handle with
/// `{ .. }` patterns and keep a fallback arm; errors come from the crate's operations.
///
/// ```
/// # async fn demo() {
/// use lock_core::{LockError, Locker};
///
/// let locker = Locker::memory();
/// let _held = locker.lock("order:42").await.unwrap();
/// match locker.try_lock("order:42").await {
///     Err(LockError::Busy { retry_after, .. }) => {
///         // Someone else holds it; `retry_after` hints when its lease ends.
///         assert!(retry_after.is_some());
///     }
///     other => panic!("expected Busy, got {other:?}"),
/// }
/// # }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
/// ```
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The lock is held by someone else and this attempt does not wait (`try_lock`, `no_wait`).
    ///
    /// Retry later (after `retry_after`, when known), or wait for the lock with
    /// [`LockRequest::wait`](crate::LockRequest::wait).
    #[error("lock {key:?} is busy")]
    #[non_exhaustive]
    Busy {
        /// The key that was busy.
        key: String,
        /// How long the current holder's lease still runs, when the backend told us.
        retry_after: Option<Duration>,
    },

    /// The lock stayed busy for the whole wait (a wait in which the backend never answered
    /// ends with [`Backend`](Self::Backend) instead).
    ///
    /// Raise the wait, or shorten the critical sections that hold the key.
    #[error("timed out after {waited:?} waiting for lock {key:?}")]
    #[non_exhaustive]
    Timeout {
        /// The key that was waited for.
        key: String,
        /// How long we waited.
        waited: Duration,
    },

    /// The lease was lost while the lock was held: the key expired, was deleted, or was taken
    /// by another owner. Work done under the lock since then was not protected.
    ///
    /// [`run`](crate::LockRequest::run) has cancelled its body; work done under a guard is
    /// unsafe to commit (check it with a [fencing token](crate::LockGuard::fence) where the
    /// storage can). A lease that keeps being lost wants a longer lease, or a backend that
    /// answers renewals in time.
    #[error("lease on lock {key:?} was lost")]
    #[non_exhaustive]
    LeaseLost {
        /// The key whose lease was lost.
        key: String,
    },

    /// `run` held the lock for its configured `max_hold` and cancelled the body.
    ///
    /// Raise [`max_hold`](crate::LockRequest::max_hold) or make the body finish sooner.
    #[error("lock {key:?} was held for its max_hold of {max_hold:?}")]
    #[non_exhaustive]
    MaxHoldExceeded {
        /// The key.
        key: String,
        /// The configured cap.
        max_hold: Duration,
    },

    /// The key is not acceptable (empty, longer than [`MAX_KEY_LEN`](crate::MAX_KEY_LEN)).
    ///
    /// Name the resource you protect (`"order:42"`); hash long or untrusted values first.
    #[error("invalid lock key {key:?}: {reason}")]
    #[non_exhaustive]
    InvalidKey {
        /// The key as given (shortened when long).
        key: String,
        /// Why it was refused and what is allowed.
        reason: String,
    },

    /// A configuration value is out of range (lease, wait, prefix, URL...), or the Redis user
    /// lacks a permission the lock needs.
    ///
    /// `what` names the value and the range allowed, or the missing permission (see
    /// "Permissions" in the guide's Redis chapter, `docs/src/backends/redis.md`, for the ACL rule).
    #[error("invalid lock configuration: {what}")]
    #[non_exhaustive]
    InvalidConfig {
        /// What is wrong and what is allowed.
        what: String,
    },

    /// An idempotency record to store is larger than allowed: its result above
    /// [`MAX_RESULT_LEN`](crate::MAX_RESULT_LEN), or its fingerprint above
    /// [`MAX_FINGERPRINT_LEN`](crate::MAX_FINGERPRINT_LEN). Nothing was written.
    ///
    /// Store a smaller result (a reference to where the large one lives, or a digest of it),
    /// or a digest of the request as the fingerprint. The lock is still held.
    #[error("the idempotency {what} for {key:?} is {len} bytes, more than the {max} allowed")]
    #[non_exhaustive]
    RecordTooLarge {
        /// The key whose record it is.
        key: String,
        /// Which part is too large: `"result"` or `"fingerprint"`.
        what: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The most allowed, in bytes.
        max: usize,
    },

    /// A request with this idempotency key started (its "started" mark is stored, see
    /// [`LockGuard::mark_started`](crate::LockGuard::mark_started)) but its outcome was never
    /// recorded: the process ended, or lost its lock, or its result could not be stored, after
    /// the work began. The work may have been done, partly or wholly; it is not run again
    /// under this key until the mark expires (the record's TTL).
    ///
    /// Not retryable: the same key gets the same answer until then. Check the state of what
    /// the work changes, then call again with a new key if the work is still needed.
    /// `fingerprint` is the mark's: compare it with yours to tell another request under the
    /// same key from this one.
    #[error(
        "the outcome of idempotent key {key:?} is unknown: it started and recorded no result (the mark expires in {expires_in:?})"
    )]
    #[non_exhaustive]
    OutcomeUnknown {
        /// The idempotency key.
        key: String,
        /// The fingerprint written with the mark.
        fingerprint: String,
        /// How long the mark is still kept (`Duration::MAX` without expiry).
        expires_in: Duration,
    },

    /// An idempotency key already holds the record of another function (or of this function
    /// when it returned another type): two `#[distributed_lock(idempotent)]` functions share a
    /// key template, such as `charge` and `refund` both on `"order:{id}"`. Neither the stored
    /// value nor a second run is given: the body did not run. The HTTP layer answers the same
    /// case (one key, another request) with 422.
    ///
    /// Give each function a key template of its own (`"charge:{id}"`, `"refund:{id}"`); a
    /// record of a type changed by a deploy answers this until it expires (`expires_in`).
    ///
    /// ```
    /// # #[derive(Debug)] struct AppError(lock_core::LockError);
    /// # impl From<lock_core::LockError> for AppError { fn from(e: lock_core::LockError) -> Self { AppError(e) } }
    /// use lock_core::{distributed_lock, LockError, Locker};
    ///
    /// #[distributed_lock(key = "order:{id}", locker = locker, idempotent)]
    /// async fn charge(locker: &Locker, id: u64) -> Result<u64, AppError> { Ok(100) }
    ///
    /// #[distributed_lock(key = "order:{id}", locker = locker, idempotent)]
    /// async fn refund(locker: &Locker, id: u64) -> Result<u64, AppError> { Ok(0) }
    ///
    /// # async fn demo() {
    /// let locker = Locker::memory();
    /// assert_eq!(charge(&locker, 7).await.unwrap(), 100);
    /// match refund(&locker, 7).await {
    ///     Err(AppError(LockError::IdempotencyKeyReused { key, stored, .. })) => {
    ///         assert_eq!(key, "order:7");
    ///         assert!(stored.contains("charge"));
    ///     }
    ///     other => panic!("expected IdempotencyKeyReused, got {other:?}"),
    /// }
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    #[error("idempotency key {key:?} holds the record of another function: {stored}")]
    #[non_exhaustive]
    IdempotencyKeyReused {
        /// The key.
        key: String,
        /// The fingerprint of the stored record: the function that stored it and its return
        /// type (`json2:<path of the function> -> <type>`), or a digest of that when it is long.
        stored: String,
        /// The fingerprint of this call, in the same form.
        caller: String,
        /// How long the stored record still lives.
        expires_in: Duration,
    },

    /// No process-wide locker was set with [`set_global`](crate::set_global) before it was needed.
    ///
    /// Call `lock_core::set_global(locker)` at start-up, or pass `locker = ...` to
    /// `#[distributed_lock]`.
    ///
    /// A plain unit variant: match it as `LockError::NoGlobalLocker` (or with `{ .. }`).
    #[error("no global locker is set")]
    NoGlobalLocker,

    /// The backend failed: Redis unreachable, timed out, or answered something unexpected.
    /// The lock state is unknown to us; nothing was run under it.
    ///
    /// Retrying later may succeed ([`is_retryable`](Self::is_retryable)); a lock that may
    /// have been taken is released by its lease.
    #[error("lock backend failed during {operation}{}: {source}", on_key(.key.as_deref()))]
    #[non_exhaustive]
    Backend {
        /// What we were doing (acquire, release, extend, renew, subscribe, connect).
        operation: &'static str,
        /// The key involved, when there is one.
        key: Option<String>,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
}

/// `" on <key>"` for a backend error about one key.
fn on_key(key: Option<&str>) -> String {
    key.map(|k| format!(" on {k:?}")).unwrap_or_default()
}

impl LockError {
    /// Whether retrying the same operation later may succeed (busy, timeout, transport failure).
    ///
    /// ```
    /// # async fn demo() {
    /// let locker = lock_core::Locker::memory();
    /// let _held = locker.lock("k").await.unwrap();
    /// let busy = locker.try_lock("k").await.unwrap_err();
    /// assert!(busy.is_retryable());
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            LockError::Busy { .. } | LockError::Timeout { .. } | LockError::Backend { .. }
        )
    }

    /// The key this error is about, when there is one.
    ///
    /// ```
    /// # async fn demo() {
    /// let locker = lock_core::Locker::memory();
    /// let _held = locker.lock("order:1").await.unwrap();
    /// let busy = locker.try_lock("order:1").await.unwrap_err();
    /// assert_eq!(busy.key(), Some("order:1"));
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub fn key(&self) -> Option<&str> {
        match self {
            LockError::Busy { key, .. }
            | LockError::Timeout { key, .. }
            | LockError::LeaseLost { key }
            | LockError::MaxHoldExceeded { key, .. }
            | LockError::InvalidKey { key, .. }
            | LockError::RecordTooLarge { key, .. }
            | LockError::OutcomeUnknown { key, .. }
            | LockError::IdempotencyKeyReused { key, .. } => Some(key),
            LockError::Backend { key, .. } => key.as_deref(),
            _ => None,
        }
    }

    #[cfg(any(feature = "redis", feature = "etcd", feature = "zookeeper"))]
    pub(crate) fn backend<'k>(
        operation: &'static str,
        key: impl Into<Option<&'k str>>,
        source: impl StdError + Send + Sync + 'static,
    ) -> Self {
        LockError::Backend {
            operation,
            key: key.into().map(str::to_owned),
            source: Arc::new(source),
        }
    }

    #[cfg(any(feature = "redis", feature = "etcd", feature = "zookeeper"))]
    pub(crate) fn protocol<'k>(
        operation: &'static str,
        key: impl Into<Option<&'k str>>,
        what: impl Into<String>,
    ) -> Self {
        LockError::Backend {
            operation,
            key: key.into().map(str::to_owned),
            source: Arc::new(ProtocolError(what.into())),
        }
    }

    /// A backend call that reached too few servers (or slots) to say yes or no for `key`.
    pub(crate) fn undecided(operation: &'static str, key: &str) -> Self {
        LockError::Backend {
            operation,
            key: Some(key.to_owned()),
            source: Arc::new(Undecided),
        }
    }

    pub(crate) fn config(what: impl Into<String>) -> Self {
        LockError::InvalidConfig { what: what.into() }
    }
}

/// Too few servers (or slots) answered to decide: the lock may hold the old state or the new.
#[derive(Debug, thiserror::Error)]
#[error("too few answers to decide; the lease may be the old one or the new one")]
struct Undecided;

#[cfg(any(feature = "redis", feature = "etcd", feature = "zookeeper"))]
/// The server answered something this crate does not understand.
#[derive(Debug, thiserror::Error)]
#[error("unexpected answer from the lock backend: {0}")]
pub(crate) struct ProtocolError(pub(crate) String);
