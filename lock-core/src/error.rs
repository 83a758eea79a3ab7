//! The one error type of the crate.

use std::error::Error as StdError;
use std::sync::Arc;
use std::time::Duration;

/// A boxed, shareable source error (transport or server failure).
pub type BoxError = Arc<dyn StdError + Send + Sync + 'static>;

/// Everything that can go wrong when taking, holding or releasing a lock.
///
/// Every variant says which key it is about (where there is one) and what to do about it.
/// The enum is `#[non_exhaustive]`: match the variants you handle and keep a fallback arm.
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
    #[error(
        "lock {key:?} is busy: held by another owner; retry later or wait for it with `.wait(..)`"
    )]
    Busy {
        /// The key that was busy.
        key: String,
        /// How long the current holder's lease still runs, when the backend told us.
        retry_after: Option<Duration>,
    },

    /// The lock stayed busy for the whole wait.
    #[error(
        "timed out after {waited:?} waiting for lock {key:?}; raise the wait or shorten the critical section"
    )]
    Timeout {
        /// The key that was waited for.
        key: String,
        /// How long we waited.
        waited: Duration,
    },

    /// The lease was lost while the lock was held: the key expired, was deleted, or was taken
    /// by another owner. Work done under the lock since then was not protected.
    #[error(
        "lease on lock {key:?} was lost while held (expired, deleted or taken over); the protected work was cancelled or is unsafe to commit"
    )]
    LeaseLost {
        /// The key whose lease was lost.
        key: String,
    },

    /// `run` held the lock for its configured `max_hold` and cancelled the body.
    #[error("lock {key:?} was held for its max_hold of {max_hold:?}; the body was cancelled")]
    MaxHoldExceeded {
        /// The key.
        key: String,
        /// The configured cap.
        max_hold: Duration,
    },

    /// The key is not acceptable (empty, too long).
    #[error("invalid lock key {key:?}: {reason}")]
    InvalidKey {
        /// The key as given (shortened when long).
        key: String,
        /// Why it was refused and what is allowed.
        reason: String,
    },

    /// A configuration value is out of range (lease, wait, prefix, URL...).
    #[error("invalid lock configuration: {what}")]
    InvalidConfig {
        /// What is wrong and what is allowed.
        what: String,
    },

    /// No process-wide locker was set with [`set_global`](crate::set_global) before it was needed.
    #[error(
        "no global locker is set: call lock_core::set_global(locker) at start-up, or pass `locker = ...` to #[distributed_lock]"
    )]
    NoGlobalLocker,

    /// The backend failed: Redis unreachable, timed out, or answered something unexpected.
    /// The lock state is unknown to us; nothing was run under it.
    #[error("lock backend failed during {operation} on {key:?}: {source}")]
    Backend {
        /// What we were doing (acquire, release, extend, renew, subscribe, connect).
        operation: &'static str,
        /// The key involved, or empty when none.
        key: String,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
}

impl LockError {
    /// Whether retrying the same operation later may succeed (busy, timeout, transport failure).
    ///
    /// ```
    /// use lock_core::LockError;
    /// let e = LockError::Timeout { key: "k".into(), waited: std::time::Duration::from_secs(1) };
    /// assert!(e.is_retryable());
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
    /// use lock_core::LockError;
    /// let e = LockError::LeaseLost { key: "order:1".into() };
    /// assert_eq!(e.key(), Some("order:1"));
    /// ```
    pub fn key(&self) -> Option<&str> {
        match self {
            LockError::Busy { key, .. }
            | LockError::Timeout { key, .. }
            | LockError::LeaseLost { key }
            | LockError::MaxHoldExceeded { key, .. }
            | LockError::InvalidKey { key, .. } => Some(key),
            LockError::Backend { key, .. } if !key.is_empty() => Some(key),
            _ => None,
        }
    }

    #[cfg(feature = "redis")]
    pub(crate) fn backend(
        operation: &'static str,
        key: &str,
        source: impl StdError + Send + Sync + 'static,
    ) -> Self {
        LockError::Backend {
            operation,
            key: key.to_owned(),
            source: Arc::new(source),
        }
    }

    #[cfg(feature = "redis")]
    pub(crate) fn protocol(operation: &'static str, key: &str, what: impl Into<String>) -> Self {
        LockError::Backend {
            operation,
            key: key.to_owned(),
            source: Arc::new(ProtocolError(what.into())),
        }
    }

    pub(crate) fn config(what: impl Into<String>) -> Self {
        LockError::InvalidConfig { what: what.into() }
    }
}

#[cfg(feature = "redis")]
/// The server answered something this crate does not understand.
#[derive(Debug, thiserror::Error)]
#[error("unexpected answer from the lock backend: {0}")]
pub(crate) struct ProtocolError(pub(crate) String);
