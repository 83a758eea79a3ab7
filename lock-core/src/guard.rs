//! A held lock: its shared state ([`Held`]), the owner's [`LockGuard`] and the read-only
//! [`LockInfo`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::LockError;
use crate::backend::Renewal;
use crate::key::LockKey;
use crate::locker::LockerInner;
use crate::token::Token;

/// Where one acquisition stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Held,
    Lost,
    Released,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct HoldState {
    /// Until when the lease is ours for sure, on the monotonic clock, drift already subtracted.
    pub(crate) valid_until: Instant,
    pub(crate) phase: Phase,
}

/// The state of one acquisition, shared by its guard, the watchdog and `run`.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) id: u64,
    pub(crate) key: LockKey,
    pub(crate) token: Token,
    pub(crate) fence: Option<u64>,
    pub(crate) locker: Arc<LockerInner>,
    /// The lease in whole milliseconds (changes with `extend`).
    lease_ms: AtomicU64,
    state: watch::Sender<HoldState>,
    /// Renewal stops here (`max_hold`).
    pub(crate) renew_until: Option<Instant>,
    pub(crate) acquired_at: Instant,
    /// When the watchdog first renews: a third into the lease the backend set at acquisition, or
    /// at once for a lock handed over with a shorter lease than asked for.
    pub(crate) first_renewal: Instant,
    /// Whether the first attempt found the lock busy.
    pub(crate) waited: bool,
    /// Held by whoever is changing the lease in the backend (the watchdog's batch or an
    /// `extend`), so two renewals with different leases never race: the later PEXPIRE could
    /// otherwise shorten the lease behind the other's back.
    pub(crate) renewing: Arc<tokio::sync::Mutex<()>>,
}

/// The drift allowance subtracted from every lease: 1 % plus 2 ms.
pub(crate) fn drift(lease: Duration) -> Duration {
    lease / 100 + Duration::from_millis(2)
}

/// What an acquire attempt that succeeded knows about the new lock.
#[derive(Debug)]
pub(crate) struct Acquisition {
    pub(crate) key: LockKey,
    pub(crate) token: Token,
    pub(crate) fence: Option<u64>,
    pub(crate) lease: Duration,
    /// The lease the backend set at acquisition: `lease`, or a shorter one on a lock handed
    /// over by a release (the watchdog then extends it early).
    pub(crate) first_lease: Duration,
    /// The instant before the acquire was sent: validity is measured from here.
    pub(crate) sent_at: Instant,
    /// When the lock counts as the caller's: `max_hold` runs from here. `sent_at` for an
    /// acquisition; the moment it arrived for a handed-over lock, whose `sent_at` (the attempt
    /// the handover names) may be a second earlier.
    pub(crate) received_at: Instant,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) waited: bool,
}

impl Held {
    pub(crate) fn new(locker: Arc<LockerInner>, acquisition: Acquisition) -> Arc<Self> {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let Acquisition {
            key,
            token,
            fence,
            lease,
            first_lease,
            sent_at,
            received_at,
            max_hold,
            waited,
        } = acquisition;
        let valid_until = sent_at + first_lease.saturating_sub(drift(first_lease));
        let (state, _) = watch::channel(HoldState {
            valid_until,
            phase: Phase::Held,
        });
        Arc::new(Held {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            key,
            token,
            fence,
            locker,
            lease_ms: AtomicU64::new(u64::try_from(lease.as_millis()).unwrap_or(u64::MAX)),
            state,
            renew_until: max_hold.map(|m| received_at + m),
            acquired_at: received_at,
            // A lock handed over with a short lease is renewed to the full one as soon as it
            // arrives: until then a server stall of a second or two would outlast it, where a
            // lock taken with the full lease rides out a stall of a whole lease.
            first_renewal: if first_lease < lease {
                received_at
            } else {
                sent_at + first_lease / 3
            },
            waited,
            renewing: Arc::new(tokio::sync::Mutex::new(())),
        })
    }

