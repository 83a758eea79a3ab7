//! Task-scoped reentrancy: the locks held by the current `run` scope (and `#[distributed_lock]`
//! functions) of this task.
//!
//! The scope is a tokio task-local, so it follows the task across threads and is *not*
//! inherited by tasks spawned inside it: a spawned task that locks a key its parent holds
//! waits like any other owner (otherwise two tasks would run "under" one lock at once).

use std::future::Future;
use std::sync::Arc;

use crate::guard::{Held, LockInfo};

tokio::task_local! {
    static SCOPE: Scope;
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Scope {
    /// Innermost last.
    held: Vec<Arc<Held>>,
}

/// The lock of the current scope for `key` under the locker `locker_id`, if any.
pub(crate) fn find(locker_id: u64, key: &str) -> Option<Arc<Held>> {
    SCOPE
        .try_with(|s| {
            s.held
                .iter()
                .rev()
                .find(|h| h.locker.id == locker_id && h.key.user() == key)
                .cloned()
        })
        .ok()
        .flatten()
}

/// Runs `fut` with `held` added to the current scope.
pub(crate) async fn enter<F: Future>(held: Arc<Held>, fut: F) -> F::Output {
    scoped(held, fut).await
}

/// `fut`, run with `held` added to the scope that is current when this is called.
pub(crate) fn scoped<F: Future>(held: Arc<Held>, fut: F) -> Scoped<F> {
    let mut scope = SCOPE.try_with(Scope::clone).unwrap_or_default();
    scope.held.push(held);
    Scoped {
        inner: SCOPE.scope(scope, fut),
    }
}

pin_project_lite::pin_project! {
    /// A future run inside a lock's scope; from [`LockGuard::scope`](crate::LockGuard::scope).
    ///
    /// ```
    /// # async fn demo() {
    /// let locker = lock_core::Locker::memory();
    /// let guard = locker.lock("k").fenced().await.unwrap();
    /// let scoped: lock_core::Scoped<_> = guard.scope(async { lock_core::current_fence() });
    /// assert_eq!(scoped.await, guard.fence());
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    #[must_use = "futures do nothing unless polled"]
    pub struct Scoped<F: Future> {
        #[pin]
        inner: tokio::task::futures::TaskLocalFuture<Scope, F>,
    }
}

impl<F: Future> std::fmt::Debug for Scoped<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scoped").finish_non_exhaustive()
    }
}

impl<F: Future> Future for Scoped<F> {
    type Output = F::Output;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        self.project().inner.poll(cx)
    }
}

/// The innermost lock held by the current task's `run` scope or `#[distributed_lock]`
/// function, if any: its key, fencing token, validity and loss signal.
///
/// ```
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use lock_core::{current_lock, Locker};
///
/// let locker = Locker::memory();
/// assert!(current_lock().is_none());
/// let fence = locker
///     .lock("inventory:sku-1")
///     .fenced()
///     .run(async { current_lock().and_then(|l| l.fence()) })
///     .await?;
/// assert_eq!(fence, Some(1));
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
/// ```
pub fn current_lock() -> Option<LockInfo> {
    SCOPE
        .try_with(|s| s.held.last().cloned())
        .ok()
        .flatten()
        .map(|held| LockInfo { held })
}

/// The fencing token of the innermost lock of the current scope, when it is fenced.
///
/// ```
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// let locker = lock_core::Locker::memory();
/// let t = locker.lock("k").fenced().run(async { lock_core::current_fence() }).await?;
/// assert!(t.is_some());
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
/// ```
pub fn current_fence() -> Option<u64> {
    current_lock().and_then(|l| l.fence())
}
