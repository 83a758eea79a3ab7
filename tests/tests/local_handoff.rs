//! Local hand-off (lock cohorting, issue 15): a lock released while another task of the same
//! locker waits for its key is passed to that task without the backend, within bounds that let
//! waiters of other lockers (other processes) in. Each property runs on the memory backend and
//! on a real redis-server; a second locker on the same backend stands for another process.
//!
//! What must hold: mutual exclusion across local hand-offs and across lockers; the lock passed
//! on keeps its lease (the watchdog renews it) and its loss detection; a waiter of another
//! locker is served after at most `local_turns` local turns (or `local_hold`); fenced requests
//! never share a fence; `local_handoff(false)` turns it off.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed expectation fails the test"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use lock_core::{LockError, Locker, RedisBackend};
use lock_testkit::{RedisServer, eventually};
use tokio::task::JoinSet;

mod support;

use support::store::{SOON, Store, on_both, until_a_local_handoff};

on_both!(
    waiters_of_one_locker_take_their_turns_without_the_backend,
    no_two_holders_across_local_handoffs_and_lockers,
    a_waiter_of_another_locker_is_served_within_the_local_turns,
    a_waiter_of_another_locker_is_served_within_the_local_hold,
    fenced_requests_never_take_a_passed_lock,
    a_passed_lock_keeps_its_lease_and_its_loss_detection,
    turned_off_every_turn_goes_through_the_backend,
    out_of_range_bounds_are_refused,
    a_local_waiter_is_not_stuck_behind_a_holder_whose_lease_ran_out,
    a_fair_waiter_is_not_overtaken_by_local_turns,
    a_fair_waiter_ends_a_run_of_local_turns,
    a_fair_waiter_is_not_overtaken_when_local_handoff_is_off,
    a_lock_passed_after_its_key_was_lost_learns_it_within_a_tenth_of_its_lease,
);

/// Holds `key` in one task while `n` tasks of the same locker queue for it, then releases:
/// each waiter takes the lock in turn and releases it. Returns how many got it.
///
/// The release waits until the first waiter's ticket is in the backend's queue, not only in
/// the locker's: a release that came before it would find nobody to hand over to, and the
/// waiter's own attempt would then take the free lock (a turn that is not a hand-over).
async fn chain(store: &Store, locker: &Locker, key: &str, n: usize) -> usize {
    let first = locker.lock(key).await.unwrap();
    let got = Arc::new(AtomicU64::new(0));
    let mut tasks = JoinSet::new();
    for _ in 0..n {
        let (locker, key, got) = (locker.clone(), key.to_owned(), got.clone());
        tasks.spawn(async move {
            let guard = locker.lock(&key).await.unwrap();
            got.fetch_add(1, Ordering::SeqCst);
            guard.release().await.unwrap();
        });
    }
    eventually("every waiter queued", SOON, async || {
        locker.stats().waiters == n
    })
    .await;
    eventually("the first waiter queued in the backend", SOON, async || {
        store.queued(key).await >= 1
    })
    .await;
    first.release().await.unwrap();
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    usize::try_from(got.load(Ordering::SeqCst)).unwrap()
}

async fn waiters_of_one_locker_take_their_turns_without_the_backend(store: Store) {
    let locker = store.builder().await.build();
    let before = locker.stats();
    assert_eq!(chain(&store, &locker, "hot", 10).await, 10);
    let after = locker.stats();
    // The first holder took the lock before anyone queued here, when the locker keeps no note
    // of holders (the uncontended path does no bookkeeping): it releases in the backend, which
    // hands the lock to the first waiter (queued there). From then on every turn is local.
    assert_eq!(after.handovers - before.handovers, 1, "{after:?}");
    assert_eq!(after.local_handoffs - before.local_handoffs, 9, "{after:?}");
    // Backend calls: the first acquire, each waiter's first attempt (up to 10, before the queue
    // formed), the first waiter's place in the backend's queue (and its leave), the first
    // release, the renewal a handed-over lock gets at once, the last release: none for the
    // nine local turns.
    let calls = after.backend_calls - before.backend_calls;
    assert!(
        calls <= 17,
        "{calls} backend calls for 9 local turns: {after:?}"
    );
}

async fn no_two_holders_across_local_handoffs_and_lockers(store: Store) {
    until_a_local_handoff(&store, holders_round).await;
}

