//! The local wait queue: within one locker, waiters for one key queue up in arrival order and
//! only the head contends in the backend, where it keeps a ticket in the key's queue so that a
//! release can hand it the lock directly.
//!
//! Local hand-off (lock cohorting): while a task of this locker holds the key, the head does not
//! contend in the backend at all; the holder's release passes the lock (its token and lease in
//! the backend) straight to the head, for at most `local_turns` turns in a row and `local_hold`
//! from the backend acquisition. Past either bound the holder asks the backend whether a waiter
//! of another process queues: if one does the lock goes to it, otherwise the turns start again.
//!
//! Grace (issue 34): a holder of a hot key (in a run of local turns: passed between this
//! locker's tasks, or taken parked, since the backend last vouched for it) that releases while
//! no local waiter queues does not give the lock back to the backend at once: it *parks* it in
//! the queue for `local_grace`, under the same conditions as a local turn (no other process
//! known to wait). It asks the backend first (`keep.lua`, one round trip, as the release it
//! stands for): the lock is parked only on the backend's word that it is still ours and that
//! no other process queues (one that does gets the lock), so a release never says `Ok` for a
//! lost lock it parks, and the bounds of local turns start again. A request of this locker that arrives meanwhile takes it as a local
//! turn ([`WaitQueues::arrive`]); a request that may not (fenced, fair, without the watchdog),
//! the grace's end ([`Keeper`]), a loss, or the runtime's shutdown gives it back to the
//! backend. Tasks that await between one lock and the next thus keep a hot key in the process
//! instead of taking it through the backend each time the local queue drains.
//!
//! The head hears through the queue's inbox: a handover or release message (one subscription per
//! locker and key, made when the queue forms and dropped [`LINGER`] after it empties, so a burst
//! of contention subscribes once), a release through this locker; and it tries again when the
//! holder's remaining lease runs out (a key that expires publishes nothing). A waiter that times
//! out, is dropped or whose task is aborted leaves the queue in its `Drop`, handing the turn on.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use std::time::Duration;

use tokio::sync::{Mutex as AsyncMutex, Notify};
use tokio::time::Instant;

use crate::backend::Inbox;
use crate::background;
use crate::engine::held::Held;
use crate::key::LockKey;
use crate::locker::LockerInner;
use crate::observe::End;
use crate::sync::{Mutex, MutexGuard};

/// How long an emptied queue keeps its release subscription for the next waiter.
pub(crate) const LINGER: Duration = Duration::from_millis(250);

#[derive(Debug, Default)]
pub(crate) struct WaitQueues {
    by_key: Mutex<HashMap<String, Queue>>,
}

#[derive(Debug)]
struct Queue {
    waiters: VecDeque<Waiter>,
    /// Where the head hears of releases and handovers (notifications and local releases).
    inbox: Arc<Inbox>,
    /// The queue's release subscription: whether the backend confirmed it.
    subscription: Arc<Subscription>,
    /// When the queue last emptied; `None` while anyone waits. It is removed (with its
    /// subscription) once it has stayed empty for [`LINGER`].
    idle_since: Option<Instant>,
    /// The runtime of the last [`Sweeper`] started for this queue, while it watches: a key
    /// whose queue empties at every release (one waiter at a time) does not start a task each
    /// time. An emptying on another runtime starts one there: the first may sit on a runtime
    /// that is no longer driven.
    swept: Option<tokio::runtime::Id>,
    /// The acquisition of this locker that holds the key and may pass it to the head.
    holder: Option<Cohort>,
    /// A lock passed to the head and not taken yet: the waiter's id and the lock.
    handed: Option<(u64, Arc<Held>)>,
    /// A hot lock released with nobody queued here, kept for the next local request.
    parked: Option<Parked>,
    /// The runtime of the last [`Keeper`] started for this queue, while it watches.
    keeper: Option<tokio::runtime::Id>,
}

/// A lock parked in its queue for the grace (see the module docs): still held in the backend
/// and renewed by the watchdog, by an acquisition nobody holds (`lock`, the queue's `holder`).
#[derive(Debug)]
struct Parked {
    lock: Arc<Held>,
    /// When the grace ends: the lock goes back to the backend.
    until: Instant,
}

/// What a request of this locker finds for its key when it arrives (see
/// [`WaitQueues::arrive`]).
#[derive(Debug)]
pub(crate) enum Arrival {
    /// Nobody here holds or queues for it: contend in the backend.
    Free,
    /// A task of this locker holds it, or waiters queue: queue here.
    Busy,
    /// The parked lock, taken as a local turn.
    Taken(Arc<Held>),
    /// The parked lock, which this request may not take (or may not any more): give it back
    /// to the backend, then contend there.
    GiveBack(Arc<Held>),
}

/// A queue's release subscription: not asked for yet, confirmed by the backend, or failed.
#[derive(Debug, Default)]
struct Subscription {
    /// One request to the backend at a time (a head's, or one made again in the background).
    attempt: Arc<AsyncMutex<()>>,
    /// [`NOT_ASKED`], [`CONFIRMED`] or [`FAILED`].
    state: std::sync::atomic::AtomicU8,
}