    pub(crate) fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms.load(Ordering::Relaxed))
    }

    pub(crate) fn snapshot(&self) -> HoldState {
        *self.state.borrow()
    }

    pub(crate) fn renewal(&self) -> Renewal {
        Renewal {
            key: self.key.clone(),
            token: self.token.clone(),
            lease: self.lease(),
        }
    }

    /// Whether the lease is still ours by the local clock.
    pub(crate) fn is_held(&self) -> bool {
        let s = self.snapshot();
        if s.phase != Phase::Held {
            return false;
        }
        if Instant::now() >= s.valid_until {
            self.mark_lost("the local validity deadline passed without a successful renewal");
            return false;
        }
        true
    }

    pub(crate) fn remaining(&self) -> Duration {
        if !self.is_held() {
            return Duration::ZERO;
        }
        self.snapshot()
            .valid_until
            .saturating_duration_since(Instant::now())
    }

    /// A renewal sent at `sent_at` succeeded.
    pub(crate) fn renewed(&self, sent_at: Instant, lease: Duration) {
        self.state.send_if_modified(|s| {
            if s.phase != Phase::Held {
                return false;
            }
            let until = sent_at + lease.saturating_sub(drift(lease));
            if until > s.valid_until {
                s.valid_until = until;
                true
            } else {
                false
            }
        });
    }

    /// The lease is gone. Idempotent; a released lock is never marked lost.
    pub(crate) fn mark_lost(&self, why: &str) {
        let changed = self.state.send_if_modified(|s| {
            if s.phase == Phase::Held {
                s.phase = Phase::Lost;
                true
            } else {
                false
            }
        });
        if changed {
            tracing::warn!(key = %crate::key::display_key(self.key.user()), reason = why, "lock lease lost");
            self.locker.watchdog.remove(self.id);
        }
    }

    /// Marks the lock released; returns the phase it was in.
    fn mark_released(&self) -> Phase {
        let mut before = Phase::Released;
        self.state.send_modify(|s| {
            before = s.phase;
            s.phase = Phase::Released;
        });
        before
    }

    /// Resolves when the lease is lost (never, once released).
    pub(crate) async fn lost(&self) {
        let mut rx = self.state.subscribe();
        loop {
            let s = *rx.borrow_and_update();
            match s.phase {
                Phase::Lost => return,
                Phase::Released => std::future::pending::<()>().await,
                Phase::Held => {}
            }
            tokio::select! {
                changed = rx.changed() => {
                    if changed.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
                () = tokio::time::sleep_until(s.valid_until) => {
                    // Marks the loss if the deadline really passed; a renewal that moved it at
                    // this very moment keeps the lock, and the loop reads the new state.
                    let _ = self.is_held();
                }
            }
        }
    }

    /// Resolves when this acquisition stops being held, for any reason: released (also by a
    /// dropped guard or the end of its `run`), lost, or past its local validity deadline (which
    /// is also how a `max_hold` that stopped renewal ends it). Reentrant uses of the lock end
    /// here: they must not outlive the outer lock, whoever else may hold the key next.
    pub(crate) async fn ended(&self) {
        let mut rx = self.state.subscribe();
        loop {
            let s = *rx.borrow_and_update();
            if s.phase != Phase::Held {
                return;
            }
            tokio::select! {
                changed = rx.changed() => {
                    if changed.is_err() {
                        // Unreachable while `self` lives (it owns the sender); ended either way.
                        return;
                    }
                }
                () = tokio::time::sleep_until(s.valid_until) => {
                    // Marks the loss if the deadline really passed; a renewal that moved it at
                    // this very moment keeps the lock, and the loop reads the new state.
                    if !self.is_held() {
                        return;
                    }
                }
            }
        }
    }

    /// Releases in the backend. `Ok(())` only when the lock was ours until this moment.
    /// Cancel-safe: if this future is dropped before the backend answered, the release is
    /// finished in the background.
    pub(crate) async fn release(self: &Arc<Self>) -> Result<(), LockError> {
        let valid = self.is_held();
        self.locker.watchdog.remove(self.id);
        let before = self.mark_released();
        if before == Phase::Released {
            return Ok(());
        }
        let mut unfinished = Unfinished(Some(self));
        // Safe even after a loss: the script deletes only a key that still holds our token.
        let ours = self.locker.call().release(&self.key, &self.token).await;
        unfinished.0 = None;
        if !matches!(ours, Ok(true)) {
            // A release that went through told this process's waiters itself (and may have
            // handed the lock to one of them); otherwise the local head looks for itself.
            self.locker.queues.wake_local(&self.key);
        }
        match ours {
            Ok(true) if valid && before == Phase::Held => Ok(()),
            Ok(_) => Err(LockError::LeaseLost {
                key: self.key.user().to_owned(),
            }),
            Err(e) => Err(e),
        }
    }

    /// Stops renewal and releases in the background (drop of a guard).
    pub(crate) fn release_in_background(self: &Arc<Self>) {
        self.locker.watchdog.remove(self.id);
        if self.snapshot().phase == Phase::Released {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                let held = self.clone();
                handle.spawn(async move {
                    if let Err(e) = held.release().await {
                        tracing::debug!(key = %crate::key::display_key(held.key.user()), error = %e, "background release of a dropped lock guard failed; the lease will expire");
                    }
                });
            }
            Err(_) => {
                self.mark_released();
                tracing::debug!(key = %crate::key::display_key(self.key.user()), "lock guard dropped outside a tokio runtime; the lease will expire");
            }
        }
    }

    pub(crate) async fn extend(&self, lease: Duration) -> Result<(), LockError> {
        crate::locker::validate_lease(lease)?;
        let _serial = self.renewing.lock().await;
        if !self.is_held() {
            return Err(self.lease_lost());
        }
        let sent_at = Instant::now();
        let item = Renewal {
            key: self.key.clone(),
            token: self.token.clone(),
            lease,
        };
        // Until the answer is in, the backend may hold either lease: if this future is dropped
        // or the call fails, assume the shorter one and have the watchdog renew at once.
        let mut unsure = UnsureLease {
            held: Some(self),
            sent_at,
            lease,
        };
        let answer = self
            .locker
            .call()
            .renew(std::slice::from_ref(&item))
            .await?;
        unsure.held = None;
        if answer.first() == Some(&true) {
            self.lease_ms.store(
                u64::try_from(lease.as_millis()).unwrap_or(u64::MAX),
                Ordering::Relaxed,
            );
            // The new lease may be shorter than the old one: the deadline follows it down.
            self.state.send_if_modified(|s| {
                if s.phase != Phase::Held {
                    return false;
                }
                s.valid_until = sent_at + lease.saturating_sub(drift(lease));
                true
            });
            self.locker
                .watchdog
                .rescheduled(self.id, sent_at + lease / 3);
            Ok(())
        } else {
            self.mark_lost("extend found the lock no longer ours");
            Err(self.lease_lost())
        }
    }

    pub(crate) fn lease_lost(&self) -> LockError {
        LockError::LeaseLost {
            key: self.key.user().to_owned(),
        }
    }
}