/// Two lockers' tasks take turns on one key, with local hand-offs: never two holders, no lost
/// update; the local hand-offs that happened.
async fn holders_round(store: &Store) -> u64 {
    let inside = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let mut tasks = JoinSet::new();
    for _ in 0..2 {
        let locker = store.builder().await.local_turns(3).build();
        for _ in 0..8 {
            let (locker, inside, count) = (locker.clone(), inside.clone(), count.clone());
            tasks.spawn(async move {
                for _ in 0..25 {
                    let guard = locker.lock("counter").await.unwrap();
                    assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                    // A read-modify-write with a yield in the middle: lost updates show.
                    let seen = count.load(Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    count.store(seen + 1, Ordering::SeqCst);
                    inside.store(false, Ordering::SeqCst);
                    guard.release().await.unwrap();
                }
                locker.stats().local_handoffs
            });
        }
    }
    let mut local = 0;
    while let Some(done) = tasks.join_next().await {
        local = local.max(done.unwrap());
    }
    assert_eq!(count.load(Ordering::SeqCst), 2 * 8 * 25);
    local
}

/// Keeps `key` busy in `tasks` tasks of `locker` (lock, yield, release, in a loop) until
/// `stop`; counts acquisitions in `taken`.
fn keep_busy(
    locker: &Locker,
    key: &str,
    tasks: usize,
    stop: &Arc<AtomicBool>,
    taken: &Arc<AtomicU64>,
) -> JoinSet<()> {
    let mut set = JoinSet::new();
    for _ in 0..tasks {
        let (locker, key, stop, taken) =
            (locker.clone(), key.to_owned(), stop.clone(), taken.clone());
        set.spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let guard = locker.lock(&key).await.unwrap();
                taken.fetch_add(1, Ordering::SeqCst);
                tokio::task::yield_now().await;
                guard.release().await.unwrap();
            }
        });
    }
    set
}

/// Busy-loops `hot` in `hog`'s tasks, then has `other` wait for the key: returns how many
/// acquisitions of `hog` happened between `other` asking and `other` getting the lock.
async fn turns_before_the_other_gets_in(hog: &Locker, other: &Locker) -> u64 {
    let (stop, taken) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let mut busy = keep_busy(hog, "hot", 6, &stop, &taken);
    eventually("the hog passes the lock locally", SOON, async || {
        hog.stats().local_handoffs > 10
    })
    .await;
    let asked = taken.load(Ordering::SeqCst);
    let guard = other
        .lock("hot")
        .await
        .expect("the other locker gets its turn");
    let between = taken.load(Ordering::SeqCst) - asked;
    stop.store(true, Ordering::SeqCst);
    guard.release().await.unwrap();
    while let Some(done) = busy.join_next().await {
        done.unwrap();
    }
    between
}

async fn a_waiter_of_another_locker_is_served_within_the_local_turns(store: Store) {
    // A long hold bound: only the turns bound can let the other locker in.
    let hog = store
        .builder()
        .await
        .local_turns(4)
        .local_hold(Duration::from_secs(600))
        .build();
    let other = store.builder().await.build();
    let between = turns_before_the_other_gets_in(&hog, &other).await;
    // The other locker's first attempt and its place in the backend's queue take a few turns
    // of the hog (each at memory speed); once it queues, at most 4 local turns pass before
    // the hog asks the backend and gives the lock to it. Without the bound it would wait for
    // its whole wait (10 s) while the hog takes turns by the hundred thousand.
    assert!(
        between < 2_000,
        "{between} turns of the hog before the other got in"
    );
}

async fn a_waiter_of_another_locker_is_served_within_the_local_hold(store: Store) {
    // Turns bound out of reach: only the time bound can let the other locker in.
    let hog = store
        .builder()
        .await
        .local_turns(100_000)
        .local_hold(Duration::from_millis(20))
        .build();
    let other = store.builder().await.build();
    let started = std::time::Instant::now();
    let between = turns_before_the_other_gets_in(&hog, &other).await;
    assert!(
        started.elapsed() < SOON / 2,
        "{between} turns and {:?} before the other got in",
        started.elapsed()
    );
}

