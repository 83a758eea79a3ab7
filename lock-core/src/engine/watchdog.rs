//! The watchdog: one renewal scheduler per locker, batching the renewals of every held lock
//! that is due into one backend call per tick.
//!
//! Each held lock is due lease/3 after its last successful renewal (or its acquire). Locks due
//! within a tenth of their lease of each other go in the same call, so after the first tick
//! locks with the same lease stay in step and 1,000 held locks cost one call per lease/3.
//! A transport failure is retried every lease/15 (10 ms to 1 s) while the lease is still
//! locally valid; an answer of "not owner" marks the lock lost at once. When the backend
//! reports its connection dropped or back (the server may have restarted empty or failed
//! over), every held lock is checked at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::{Notify, OwnedMutexGuard, watch};
use tokio::time::Instant;

use crate::backend::{Renewal, Renewed};
use crate::engine::held::{HANDOVER_RENEWAL_BOUND, Held, Phase};
use crate::locker::LockerInner;
use crate::sync::{Mutex, MutexGuard};

#[derive(Debug, Default)]
pub(crate) struct Watchdog {
    entries: Mutex<Table>,
    wake: Arc<Notify>,
    /// The scheduler task and the runtime it runs on; spawned again if that runtime has shut
    /// down.
    task: Mutex<Option<(tokio::task::JoinHandle<()>, tokio::runtime::Handle)>>,
    pub(crate) calls: AtomicU64,
    /// How many times the scheduler has looked at the table.
    ticks: AtomicU64,
}

#[derive(Debug)]
struct Entry {
    held: Weak<Held>,
    renew_at: Instant,
}

#[derive(Debug, Default)]
struct Table {
    /// Keyed by `Held::id`, counted by this process: hashed without SipHash (foldhash: nobody outside chooses these keys).
    map: HashMap<u64, Entry, foldhash::fast::FixedState>,
    /// What the scheduler does now, so that adding a lock wakes it only when it must: most
    /// new locks are due after the one it already sleeps for.
    plan: Plan,
    /// How long after its acquisition the latest lock added was due (its first renewal).
    first_interval: Duration,
    /// Ticks in a row that found no lock.
    empty_ticks: u32,
    /// While this locker has waiters that may be handed a lock with a short lease: the
    /// scheduler sleeps at most [`HANDOVER_RENEWAL_BOUND`] (see [`Watchdog::expect_handovers`]).
    waiting: bool,
}

/// How many ticks in a row may find no lock before the scheduler stops waking up on its own.
/// Until then an emptied table is looked at again one `first_interval` later, so a locker that
/// takes and releases lock after lock (the table empties between them) adds each one to a
/// scheduler already sleeping past its first renewal, instead of waking it for every lock.
const EMPTY_TICKS: u32 = 3;

#[derive(Debug, Default, Clone, Copy)]
enum Plan {
    /// Ticking (or about to): it will see every entry.
    #[default]
    Awake,
    SleepingUntil(Instant),
    Idle,
}

impl Table {
    /// Whether the scheduler would look at the table only after `at` unless woken.
    fn sleeps_past(&self, at: Instant) -> bool {
        match self.plan {
            Plan::Awake => false,
            Plan::SleepingUntil(wake) => wake > at,
            Plan::Idle => true,
        }
    }
}

impl std::ops::Deref for Table {
    type Target = HashMap<u64, Entry, foldhash::fast::FixedState>;
    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl std::ops::DerefMut for Table {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.map
    }
}