/// An `extend` whose outcome is unknown (dropped, or the call failed): the backend may now hold
/// the new lease, which may be shorter than the one the local deadline was computed from.
struct UnsureLease<'a> {
    held: Option<&'a Held>,
    sent_at: Instant,
    lease: Duration,
}

impl Drop for UnsureLease<'_> {
    fn drop(&mut self) {
        let Some(held) = self.held.take() else {
            return;
        };
        let until = self.sent_at + self.lease.saturating_sub(drift(self.lease));
        held.state.send_if_modified(|s| {
            if s.phase == Phase::Held && until < s.valid_until {
                s.valid_until = until;
                true
            } else {
                false
            }
        });
        held.locker.watchdog.rescheduled(held.id, Instant::now());
    }
}

/// Finishes a release whose future was dropped before the backend answered.
struct Unfinished<'a>(Option<&'a Arc<Held>>);

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if let Some(held) = self.0.take() {
            held.locker
                .release_later(held.key.clone(), held.token.clone());
        }
    }
}

/// An acquired lock. Dropping it releases the lock in the background; [`release`] does it now
/// and says whether the lock was still ours.
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
}

impl LockGuard {
    pub(crate) fn owned(held: Arc<Held>) -> Self {
        LockGuard {
            held,
            reentrant: false,
            done: false,
        }
    }

    pub(crate) fn reentrant(held: Arc<Held>) -> Self {
        LockGuard {
            held,
            reentrant: true,
            done: false,
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

    /// Whether this acquisition had to wait: its first attempt found the lock held.
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
        crate::scope::scoped(self.held.clone(), fut)
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
    /// not answer; the lease then expires on its own. A reentrant guard's release does nothing.
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
        if self.reentrant {
            return Ok(());
        }
        self.held.release().await
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
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