async fn fenced_requests_never_take_a_passed_lock(store: Store) {
    let locker = store.builder().await.build();
    let first = locker.lock("fenced").fenced().await.unwrap();
    let mut fences = vec![first.fence().unwrap()];
    let mut tasks = JoinSet::new();
    for _ in 0..5 {
        let locker = locker.clone();
        tasks.spawn(async move {
            let guard = locker.lock("fenced").fenced().await.unwrap();
            let fence = guard.fence().unwrap();
            guard.release().await.unwrap();
            fence
        });
    }
    eventually("every waiter queued", SOON, async || {
        locker.stats().waiters == 5
    })
    .await;
    first.release().await.unwrap();
    while let Some(done) = tasks.join_next().await {
        fences.push(done.unwrap());
    }
    let mut sorted = fences.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(
        sorted.len(),
        6,
        "every holder has a fence of its own: {fences:?}"
    );
    assert_eq!(locker.stats().local_handoffs, 0);
}

async fn a_passed_lock_keeps_its_lease_and_its_loss_detection(store: Store) {
    let lease = Duration::from_millis(600);
    let locker = store.builder().await.lease(lease).build();
    let first = locker.lock("kept").await.unwrap();
    // The first waiter gets the lock from the backend (nobody queued when it was taken), and
    // passes it to the second.
    let first_waiter = {
        let locker = locker.clone();
        tokio::spawn(async move {
            let guard = locker.lock("kept").await.unwrap();
            guard.release().await.unwrap();
        })
    };
    eventually("the first waiter queued", SOON, async || {
        locker.stats().waiters == 1
    })
    .await;
    let waiter = {
        let locker = locker.clone();
        tokio::spawn(async move { locker.lock("kept").await.unwrap() })
    };
    eventually("both waiters queued", SOON, async || {
        locker.stats().waiters == 2
    })
    .await;
    first.release().await.unwrap();
    first_waiter.await.unwrap();
    let passed = waiter.await.unwrap();
    assert_eq!(locker.stats().local_handoffs, 1);
    // Held over several leases: the watchdog renews the passed lock.
    tokio::time::sleep(lease * 3).await;
    assert!(passed.is_held());
    let intruder = store.builder().await.build();
    assert!(matches!(
        intruder.try_lock("kept").await,
        Err(LockError::Busy { .. })
    ));
    // Deleted behind its back: the new holder is told.
    store.delete("kept").await;
    tokio::time::timeout(SOON, passed.lost())
        .await
        .expect("the loss of a passed lock is detected");
    assert!(matches!(
        passed.release().await,
        Err(LockError::LeaseLost { .. })
    ));
}

/// The key is lost behind the holders' backs (an operator's `DEL`, `FLUSHALL`, eviction) and
/// another locker takes it, between two local turns: the turn after it is passed without the
/// backend (it comes within `local_hold` of the backend's last word), so the task it goes to
/// holds a lock that is someone else's in the backend. That task is told (its `lost()`
/// resolves) by a renewal due within a tenth of its lease (3 s of the default 30 s), not a
/// third of a lease later: before, it held on for 9 s beside the other locker.
async fn a_lock_passed_after_its_key_was_lost_learns_it_within_a_tenth_of_its_lease(store: Store) {
    let key = "lost-between-turns";
    let locker = store.builder().await.build();
    let first = locker.lock(key).await.unwrap();
    let mut waiters = Vec::new();
    for n in 1..=3 {
        let l = locker.clone();
        waiters.push(tokio::spawn(async move { l.lock(key).await.unwrap() }));
        eventually("the waiter queued", SOON, async || {
            locker.stats().waiters == n
        })
        .await;
    }
    eventually("the head queued in the backend", SOON, async || {
        store.queued(key).await >= 1
    })
    .await;
    let mut waiters = waiters.into_iter();
    let mut next = async || waiters.next().unwrap().await.unwrap();
    first.release().await.unwrap();
    // The first waiter has it from the backend, and holds it until the watchdog has renewed it
    // once (the next renewal is a third of a lease away); its release asks the backend (the
    // first turn of a run) and passes it on.
    let renewals = locker.stats().renewal_calls;
    let taken = next().await;
    eventually("the taken lock was renewed", SOON, async || {
        locker.stats().renewal_calls > renewals
    })
    .await;
    taken.release().await.unwrap();
    let second = next().await;
    assert_eq!(locker.stats().local_handoffs, 1);
    store.delete(key).await;
    let other = store.builder().await.build();
    let others = other.try_lock(key).await.unwrap();
    // Within the local hold of the backend's answer: passed on without asking it. (This
    // release says `Ok`: FAULTS.md, local hand-off.)
    let _ = second.release().await;
    let third = next().await;
    assert_eq!(locker.stats().local_handoffs, 2);
    tokio::time::timeout(Duration::from_secs(6), third.lost())
        .await
        .expect("the task the lock was passed to learns of the loss within a tenth of its lease");
    assert!(!third.is_held());
    assert!(others.is_held());
}