const NOT_ASKED: u8 = 0;
const CONFIRMED: u8 = 1;
const FAILED: u8 = 2;

impl Subscription {
    fn confirmed(&self) -> bool {
        self.state.load(Ordering::Acquire) == CONFIRMED
    }

    fn answered(&self, confirmed: bool) {
        let state = if confirmed { CONFIRMED } else { FAILED };
        self.state.store(state, Ordering::Release);
    }
}

/// This locker's holder of a key, and how long the key has stayed in the locker.
#[derive(Debug, Clone)]
struct Cohort {
    /// The holder's acquisition ([`Held::id`]).
    held: u64,
    /// The holder itself: a head waiting for it to pass the lock watches its validity deadline
    /// (a holder that stops renewing, without a watchdog, past its `max_hold` or hung, loses
    /// its lease in the backend without anyone marking it lost).
    lock: Weak<Held>,
    /// Local hand-offs since the lock was taken in the backend (or since the backend was last
    /// asked for waiters of other processes).
    turns: u32,
    since: Instant,
    /// The locker's force generation ([`LockerInner::forced`]) read before the backend last
    /// vouched for the lock: a `force_unlock` of this locker that ended since may have removed
    /// it, and no local turn is passed (or parked lock taken) until the backend vouched again.
    forced: u64,
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    turn: Arc<Notify>,
    /// What the waiter asked for, when it may receive a lock by local hand-off.
    receives: Option<Receives>,
}

/// The lease and `max_hold` of a waiter that may take a lock passed by local hand-off.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Receives {
    pub(crate) lease: Duration,
    pub(crate) max_hold: Option<Duration>,
    /// The waiter's class (its metrics' label).
    pub(crate) class: &'static str,
}

/// What a releasing holder does with its lock (see [`WaitQueues::pass_on`]).
#[derive(Debug)]
pub(crate) enum PassOn {
    /// Passed to the head of the local queue: nothing to do in the backend.
    Passed,
    /// A bound of local turns was reached: ask the backend whether another process waits.
    AskBackend,
    /// Release it in the backend.
    Release,
}

/// What a waiter of the local queue learnt while waiting for a local hand-off.
#[derive(Debug)]
pub(crate) enum Local {
    /// The lock, passed by this locker's holder.
    Handed(Arc<Held>),
    /// No task of this locker holds the key (any more): contend in the backend.
    NotHeldHere,
    /// The deadline passed.
    TimedOut,
}