impl Watchdog {
    fn entries(&self) -> MutexGuard<'_, Table> {
        self.entries.lock()
    }

    /// Starts renewing `held` (and the scheduler, the first time).
    pub(crate) fn add(&self, inner: &Arc<LockerInner>, held: &Arc<Held>) {
        self.add_at(inner, held, held.first_renewal, held.first_renewal_by);
    }

    /// A task of this locker waits for a key and may be handed the lock with the short
    /// hand-over lease: until no task waits, the scheduler sleeps at most the bound of such a
    /// lock's first renewal ([`HANDOVER_RENEWAL_BOUND`]), so that adding the lock when it comes
    /// needs no wake-up (one on the waiter's return path, a system call when the waiter runs
    /// outside the runtime's workers). Wakes it now if it sleeps longer.
    pub(crate) fn expect_handovers(&self, inner: &Arc<LockerInner>) {
        let must_wake = {
            let mut table = self.entries();
            table.waiting = true;
            table.sleeps_past(Instant::now() + HANDOVER_RENEWAL_BOUND)
        };
        self.run_scheduler(inner, must_wake);
    }

    /// Adds `held`, due at `renew_at` and at the latest at `by`.
    fn add_at(&self, inner: &Arc<LockerInner>, held: &Arc<Held>, renew_at: Instant, by: Instant) {
        let must_wake = {
            let mut table = self.entries();
            // From the acquisition, not from now: the same within the adding's own time, and
            // no clock read on every lock.
            let interval = renew_at.saturating_duration_since(held.acquired_at);
            if !interval.is_zero() {
                table.first_interval = interval;
            }
            table.insert(
                held.id,
                Entry {
                    held: Arc::downgrade(held),
                    renew_at,
                },
            );
            table.sleeps_past(by.max(renew_at))
        };
        self.run_scheduler(inner, must_wake);
    }

    /// The runtime the scheduler runs on, while it runs: where a guard dropped on a thread
    /// outside any runtime sends its release (the scheduler's task ends with its runtime).
    pub(crate) fn runtime(&self) -> Option<tokio::runtime::Handle> {
        let task = self.task.lock();
        let (task, runtime) = task.as_ref()?;
        (!task.is_finished()).then(|| runtime.clone())
    }

    /// Starts the scheduler if it is not running; wakes it if `wake`.
    fn run_scheduler(&self, inner: &Arc<LockerInner>, wake: bool) {
        {
            let mut task = self.task.lock();
            if task.as_ref().is_none_or(|(task, _)| task.is_finished()) {
                let runtime = tokio::runtime::Handle::current();
                let scheduler = runtime.spawn(run(
                    Arc::downgrade(inner),
                    self.wake.clone(),
                    inner.backend.reconnects(),
                ));
                *task = Some((scheduler, runtime));
            }
        }
        if wake {
            self.wake.notify_one();
        }
    }

    /// A local hand-off passed the lock of entry `from` on to `to` (same token, same lease in
    /// the backend): `to` is renewed when `from` would have been (at once if `from` had no
    /// entry: it may have been between a renewal and its answer, or not renewed at all), or at
    /// `renew_by` if that is sooner.
    pub(crate) fn transfer(
        &self,
        inner: &Arc<LockerInner>,
        from: u64,
        to: &Arc<Held>,
        renew_by: Instant,
    ) {
        let renew_at = self.entries().remove(&from).map(|e| e.renew_at);
        let renew_at = renew_at.unwrap_or(to.first_renewal).min(renew_by);
        self.add_at(inner, to, renew_at, renew_at);
    }

    /// Stops renewing a lock. Takes effect before the next tick: a released lock is never renewed.
    pub(crate) fn remove(&self, id: u64) {
        self.entries().remove(&id);
    }

    /// A manual extend moved the lock's next renewal.
    pub(crate) fn rescheduled(&self, id: u64, renew_at: Instant) {
        if let Some(e) = self.entries().get_mut(&id) {
            e.renew_at = renew_at;
        }
        self.wake.notify_one();
    }

    pub(crate) fn len(&self) -> usize {
        self.entries().len()
    }

    /// The connection to the backend dropped or came back: the server may have restarted
    /// empty, failed over, or only closed the connection. Every held lock is due now, so a lock
    /// gone with the server's data is reported lost within a round trip of the reconnect, not
    /// at its next regular renewal.
    fn check_all_now(&self) {
        let now = Instant::now();
        let mut table = self.entries();
        for e in table.map.values_mut() {
            e.renew_at = e.renew_at.min(now);
        }
        if !table.is_empty() {
            tracing::debug!(
                locks = table.len(),
                "lock server connection lost or back; checking every held lock now"
            );
        }
    }

    /// Renews whatever is due; returns when to look again.
    async fn tick(&self, inner: &Arc<LockerInner>) -> Option<Instant> {
        self.ticks.fetch_add(1, Ordering::Relaxed);
        // Read before the table's lock (a release passing a lock on takes the queues' lock,
        // then the table's). A waiter that joins after this read and before the plan is set
        // may find the plan idle: its hand-over then wakes the scheduler, as without waiters.
        let waiters = inner.queues.has_waiters();
        let now = Instant::now();
        let mut due: Vec<Arc<Held>> = Vec::new();
        let mut early: Vec<(Arc<Held>, Instant)> = Vec::new();
        {
            let mut table = self.entries();
            table.plan = Plan::Awake;
            table.waiting &= waiters;
            table.map.retain(|_, e| {
                let Some(held) = e.held.upgrade() else {
                    return false;
                };
                if held.snapshot().phase != Phase::Held
                    || held.renew_until.is_some_and(|u| now >= u)
                {
                    return false;
                }
                if e.renew_at <= now {
                    due.push(held);
                } else {
                    early.push((held, e.renew_at));
                }
                true
            });
            if due.is_empty() {
                let mut next = early.iter().map(|(_, at)| *at).min();
                if next.is_some() {
                    table.empty_ticks = 0;
                } else if table.empty_ticks < EMPTY_TICKS && !table.first_interval.is_zero() {
                    table.empty_ticks += 1;
                    next = Some(now + table.first_interval);
                }
                if table.waiting {
                    let bound = now + HANDOVER_RENEWAL_BOUND;
                    next = Some(next.map_or(bound, |at| at.min(bound)));
                }
                table.plan = next.map_or(Plan::Idle, Plan::SleepingUntil);
                return next;
            }
            table.empty_ticks = 0;
        }
        // Renew in the same call the locks that would be due within a tenth of their lease.
        due.extend(
            early
                .into_iter()
                .filter(|(h, at)| *at <= now + h.lease() / 10)
                .map(|(h, _)| h),
        );
        // A lock whose lease an `extend` is changing right now is left to it (it reschedules
        // the lock when done); the others are held until their answers are applied.
        let mut serials = Vec::with_capacity(due.len());
        due.retain(|h| match h.renewing().clone().try_lock_owned() {
            Ok(serial) => {
                serials.push(serial);
                true
            }
            Err(_) => false,
        });
        if due.is_empty() {
            return Some(Instant::now() + Duration::from_millis(10));
        }
        let items: Vec<_> = due.iter().map(|h| h.renewal()).collect();
        let Some(groups) = inner.backend.renewal_groups(&items) else {
            let lost = self.renew_group(inner, &due, &items).await;
            mark_lost(lost, serials);
            return Some(Instant::now());
        };
        // Shards (a cluster) or lease classes (Redlock): one call each, each on a task of its
        // own that applies its answers when they come, and the scheduler goes on at once: a
        // stalled shard (a slow class) delays neither the other groups' answers nor their next
        // renewals. Its locks keep their serials until their call ends, so the ticks meanwhile
        // leave them alone.
        let mut serials: Vec<_> = serials.into_iter().map(Some).collect();
        for group in groups {
            let due: Vec<Arc<Held>> = group.iter().map(|&i| due[i].clone()).collect();
            let items: Vec<Renewal> = group.iter().map(|&i| items[i].clone()).collect();
            let serials: Vec<_> = group.iter().filter_map(|&i| serials[i].take()).collect();
            let inner = inner.clone();
            tokio::spawn(async move {
                let lost = inner.watchdog.renew_group(&inner, &due, &items).await;
                mark_lost(lost, serials);
                inner.watchdog.wake.notify_one();
            });
        }
        // The locks in flight are skipped (their serials are held) until their answers come.
        Some(Instant::now() + Duration::from_millis(10))
    }

    /// Renews one group of due locks in one backend call and applies the answers; returns the
    /// locks found lost (see [`mark_lost`]).
    async fn renew_group(
        &self,
        inner: &LockerInner,
        due: &[Arc<Held>],
        items: &[Renewal],
    ) -> Vec<Arc<Held>> {
        // Wait as long as any of them can still be saved; each lock's own deadline marks it
        // lost on time regardless (see `Held::lost`).
        let bound = due
            .iter()
            .map(|h| h.remaining())
            .max()
            .unwrap_or_default()
            .max(Duration::from_millis(1));
        let sent = Instant::now();
        self.calls.fetch_add(1, Ordering::Relaxed);
        let answer = tokio::time::timeout(bound, inner.call().renew(items)).await;
        let mut lost = Vec::new();
        let answered = matches!(&answer, Ok(Ok(v)) if v.len() == items.len());
        crate::observe::renewal_call(inner, sent.elapsed(), answered);
        let verdicts = match answer {
            Ok(Ok(verdicts)) if verdicts.len() == items.len() => verdicts,
            failed => {
                let why = match failed {
                    Ok(Err(e)) => e.to_string(),
                    Ok(Ok(v)) => format!("{} answers for {} locks", v.len(), items.len()),
                    Err(_) => format!("no answer within {bound:?}"),
                };
                tracing::warn!(locks = due.len(), error = %why, "lock renewal failed; retrying while the leases are valid");
                vec![Renewed::Unknown; items.len()]
            }
        };
        let mut entries = self.entries();
        let mut unknown = 0usize;
        for ((held, item), verdict) in due.iter().zip(items).zip(verdicts) {
            let outcome = match verdict {
                Renewed::Yes => "renewed",
                // Released while its renewal was on its way: the release removed it, which
                // is no loss.
                Renewed::Lost if held.released_for_good() => "released",
                Renewed::Lost => "lost",
                Renewed::Unknown => "undecided",
            };
            crate::observe::renewal(inner, held.class(), outcome);
            match verdict {
                Renewed::Yes => {
                    held.renewed(sent, item.lease);
                    if let Some(e) = entries.get_mut(&held.id) {
                        e.renew_at = sent + item.lease / 3;
                    }
                }
                Renewed::Lost => {
                    entries.remove(&held.id);
                    lost.push(held.clone());
                }
                Renewed::Unknown => {
                    // Only this lock is retried, soon, while its lease is still locally valid;
                    // its own deadline marks it lost on time regardless.
                    unknown += 1;
                    if let Some(e) = entries.get_mut(&held.id) {
                        e.renew_at = Instant::now()
                            + (held.lease() / 15)
                                .clamp(Duration::from_millis(10), Duration::from_secs(1));
                    }
                }
            }
        }
        if unknown > 0 && unknown < due.len() {
            tracing::debug!(
                undecided = unknown,
                locks = due.len(),
                "some renewals were undecided; retrying those while their leases are valid"
            );
        }
        lost
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // Ends the scheduler task when its locker goes away.
        self.wake.notify_one();
    }
}