async fn turned_off_every_turn_goes_through_the_backend(store: Store) {
    let locker = store.builder().await.local_handoff(false).build();
    assert_eq!(chain(&store, &locker, "cold", 5).await, 5);
    assert_eq!(locker.stats().local_handoffs, 0);
}

async fn out_of_range_bounds_are_refused(store: Store) {
    for builder in [
        store.builder().await.local_turns(0),
        store.builder().await.local_turns(100_001),
        store.builder().await.local_hold(Duration::ZERO),
    ] {
        assert!(matches!(
            builder.try_build(),
            Err(LockError::InvalidConfig { .. })
        ));
    }
}

/// Review: a holder noted as giver whose lease runs out without anyone marking it lost (no
/// watchdog; a hung task keeps its guard) must not keep the local head in `wait_local` until its
/// wait ends: the lock is free in the backend once the lease expires.
async fn a_local_waiter_is_not_stuck_behind_a_holder_whose_lease_ran_out(store: Store) {
    let locker = store.builder().await.build();
    let first = locker.lock("hung").await.unwrap();
    // Queues while `first` holds: it takes the lock from the backend with a queue here, so it
    // is noted as the key's holder (a giver), then hangs with its guard and no watchdog.
    let hung = {
        let locker = locker.clone();
        tokio::spawn(async move {
            let guard = locker
                .lock("hung")
                .watchdog(false)
                .lease(Duration::from_millis(400))
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_secs(30)).await;
            drop(guard);
        })
    };
    eventually("the hung task queued", SOON, async || {
        locker.stats().waiters == 1
    })
    .await;
    first.release().await.unwrap();
    eventually("the hung task holds", SOON, async || {
        locker.stats().waiters == 0
    })
    .await;
    let started = std::time::Instant::now();
    let got = locker.lock("hung").wait(Duration::from_secs(4)).await;
    hung.abort();
    let got = got.unwrap_or_else(|e| {
        panic!(
            "the lease ran out after 400 ms, yet the waiter got {e:?} after {:?}",
            started.elapsed()
        )
    });
    assert!(got.is_held());
}

/// Review: a `.fair()` request queued before a default one of the same locker is served first
/// ("first-come, first-served across processes"), also when the holder could pass the lock on
/// locally.
/// Strict FIFO for `.fair()` across processes, with local hand-off on in the other locker
/// (only the turns bound, far off, could otherwise let the fair one in) and off.
async fn a_fair_waiter_is_not_overtaken_by_local_turns(store: Store) {
    let locker = store
        .builder()
        .await
        .local_hold(Duration::from_secs(600))
        .build();
    fair_before_late(&store, &locker).await;
}

/// A fair waiter that queues while another locker is in the middle of a run of local turns
/// (after it last asked the backend) announces itself: the run ends at the next release, long
/// before the bounds (set out of reach here) would end it.
async fn a_fair_waiter_ends_a_run_of_local_turns(store: Store) {
    let hog = store
        .builder()
        .await
        .local_turns(100_000)
        .local_hold(Duration::from_secs(600))
        .build();
    let (stop, taken) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let mut busy = keep_busy(&hog, "hot", 6, &stop, &taken);
    eventually("the hog passes the lock locally", SOON, async || {
        hog.stats().local_handoffs > 10
    })
    .await;
    let fair = store.builder().await.build();
    let asked = taken.load(Ordering::SeqCst);
    let guard = fair
        .lock("hot")
        .fair()
        .await
        .expect("the fair waiter gets in");
    let between = taken.load(Ordering::SeqCst) - asked;
    stop.store(true, Ordering::SeqCst);
    guard.release().await.unwrap();
    while let Some(done) = busy.join_next().await {
        done.unwrap();
    }
    // The turns the hog takes while the fair request's first attempt, its place in the queue
    // and its announcement travel; without the announcement, up to 100,000.
    assert!(
        between < 5_000,
        "{between} turns of the hog before the fair waiter got in"
    );
}

