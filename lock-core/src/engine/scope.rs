//! Task-scoped reentrancy: the locks held by the current `run` scope (and `#[distributed_lock]`
//! functions) of this task.
//!
//! The scope is a tokio task-local, so it follows the task across threads and is *not*
//! inherited by tasks spawned inside it: a spawned task that locks a key its parent holds
//! waits like any other owner (otherwise two tasks would run "under" one lock at once). A
//! future wrapped by [`LockGuard::scope`](crate::LockGuard::scope) carries its guard's lock,
//! and only that one, into the task that runs it: the surrounding scope is read where it is
//! first polled, never where it was built.
//!
//! Reentrant use ends with the outer lock: once that lock is released, dropped, lost or past
//! its validity deadline, a reentrant `run` body is cancelled (`LeaseLost`), a reentrant guard
//! reports `lost()`, and locking the key again in the scope is refused with `LeaseLost`.

use std::future::Future;
use std::sync::Arc;

use crate::engine::held::Held;
use crate::guard::LockInfo;

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

/// `fut`, run with `held` added to the scope that is current where it is first polled.
///
/// The surrounding scope is read at the first poll, not here: a future built inside a `run`
/// scope and spawned as its own task must not carry that scope along (a spawned task is
/// another owner).
pub(crate) fn scoped<F: Future>(held: Arc<Held>, fut: F) -> Scoped<F> {
    Scoped {
        state: State::Start { held, fut },
    }
}

pin_project_lite::pin_project! {
    /// A future run inside a lock's scope; from [`LockGuard::scope`](crate::LockGuard::scope).
    ///
    /// It carries its guard's lock into wherever it runs, on top of the scope of the task that
    /// polls it (read at its first poll): spawned as a task of its own, it carries that lock
    /// alone, never the locks of the task that built it.
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
        state: State<F>,
    }
}

pin_project_lite::pin_project! {
    /// One variant at a time, so the future is stored once (nested scopes do not double in
    /// size at each level).
    #[project = StateProj]
    #[project_replace = StateReplace]
    enum State<F: Future> {
        // Until the first poll: the lock to add and the future, never pinned yet (so it may
        // still move into `Running`).
        Start { held: Arc<Held>, fut: F },
        Running { #[pin] inner: tokio::task::futures::TaskLocalFuture<Scope, F> },
        // Only between the two, inside one poll.
        Moving,
    }
}

impl<F: Future> std::fmt::Debug for Scoped<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scoped")
            .field("started", &matches!(self.state, State::Running { .. }))
            .finish_non_exhaustive()
    }
}

impl<F: Future> Future for Scoped<F> {
    type Output = F::Output;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let mut state = self.project().state;
        if matches!(state.as_mut().project(), StateProj::Start { .. })
            && let StateReplace::Start { held, fut } = state.as_mut().project_replace(State::Moving)
        {
            let mut scope = SCOPE.try_with(Scope::clone).unwrap_or_default();
            scope.held.push(held);
            state.set(State::Running {
                inner: SCOPE.scope(scope, fut),
            });
        }
        match state.project() {
            StateProj::Running { inner } => inner.poll(cx),
            // Unreachable: `Start` becomes `Running` above, within this poll.
            StateProj::Start { .. } | StateProj::Moving => std::task::Poll::Pending,
        }
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