impl WaitQueues {
    fn map(&self) -> MutexGuard<'_, HashMap<String, Queue>> {
        self.by_key.lock()
    }

    /// A request for `key` arrives (`receives`: it may take a lock passed by local hand-off):
    /// whether any local waiter queues for it, or a task of this locker holds it and may pass
    /// it on (a new request then queues here without trying the backend); a parked lock is
    /// taken, or handed back to be given back to the backend.
    pub(crate) fn arrive(
        &self,
        inner: &Arc<LockerInner>,
        key: &LockKey,
        receives: Option<Receives>,
    ) -> Arrival {
        let mut map = self.map();
        let Some(q) = map.get_mut(key.name()) else {
            return Arrival::Free;
        };
        // Taken as the request arrives: it found the key free here, and did not wait.
        match take_parked(q, inner, receives, false) {
            Some(Ok(next)) => Arrival::Taken(next),
            Some(Err(parked)) => Arrival::GiveBack(parked),
            None if !q.waiters.is_empty() || q.holder.is_some() => Arrival::Busy,
            None => Arrival::Free,
        }
    }

    /// Takes out the lock parked for `key`, if any, to be given back to the backend (a
    /// request that may never take it, a fair one, arrives).
    pub(crate) fn unpark(&self, key: &LockKey) -> Option<Arc<Held>> {
        let mut map = self.map();
        let q = map.get_mut(key.name())?;
        let parked = q.parked.take()?;
        if q.holder.as_ref().is_some_and(|c| c.held == parked.lock.id) {
            q.holder = None;
        }
        Some(parked.lock)
    }

    /// An acquisition of `key` by this locker: when a local queue exists for the key, the new
    /// holder is noted there, and may pass the lock to the queue (`giver`).
    pub(crate) fn note_holder(&self, held: &Arc<Held>, giver: bool) {
        if let Some(q) = self.map().get_mut(held.key.name()) {
            // No turn yet: the backend is asked before the first (whatever `forced` says).
            q.holder = giver.then(|| Cohort {
                held: held.id,
                lock: Arc::downgrade(held),
                turns: 0,
                since: Instant::now(),
                forced: 0,
            });
        }
    }

    /// The holder `held` lost its lock: the head must contend in the backend again. A parked
    /// lock lost is given to nobody: it is dropped (its release in the backend, which checks
    /// the token, cleans up in case the key still holds it).
    pub(crate) fn holder_lost(&self, held: &Held) {
        let mut map = self.map();
        let Some(q) = map.get_mut(held.key.name()) else {
            return;
        };
        if q.holder.as_ref().is_some_and(|c| c.held == held.id) {
            q.holder = None;
            q.inbox.wake();
        }
        let lost = match &q.parked {
            Some(p) if p.lock.id == held.id => q.parked.take(),
            _ => None,
        };
        drop(map);
        if let Some(parked) = lost {
            parked.lock.give_back();
        }
    }

    /// The holder `held` is releasing: passes the lock to the local queue's head when the
    /// head may take it and the bounds allow (see the module docs), else says what to do.
    /// `asked` when the backend just answered that no other process waits (and the lock is
    /// ours): the bounds start again; it holds the locker's force generation read before the
    /// backend was asked.
    pub(crate) fn pass_on(
        &self,
        inner: &Arc<LockerInner>,
        held: &Arc<Held>,
        asked: Option<u64>,
    ) -> PassOn {
        let mut map = self.map();
        let Some(q) = map.get_mut(held.key.name()) else {
            return PassOn::Release;
        };
        let Some(mut cohort) = q.holder.clone().filter(|c| c.held == held.id) else {
            return PassOn::Release;
        };
        if asked.is_some_and(|forced| forced != inner.forced()) {
            // A `force_unlock` of this locker ended while the backend was asked: its answer
            // may be from before the removal. Neither passed nor parked: released in the
            // backend, whose answer (the token compared) says whether it was still ours.
            q.holder = None;
            return PassOn::Release;
        }
        let head = q.waiters.front().and_then(|w| Some((w.id, w.receives?)));
        let Some((head, receives)) = head.filter(|_| q.handed.is_none()) else {
            let (outcome, keeper) = park(q, inner, held, cohort, asked);
            drop(map);
            if keeper {
                Keeper::start(inner, &held.key);
            }
            return outcome;
        };
        let local = inner.config.local;
        if held.renewing().try_lock().is_err() {
            // A lease change or a result store is in flight for this lock: let the caller
            // wait for it (the backend is asked, which waits), never pass the lock under it.
            return PassOn::AskBackend;
        }
        // The backend is asked (one round trip) before the first local turn of a run (a fair
        // waiter may queue there already), whenever a fair waiter announced itself since, while
        // such announcements could be missed (no confirmed subscription), and at the bounds.
        // And after a `force_unlock` of this locker (the lock may be gone).
        let heard = q.subscription.confirmed() && inner.backend.notifications_healthy();
        if let Some(forced) = asked {
            cohort.turns = 0;
            cohort.since = Instant::now();
            cohort.forced = forced;
        } else if cohort.turns == 0
            || !heard
            || q.inbox.fair_waiting()
            || cohort.turns >= local.turns
            || cohort.since.elapsed() >= local.hold
            || cohort.forced != inner.forced()
        {
            return PassOn::AskBackend;
        }
        // To a queued waiter: it waited.
        let passed = held.pass_to(
            receives.lease,
            receives.max_hold,
            receives.class,
            End::Passed,
            true,
        );
        let Some(next) = passed else {
            q.holder = None;
            return PassOn::Release;
        };
        // Renewed within a tenth of its lease at the latest (not a third): a lock passed
        // without asking the backend learns sooner of a loss behind its back (data lost on the
        // server, the key deleted), even when the task it is passed to holds it long. Not
        // sooner: the watchdog renews every lock due within a tenth of its lease together, so
        // an earlier bound would have each hot key's passes renew every other hot key.
        let renew_by = Instant::now() + next.lease() / 10;
        inner.watchdog.transfer(inner, held.id, &next, renew_by);
        q.holder = Some(Cohort {
            held: next.id,
            lock: Arc::downgrade(&next),
            turns: cohort.turns + 1,
            since: cohort.since,
            forced: cohort.forced,
        });
        q.handed = Some((head, next));
        q.inbox.wake();
        inner.local_handoffs.fetch_add(1, Ordering::Relaxed);
        PassOn::Passed
    }

    /// The backend is about to be asked whether anyone queues for `key`: fair waiters that
    /// announced themselves before are in its answer.
    pub(crate) fn asking_backend(&self, key: &LockKey) {
        if let Some(q) = self.map().get(key.name()) {
            q.inbox.clear_fair_waiting();
        }
    }

    /// The holder `held` gave the lock back to the backend (or lost it): no longer a holder.
    pub(crate) fn holder_left(&self, held: &Held) {
        if let Some(q) = self.map().get_mut(held.key.name())
            && q.holder.as_ref().is_some_and(|c| c.held == held.id)
        {
            q.holder = None;
        }
    }

    /// How many keys have local waiters.
    pub(crate) fn waiting_keys(&self) -> usize {
        self.map()
            .values()
            .filter(|q| !q.waiters.is_empty())
            .count()
    }

    /// How many keys with local waiters hear of releases now (their subscription confirmed,
    /// the backend's notifications healthy).
    pub(crate) fn notified_keys(&self, healthy: bool) -> usize {
        if !healthy {
            return 0;
        }
        self.map()
            .values()
            .filter(|q| !q.waiters.is_empty() && q.subscription.confirmed())
            .count()
    }

    /// Whether any key has local waiters.
    pub(crate) fn has_waiters(&self) -> bool {
        self.map().values().any(|q| !q.waiters.is_empty())
    }

    /// How many local waiters there are in all.
    pub(crate) fn waiters(&self) -> usize {
        self.map().values().map(|q| q.waiters.len()).sum()
    }

    /// A lock of this locker was released: wake the key's head at once.
    pub(crate) fn wake_local(&self, key: &LockKey) {
        if let Some(q) = self.map().get(key.name()).filter(|q| !q.waiters.is_empty()) {
            q.inbox.wake();
        }
    }

    /// Joins the queue of `key` at its tail; `receives` when the waiter may take a lock passed
    /// by local hand-off.
    pub(crate) fn join(
        &self,
        locker: &Arc<LockerInner>,
        key: &LockKey,
        receives: Option<Receives>,
    ) -> Ticket {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        let turn = Arc::new(Notify::new());
        let mut map = self.map();
        let q = map.entry(key.name().to_owned()).or_insert_with(|| Queue {
            waiters: VecDeque::new(),
            inbox: Arc::new(Inbox::default()),
            subscription: Arc::default(),
            idle_since: None,
            swept: None,
            holder: None,
            handed: None,
            parked: None,
            keeper: None,
        });
        q.idle_since = None;
        // A lock parked since this waiter's request arrived: taken as its local turn (this
        // waiter is the head), or given back to the backend.
        // This waiter's request found the key held here (it queues): it waited.
        let give_back = match take_parked(q, locker, receives, true) {
            Some(Ok(next)) => {
                q.handed = Some((id, next));
                None
            }
            Some(Err(parked)) => Some(parked),
            None => None,
        };
        q.waiters.push_back(Waiter {
            id,
            turn: turn.clone(),
            receives,
        });
        let (inbox, subscription) = (q.inbox.clone(), q.subscription.clone());
        drop(map);
        if let Some(parked) = give_back {
            parked.give_back();
        }
        Ticket {
            locker: locker.clone(),
            key: key.clone(),
            id,
            turn,
            inbox,
            subscription,
        }
    }
}