async fn a_fair_waiter_is_not_overtaken_when_local_handoff_is_off(store: Store) {
    let locker = store.builder().await.local_handoff(false).build();
    fair_before_late(&store, &locker).await;
}

/// `locker` holds the key (through a waiter that got it from the backend, so that the locker
/// notes it as its holder); a fair request of another locker queues, then a plain request of
/// `locker`: the fair one must get the lock first.
async fn fair_before_late(store: &Store, locker: &Locker) {
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let first = locker.lock("fifo").await.unwrap();
    // `second` queues here and gets the lock from the backend.
    let (go, gate) = tokio::sync::oneshot::channel::<()>();
    let second = {
        let locker = locker.clone();
        tokio::spawn(async move {
            let guard = locker.lock("fifo").await.unwrap();
            gate.await.unwrap();
            guard.release().await.unwrap();
        })
    };
    eventually("second queued", SOON, async || locker.stats().waiters == 1).await;
    first.release().await.unwrap();
    eventually("second holds", SOON, async || locker.stats().waiters == 0).await;
    let fair = {
        let (locker, order) = (store.builder().await.build(), order.clone());
        tokio::spawn(async move {
            let guard = locker.lock("fifo").fair().await.unwrap();
            order.lock().unwrap().push("fair");
            guard.release().await.unwrap();
        })
    };
    // The fair request takes its place in the backend's queue first.
    eventually("the fair request queued", SOON, async || {
        store.queued("fifo").await == 1
    })
    .await;
    let late = {
        let (locker, order) = (locker.clone(), order.clone());
        tokio::spawn(async move {
            let guard = locker.lock("fifo").await.unwrap();
            order.lock().unwrap().push("late");
            guard.release().await.unwrap();
        })
    };
    eventually("late queued", SOON, async || locker.stats().waiters == 1).await;
    go.send(()).unwrap();
    second.await.unwrap();
    fair.await.unwrap();
    late.await.unwrap();
    assert_eq!(*order.lock().unwrap(), ["fair", "late"]);
}

/// 20 waiters of `locker` queue for "hot" behind `head` (a waiter queued there already,
/// whose release subscription failed) while `first` holds it; then `first` is released, and
/// once the head holds the lock, every waiter takes its turn, by local hand-off. When
/// `heard_again`, the key's subscription must be asked for again and confirmed before the
/// turns (by a head: the next one, or the first as its timers woke it), and they may cost at
/// most [`CALLS_FOR_20_TURNS`] backend calls.
async fn turns_after_a_failed_subscription(
    locker: &Locker,
    (first, head): (lock_core::LockGuard, Head),
    heard_again: bool,
) {
    let mut tasks = JoinSet::new();
    for _ in 0..20 {
        let locker = locker.clone();
        tasks.spawn(async move {
            locker.lock("hot").await.unwrap().release().await.unwrap();
        });
    }
    eventually("every waiter queued", SOON, async || {
        locker.stats().waiters == 21
    })
    .await;
    first.release().await.unwrap();
    let Head { holds, go, task } = head;
    holds.await.unwrap();
    // A head asks for the subscription again (in the background), and the key hears of
    // releases again. (A count of the server's SUBSCRIBE commands cannot tell: under load the
    // first head, woken by its timers, could ask and be confirmed before any count was taken,
    // and a subscriber reconnecting subscribes its channels on its own.)
    if heard_again {
        eventually("the key hears of releases again", SOON, async || {
            locker.stats().notified_keys == 1
        })
        .await;
    }
    let before = locker.stats();
    go.send(()).unwrap();
    task.await.unwrap();
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    let after = locker.stats();
    assert_eq!(
        after.local_handoffs - before.local_handoffs,
        20,
        "every turn after the head's is local: {after:?}"
    );
    // Renewals are not the turns' asking: under load the head's hand-over renewal (due 5 to
    // 100 ms after the lock came) can fall among the turns (a CI-like run counted 6 calls).
    let renewals = after.renewal_calls - before.renewal_calls;
    let calls = after.backend_calls - before.backend_calls - renewals;
    assert!(
        !heard_again || calls <= CALLS_FOR_20_TURNS,
        "{calls} backend calls besides {renewals} renewals for 20 local turns"
    );
}

/// One connection of a test's own, kept open: the server may refuse new ones.
struct Admin(redis::aio::MultiplexedConnection);

impl Admin {
    async fn new(server: &RedisServer) -> Self {
        Admin(server.client().await)
    }

