//! The owner's [`LockGuard`] and the read-only [`LockInfo`] of a held lock (whose state is
//! [`Held`]).

use std::sync::Arc;
use std::time::Duration;

use crate::LockError;
use crate::engine::held::Held;

/// An acquired lock. Dropping it releases the lock in the background; [`release`] does it now
/// and says whether the lock was still ours. (A hot key's lock may stay parked in its locker
/// for the next task of the locker, for up to
/// [`local_grace`](crate::LockerBuilder::local_grace), before other lockers can take it.
/// On the memory backend, inside a runtime, a drop has otherwise released the lock by the time
/// it returns: there is no I/O to wait for. On Redis the
/// release is on its way: a `try_lock` of the key right after the drop may still be `Busy`,
/// where a `lock` with a wait is woken by that release.) A guard dropped on a thread outside
/// any runtime (a `std::thread`) sends its release to the runtime its locker's watchdog runs
/// on; with none running (that runtime shut down, or the watchdog turned off for every lock
/// so far), the lease's expiry frees the key.
///
/// While the guard lives, the locker's watchdog renews its lease (unless turned off); if the
/// lease is lost anyway, [`lost`] resolves and [`is_held`] turns false.
///
/// A guard obtained again for a key that the current [`run`](crate::LockRequest::run) scope
/// already holds is *reentrant*: it shares the outer lock, and releasing or dropping it does
/// nothing (the outermost scope releases). It ends with the outer lock, whatever ends that:
/// [`lost`] resolves and [`is_held`] turns false.
///
/// [`release`]: LockGuard::release
/// [`lost`]: LockGuard::lost
/// [`is_held`]: LockGuard::is_held
///
/// ```
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use lock_core::Locker;
///
/// let locker = Locker::memory();
/// let guard = locker.lock("order:42").fenced().await?;
/// assert_eq!(guard.key(), "order:42");
/// assert!(guard.is_held());
/// assert_eq!(guard.fence(), Some(1));
/// guard.release().await?;
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
/// ```
#[must_use = "the lock is released as soon as the guard is dropped"]
#[derive(Debug)]
pub struct LockGuard {
    held: Arc<Held>,
    reentrant: bool,
    done: bool,
    /// Whether this guard may have left an idempotency "started" mark behind: written (or
    /// tried) and neither replaced by a result nor taken back. Then, when it ends, later marks
    /// under its acquisition take a new id (see `Held::forget_mark`).
    marked: std::sync::atomic::AtomicBool,
}

impl LockGuard {
    pub(crate) fn owned(held: Arc<Held>) -> Self {
        LockGuard {
            held,
            reentrant: false,
            done: false,
            marked: std::sync::atomic::AtomicBool::new(false),
        }
    }