/// The holder `held` releases and no local waiter may take the lock: parks it for the grace
/// when the key is hot here and no other process is known to wait (see the module docs), else
/// says what to do. `cohort`: the holder's, `asked` as in [`WaitQueues::pass_on`]. Also
/// returns whether a [`Keeper`] must be started for the queue.
fn park(
    q: &mut Queue,
    inner: &Arc<LockerInner>,
    held: &Arc<Held>,
    mut cohort: Cohort,
    asked: Option<u64>,
) -> (PassOn, bool) {
    let local = inner.config.local;
    // Hot: in a run of local turns (the lock was passed between this locker's tasks, or taken
    // parked, since the backend last vouched for it), or the backend just answered that nobody
    // else queues, at the bounds of such a run. Not a lock taken from the backend and released
    // with nobody here to pass it to: a single task that waited for another process's holder
    // makes no cohort, and its release goes to the backend as before. Heard: a fair waiter of
    // another process announcing itself during the grace is heard.
    // On a runtime that runs on its own (multi-thread): its keeper gives a parked lock back at
    // the grace's end. There is none to run one outside a runtime (a future polled by another
    // executor; review 38, hole 4), and a current-thread runtime runs its tasks only while a
    // `block_on` drives it: one kept but not driven after the release (a sync facade's
    // `block_on` per request) left its parked lock to its lease, its keeper, watchdog and
    // connection all waiting on it. There the release goes to the backend, as without a grace.
    let heard = q.subscription.confirmed() && inner.backend.notifications_healthy();
    let runtime = tokio::runtime::Handle::try_current()
        .ok()
        .filter(|h| h.runtime_flavor() != tokio::runtime::RuntimeFlavor::CurrentThread)
        .map(|h| h.id());
    let parkable = !local.grace.is_zero()
        && runtime.is_some()
        && (asked.is_some() || cohort.turns > 0)
        && q.waiters.is_empty()
        && q.handed.is_none()
        && q.parked.is_none()
        && heard
        && !q.inbox.fair_waiting();
    if !parkable {
        q.holder = None;
        return (PassOn::Release, false);
    }
    if held.renewing().try_lock().is_err() {
        // As for a pass: never parked under a lease change or a result store in flight.
        return (PassOn::AskBackend, false);
    }
    // Parked only on the backend's word, just given: the lock is still ours and no other
    // process queues for it. A release that parks its lock tells its caller `Ok`, and nobody
    // holds a parked lock to learn of a loss later: without that word, a lock lost behind its
    // holder's back (an operator's `DEL`, a `FLUSHALL`, a `force_unlock`) would be parked and
    // reported released (review 38, hole 1). The backend is asked first (one round trip, as
    // the release it stands for); the release then says `LeaseLost` for a lost lock, or parks
    // it with the bounds of local turns starting again (a waiter of another process queued
    // there was given the lock by the asking).
    let Some(forced) = asked else {
        return (PassOn::AskBackend, false);
    };
    let now = Instant::now();
    cohort.turns = 0;
    cohort.since = now;
    cohort.forced = forced;
    // The grace ends by the bound of local hold: a waiter of another process, served at the
    // bounds, waits no longer than without a grace.
    let until = (now + local.grace).min(cohort.since + local.hold);
    let class = held.class().unwrap_or(crate::observe::DEFAULT_CLASS);
    // Renewed up to the grace's end only: a parked lock whose keeper never runs (its runtime
    // not driven) expires on its own.
    let max_hold = until.saturating_duration_since(now);
    // Held by nobody (`waited` is the taker's, given when it is taken).
    let parked = held.pass_to(held.lease(), Some(max_hold), class, End::Released, false);
    let Some(parked) = parked else {
        q.holder = None;
        return (PassOn::Release, false);
    };
    inner
        .watchdog
        .transfer(inner, held.id, &parked, now + parked.lease() / 10);
    q.holder = Some(Cohort {
        held: parked.id,
        lock: Arc::downgrade(&parked),
        turns: cohort.turns,
        since: cohort.since,
        forced: cohort.forced,
    });
    q.parked = Some(Parked {
        lock: parked,
        until,
    });
    let keeper = q.keeper != runtime;
    if keeper {
        q.keeper = runtime;
    }
    (PassOn::Passed, keeper)
}

