//! The state of one held lock ([`Held`]), shared by its guard, the watchdog and `run`: where
//! the acquisition stands ([`Phase`]), its local validity deadline (lease minus [`drift`]),
//! loss, extension and release in the backend.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::LockError;
use crate::backend::{Kept, Renewal, Renewed, drift};
use crate::background;
use crate::engine::wait::PassOn;
use crate::engine::watched::Watched;
use crate::key::LockKey;
use crate::locker::LockerInner;
use crate::observe::{End, Holding, LossReason};
use crate::sync::Mutex;
use crate::token::Token;

/// How long after a lock handed over with a short lease arrives the watchdog renews it to the
/// full lease (see `Held::first_renewal`).
pub(crate) const HANDOVER_RENEWAL_DELAY: Duration = Duration::from_millis(5);

/// How long after it arrives a lock handed over with the short hand-over lease (3 s, for a
/// request whose own lease is longer) is renewed at the latest: a thirtieth of that lease. The
/// watchdog is not woken for it when it already looks at its table by then (it does while this
/// locker has such waiters): the waiter's return path takes no wake-up. Within the bound a
/// server stall of most of the hand-over lease is ridden out.
pub(crate) const HANDOVER_RENEWAL_BOUND: Duration = Duration::from_millis(100);

/// How long a parked lock's release at a runtime's shutdown may take (see
/// `Held::give_back_blocking`): the shutdown waits for it.
pub(crate) const GIVE_BACK_BOUND: Duration = Duration::from_secs(2);

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
    /// Whether it is observed (`Held::observe`): its end has something to tell.
    pub(crate) observed: bool,
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
    state: Watched<HoldState>,
    /// Renewal stops here (`max_hold`).
    pub(crate) renew_until: Option<Instant>,
    pub(crate) acquired_at: Instant,
    /// When the watchdog first renews: a third into the lease the backend set at acquisition, or
    /// at once for a lock handed over with a shorter lease than asked for.
    pub(crate) first_renewal: Instant,
    /// When it renews first at the latest: `first_renewal`, or for a lock handed over with a
    /// short lease [`HANDOVER_RENEWAL_BOUND`] after it arrived.
    pub(crate) first_renewal_by: Instant,
    /// Whether the first attempt found the lock busy.
    pub(crate) waited: bool,
    /// See [`Held::renewing`]; made when first needed (most locks are released before their
    /// first renewal).
    renewing: OnceLock<Arc<tokio::sync::Mutex<()>>>,
    /// The current holder of this lease, shared by every acquisition a local hand-off passed
    /// it through (same token, same lease in the backend; made at the first hand-off): what
    /// is learnt about the lease by an earlier holder (a renewal in flight, a loss) is
    /// forwarded to it, whichever holders in between are gone.
    current: OnceLock<Arc<Mutex<Weak<Held>>>>,
    /// The id of the idempotency "started" mark written under this acquisition (made at its
    /// first use): its reentrant guards share it (a nested call under the same key works
    /// inside its outer call's mark); an acquisition handed over locally (same token) gets
    /// its own, and it is made anew when a guard leaves a mark behind (see
    /// [`forget_mark`](Self::forget_mark)).
    mark: Mutex<Option<Token>>,
    /// Its span and metric labels while it is held (see [`observe`](Self::observe)); taken
    /// when it ends.
    obs: Mutex<Option<Holding>>,
    /// The class its metrics count it under (see [`class`](Self::class)): set when it is
    /// observed, or by the local hand-off that passed it; kept after it ends, for a renewal
    /// answered after its release.
    class: OnceLock<&'static str>,
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
    /// The id of this acquisition's "started" mark (see `mark`).
    pub(crate) fn mark_id(&self) -> Token {
        self.mark
            .lock()
            .get_or_insert_with(|| Token::new(true))
            .clone()
    }

    /// A guard left its mark behind (its outcome unknown): later marks under this acquisition
    /// take a new id, so they never take that one for their own.
    pub(crate) fn forget_mark(&self) {
        *self.mark.lock() = None;
    }

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
        // A lock handed over with a short lease is renewed to the full one soon after it
        // arrives: until then a server stall of a second or two would outlast it, where a lock
        // taken with the full lease rides out a stall of a whole lease. Not at once: the
        // renewal would compete with the hand-over itself for the CPU (the waiter's part of a
        // handoff measured 45-57 µs against 70-72 µs at once), and a hold shorter than the
        // delay needs none. Nor by waking the watchdog when it already ticks within the bound.
        let (first_renewal, first_renewal_by) = if first_lease < lease {
            (
                received_at + HANDOVER_RENEWAL_DELAY,
                received_at + HANDOVER_RENEWAL_BOUND,
            )
        } else {
            let at = sent_at + first_lease / 3;
            (at, at)
        };
        let state = Watched::new(HoldState {
            valid_until,
            phase: Phase::Held,
            observed: false,
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
            first_renewal,
            first_renewal_by,
            waited,
            renewing: OnceLock::new(),
            current: OnceLock::new(),
            mark: Mutex::new(None),
            obs: Mutex::new(None),
            class: OnceLock::new(),
        })
    }

    /// Local hand-off: passes this lock (token, lease in the backend, validity deadline) to
    /// another task of the same locker, which asked for `lease` (the watchdog renews with it
    /// from now on) and `max_hold`. This acquisition ends (released) and the lease's news goes
    /// to the new one, counted in metrics under the receiver's `class`. `None` when this one was
    /// no longer held: nothing is passed.
    /// `end`: how this acquisition's end is observed (`End::Passed`; `End::Released` when it
    /// is parked for the next request of the locker: released, to its caller). `waited`: the
    /// new acquisition's [`waited`](Self::waited): whether its request found the key held (a
    /// queued waiter did; a request that takes a parked lock as it arrives did not).
    pub(crate) fn pass_to(
        self: &Arc<Self>,
        lease: Duration,
        max_hold: Option<Duration>,
        class: &'static str,
        end: End,
        waited: bool,
    ) -> Option<Arc<Held>> {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1 << 62);
        let now = Instant::now();
        let current = self.current.get_or_init(Arc::default);
        let state = Watched::new(HoldState {
            valid_until: self.snapshot().valid_until,
            phase: Phase::Held,
            observed: false,
        });
        let next = Arc::new(Held {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            key: self.key.clone(),
            token: self.token.clone(),
            fence: None,
            locker: self.locker.clone(),
            lease_ms: AtomicU64::new(u64::try_from(lease.as_millis()).unwrap_or(u64::MAX)),
            state,
            renew_until: max_hold.map(|m| now + m),
            acquired_at: now,
            first_renewal: now,
            first_renewal_by: now,
            waited,
            renewing: OnceLock::from(self.renewing().clone()),
            current: OnceLock::from(current.clone()),
            mark: Mutex::new(None),
            obs: Mutex::new(None),
            class: OnceLock::from(class),
        });
        // From here a renewal answer or a loss that reaches this acquisition (or an earlier
        // holder of the lease) reaches `next` too; then this one ends. Had it been lost just
        // before, nothing is passed (`next`, known to nobody yet, ends quietly: this runs
        // under the wait queues' lock).
        *current.lock() = Arc::downgrade(&next);
        // Ends this acquisition only when it is passed: one lost meanwhile stays lost (its
        // release must say so, and release in the backend), one past its deadline is left to
        // the usual release (marking it lost here would take the wait queues' lock again).
        let mut passed = false;
        let mut observed = false;
        self.state.change(|s| {
            if s.phase == Phase::Held && now < s.valid_until {
                s.phase = Phase::Released;
                passed = true;
                observed = s.observed;
            }
            passed
        });
        if passed {
            if observed {
                self.end_observed(end);
            }
        } else {
            next.state.change(|s| {
                s.phase = Phase::Lost;
                true
            });
            return None;
        }
        Some(next)
    }

    /// The holder the lease was passed to since this acquisition, if any is alive.
    fn successor(&self) -> Option<Arc<Held>> {
        self.current
            .get()?
            .lock()
            .upgrade()
            .filter(|current| current.id != self.id)
    }

    /// Held by whoever is changing the lease in the backend (the watchdog's batch or an
    /// `extend`), so two renewals with different leases never race: the later PEXPIRE could
    /// otherwise shorten the lease behind the other's back. Shared with the successors of a
    /// local hand-off (one lease in the backend).
    pub(crate) fn renewing(&self) -> &Arc<tokio::sync::Mutex<()>> {
        self.renewing.get_or_init(Arc::default)
    }

    pub(crate) fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms.load(Ordering::Relaxed))
    }

    pub(crate) fn snapshot(&self) -> HoldState {
        self.state.get()
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
        if let Some(current) = self.successor() {
            current.apply_renewal(sent_at, lease);
        }
        self.apply_renewal(sent_at, lease);
    }

    fn apply_renewal(&self, sent_at: Instant, lease: Duration) {
        self.state.change(|s| {
            if s.phase != Phase::Held {
                return false;
            }
            // Outright, not only later: a renewal sets the backend's expiry to its lease from
            // when it ran, which may be sooner than before (a lock passed on locally to a task
            // that asked for a shorter lease). Renewals of one lock are serialized
            // (`renewing`), so the last one applied is the last one run.
            let until = sent_at + lease.saturating_sub(drift(lease));
            let changed = until != s.valid_until;
            s.valid_until = until;
            changed
        });
    }

    /// The lease is gone. Idempotent; a released lock is never marked lost (a lock passed on
    /// by a local hand-off tells its successor instead).
    pub(crate) fn mark_lost(&self, why: &str) {
        if let Some(current) = self.successor() {
            current.apply_loss(why);
        }
        self.apply_loss(why);
    }

    fn apply_loss(&self, why: &str) {
        let mut observed = false;
        let changed = self.state.change(|s| {
            if s.phase == Phase::Held {
                s.phase = Phase::Lost;
                observed = s.observed;
                true
            } else {
                false
            }
        });
        if changed {
            // In the held lock's span, when it has one.
            self.observed_span().in_scope(|| {
                tracing::warn!(key = %self.key.display(), reason = why, "lock lease lost");
            });
            if observed {
                self.end_observed(End::Lost(LossReason::of(why)));
            }
            #[cfg(test)]
            tests::LOST_NOT_YET_LEFT.reached(self);
            self.locker.watchdog.remove(self.id);
            self.locker.queues.holder_lost(self);
        }
    }

    /// Marks the lock released; returns the phase it was in.
    pub(crate) fn mark_released(&self) -> Phase {
        self.mark_released_observed().0
    }

    /// [`mark_released`](Self::mark_released), and the class the lock was observed under.
    fn mark_released_observed(&self) -> (Phase, Option<&'static str>) {
        let mut before = Phase::Released;
        let mut observed = false;
        self.state.change(|s| {
            before = s.phase;
            observed = s.observed;
            s.phase = Phase::Released;
            before != Phase::Released
        });
        let class = if before == Phase::Held && observed {
            self.end_observed(End::Released)
        } else {
            None
        };
        (before, class)
    }

    /// Starts observing this lock as held (its acquisition returned it): `holding` is kept
    /// until the lock ends, then told how. Not when it ended already (lost on its way to the
    /// caller): under the state's lock, so a transition either sees it or came first.
    pub(crate) fn observe(&self, holding: Holding) {
        self.state.change(|s| {
            if s.phase == Phase::Held {
                let _ = self.class.set(holding.class);
                holding.started();
                *self.obs.lock() = Some(holding);
                s.observed = true;
            }
            false
        });
    }

    /// The class this lock is counted under: the one it was observed under, or given by the
    /// local hand-off that passed it, also after it ended (a renewal in flight at its release
    /// is counted when its answer comes).
    pub(crate) fn class(&self) -> Option<&'static str> {
        self.class.get().copied()
    }

    /// Whether this acquisition was released and passed to nobody: a renewal answer for it
    /// no longer says anything about a held lease.
    pub(crate) fn released_for_good(&self) -> bool {
        // `pass_to` names its successor before it ends this acquisition: one seen released
        // here with no successor was released, not passed.
        self.snapshot().phase == Phase::Released && self.successor().is_none()
    }

    /// The held lock's span (`Span::none()` when not observed).
    fn observed_span(&self) -> tracing::Span {
        self.obs
            .lock()
            .as_ref()
            .map_or_else(tracing::Span::none, Holding::span)
    }

    /// This lock stopped being held (called by whoever moved it out of `Held`, once);
    /// returns the class it was observed under.
    fn end_observed(&self, end: End) -> Option<&'static str> {
        let holding = self.obs.lock().take()?;
        let class = holding.class;
        holding.ended(self.acquired_at, end);
        Some(class)
    }

    /// Resolves when the lease is lost (never, once released).
    pub(crate) async fn lost(&self) {
        let watch = self.state.watch();
        loop {
            let (s, changed) = watch.read();
            match s.phase {
                Phase::Lost => return,
                Phase::Released => std::future::pending::<()>().await,
                Phase::Held => {}
            }
            tokio::select! {
                () = changed => {}
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
        let watch = self.state.watch();
        loop {
            let (s, changed) = watch.read();
            if s.phase != Phase::Held {
                return;
            }
            tokio::select! {
                () = changed => {}
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
        if valid && self.locker.config.local.on {
            // Dropped while it asks the backend, the release is finished in the background
            // (in the backend: see `PassingOn`).
            let mut passing = PassingOn(Some(self));
            let passed = self.pass_on().await;
            passing.0 = None;
            match passed {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => return Err(e),
            }
        } else {
            self.locker.queues.holder_left(self);
        }
        self.release_in_backend(valid).await
    }

    /// The release in the backend, never passed on locally (`valid`: held until now by every
    /// local sign). Also how a parked lock whose grace ended goes back to the backend.
    pub(crate) async fn release_in_backend(self: &Arc<Self>, valid: bool) -> Result<(), LockError> {
        self.locker.watchdog.remove(self.id);
        let (before, class) = self.mark_released_observed();
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
        if matches!(ours, Ok(false)) && valid && before == Phase::Held {
            // Held until now by every local sign: the loss is learnt here.
            crate::observe::lost_at_release(
                &self.locker,
                class.unwrap_or(crate::observe::DEFAULT_CLASS),
                &self.key,
            );
        }
        match ours {
            Ok(true) if valid && before == Phase::Held => Ok(()),
            Ok(_) => Err(LockError::LeaseLost {
                key: self.key.user().to_owned(),
            }),
            Err(e) => Err(e),
        }
    }

    /// Local hand-off: `Ok(true)` when the lock was passed to a waiting task of this locker
    /// (this acquisition has ended), `Ok(false)` when it must be released in the backend.
    /// Past the bounds of local turns the backend is asked first whether a waiter of another
    /// process queues: if one does, the lock is released to it here (`Ok(true)` too).
    async fn pass_on(self: &Arc<Self>) -> Result<bool, LockError> {
        let queues = &self.locker.queues;
        match queues.pass_on(&self.locker, self, None) {
            PassOn::Passed => return Ok(true),
            PassOn::Release => return Ok(false),
            PassOn::AskBackend => {}
        }
        // Until the backend answered, the lock stays ours and renewed: if this future is
        // dropped meanwhile, the guard's release finishes in the background as usual.
        // Serialized with the watchdog's renewals: one in flight as this call gives the lock
        // away would find it gone and report a loss that is in fact this release.
        let serial = self.renewing().lock().await;
        queues.asking_backend(&self.key);
        // Read before the backend is asked: a `force_unlock` of this locker that ends after
        // this point may have removed the lock after the backend vouched for it.
        let forced = self.locker.forced();
        let answer = self
            .locker
            .call()
            .keep_if_alone(&self.key, &self.token)
            .await;
        // Held until this acquisition has ended (Released, NotOurs): a renewal let through
        // before that would find the lock given away and report it lost.
        match answer {
            Ok(Kept::Alone) => {
                drop(serial);
                let passed = queues.pass_on(&self.locker, self, Some(forced));
                match passed {
                    PassOn::Passed => Ok(true),
                    PassOn::Release | PassOn::AskBackend => {
                        queues.holder_left(self);
                        Ok(false)
                    }
                }
            }
            Ok(Kept::Released) => {
                queues.holder_left(self);
                self.locker.watchdog.remove(self.id);
                let before = self.mark_released();
                drop(serial);
                queues.wake_local(&self.key);
                if before == Phase::Held {
                    Ok(true)
                } else {
                    Err(self.lease_lost())
                }
            }
            Ok(Kept::NotOurs) => {
                queues.holder_left(self);
                self.locker.watchdog.remove(self.id);
                self.end_observed(End::Lost(LossReason::Release));
                self.mark_released();
                drop(serial);
                queues.wake_local(&self.key);
                Err(self.lease_lost())
            }
            Err(e) => {
                // Unknown: give it back the usual way (the release checks the token).
                tracing::debug!(key = %self.key.display(), error = %e, "asking for waiters of other processes failed; releasing");
                queues.holder_left(self);
                Ok(false)
            }
        }
    }

    /// A parked lock goes back to the backend (its grace ended, or it must go): released there,
    /// never passed on locally; at once on the memory backend, else in the background. Where no
    /// task can be spawned (no runtime, or one shutting down), see [`give_back_blocking`].
    ///
    /// [`give_back_blocking`]: Self::give_back_blocking
    pub(crate) fn give_back(self: &Arc<Self>) {
        let held = self.clone();
        let mut release = Box::pin(async move {
            let valid = held.is_held();
            if let Err(e) = held.release_in_backend(valid).await {
                tracing::debug!(key = %held.key.display(), error = %e, "giving a parked lock back failed; the lease will expire");
            }
        });
        let in_runtime = tokio::runtime::Handle::try_current().is_ok();
        if self.done_at_once(in_runtime, release.as_mut()) {
            return;
        }
        // A runtime shutting down drops a task spawned on it at once, unpolled (nothing of
        // the release ran): finished already, it is done on a thread of its own.
        match background::spawn(release) {
            Some(task) if !task.is_finished() => {}
            _ => self.give_back_blocking(),
        }
    }

    /// [`give_back`](Self::give_back) where no task can be spawned (the runtime the lock was
    /// parked on shuts down): the release runs on a thread of its own, on a runtime of its
    /// own, and this waits for it (at most [`GIVE_BACK_BOUND`]), so that a program that ends
    /// right after its last release does not leave the lock to its lease. Not while a
    /// current-thread runtime shuts down on this thread: its tasks, the backend's connection
    /// among them, are dropped one after the other by this very thread, so a release sent on
    /// that connection is answered (failed, then sent again on a new one) only once this drop
    /// returns; the thread finishes it then, unwaited for.
    pub(crate) fn give_back_blocking(self: &Arc<Self>) {
        let shutting_down_here = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread);
        if self.snapshot().phase == Phase::Released {
            return;
        }
        let held = self.clone();
        let thread = std::thread::Builder::new()
            .name("lock-give-back".into())
            .spawn(move || {
                let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    return;
                };
                runtime.block_on(async {
                    let valid = held.is_held();
                    let release = held.release_in_backend(valid);
                    if tokio::time::timeout(GIVE_BACK_BOUND, release).await.is_err() {
                        tracing::debug!(key = %held.key.display(), "giving a parked lock back at shutdown timed out; the lease will expire");
                    }
                });
            });
        if let Ok(thread) = thread
            && !shutting_down_here
        {
            let _ = thread.join();
        }
    }

    /// Polls a release once where it needs no I/O (an in-process backend, inside a runtime):
    /// whether it is done.
    fn done_at_once(
        &self,
        in_runtime: bool,
        release: std::pin::Pin<&mut (impl Future<Output = ()> + ?Sized)>,
    ) -> bool {
        self.locker.backend.in_process()
            && in_runtime
            && release
                .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
                .is_ready()
    }

    /// Stops renewal and releases in the background (drop of a guard).
    pub(crate) fn release_in_background(self: &Arc<Self>) {
        // Dropped on a thread outside any runtime (a `std::thread`, a foreign pool): the
        // release goes to the runtime this locker's watchdog runs on, while it runs, as from a
        // task of it. Not while the thread's runtime context is being torn down (its
        // thread-locals destroyed: entering a runtime there panics, in a destructor). Without
        // a runtime it is left to the lease (below).
        let (runtime, borrowed) = match tokio::runtime::Handle::try_current() {
            Ok(current) => (Some(current), false),
            Err(e) if e.is_missing_context() => (self.locker.watchdog.runtime(), true),
            Err(_) => (None, false),
        };
        let _entered = runtime
            .as_ref()
            .filter(|_| borrowed)
            .map(tokio::runtime::Handle::enter);
        let in_runtime = runtime.is_some();
        if self.snapshot().phase == Phase::Released {
            self.locker.watchdog.remove(self.id);
            return;
        }
        // A local hand-off needs no I/O: done here, at once. Not outside a runtime: the lock
        // passed on must be renewed, and the watchdog's task may have to start, which needs
        // one (it panicked in `Drop`); the waiter then takes the key when the lease ends.
        if self.locker.config.local.on
            && in_runtime
            && self.is_held()
            && matches!(
                self.locker.queues.pass_on(&self.locker, self, None),
                PassOn::Passed
            )
        {
            return;
        }
        // Not renewed from now on: this lock is on its way out (or, past the bounds of local
        // turns, to a task that renews it from the moment it has it).
        self.locker.watchdog.remove(self.id);
        let held = self.clone();
        let mut release = Box::pin(async move {
            if let Err(e) = held.release().await {
                tracing::debug!(key = %held.key.display(), error = %e, "background release of a dropped lock guard failed; the lease will expire");
            }
        });
        // Without I/O (memory) the release is done here, at once: the key is free when the drop
        // returns, for a lock taken right after it by this task or any other. It goes on in the
        // background only if it has to wait (a renewal in progress). Not outside a runtime
        // (none entered above): a lock passed on to a local waiter may start the watchdog's
        // task, which needs one.
        if self.done_at_once(in_runtime, release.as_mut()) {
            return;
        }
        if let Some(runtime) = runtime {
            drop(runtime.spawn(release));
        } else {
            self.locker.queues.holder_left(self);
            self.mark_released();
            tracing::debug!(key = %self.key.display(), "lock guard dropped outside a tokio runtime, with no runtime of its locker running; the lease will expire");
        }
    }

    pub(crate) async fn extend(&self, lease: Duration) -> Result<(), LockError> {
        crate::locker::validate_lease(lease)?;
        let _serial = self.renewing().lock().await;
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
        match answer.first() {
            Some(Renewed::Yes) => {}
            Some(Renewed::Lost) => {
                unsure.held = None;
                self.mark_lost("extend found the lock no longer ours");
                return Err(self.lease_lost());
            }
            // Undecided (too few servers answered): the backend may hold either lease, as
            // when the call failed; `unsure` has the watchdog renew at once.
            _ => return Err(LockError::undecided("extend", self.key.user())),
        }
        unsure.held = None;
        self.lease_ms.store(
            u64::try_from(lease.as_millis()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        // The new lease may be shorter than the old one: the deadline follows it down.
        self.state.change(|s| {
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
        held.state.change(|s| {
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

/// A release dropped while its local hand-off asks the backend: finished in the background,
/// in the backend only. `keep.lua` may have run already and given the lock to another
/// process's waiter, so it is never passed to a local task from here (that task would hold it
/// beside that process); the backend's release checks the token, and the local waiters are
/// woken to take their turn through the backend.
struct PassingOn<'a>(Option<&'a Arc<Held>>);

impl Drop for PassingOn<'_> {
    fn drop(&mut self) {
        if let Some(held) = self.0.take() {
            held.locker.queues.holder_left(held);
            held.locker.watchdog.remove(held.id);
            if held.mark_released() != Phase::Released {
                held.locker
                    .release_later(held.key.clone(), held.token.clone());
            }
            held.locker.queues.wake_local(&held.key);
        }
    }
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if let Some(held) = self.0.take() {
            held.locker
                .release_later(held.key.clone(), held.token.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::test_support::{
        BOUND, Hook, HookPoint, passing_locally, released_lost_and_not_passed, within,
    };
    use crate::{Locker, MemoryBackend};

    /// Reached right after a lock is marked lost and before the local queue hears of it
    /// (`holder_lost`).
    pub(super) static LOST_NOT_YET_LEFT: HookPoint = HookPoint::new();

    /// A lease brought down while tasks wait on `lost()` and `ended()` (the only deadline they
    /// sleep to is the old one, 30 s) wakes them, and they end at the new deadline, whichever
    /// way it came down: an `extend` to a shorter lease, an `extend` whose answer never came,
    /// a renewal with a shorter lease (a local successor's). Fails if any of these changes
    /// does not wake the watchers (found by review: a waiting `lost()` slept on to the old
    /// deadline, and `run` kept its body running past the lease, with every other test green).
    #[tokio::test(start_paused = true)]
    async fn every_way_a_lease_comes_down_wakes_lost_and_ended() {
        const SHORT: Duration = Duration::from_millis(300);
        for way in ["extend", "unsure extend", "renewal"] {
            let locker = Locker::builder(MemoryBackend::new())
                .lease(Duration::from_secs(30))
                .watchdog(false)
                .build();
            let guard = locker.lock("comes-down").await.unwrap();
            let held = guard.held().clone();
            let lost = tokio::spawn({
                let held = held.clone();
                async move {
                    held.lost().await;
                    Instant::now()
                }
            });
            let ended = tokio::spawn({
                let held = held.clone();
                async move {
                    held.ended().await;
                    Instant::now()
                }
            });
            within(async {
                while held.state.watchers() < 2 {
                    tokio::task::yield_now().await;
                }
            })
            .await;
            let lowered_at = Instant::now();
            match way {
                "extend" => guard.extend(SHORT).await.unwrap(),
                "unsure extend" => drop(UnsureLease {
                    held: Some(&held),
                    sent_at: lowered_at,
                    lease: SHORT,
                }),
                _ => held.renewed(lowered_at, SHORT),
            }
            for (what, watcher) in [("lost()", lost), ("ended()", ended)] {
                // Paused time jumps to the next timer: the new deadline if the watcher heard
                // of it, else this bound, long before the old deadline.
                let at = tokio::time::timeout(Duration::from_secs(5), watcher)
                    .await
                    .unwrap_or_else(|_| panic!("{way}: {what} slept past the lowered deadline"))
                    .unwrap();
                assert!(at <= lowered_at + SHORT, "{way}: {what} ended late");
            }
            assert!(!guard.is_held(), "{way}");
        }
    }

    /// A lock passed on locally twice keeps one renewal serial for all its holders (two
    /// renewals with different leases never race), and a renewal or a loss that reaches the
    /// first holder reaches the last (one chain). Fails if a successor gets a serial or a
    /// chain of its own (found by review: no test looked at either).
    #[tokio::test]
    async fn a_lock_passed_on_twice_keeps_one_serial_and_one_chain() {
        let locker = Locker::builder(MemoryBackend::new())
            .lease(Duration::from_secs(30))
            .watchdog(false)
            .build();
        let guard = locker.lock("lineage").await.unwrap();
        let first = guard.held().clone();
        let second = first
            .pass_to(Duration::from_secs(30), None, "test", End::Passed, true)
            .expect("passed");
        let third = second
            .pass_to(Duration::from_secs(30), None, "test", End::Passed, true)
            .expect("passed again");
        assert!(Arc::ptr_eq(first.renewing(), second.renewing()));
        assert!(Arc::ptr_eq(second.renewing(), third.renewing()));
        let before = third.snapshot().valid_until;
        first.renewed(Instant::now(), Duration::from_secs(3));
        assert!(
            third.snapshot().valid_until < before,
            "a renewal answered for the first holder must reach the last"
        );
        first.mark_lost("the test marks it lost");
        assert_eq!(third.snapshot().phase, Phase::Lost);
        assert_eq!(second.snapshot().phase, Phase::Released);
    }

    /// A lock dropped on a thread outside any runtime, when no runtime of its locker runs any
    /// more (its watchdog's task ran on one since shut down), is not passed on to a local
    /// waiter there: the lock passed on must be renewed, and starting the watchdog's task needs
    /// a runtime (it panicked in `Drop`; found by review). The release is left to the lease,
    /// and a waiter takes the key from the backend when it ends.
    #[test]
    fn a_lock_dropped_outside_any_running_runtime_is_not_passed_on_there() {
        const KEY: &str = "no-runtime-left";
        let locker = Locker::builder(MemoryBackend::new())
            .lease(Duration::from_secs(2))
            .local_hold(Duration::from_secs(30))
            .build();
        // The watchdog's task starts on `first`, runs there, and ends when it shuts down.
        let first = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        first.block_on(async {
            let warm = locker.lock("warm").await.unwrap();
            warm.release().await.unwrap();
        });
        let second = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (holder, mut handed) = second.block_on(passing_locally(&locker, KEY, 4));
        first.shutdown_timeout(BOUND);
        assert!(
            locker.inner.watchdog.runtime().is_none(),
            "the watchdog's task ended"
        );
        let passes = locker.stats().local_handoffs;
        let dropped = std::thread::spawn(move || drop(holder)).join();
        assert!(dropped.is_ok(), "dropping the guard panicked");
        let next = second.block_on(within(handed.recv())).unwrap().unwrap();
        assert_eq!(
            locker.stats().local_handoffs,
            passes,
            "passed on outside a runtime"
        );
        second.block_on(next.release()).unwrap();
    }

    /// A `force_unlock` of this locker that ends while a release asks the backend whether it may
    /// keep the lock (`keep.lua`): the backend's "ours, nobody waits" may be from before the
    /// removal, so the lock is neither passed on nor parked on it; the release goes to the
    /// backend. Fails if the generation read before asking is not checked when the answer is
    /// applied (the lock was passed: two holders once another locker takes the key).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_force_unlock_that_ends_while_the_backend_is_asked_stops_the_pass() {
        const KEY: &str = "forced-while-asked";
        let locker = Locker::builder(MemoryBackend::new())
            .lease(Duration::from_secs(30))
            .local_hold(Duration::from_secs(30))
            .build();
        let (holder, handed) = passing_locally(&locker, KEY, 4).await;
        let held = holder.held().clone();
        // As `Held::pass_on` does: the generation is read before the backend is asked ...
        let forced = locker.inner.forced();
        // ... and the force ends before its answer is applied.
        assert!(locker.force_unlock(KEY).await.unwrap().is_some());
        let passes = locker.stats().local_handoffs;
        let outcome = locker
            .inner
            .queues
            .pass_on(&locker.inner, &held, Some(forced));
        assert!(
            matches!(outcome, PassOn::Release),
            "passed on a vouch from before the force_unlock: {outcome:?}"
        );
        assert_eq!(locker.stats().local_handoffs, passes);
        released_lost_and_not_passed((holder, handed), &locker, passes).await;
    }

    /// A release that checked its lock was held, then passes it on to a local waiter just as
    /// the lock is marked lost, before the local queue heard of the loss: the lock is not
    /// passed (`pass_to` looks at the phase under the queues' lock), and the release reports
    /// the loss. Fails if `pass_to` passes a lock whatever its phase (found by a mutation
    /// audit: no test reached this gap).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lock_lost_as_it_is_passed_on_is_not_passed() {
        const KEY: &str = "lost-as-passed";
        let locker = Locker::builder(MemoryBackend::new())
            .lease(Duration::from_secs(30))
            .local_hold(Duration::from_secs(30))
            .build();
        let (holder, handed) = passing_locally(&locker, KEY, 4).await;
        let (passed_tx, passed) = std::sync::mpsc::channel();
        let target = holder.held().clone();
        let hook: Hook = Box::new(move |held: &Held| {
            assert_eq!(held.id, target.id);
            let outcome = target.locker.queues.pass_on(&target.locker, &target, None);
            let _ = passed_tx.send(matches!(outcome, PassOn::Passed));
        });
        LOST_NOT_YET_LEFT.set(KEY, hook);
        let passes = locker.stats().local_handoffs;
        holder.held().mark_lost("the test marks it lost");
        assert!(
            !passed.try_recv().expect("the hook ran"),
            "a lock marked lost was passed on to a local waiter"
        );
        assert_eq!(locker.stats().local_handoffs, passes);
        // The waiters left take the key through the backend, not as a pass of the lost lock.
        released_lost_and_not_passed((holder, handed), &locker, passes).await;
    }
}