/// Marks the locks a renewal found no longer ours as lost, then lets go of the renewal
/// serials of the call (`serials`): a release that passes the lock on locally takes the serial
/// first, so it either passes it before the answer came (and the loss reaches the task it was
/// passed to), or finds it lost; it never reports a lock the backend just called someone
/// else's as released.
fn mark_lost(lost: Vec<Arc<Held>>, serials: Vec<OwnedMutexGuard<()>>) {
    for held in lost {
        #[cfg(test)]
        tests::MARKING_LOST.reached(&held);
        held.mark_lost("renewal found the lock no longer ours");
    }
    drop(serials);
}

async fn run(
    inner: Weak<LockerInner>,
    wake: Arc<Notify>,
    mut reconnects: Option<watch::Receiver<u64>>,
) {
    loop {
        let next = {
            let Some(inner) = inner.upgrade() else {
                return;
            };
            inner.watchdog.tick(&inner).await
        };
        let sleep = async {
            match next {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = sleep => {}
            () = wake.notified() => {}
            () = reconnected(&mut reconnects) => {
                let Some(inner) = inner.upgrade() else {
                    return;
                };
                inner.watchdog.check_all_now();
            }
        }
    }
}

/// Resolves when the backend's connection dropped or came back since the last time; never
/// when the backend cannot tell.
async fn reconnected(reconnects: &mut Option<watch::Receiver<u64>>) {
    let changed = match reconnects.as_mut() {
        Some(r) => r.changed().await.is_ok(),
        None => false,
    };
    if !changed {
        // The backend is gone or cannot tell: stop listening.
        *reconnects = None;
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::mpsc;
    use std::time::Duration;

    use crate::engine::held::Held;
    use crate::test_support::{BOUND, Hook, HookPoint, passing_locally, within};
    use crate::{LockError, Locker};

    /// Reached on the watchdog's task right before the watchdog marks lost a lock that a
    /// renewal found no longer ours.
    pub(super) static MARKING_LOST: HookPoint = HookPoint::new();

    /// FAULTS.md, local hand-off: "A renewal that finds the lock gone is applied before a
    /// release can pass the lock on: the release then reports the loss." A release that
    /// would pass the lock to a local waiter runs while the watchdog holds a renewal's answer
    /// "not ours" and is about to mark the lock lost: it must not pass the lock on and say
    /// `Ok` (the backend just called the key someone else's); it waits for the answer and
    /// reports `LeaseLost`. Fails when the renewal's serials are let go before the loss is
    /// marked: the release then passes the lock and says `Ok`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_release_while_a_renewal_marks_the_lock_lost_reports_the_loss() {
        const KEY: &str = "mark-lost-race";
        let backend = crate::MemoryBackend::new();
        let locker = Locker::builder(backend.clone())
            .lease(Duration::from_millis(600))
            // Past the renewal (a tenth of the lease after the pass), turns go on locally.
            .local_hold(Duration::from_secs(30))
            .build();
        let (second, mut handed) = passing_locally(&locker, KEY, 4).await;
        // The next release may pass the lock on without asking: the case.
        let (outcome_tx, outcome) = mpsc::channel();
        let hook: Hook = Box::new(move |_: &Held| {
            let (released_tx, released) = mpsc::channel();
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let _ = released_tx.send(runtime.block_on(second.release()));
            });
            // Before the loss is marked, the release can only wait (for the renewal's serial);
            // one that ends here passed the lock on under the answer "not ours".
            let early = released.recv_timeout(Duration::from_millis(300)).ok();
            let _ = outcome_tx.send((early, released));
        });
        MARKING_LOST.set(KEY, hook);
        // Behind the holder's back: the next renewal (within a tenth of the lease of a lock
        // passed locally) finds it gone.
        assert!(backend.force_delete(KEY));
        let (early, released) = tokio::task::spawn_blocking(move || {
            outcome
                .recv_timeout(BOUND)
                .expect("the renewal never found the lock lost")
        })
        .await
        .unwrap();
        assert!(
            early.is_none(),
            "the release ended while the renewal's loss was not yet marked: {early:?}"
        );
        let released = tokio::task::spawn_blocking(move || {
            released
                .recv_timeout(BOUND)
                .expect("the release never ended")
        })
        .await
        .unwrap();
        assert!(
            matches!(released, Err(LockError::LeaseLost { .. })),
            "a release after the renewal found the lock gone: {released:?}"
        );
        // The waiters left take the free key through the backend, not as a pass of the lost one.
        let passes = locker.stats().local_handoffs;
        let third = within(handed.recv()).await.unwrap().unwrap();
        assert_eq!(
            locker.stats().local_handoffs,
            passes,
            "the lost lock was not passed"
        );
        third.release().await.unwrap();
    }

    /// While tasks wait, the scheduler looks at its table every 100 ms (the bound of a
    /// hand-over's first renewal), not more often: a waiter with a short lease (its hand-over
    /// carries its whole lease, so it needs no early renewal) does not make it tick every
    /// 5 ms, for itself or, after it left, for the others. Found by review: 202 ticks in a
    /// second with one waiter left.
    #[tokio::test(start_paused = true)]
    async fn waiting_tasks_make_the_scheduler_tick_at_most_every_100_ms() {
        let backend = crate::MemoryBackend::new();
        let a = Locker::builder(backend.clone()).build();
        let b = Locker::builder(backend).build();
        let _short = a.lock("short").await.unwrap();
        let _long = a.lock("long").await.unwrap();
        let long = tokio::spawn({
            let b = b.clone();
            async move { b.lock("long").wait(Duration::from_secs(5)).await }
        });
        let short = tokio::spawn({
            let b = b.clone();
            async move {
                b.lock("short")
                    .lease(Duration::from_millis(150))
                    .wait(Duration::from_millis(200))
                    .await
            }
        });
        // Paused clock: time moves only once every task waits, so both have queued.
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(b.stats().waiters, 2);
        let before = b.inner.watchdog.ticks.load(Ordering::Relaxed);
        assert!(short.await.unwrap().is_err(), "the short waiter timed out");
        tokio::time::sleep(Duration::from_secs(1)).await;
        let ticks = b.inner.watchdog.ticks.load(Ordering::Relaxed) - before;
        assert!(ticks <= 14, "{ticks} ticks in 1.2 s of waiting");
        long.abort();
    }

    /// A lock handed over to a task that waited is added without waking the scheduler (a
    /// wake-up on the waiter's return path, a system call when the waiter runs outside the
    /// runtime's workers): while the locker has waiters the scheduler looks at its table often
    /// enough for the hand-over's first renewal. That renewal still comes within its bound.
    #[tokio::test(start_paused = true)]
    async fn a_hand_over_to_a_waiting_task_does_not_wake_the_scheduler() {
        let backend = crate::MemoryBackend::new();
        let a = Locker::builder(backend.clone()).build();
        let b = Locker::builder(backend).build();
        let holder = a.lock("k").await.unwrap();
        let waiter = tokio::spawn({
            let b = b.clone();
            async move { b.lock("k").wait(Duration::from_secs(10)).await }
        });
        // Paused clock: time moves only once every task waits, so the waiter has queued.
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(b.stats().waiters, 1);
        let ticks = b.inner.watchdog.ticks.load(Ordering::Relaxed);
        holder.release().await.unwrap();
        let guard = waiter.await.unwrap().unwrap();
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
        assert_eq!(b.stats().handovers, 1);
        assert_eq!(
            b.inner.watchdog.ticks.load(Ordering::Relaxed),
            ticks,
            "the hand-over woke the scheduler"
        );
        tokio::time::sleep(Duration::from_millis(101)).await;
        assert_eq!(b.stats().renewal_calls, 1, "renewed within 100 ms");
        assert!(guard.remaining() > Duration::from_secs(29));
        guard.release().await.unwrap();
    }

    /// A locker that takes and releases lock after lock empties the table between them: the
    /// scheduler must not be woken for each new lock (each is due a third of its lease later,
    /// after the time it already sleeps until).
    #[tokio::test]
    async fn lock_after_lock_does_not_wake_the_scheduler_each_time() {
        let locker = Locker::builder(crate::MemoryBackend::new())
            .lease(Duration::from_secs(3))
            .build();
        for _ in 0..200 {
            locker.lock("job").await.unwrap().release().await.unwrap();
            // Lets the scheduler run, as any I/O would.
            tokio::task::yield_now().await;
        }
        let ticks = locker.inner.watchdog.ticks.load(Ordering::Relaxed);
        assert!(ticks <= 5, "{ticks} scheduler ticks for 200 locks");
    }
}