/// Takes the lock parked in `q`, if any: `Ok` with the lock passed to a request that may take
/// it (`receives`) as a local turn, within the grace, the bounds and while no other process is
/// known to wait; `Err` with the parked lock otherwise, to be given back to the backend (also
/// one lost meanwhile). `waited`: whether the request found the key held (review 38, hole 3:
/// a `try_lock` that took a parked lock said it had waited, and lock-tower counted a wait).
fn take_parked(
    q: &mut Queue,
    inner: &Arc<LockerInner>,
    receives: Option<Receives>,
    waited: bool,
) -> Option<Result<Arc<Held>, Arc<Held>>> {
    let parked = q.parked.take()?;
    // The parked lock's own note as holder goes with it, whatever comes next.
    let cohort = q.holder.take_if(|c| c.held == parked.lock.id);
    let heard = q.subscription.confirmed() && inner.backend.notifications_healthy();
    let local = inner.config.local;
    let taker = receives.zip(cohort).filter(|(_, cohort)| {
        q.waiters.is_empty()
            && q.handed.is_none()
            && heard
            && !q.inbox.fair_waiting()
            && Instant::now() < parked.until
            && cohort.turns < local.turns
            && cohort.forced == inner.forced()
    });
    let Some((receives, cohort)) = taker else {
        return Some(Err(parked.lock));
    };
    if parked.lock.renewing().try_lock().is_err() {
        // A renewal in flight (the watchdog's): never passed under it.
        return Some(Err(parked.lock));
    }
    let passed = parked.lock.pass_to(
        receives.lease,
        receives.max_hold,
        receives.class,
        End::Passed,
        waited,
    );
    // Lost (or past its validity) while parked: given to nobody.
    let Some(next) = passed else {
        return Some(Err(parked.lock));
    };
    let renew_by = Instant::now() + next.lease() / 10;
    inner
        .watchdog
        .transfer(inner, parked.lock.id, &next, renew_by);
    q.holder = Some(Cohort {
        held: next.id,
        lock: Arc::downgrade(&next),
        turns: cohort.turns + 1,
        since: cohort.since,
        forced: cohort.forced,
    });
    // In use: the queue (and its subscription) stays while the key is hot, though nobody
    // joins it.
    if q.idle_since.is_some() {
        q.idle_since = Some(Instant::now());
    }
    inner.local_handoffs.fetch_add(1, Ordering::Relaxed);
    crate::observe::local_handoff(inner, parked.lock.class().unwrap_or(receives.class));
    Some(Ok(next))
}

/// Ends the grace of the locks parked in one queue: sleeps until the parked lock's grace ends,
/// then gives it back to the backend; ends when nothing is parked. One per queue and runtime
/// while it watches (a hot key parks again and again: the keeper started at the first park
/// sees the later ones). Dropped before it is done (its runtime shut down), it gives the
/// parked lock back on a thread of its own.
struct Keeper {
    locker: Arc<LockerInner>,
    key: LockKey,
    runtime: Option<tokio::runtime::Id>,
    done: bool,
}

/// What a [`Keeper`] found when it looked.
enum Look {
    Sleep(Instant),
    GiveBack(Arc<Held>),
    Done,
}

impl Keeper {
    fn start(inner: &Arc<LockerInner>, key: &LockKey) {
        let keeper = Keeper {
            locker: inner.clone(),
            key: key.clone(),
            runtime: tokio::runtime::Handle::try_current().ok().map(|h| h.id()),
            done: false,
        };
        // Started on a multi-thread runtime only (nothing is parked elsewhere); a runtime
        // shutting down drops it, and its drop gives the lock back.
        drop(background::spawn(keeper.run()));
    }