    /// A numeric field of `INFO section`.
    async fn info(&mut self, section: &str, name: &str) -> u64 {
        let text: String = redis::cmd("INFO")
            .arg(section)
            .query_async(&mut self.0)
            .await
            .unwrap();
        let prefix = format!("{name}:");
        text.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    /// Makes the server refuse every new connection (`maxclients` at the connections open
    /// now), or accept them again.
    async fn refuse_new_connections(&mut self, refuse: bool) {
        let max = if refuse {
            self.info("clients", "connected_clients").await
        } else {
            10_000
        };
        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxclients")
            .arg(max)
            .query_async(&mut self.0)
            .await
            .unwrap();
    }

    async fn hlen(&mut self, key: &str) -> i64 {
        redis::cmd("HLEN")
            .arg(key)
            .query_async(&mut self.0)
            .await
            .unwrap()
    }
}

/// A locker whose runs of local turns end only at `local_turns` (64, more than the tests'
/// turns): `local_hold` cannot end one on a slow machine.
fn hot_key_locker(backend: RedisBackend) -> Locker {
    Locker::builder(backend)
        .wait(SOON)
        .local_hold(Duration::from_secs(600))
        .build()
}

/// The head's waiter: takes `key`, says so, and releases it when told.
struct Head {
    holds: tokio::sync::oneshot::Receiver<()>,
    go: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

fn queued_head(locker: &Locker, key: &str) -> Head {
    let (locker, key) = (locker.clone(), key.to_owned());
    let (said, holds) = tokio::sync::oneshot::channel();
    let (go, told) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let guard = locker.lock(&key).await.unwrap();
        said.send(()).unwrap();
        told.await.unwrap();
        guard.release().await.unwrap();
    });
    Head { holds, go, task }
}

/// How many backend calls 20 local turns may cost: the backend asked for other processes'
/// waiters before the first local turn, the last release (2), and three to spare: the test
/// waits until the server has the subscription asked for again, and until its confirmation
/// has come back to the client the turns keep asking (one CI run on a loaded machine counted
/// 4). A queue that cannot hear other processes' waiters asks at every turn: 21. So does one
/// whose next head's subscription is refused for a recovery that was about to subscribe it (a
/// few turns).
const CALLS_FOR_20_TURNS: u64 = 5;

/// A queue whose release subscription was refused (its user lost the channel permission for a
/// while) subscribes again once notifications are back. Before, the refusal was kept for the
/// queue's life: on a key whose queue never empties, every local turn then asked the backend
/// for waiters of other processes, as if none could be heard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_subscription_is_made_again_once_notifications_are_back() {
    let user = lock_testkit::AclUser::new("app", "secret").rules(["~*", "&*", "+@all"]);
    let server = RedisServer::builder().user(&user).start();
    let backend = RedisBackend::connect(&server.url_for(&user)).await.unwrap();
    let locker = hot_key_locker(backend);
    let set_user = async |rule: &str| {
        let ok: String = server
            .query(
                redis::cmd("ACL")
                    .arg("SETUSER")
                    .arg("app")
                    .arg(rule)
                    .clone(),
            )
            .await;
        assert_eq!(ok, "OK");
    };
    let first = locker.lock("hot").await.unwrap();
    set_user("resetchannels").await;
    let head = queued_head(&locker, "hot");
    // The head subscribes before it takes a place in the backend's queue.
    eventually("the head queued in the backend", SOON, async || {
        let waiters: i64 = server
            .query(redis::cmd("HLEN").arg("lock:{hot}:waiters").clone())
            .await;
        waiters == 1
    })
    .await;
    assert!(
        server.subscribed_channels().await.is_empty(),
        "the subscription was refused"
    );
    assert_eq!(
        locker.stats().notified_keys,
        0,
        "the key hears of no release"
    );
    set_user("allchannels").await;
    eventually("the subscriber recovered", SOON, async || {
        !server.subscribed_channels().await.is_empty()
    })
    .await;
    turns_after_a_failed_subscription(&locker, (first, head), true).await;
}