    pub(crate) fn reentrant(held: Arc<Held>) -> Self {
        LockGuard {
            held,
            reentrant: true,
            done: false,
            marked: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Records whether this guard may have left a "started" mark behind (see `marked`).
    pub(crate) fn set_marked(&self, marked: bool) {
        self.marked
            .store(marked, std::sync::atomic::Ordering::Relaxed);
    }

    /// At the guard's end: a mark it left behind is never taken for a later one's.
    fn forget_mark_left(&self) {
        if self.marked.load(std::sync::atomic::Ordering::Relaxed) {
            self.held.forget_mark();
        }
    }

    pub(crate) fn held(&self) -> &Arc<Held> {
        &self.held
    }

    /// The key, as given to `lock`.
    ///
    /// ```
    /// # async fn demo() {
    /// let g = lock_core::Locker::memory().lock("a").await.unwrap();
    /// assert_eq!(g.key(), "a");
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub fn key(&self) -> &str {
        self.held.key.user()
    }

    /// The fencing token, when the lock was taken with [`fenced`](crate::LockRequest::fenced):
    /// strictly greater than every token handed out before for this key. Pass it to the storage
    /// you write to and have it reject writes with a token lower than the highest it has seen.
    ///
    /// ```
    /// # async fn demo() {
    /// let locker = lock_core::Locker::memory();
    /// let first = locker.lock("k").fenced().await.unwrap();
    /// let t1 = first.fence().unwrap();
    /// first.release().await.unwrap();
    /// let second = locker.lock("k").fenced().await.unwrap();
    /// assert!(second.fence().unwrap() > t1);
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub fn fence(&self) -> Option<u64> {
        self.held.fence
    }

    /// Whether the lease is still ours by the local monotonic clock (validity deadline not
    /// passed, no renewal said "not owner", not released). A reentrant guard follows the outer
    /// lock: false once that is released or dropped.
    ///
    /// ```
    /// # async fn demo() {
    /// let g = lock_core::Locker::memory().lock("a").await.unwrap();
    /// assert!(g.is_held());
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub fn is_held(&self) -> bool {
        self.held.is_held()
    }

    /// How long the lease is still ours for sure, by the local clock; zero once lost.
    ///
    /// A lock handed over by a release (see [`LockRequest::fair`](crate::LockRequest::fair))
    /// starts with a lease of at most 3 s when the watchdog is on; the watchdog extends it to
    /// the full lease within its first third.
    ///
    /// ```
    /// # async fn demo() {
    /// use std::time::Duration;
    /// let g = lock_core::Locker::memory().lock("a").lease(Duration::from_secs(10)).await.unwrap();
    /// assert!(g.remaining() <= Duration::from_secs(10));
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub fn remaining(&self) -> Duration {
        self.held.remaining()
    }

    /// The current lease length.
    ///
    /// ```
    /// # async fn demo() {
    /// use std::time::Duration;
    /// let g = lock_core::Locker::memory().lock("a").lease(Duration::from_secs(5)).await.unwrap();
    /// assert_eq!(g.lease(), Duration::from_secs(5));
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub fn lease(&self) -> Duration {
        self.held.lease()
    }

    /// Whether this acquisition had to wait: its first attempt found the lock held. A lock
    /// passed by local hand-off to a queued task waited; one taken parked in the locker's
    /// [`local_grace`](crate::LockerBuilder::local_grace) as its request arrived did not.
    ///
    /// ```
    /// # async fn demo() {
    /// let g = lock_core::Locker::memory().lock("a").await.unwrap();
    /// assert!(!g.waited());
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub fn waited(&self) -> bool {
        self.held.waited
    }

    /// Runs `fut` inside this lock's scope, as [`run`](crate::LockRequest::run) runs its body:
    /// [`current_lock`](crate::current_lock) describes this lock there, and locking the same key
    /// through the same locker is reentrant. The lock is not released at the end (the guard is).
    ///
    /// ```
    /// # async fn demo() {
    /// let locker = lock_core::Locker::memory();
    /// let guard = locker.lock("order:1").await.unwrap();
    /// let again = guard.scope(async { locker.try_lock("order:1").await.map(|g| g.is_reentrant()) });
    /// assert!(again.await.unwrap());
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub fn scope<F: std::future::Future>(&self, fut: F) -> crate::Scoped<F> {
        crate::engine::scope::scoped(self.held.clone(), fut)
    }

    /// Whether this guard is a reentrant one (its release is left to the outer scope).
    ///
    /// ```
    /// # async fn demo() {
    /// let locker = lock_core::Locker::memory();
    /// let l2 = locker.clone();
    /// locker.lock("a").run(async move {
    ///     let inner = l2.lock("a").await.unwrap();
    ///     assert!(inner.is_reentrant());
    /// }).await.unwrap();
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub fn is_reentrant(&self) -> bool {
        self.reentrant
    }

    /// Resolves when the lease is lost while held: the key expired, was deleted, or another
    /// owner took it, or no renewal succeeded before the local validity deadline. Never
    /// resolves while the lock is still ours. Use it to stop work that must not go on unprotected
    /// (or use [`run`](crate::LockRequest::run), which does it for you).
    ///
    /// A [reentrant](Self::is_reentrant) guard also resolves when the outer lock is released
    /// or dropped: its work must not go on once the lock it shares is no longer held (another
    /// owner may take the key at once). An owned guard's `lost` never resolves once it is
    /// released.
    ///
    /// ```
    /// # async fn demo() {
    /// let guard = lock_core::Locker::memory().lock("job").await.unwrap();
    /// tokio::select! {
    ///     () = guard.lost() => { /* stop: the lock is gone */ }
    ///     () = async { /* the protected work */ } => {}
    /// }
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub async fn lost(&self) {
        if self.reentrant {
            self.held.ended().await;
        } else {
            self.held.lost().await;
        }
    }

    /// A read-only handle on this lock that can be cloned and moved to other tasks.
    ///
    /// Its [`lost`](LockInfo::lost) never resolves once the lock is released: a task watching
    /// for the loss should also stop when the work it guards ends.
    ///
    /// ```
    /// # async fn demo() {
    /// let guard = lock_core::Locker::memory().lock("job").await.unwrap();
    /// let info = guard.info();
    /// let (done, finished) = tokio::sync::oneshot::channel::<()>();
    /// let watcher = tokio::spawn(async move {
    ///     tokio::select! {
    ///         () = info.lost() => { /* tell the worker to stop */ }
    ///         _ = finished => {}
    ///     }
    /// });
    /// // ... the work ...
    /// let _ = done.send(());
    /// watcher.await.unwrap();
    /// guard.release().await.unwrap();
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub fn info(&self) -> LockInfo {
        LockInfo {
            held: self.held.clone(),
        }
    }

    /// Sets the lease to `lease` from now, if the lock is still ours. Meant for locks taken with
    /// `.watchdog(false)`; with the watchdog on it also changes the lease the watchdog renews.
    ///
    /// # Errors
    /// [`LockError::LeaseLost`] when the lock is no longer ours (nothing else's lock is touched),
    /// [`LockError::InvalidConfig`] for a zero or absurd lease, [`LockError::Backend`].
    ///
    /// ```
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// use std::time::Duration;
    /// let locker = lock_core::Locker::memory();
    /// let guard = locker.lock("job").watchdog(false).lease(Duration::from_secs(1)).await?;
    /// guard.extend(Duration::from_secs(5)).await?;
    /// assert_eq!(guard.lease(), Duration::from_secs(5));
    /// # Ok(()) }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
    /// ```
    pub async fn extend(&self, lease: Duration) -> Result<(), LockError> {
        self.held.extend(lease).await
    }

    /// Releases the lock now.
    ///
    /// # Errors
    /// [`LockError::LeaseLost`] when the lock had stopped being ours (expired, deleted, taken):
    /// in that case nobody else's lock was touched. [`LockError::Backend`] when the backend did
    /// not answer; the lease then expires on its own. A reentrant guard's release leaves the
    /// lock to the outer scope (nothing is sent to the backend): `Ok` while the outer lock is
    /// held by the local clock, [`LockError::LeaseLost`] once it is known lost, released or
    /// dropped (the outer release asks the backend, and reports a loss found then).
    ///
    /// ```
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let guard = lock_core::Locker::memory().lock("job").await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
    /// ```
    pub async fn release(mut self) -> Result<(), LockError> {
        self.done = true;
        self.forget_mark_left();
        if self.reentrant {
            // Never `Ok` for a lock known to be gone: the caller may take it for "held until
            // now" (found by an outside audit: `Ok` while another owner held the key).
            return if self.held.is_held() {
                Ok(())
            } else {
                Err(self.held.lease_lost())
            };
        }
        self.held.release().await
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if !self.done {
            self.forget_mark_left();
        }
        if !self.done && !self.reentrant {
            self.held.release_in_background();
        }
    }
}

/// A read-only view of a held lock: key, fencing token, validity, loss.
///
/// Get one from [`LockGuard::info`] or, inside a [`run`](crate::LockRequest::run) scope or a
/// `#[distributed_lock]` function, from [`current_lock`](crate::current_lock).
///
/// ```
/// # async fn demo() {
/// use lock_core::{current_lock, Locker};
/// let locker = Locker::memory();
/// locker.lock("draw:7").fenced().run(async {
///     let info = current_lock().unwrap();
///     assert_eq!(info.key(), "draw:7");
///     assert!(info.fence().is_some());
/// }).await.unwrap();
/// # }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
/// ```
#[derive(Debug, Clone)]
pub struct LockInfo {
    pub(crate) held: Arc<Held>,
}

impl LockInfo {
    /// The key, as given to `lock`.
    ///
    /// ```
    /// # async fn demo() {
    /// let g = lock_core::Locker::memory().lock("a").await.unwrap();
    /// assert_eq!(g.info().key(), "a");
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub fn key(&self) -> &str {
        self.held.key.user()
    }

    /// The fencing token, when the lock is fenced. See [`LockGuard::fence`].
    ///
    /// ```
    /// # async fn demo() {
    /// let g = lock_core::Locker::memory().lock("a").await.unwrap();
    /// assert_eq!(g.info().fence(), None);
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub fn fence(&self) -> Option<u64> {
        self.held.fence
    }

    /// Whether the lease is still ours. See [`LockGuard::is_held`].
    ///
    /// ```
    /// # async fn demo() {
    /// let g = lock_core::Locker::memory().lock("a").await.unwrap();
    /// assert!(g.info().is_held());
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub fn is_held(&self) -> bool {
        self.held.is_held()
    }

    /// How long the lease is still ours for sure. See [`LockGuard::remaining`].
    ///
    /// ```
    /// # async fn demo() {
    /// let g = lock_core::Locker::memory().lock("a").await.unwrap();
    /// assert!(g.info().remaining() > std::time::Duration::ZERO);
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub fn remaining(&self) -> Duration {
        self.held.remaining()
    }

    /// Resolves when the lease is lost. See [`LockGuard::lost`].
    ///
    /// ```
    /// # async fn demo() {
    /// let g = lock_core::Locker::memory().lock("a").await.unwrap();
    /// let info = g.info();
    /// tokio::select! { () = info.lost() => {}, () = async {} => {} }
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub async fn lost(&self) {
        self.held.lost().await;
    }
}