    async fn run(mut self) {
        loop {
            match self.look(false) {
                Look::Sleep(until) => tokio::time::sleep_until(until).await,
                Look::GiveBack(parked) => {
                    let valid = parked.is_held();
                    if let Err(e) = parked.release_in_backend(valid).await {
                        tracing::debug!(key = %parked.key.display(), error = %e, "giving a parked lock back failed; the lease will expire");
                    }
                }
                Look::Done => break,
            }
        }
        self.done = true;
    }

    /// `now`: the grace ends now, whatever is left of it.
    fn look(&self, now: bool) -> Look {
        let mut map = self.locker.queues.map();
        let Some(q) = map.get_mut(self.key.name()) else {
            return Look::Done;
        };
        let until = q.parked.as_ref().map(|p| p.until);
        match until {
            Some(until) if !now && Instant::now() < until => Look::Sleep(until),
            Some(_) => {
                let parked = q.parked.take().map(|p| p.lock);
                if let Some(p) = &parked
                    && q.holder.as_ref().is_some_and(|c| c.held == p.id)
                {
                    q.holder = None;
                }
                parked.map_or(Look::Done, Look::GiveBack)
            }
            None => {
                if q.keeper == self.runtime {
                    q.keeper = None;
                }
                Look::Done
            }
        }
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Look::GiveBack(parked) = self.look(true) {
            parked.give_back_blocking();
        }
        let mut map = self.locker.queues.map();
        if let Some(q) = map.get_mut(self.key.name())
            && q.keeper == self.runtime
        {
            q.keeper = None;
        }
    }
}

/// A subscription asked for again in the background. When it ends (answered, or dropped with
/// its runtime), a queue removed meanwhile (its waiters gone) has unsubscribed already: the
/// listener this request registered again is removed.
struct Resubscribe {
    locker: Arc<LockerInner>,
    key: LockKey,
    inbox: Arc<Inbox>,
    subscription: Arc<Subscription>,
}

impl Drop for Resubscribe {
    fn drop(&mut self) {
        let still_queued = self
            .locker
            .queues
            .map()
            .get(self.key.name())
            .is_some_and(|q| Arc::ptr_eq(&q.subscription, &self.subscription));
        if !still_queued {
            self.locker.backend.unsubscribe(&self.key, &self.inbox);
        }
    }
}

/// A place in a key's local queue. Dropping it leaves the queue.
#[derive(Debug)]
pub(crate) struct Ticket {
    locker: Arc<LockerInner>,
    key: LockKey,
    id: u64,
    turn: Arc<Notify>,
    inbox: Arc<Inbox>,
    subscription: Arc<Subscription>,
}

impl Ticket {
    /// Whether this waiter is the head.
    fn is_head(&self) -> bool {
        let map = self.locker.queues.map();
        map.get(self.key.name())
            .and_then(|q| q.waiters.front())
            .is_some_and(|w| w.id == self.id)
    }

    /// Waits until this waiter is the head.
    pub(crate) async fn my_turn(&self) {
        loop {
            let notified = self.turn.notified();
            if self.is_head() {
                return;
            }
            notified.await;
        }
    }

    /// Makes sure the backend delivers release notifications for this key to the queue.
    /// `false` when they are not confirmed to flow now (the caller then retries on timers).
    ///
    /// The queue's first head asks the backend and waits for its answer. Later heads ask again
    /// only when the subscription failed, or was confirmed on a connection that has gone since
    /// (the backend's notifications are down), and the backend's notifications may work again
    /// (`resubscribe_after`); they ask in the background, without waiting for a connection: a
    /// queue that never empties long enough to be removed would otherwise keep the failure for
    /// good, and its holders would ask the backend for waiters of other processes at every
    /// local turn.
    pub(crate) async fn subscribe(&self) -> bool {
        let (subscription, backend) = (&self.subscription, &self.locker.backend);
        if subscription.state.load(Ordering::Acquire) == NOT_ASKED {
            let _one_at_a_time = subscription.attempt.lock().await;
            if subscription.state.load(Ordering::Acquire) == NOT_ASKED {
                let confirmed = backend.subscribe(&self.key, &self.inbox).await;
                subscription.answered(confirmed);
                return confirmed;
            }
        }
        self.heard_or_ask_again()
    }

    /// Whether release notifications for this key are confirmed to flow now; when they are not
    /// and may work again, the subscription is asked for again in the background. Also checked
    /// by a head each time its wait is woken (local or in the backend's queue): a subscription
    /// can go (its connection ended with the runtime it ran on) after the head found it
    /// confirmed.
    pub(crate) fn heard_or_ask_again(&self) -> bool {
        let backend = &self.locker.backend;
        let heard = self.subscription.confirmed() && backend.notifications_healthy();
        if !heard && let Some(after) = backend.resubscribe_after() {
            self.subscribe_again(after);
        }
        heard
    }