/// A queue whose subscriber could not connect at all (the server refused the connection: too
/// many clients) subscribes again at the next head, which connects it. Before, nobody
/// connected it again while the queue lived: notifications stayed off for the key, and every
/// local turn asked the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_could_not_connect_is_connected_by_the_next_head() {
    let server = RedisServer::start();
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let locker = hot_key_locker(backend);
    let mut admin = Admin::new(&server).await;
    let first = locker.lock("hot").await.unwrap();
    admin.refuse_new_connections(true).await;
    let head = queued_head(&locker, "hot");
    // The head subscribes before it takes a place in the backend's queue.
    eventually("the head queued in the backend", SOON, async || {
        admin.hlen("lock:{hot}:waiters").await == 1
    })
    .await;
    let rejected = admin.info("stats", "rejected_connections").await;
    assert!(rejected > 0, "the subscriber's connection was refused");
    assert_eq!(
        locker.stats().notified_keys,
        0,
        "the key hears of no release"
    );
    admin.refuse_new_connections(false).await;
    turns_after_a_failed_subscription(&locker, (first, head), true).await;
    assert!(
        !server.subscribed_channels().await.is_empty(),
        "notifications for the key are back"
    );
}

/// The ids of the server's clients subscribed to a channel (sharded or not).
async fn subscriber_ids(server: &RedisServer) -> Vec<String> {
    let list: String = server.query(redis::cmd("CLIENT").arg("LIST").clone()).await;
    list.lines()
        .filter(|l| {
            l.split(' ')
                .any(|f| (f.starts_with("sub=") || f.starts_with("ssub=")) && !f.ends_with("=0"))
        })
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
        .map(str::to_owned)
        .collect()
}

/// A subscription confirmed on a runtime that has shut down since (the subscriber's task and
/// connection went with it) is made again by the next head, on a new connection. Before, the
/// queue kept it as confirmed and notifications as healthy: nobody connected again, and its
/// holders passed the lock on locally without hearing other processes' fair waiters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_whose_runtime_ended_is_made_again_on_a_new_connection() {
    let server = RedisServer::start();
    let locker = hot_key_locker(RedisBackend::connect(&server.url()).await.unwrap());
    let first = locker.lock("hot").await.unwrap();
    // A head on a runtime of its own subscribes (the subscriber's task starts there), gives up
    // and its runtime ends.
    let (gone, gave_up) = tokio::sync::oneshot::channel();
    let (go, told) = tokio::sync::oneshot::channel::<()>();
    let short_lived = {
        let locker = locker.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let waiting = tokio::spawn(async move { locker.lock("hot").await });
                told.await.unwrap();
                waiting.abort();
            });
            drop(runtime);
            gone.send(()).unwrap();
        })
    };
    eventually("the short-lived head subscribed", SOON, async || {
        locker.stats().waiters == 1 && !server.subscribed_channels().await.is_empty()
    })
    .await;
    let old = subscriber_ids(&server).await;
    assert_eq!(old.len(), 1, "{old:?}");
    let next = queued_head(&locker, "hot");
    eventually("the next head queued", SOON, async || {
        locker.stats().waiters == 2
    })
    .await;
    go.send(()).unwrap();
    gave_up.await.unwrap();
    short_lived.join().unwrap();
    eventually(
        "the key's subscription is back, on a new connection",
        SOON,
        async || {
            let now = subscriber_ids(&server).await;
            now.len() == 1 && now != old
        },
    )
    .await;
    first.release().await.unwrap();
    let Head { holds, go, task } = next;
    holds.await.unwrap();
    go.send(()).unwrap();
    task.await.unwrap();
}

/// While the subscriber cannot connect at all (the server keeps refusing new connections),
/// heads do not wait for connection attempts, and the attempts are spaced out (one at a
/// time, with a back-off): every turn still comes at once, by local hand-off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heads_do_not_wait_for_a_subscriber_that_cannot_connect() {
    let server = RedisServer::start();
    let locker = hot_key_locker(RedisBackend::connect(&server.url()).await.unwrap());
    let mut admin = Admin::new(&server).await;
    let first = locker.lock("hot").await.unwrap();
    admin.refuse_new_connections(true).await;
    let head = queued_head(&locker, "hot");
    eventually("the head's subscriber was refused", SOON, async || {
        admin.info("stats", "rejected_connections").await > 0
    })
    .await;
    turns_after_a_failed_subscription(&locker, (first, head), false).await;
    // One attempt at a time, after 20 ms, 40 ms, 80 ms...: a few over the turns, not one per
    // head (each of which waited for its attempt before).
    let rejected = admin.info("stats", "rejected_connections").await;
    assert!(rejected <= 8, "{rejected} connections refused");
}