    /// Asks the backend for the queue's subscription again, in the background, `after` from
    /// now (a failed connect's back-off); nothing when a request is on its way already.
    fn subscribe_again(&self, after: Duration) {
        let Ok(one_at_a_time) = self.subscription.attempt.clone().try_lock_owned() else {
            return;
        };
        let again = Resubscribe {
            locker: self.locker.clone(),
            key: self.key.clone(),
            inbox: self.inbox.clone(),
            subscription: self.subscription.clone(),
        };
        background::spawn(async move {
            let _one_at_a_time = one_at_a_time;
            tokio::time::sleep(after).await;
            let confirmed = again
                .locker
                .backend
                .subscribe(&again.key, &again.inbox)
                .await;
            again.subscription.answered(confirmed);
        });
    }

    /// The queue's inbox, which its head uses while it waits.
    pub(crate) fn inbox(&self) -> Arc<Inbox> {
        self.inbox.clone()
    }

    /// A lock passed to this waiter by local hand-off, taken out. One lost on the way (its
    /// lease ran out before the waiter came for it) is let go, and `None` returned.
    pub(crate) fn take_handed(&self) -> Option<Arc<Held>> {
        let held = {
            let mut map = self.locker.queues.map();
            let q = map.get_mut(self.key.name())?;
            match &q.handed {
                Some((id, _)) if *id == self.id => q.handed.take().map(|(_, held)| held),
                _ => None,
            }
        }?;
        if held.is_held() {
            return Some(held);
        }
        held.release_in_background();
        None
    }

    /// As the head: while a task of this locker holds the key, waits for it to pass the lock
    /// here, without contending in the backend.
    pub(crate) async fn wait_local(&self, deadline: Instant) -> Local {
        loop {
            let notified = self.inbox.notified();
            if let Some(held) = self.take_handed() {
                return Local::Handed(held);
            }
            // The subscription's connection may have ended since this head was woken last
            // (that wakes every queue): asked for again, so that the holder's local turns go
            // on hearing other processes' waiters.
            self.heard_or_ask_again();
            let holder = self
                .locker
                .queues
                .map()
                .get(self.key.name())
                .and_then(|q| q.holder.as_ref().map(|c| c.lock.clone()));
            let Some(strong) = holder.and_then(|h| h.upgrade()) else {
                return Local::NotHeldHere;
            };
            let until = strong.snapshot().valid_until;
            // Not kept alive by this wait: a holder nobody has any more ends (and stops being
            // renewed) while its waiters sleep.
            let holder = Arc::downgrade(&strong);
            drop(strong);
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(until) => {
                    // Its lease may have run out with nobody renewing it: the check marks it lost
                    // (which takes it off the queue's note); one no longer held is let go here.
                    if let Some(holder) = holder.upgrade()
                        && !holder.is_held()
                    {
                        self.locker.queues.holder_left(&holder);
                    }
                }
                () = tokio::time::sleep_until(deadline) => {
                    return match self.take_handed() {
                        Some(held) => Local::Handed(held),
                        None => Local::TimedOut,
                    };
                }
            }
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let queues = &self.locker.queues;
        let mut map = queues.map();
        let Some(q) = map.get_mut(self.key.name()) else {
            return;
        };
        let Some(pos) = q.waiters.iter().position(|w| w.id == self.id) else {
            return;
        };
        q.waiters.remove(pos);
        // A lock passed here and never taken (the waiter timed out or was dropped as it came)
        // goes on to the next waiter, or back to the backend.
        let unclaimed = match &q.handed {
            Some((id, _)) if *id == self.id => q.handed.take().map(|(_, held)| held),
            _ => None,
        };
        if pos == 0
            && let Some(next) = q.waiters.front_mut()
        {
            next.turn.notify_one();
        }
        let mut sweep = None;
        if q.waiters.is_empty() {
            q.idle_since = Some(Instant::now());
            let runtime = tokio::runtime::Handle::try_current().ok().map(|h| h.id());
            if runtime.is_none() || q.swept != runtime {
                q.swept = runtime;
                sweep = Some(runtime);
            }
        }
        drop(map);
        if let Some(held) = unclaimed {
            held.release_in_background();
        }
        if let Some(runtime) = sweep {
            let sweeper = Sweeper {
                locker: self.locker.clone(),
                key: self.key.clone(),
                runtime,
                done: false,
            };
            // Without a runtime the task is dropped at once, and the drop removes the queue.
            drop(background::spawn(sweeper.run()));
        }
    }
}

/// Removes a key's emptied queue, and its release subscription, once it has stayed empty for
/// [`LINGER`]. It ends early when the queue is in use again (its next emptying starts a new
/// one). Dropped before it is done (its runtime shut down), it removes an empty queue at once.
struct Sweeper {
    locker: Arc<LockerInner>,
    key: LockKey,
    /// Where it runs (`None`: nowhere, dropped at once).
    runtime: Option<tokio::runtime::Id>,
    done: bool,
}

impl Sweeper {
    async fn run(mut self) {
        while let Some(until) = self.look() {
            tokio::time::sleep_until(until).await;
        }
    }

    /// Removes the queue if it has been empty long enough (`now`), or gives it up if it is in
    /// use; otherwise returns when to look again.
    fn look(&mut self) -> Option<Instant> {
        let until = self.remove_or_give_up(false);
        self.done = until.is_none();
        until
    }

    fn remove_or_give_up(&self, now: bool) -> Option<Instant> {
        let mut map = self.locker.queues.map();
        let q = map.get_mut(self.key.name())?;
        let Some(idle_since) = q.idle_since else {
            if q.swept == self.runtime {
                q.swept = None;
            }
            return None;
        };
        let until = idle_since + LINGER;
        if !now && q.parked.is_some() {
            // A parked lock keeps the queue until its keeper gave it back.
            return Some(until.max(Instant::now() + LINGER));
        }
        if !now && Instant::now() < until {
            return Some(until);
        }
        let q = map.remove(self.key.name())?;
        drop(map);
        // Unconditional: removing a listener that was never registered does nothing.
        self.locker.backend.unsubscribe(&self.key, &q.inbox);
        if let Some(parked) = q.parked {
            // Removed with its runtime shutting down: no task can give it back.
            parked.lock.give_back_blocking();
        }
        None
    }
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        if !self.done {
            self.remove_or_give_up(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Locker;

    fn key() -> LockKey {
        LockKey::new("lock:", "k").unwrap_or_else(|e| panic!("{e}"))
    }

    /// Joins the key's queue and leaves it at once: the queue empties.
    fn join_and_leave(locker: &Locker, key: &LockKey) {
        drop(locker.inner.queues.join(&locker.inner, key, None));
    }

    fn has_queue(locker: &Locker, key: &LockKey) -> bool {
        locker.inner.queues.map().contains_key(key.name())
    }

    fn alive_tasks() -> usize {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    }

    /// Lets the spawned sweepers run at the current (paused) time.
    async fn settle() {
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_queue_that_empties_again_and_again_has_one_sweeper() {
        let (locker, key) = (Locker::memory(), key());
        let before = alive_tasks();
        for _ in 0..50 {
            join_and_leave(&locker, &key);
            settle().await;
        }
        assert_eq!(alive_tasks() - before, 1, "one sweeper for 50 emptyings");
        tokio::time::advance(LINGER + Duration::from_millis(1)).await;
        settle().await;
        assert!(!has_queue(&locker, &key), "removed after LINGER idle");
        assert_eq!(alive_tasks(), before, "the sweeper ended");
    }

    #[tokio::test(start_paused = true)]
    async fn a_queue_is_removed_linger_after_it_last_emptied() {
        let (locker, key) = (Locker::memory(), key());
        join_and_leave(&locker, &key);
        settle().await;
        tokio::time::advance(Duration::from_millis(200)).await;
        join_and_leave(&locker, &key);
        settle().await;
        // LINGER after the first emptying, not after the second.
        tokio::time::advance(Duration::from_millis(100)).await;
        settle().await;
        assert!(has_queue(&locker, &key), "kept: emptied again 100 ms ago");
        tokio::time::advance(LINGER).await;
        settle().await;
        assert!(!has_queue(&locker, &key));
    }

    #[tokio::test(start_paused = true)]
    async fn a_queue_in_use_when_its_sweeper_looks_is_kept() {
        let (locker, key) = (Locker::memory(), key());
        join_and_leave(&locker, &key);
        let waiting = locker.inner.queues.join(&locker.inner, &key, None);
        tokio::time::advance(LINGER * 3).await;
        settle().await;
        assert!(has_queue(&locker, &key), "a waiter is in it");
        drop(waiting);
        settle().await;
        assert!(has_queue(&locker, &key), "lingers after the new emptying");
        tokio::time::advance(LINGER + Duration::from_millis(1)).await;
        settle().await;
        assert!(!has_queue(&locker, &key), "a new sweeper removed it");
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Found by review: the one sweeper of a queue sat on a runtime no longer driven, and
    /// emptyings on a running runtime started none: queue and subscription kept for good.
    #[test]
    fn a_queue_emptied_on_a_running_runtime_is_removed_though_its_sweeper_idles_elsewhere() {
        let memory = crate::MemoryBackend::new();
        let (locker, key) = (Locker::builder(memory.clone()).build(), key());
        let idle = runtime();
        idle.block_on(async { join_and_leave(&locker, &key) });
        runtime().block_on(async {
            let ticket = locker.inner.queues.join(&locker.inner, &key, None);
            assert!(ticket.subscribe().await);
            drop(ticket);
            tokio::time::sleep(LINGER * 4).await;
        });
        assert!(
            !has_queue(&locker, &key),
            "queue kept on the running runtime"
        );
        assert_eq!(memory.listener_count(), 0, "subscription kept");
        drop(idle);
    }

    #[test]
    fn a_sweeper_dropped_with_its_runtime_removes_the_queue() {
        let (locker, key) = (Locker::memory(), key());
        let runtime = runtime();
        // Spawned, never run: the runtime is not driven after this.
        runtime.block_on(async { join_and_leave(&locker, &key) });
        assert!(has_queue(&locker, &key));
        drop(runtime);
        assert!(!has_queue(&locker, &key), "no queue left behind for good");
        // Outside any runtime no sweeper can start: removed at once.
        join_and_leave(&locker, &key);
        assert!(!has_queue(&locker, &key));
    }
}