/// A locker on `server` with a 10 s lease that waits up to three leases.
async fn patient_locker(server: &RedisServer) -> Locker {
    let lease = Duration::from_secs(10);
    Locker::builder(RedisBackend::connect(&server.url()).await.unwrap())
        .lease(lease)
        .wait(lease * 3)
        .build()
}

/// A holder whose release will ask the backend, and the local waiter behind it: `key` is
/// handed over in the backend to a queued task of `locker` (the returned guard) while another
/// task of `locker` waits behind it (the returned task), so that guard's release is the first
/// local turn of a run, which asks the backend whether another process waits.
async fn giver_with_a_local_waiter(
    server: &RedisServer,
    locker: &Locker,
    key: &'static str,
) -> (
    lock_core::LockGuard,
    tokio::task::JoinHandle<lock_core::LockGuard>,
) {
    let first = locker.lock(key).await.unwrap();
    let l = locker.clone();
    let giver = tokio::spawn(async move { l.lock(key).await.unwrap() });
    eventually("the giver queued", SOON, async || {
        locker.stats().waiters == 1
    })
    .await;
    let l = locker.clone();
    let waiter = tokio::spawn(async move { l.lock(key).await.unwrap() });
    eventually("the waiter queued", SOON, async || {
        locker.stats().waiters == 2
    })
    .await;
    eventually("the giver queued in the backend", SOON, async || {
        support::queued(server, key).await >= 1
    })
    .await;
    first.release().await.unwrap();
    (giver.await.unwrap(), waiter)
}

/// A release given up while it asks the backend whether another process waits (the first
/// local turn of a run; the server is stalled) is finished in the background: the lock goes to
/// the local waiter once the server answers. Before, nothing finished it, and the holder (kept
/// alive by its waiter's wait) was renewed on: the waiter got the lock a lease and a half later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_given_up_while_it_asks_the_backend_is_finished_in_the_background() {
    let mut server = RedisServer::start();
    let locker = patient_locker(&server).await;
    let (giver, waiter) = giver_with_a_local_waiter(&server, &locker, "given-up").await;
    server.pause();
    let gave_up = tokio::time::timeout(Duration::from_millis(100), giver.release()).await;
    assert!(
        gave_up.is_err(),
        "the release answered with the server stalled"
    );
    server.resume();
    let waited = std::time::Instant::now();
    let passed = tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .expect("the given-up release was finished, the lock passed on")
        .unwrap();
    assert!(
        passed.is_held(),
        "{:?} after the server resumed",
        waited.elapsed()
    );
    passed.release().await.unwrap();
}

/// The same release given up while it asks the backend, now with a waiter of another process
/// queued there: the backend's answer (which comes after the give-up) hands the lock to that
/// waiter, so the given-up release must not pass it to the local waiter as well. It releases in
/// the backend only (token-checked: a no-op once the lock went to the other process), and the
/// local waiter takes its turn through the backend, after the other process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_given_up_while_it_asks_never_passes_a_lock_the_backend_gave_away() {
    let mut server = RedisServer::start();
    let key = "given-away";
    let (locker, other) = (patient_locker(&server).await, patient_locker(&server).await);
    let (giver, waiter) = giver_with_a_local_waiter(&server, &locker, key).await;
    // The other process queues in the backend behind the giver's hold.
    let o = other.clone();
    let remote = tokio::spawn(async move { o.lock(key).await.unwrap() });
    eventually(
        "the other process queued in the backend",
        SOON,
        async || support::queued(&server, key).await >= 1,
    )
    .await;
    server.pause();
    let gave_up = tokio::time::timeout(Duration::from_millis(100), giver.release()).await;
    assert!(
        gave_up.is_err(),
        "the release answered with the server stalled"
    );
    // Until the backend answers, the lock is the giver's; then the other process's.
    assert!(
        !waiter.is_finished(),
        "the given-up release passed the lock to the local waiter"
    );
    server.resume();
    let remote = tokio::time::timeout(Duration::from_secs(5), remote)
        .await
        .expect("the backend's answer gave the lock to the other process, in the queue first")
        .unwrap();
    assert!(remote.is_held());
    assert!(
        !waiter.is_finished(),
        "the local waiter got the lock beside the other process"
    );
    remote.release().await.unwrap();
    let local = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the local waiter's turn came after the other process")
        .unwrap();
    assert!(local.is_held());
    local.release().await.unwrap();
}
