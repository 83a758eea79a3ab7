//! What the consensus backends' fault tests (`etcd/`, `zookeeper/`) share: the fence-checking
//! store a lock protects, the counts of a fair queue's wake-ups, the load and fair-queue
//! scenarios in process, and again with `lock-worker` OS processes (`processes.rs`).

#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout,
    reason = "test support shared by test binaries: a failure here fails the test that uses it"
)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_core::{LockError, LockGuard, Locker};
use lock_testkit::{ChildProcess, RedisServer, eventually};
use lock_tests::probe::{SECTION, section_keys};
use lock_tests::worker::{SectionsSummary, WorkerArgs};
use tokio::task::JoinHandle;

/// The storage a lock protects, checking fences: a write carrying a lower fence than one
/// already seen for its key is refused (and counted).
#[derive(Debug, Default)]
pub struct FenceStore {
    highest: Mutex<HashMap<String, u64>>,
    pub accepted: AtomicU64,
    pub refused: AtomicU64,
}

impl FenceStore {
    /// Writes `key` under `fence`: `false` when refused as stale.
    pub fn write(&self, key: &str, fence: u64) -> bool {
        let mut highest = self.highest.lock().unwrap();
        let seen = highest.entry(key.to_owned()).or_insert(0);
        if fence < *seen {
            self.refused.fetch_add(1, SeqCst);
            return false;
        }
        *seen = fence;
        self.accepted.fetch_add(1, SeqCst);
        true
    }
}

/// Backend calls other than renewals: acquire attempts, releases, queue leaves.
pub fn attempts(locker: &Locker) -> u64 {
    let stats = locker.stats();
    stats.backend_calls - stats.renewal_calls
}

/// The backend calls of the waiter just served (the last of `order`) between `before` and
/// `after` (each waiter's [`attempts`]); fails the test if a waiter not yet served made any.
pub fn woken(order: &[usize], before: &[u64], after: &[u64]) -> u64 {
    let i = *order.last().expect("a waiter was served");
    for j in (0..after.len()).filter(|j| !order.contains(j)) {
        assert_eq!(
            after[j], before[j],
            "waiter {j}, still queued, called the backend when waiter {i} was served"
        );
    }
    after[i] - before[i]
}

/// The keys the load tests' workers contend for.
pub const LOAD_KEYS: [&str; 3] = ["acct:1", "acct:2", "acct:3"];

/// What the load tests' workers saw.
#[derive(Debug, Default)]
pub struct Seen {
    inside: [AtomicUsize; LOAD_KEYS.len()],
    pub overlaps: AtomicU64,
    pub sections: AtomicU64,
    /// Writes refused while the writer's guard still said "held".
    pub refused_while_held: AtomicU64,
    pub errors: AtomicU64,
    /// The fences granted, and what their release answered (for the diagnosis of a lock
    /// blocking the others).
    pub releases: Mutex<HashMap<u64, String>>,
}

/// A load test's workers: 4 tasks per locker, each taking the [`LOAD_KEYS`] in turn (fenced,
/// waiting up to 20 s), writing to `store` inside and releasing, until `stop`. An attempt that
/// fails with `Backend` or `Timeout` is counted and the next one made.
pub struct Load {
    pub store: Arc<FenceStore>,
    pub seen: Arc<Seen>,
    stop: Arc<AtomicBool>,
    workers: Vec<JoinHandle<()>>,
}

impl Load {
    pub fn start(lockers: &[Locker]) -> Load {
        let store = Arc::new(FenceStore::default());
        let seen = Arc::new(Seen::default());
        let stop = Arc::new(AtomicBool::new(false));
        let mut workers = Vec::new();
        for (l, locker) in lockers.iter().enumerate() {
            for t in 0..4 {
                let (locker, store, seen, stop) =
                    (locker.clone(), store.clone(), seen.clone(), stop.clone());
                workers.push(tokio::spawn(async move {
                    let mut n = l + t;
                    while !stop.load(SeqCst) {
                        n += 1;
                        work(&locker, n % LOAD_KEYS.len(), &store, &seen).await;
                    }
                }));
            }
        }
        Load {
            store,
            seen,
            stop,
            workers,
        }
    }

    /// Critical sections so far.
    pub fn sections(&self) -> u64 {
        self.seen.sections.load(SeqCst)
    }

    /// Stops the workers (each within 30 s) and checks what they saw: never two holders, no
    /// write refused while its writer held the lock, no stale write accepted, and progress in
    /// every round (`progress`: the sections of each round).
    pub async fn stop_and_check(self, rounds: usize, took: Duration, progress: &[u64]) {
        self.stop.store(true, SeqCst);
        for w in self.workers {
            tokio::time::timeout(Duration::from_secs(30), w)
                .await
                .expect("a worker stayed stuck")
                .expect("worker");
        }
        let (store, seen) = (&self.store, &self.seen);
        println!(
            "{rounds} fault rounds in {took:?}: {} critical sections (per round {progress:?}), \
             {} writes accepted, {} refused, {} lock errors",
            seen.sections.load(SeqCst),
            store.accepted.load(SeqCst),
            store.refused.load(SeqCst),
            seen.errors.load(SeqCst),
        );
        assert_eq!(seen.overlaps.load(SeqCst), 0, "two holders at once");
        assert_eq!(
            seen.refused_while_held.load(SeqCst),
            0,
            "a holder's write was refused while it held the lock: a later fence was out"
        );
        assert_eq!(
            store.refused.load(SeqCst),
            0,
            "stale writes: fences went backwards"
        );
        assert!(rounds >= 2, "only {rounds} fault rounds");
        assert!(
            progress.iter().all(|&p| p > 0),
            "a round without progress: {progress:?}"
        );
    }
}

/// One critical section of a load worker on key `k`.
async fn work(locker: &Locker, k: usize, store: &FenceStore, seen: &Seen) {
    let request = locker
        .lock(LOAD_KEYS[k])
        .fenced()
        .wait(Duration::from_secs(20));
    let guard = match request.await {
        Ok(guard) => guard,
        Err(LockError::Backend { .. } | LockError::Timeout { .. }) => {
            seen.errors.fetch_add(1, SeqCst);
            return;
        }
        Err(e) => panic!("unexpected: {e:?}"),
    };
    let fence = guard.fence().expect("fenced");
    if seen.inside[k].fetch_add(1, SeqCst) != 0 {
        seen.overlaps.fetch_add(1, SeqCst);
    }
    if !store.write(LOAD_KEYS[k], fence) && guard.is_held() {
        seen.refused_while_held.fetch_add(1, SeqCst);
    }
    tokio::time::sleep(Duration::from_millis(3)).await;
    seen.sections.fetch_add(1, SeqCst);
    seen.inside[k].fetch_sub(1, SeqCst);
    // A release may fail in a fault (the lock then ends with its lease, or is deleted in the
    // background).
    seen.releases
        .lock()
        .unwrap()
        .insert(fence, "releasing".into());
    let released = guard.release().await;
    if released.is_err() {
        seen.errors.fetch_add(1, SeqCst);
    }
    seen.releases
        .lock()
        .unwrap()
        .insert(fence, format!("{released:?}"));
}

/// While `guard` is held through a fault, `other` tries `key` every 200 ms for `span`:
/// `lost()` must not fire, the guard must stay held, and every answer must be `Busy` or an
/// error (an election in progress). Returns how many were `Busy` and how many errors.
pub async fn held_while_others_try(
    guard: &LockGuard,
    other: &Locker,
    key: &str,
    span: Duration,
) -> (u32, u32) {
    let start = Instant::now();
    let (mut busy, mut errors) = (0, 0);
    while start.elapsed() < span {
        tokio::select! {
            () = guard.lost() => panic!("lost() fired {:?} into the fault", start.elapsed()),
            answer = other.try_lock(key).fenced() => match answer {
                Err(LockError::Busy { .. }) => busy += 1,
                Err(LockError::Backend { .. }) => errors += 1,
                other => panic!("another locker's try_lock: {other:?}"),
            },
        }
        assert!(
            guard.is_held(),
            "not held {:?} into the fault",
            start.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    (busy, errors)
}

/// The holder of `guard` was just cut off: `other` waits for `key` (up to 20 s) while
/// `lost()` must fire within `bound`. Checks that the holder learnt of the loss before the
/// other locker got the lock, with a higher fence, and that `store` refuses the old holder's
/// write after the new one's. Returns the new guard.
pub async fn lost_before_taken(
    guard: &LockGuard,
    other: &Locker,
    key: &str,
    bound: Duration,
    store: &FenceStore,
    what: &str,
) -> LockGuard {
    let old = guard.fence().expect("fenced");
    let start = Instant::now();
    let next = tokio::spawn({
        let (other, key) = (other.clone(), key.to_owned());
        async move {
            let guard = other
                .lock(&key)
                .fenced()
                .wait(Duration::from_secs(20))
                .await;
            (Instant::now(), guard)
        }
    });
    tokio::time::timeout(bound, guard.lost())
        .await
        .expect("lost() did not fire in time");
    let lost = Instant::now();
    assert!(!guard.is_held());
    let (taken, next) = next.await.expect("task");
    let next = next.expect("the other locker gets the lock");
    println!(
        "{what}: lost() {:?} after the cut, the other locker got the lock {:?} after it",
        lost - start,
        taken - start
    );
    assert!(
        taken > lost,
        "the lock was granted before its holder knew it lost it"
    );
    let new = next.fence().expect("fenced");
    assert!(new > old, "fence {new} after {old}");
    assert!(store.write(key, new));
    // The old holder, unaware, writes with its fence: refused.
    assert!(!store.write(key, old), "a stale write was accepted");
    next
}

/// Takes `key` fenced on `locker`, trying again while attempts fail with `Backend` (an
/// election, a request sent to a member that was down, a session being replaced) or
/// `Timeout` for up to `bound`. Returns the guard and how many attempts failed.
pub async fn lock_through_faults(
    locker: &Locker,
    key: &str,
    bound: Duration,
) -> (LockGuard, usize) {
    let start = Instant::now();
    let mut failed = 0;
    loop {
        match locker
            .lock(key)
            .fenced()
            .wait(Duration::from_secs(10))
            .await
        {
            Ok(guard) => return (guard, failed),
            Err(LockError::Backend { .. } | LockError::Timeout { .. })
                if start.elapsed() < bound =>
            {
                failed += 1;
            }
            Err(e) => panic!("lock {key}: {e:?}"),
        }
    }
}

/// Fair waiters on `waiters` (one each, on lock `key` with `lease`) queue behind `guard` one
/// after the other (`queued(n)` waits until `n` contenders, the holder's included, are in the
/// backend's queue); then the holder releases, and each waiter, once served, releases in
/// turn. Checks that they are served in creation order, each with the fence of its own
/// contender (`fences()`: every contender's, in queue order, the holder's first), and that
/// each release wakes only the next waiter, with at most one acquire call.
pub async fn fair_waiters_are_served_in_order(
    guard: LockGuard,
    waiters: &[Locker],
    key: &str,
    lease: Duration,
    mut queued: impl AsyncFnMut(usize),
    fences: impl AsyncFnOnce() -> Vec<u64>,
) {
    let (granted_tx, mut granted) = tokio::sync::mpsc::unbounded_channel();
    let mut release = Vec::new();
    let mut tasks = Vec::new();
    for (i, waiter) in waiters.iter().enumerate() {
        let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
        release.push(Some(release_tx));
        let (waiter, granted_tx, key) = (waiter.clone(), granted_tx.clone(), key.to_owned());
        tasks.push(tokio::spawn(async move {
            let guard = waiter
                .lock(&key)
                .lease(lease)
                .fair()
                .fenced()
                .wait(Duration::from_secs(30))
                .await
                .expect("a fair waiter");
            granted_tx
                .send((i, guard.fence().expect("fenced")))
                .unwrap();
            release_rx.await.unwrap();
            guard.release().await.expect("release");
        }));
        // Queued before the next one starts: creation order is the start order.
        queued(i + 2).await;
    }
    let queue = fences().await;
    assert_eq!(queue.len(), waiters.len() + 1, "the queue: {queue:?}");
    let mut before: Vec<u64> = waiters.iter().map(attempts).collect();
    guard.release().await.expect("release");
    let (mut order, mut wakeups) = (Vec::new(), Vec::new());
    for turn in 0..waiters.len() {
        let (i, fence) = tokio::time::timeout(Duration::from_secs(10), granted.recv())
            .await
            .expect("nobody served after a release")
            .unwrap();
        order.push(i);
        assert_eq!(
            fence,
            queue[turn + 1],
            "turn {turn} went to another contender"
        );
        let after: Vec<u64> = waiters.iter().map(attempts).collect();
        wakeups.push(woken(&order, &before, &after));
        before = after;
        release[i].take().unwrap().send(()).unwrap();
    }
    for t in tasks {
        t.await.expect("task");
    }
    println!("served in order {order:?}; acquire calls of each woken waiter: {wakeups:?}");
    assert_eq!(
        order,
        (0..waiters.len()).collect::<Vec<_>>(),
        "not served in creation order"
    );
    assert!(
        wakeups.iter().all(|&w| w <= 1),
        "more than one acquire call per wake-up: {wakeups:?}"
    );
}

/// The `lock-worker` binary: a lock client in an OS process of its own.
const WORKER: &str = env!("CARGO_BIN_EXE_lock-worker");

/// Starts `n` `lock-worker` processes with `args` and waits until each has printed `first`.
pub async fn workers(args: &WorkerArgs, n: usize, first: &str) -> Vec<ChildProcess> {
    let mut workers = Vec::new();
    for _ in 0..n {
        let mut worker = ChildProcess::spawn(WORKER, args.to_args());
        worker.expect_line(first, Duration::from_secs(20)).await;
        workers.push(worker);
    }
    workers
}

/// The counts of a fence-checking store ([`SECTION`]: `entered`, `left`, `stale`, `overlap`; a
/// count never set is 0).
async fn store_counts(store: &RedisServer, key: &str) -> HashMap<String, u64> {
    store.query(redis::cmd("HGETALL").arg(key).clone()).await
}

async fn store_count(store: &RedisServer, key: &str, field: &str) -> u64 {
    store_counts(store, key)
        .await
        .get(field)
        .copied()
        .unwrap_or(0)
}

/// Scenario 1 in OS processes: `processes` `lock-worker sections` processes started with
/// `args` (its lock service, keys, tasks and lease; critical sections checked by the store
/// [`SECTION`] on `store`), through `rounds` calls of `fault` once they have done their first
/// ten sections. Checks that the store saw no section entering while another was inside and
/// accepted no stale fence, that every process did sections and had none refused, that every
/// round made progress and that at least `floor` sections were done; and that the store
/// itself refuses a repeated fence.
pub async fn sections_through_faults(
    args: &WorkerArgs,
    store: &RedisServer,
    processes: usize,
    rounds: usize,
    floor: u64,
    mut fault: impl AsyncFnMut(),
) {
    let started = Instant::now();
    let counts_key = args.counts_key().expect("sections have a counts key");
    let workers = workers(args, processes, "ready").await;
    eventually("sections done", Duration::from_secs(10), async || {
        store_count(store, &counts_key, "left").await >= 10
    })
    .await;
    let mut progress = Vec::new();
    for _ in 0..rounds {
        let before = store_count(store, &counts_key, "left").await;
        fault().await;
        progress.push(store_count(store, &counts_key, "left").await - before);
    }
    let mut summaries = Vec::new();
    for worker in workers {
        let out = worker.finish(Duration::from_secs(30)).await;
        let summary = out
            .lines
            .iter()
            .rev()
            .find_map(|l| SectionsSummary::parse(l));
        assert!(
            out.status.success() && summary.is_some(),
            "a worker failed ({}): {:?}\n{}",
            out.status,
            out.lines,
            out.stderr
        );
        summaries.extend(summary);
    }
    let seen = store_counts(store, &counts_key).await;
    println!(
        "{rounds} fault rounds, {:?} in all: store counts {seen:?}, sections per round \
         {progress:?}; per process {summaries:?}",
        started.elapsed()
    );
    let field = |name: &str| seen.get(name).copied().unwrap_or(0);
    assert_eq!(
        field("overlap"),
        0,
        "a section entered while another was inside"
    );
    assert_eq!(field("stale"), 0, "the store refused a stale fence");
    assert_eq!(
        summaries.iter().map(|s| s.sections).sum::<u64>(),
        field("left"),
        "the workers' count of sections is not the store's"
    );
    assert!(
        field("left") >= floor,
        "{} sections, fewer than {floor}",
        field("left")
    );
    assert!(
        summaries.iter().all(|s| s.sections > 0 && s.refused == 0),
        "a process did no section or was refused: {summaries:?}"
    );
    assert!(
        progress.iter().all(|&p| p > 0),
        "a round without progress: {progress:?}"
    );
    // The store itself refuses a fence that is not above the highest it accepted.
    let (_, _, fence_key) = args.names(0);
    let [highest, marker] = section_keys(&fence_key.expect("sections have a fence key"));
    let highest_fence: u64 = store.get(&highest).await.unwrap().parse().unwrap();
    let mut conn = store.client().await;
    let answer: String = redis::Script::new(SECTION)
        .key(&highest)
        .key(&marker)
        .key(&counts_key)
        .arg("enter")
        .arg(highest_fence)
        .arg("stale-check")
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(answer, "stale", "the store accepted a repeated fence");
}

/// Scenario 5 in OS processes: four `lock-worker serve` processes started with `args` (its
/// lock service and lease; `url` the Redis server `store`) each queue one fair, fenced waiter
/// on lock `queue` behind `guard`, one after the other (`queued(n)` waits until `n`
/// contenders, the holder's included, are in the backend's queue); then the holder releases,
/// and each waiter, once served, releases in turn. Checks that they are served in creation
/// order, each with the fence of its own contender (`fences()`: every contender's, in queue
/// order, the holder's first), that each release wakes only the next waiter, with at most one
/// acquire call, and (`empty()`) that no contender is left.
pub async fn fair_workers_are_served_in_order(
    args: &WorkerArgs,
    store: &RedisServer,
    guard: LockGuard,
    mut queued: impl AsyncFnMut(usize),
    fences: impl AsyncFnOnce() -> Vec<u64>,
    empty: impl AsyncFnMut() -> bool,
) {
    let started = Instant::now();
    let mut workers = workers(args, 4, "READY").await;
    for (i, worker) in workers.iter_mut().enumerate() {
        worker
            .send(&format!("WAIT queue {i} order fair fenced keep"))
            .await;
        // Queued before the next one starts: creation order is the start order.
        queued(i + 2).await;
    }
    let queue = fences().await;
    assert_eq!(queue.len(), workers.len() + 1, "the queue: {queue:?}");
    let mut before = worker_attempts(&mut workers).await;
    let released = Instant::now();
    guard.release().await.expect("release");
    let (mut order, mut wakeups) = (Vec::new(), Vec::new());
    for turn in 0..workers.len() {
        eventually(
            &format!("turn {turn} served"),
            Duration::from_secs(10),
            async || served(store).await.len() > turn,
        )
        .await;
        let i: usize = served(store).await[turn].parse().unwrap();
        order.push(i);
        let done = workers[i].line().await;
        assert_eq!(
            done,
            format!("DONE {i} fence={}", queue[turn + 1]),
            "turn {turn} went to another contender"
        );
        let after = worker_attempts(&mut workers).await;
        wakeups.push(woken(&order, &before, &after));
        before = after;
        assert_eq!(workers[i].ask("RELEASE queue").await, "RELEASED queue ok");
    }
    let served_in = released.elapsed();
    eventually("queue empty", Duration::from_secs(5), empty).await;
    println!(
        "served in order {order:?} within {served_in:?} of the first release; acquire calls of \
         each woken waiter: {wakeups:?}; {:?} in all",
        started.elapsed()
    );
    assert_eq!(order, [0, 1, 2, 3], "not served in creation order");
    assert!(
        wakeups.iter().all(|&w| w <= 1),
        "more than one acquire call per wake-up: {wakeups:?}"
    );
}

/// The ids in the order their waiters got the lock.
async fn served(store: &RedisServer) -> Vec<String> {
    store
        .query(redis::cmd("LRANGE").arg("order").arg(0).arg(-1).clone())
        .await
}

/// Each worker's backend calls other than renewals (its `STATS`).
async fn worker_attempts(workers: &mut [ChildProcess]) -> Vec<u64> {
    let mut all = Vec::new();
    for worker in workers {
        let stats = worker.ask("STATS").await;
        let attempts = stats
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix("attempts="))
            .and_then(|n| n.parse().ok());
        all.push(attempts.unwrap_or_else(|| panic!("not a STATS line: {stats}")));
    }
    all
}

/// What the people on call do, across OS processes: `stuck` and `next` are `lock-worker
/// serve` command lines (their lock service, lease and holder identity; `stuck` names itself
/// `holder`), `store` the Redis server of their fenced writes, `operator` a locker of this
/// process on the same lock service. `inspect` from here sees the agent's holder, age, fence
/// and waiter; `force_unlock` hands the lock to the waiting agent at once (printed; within
/// 500 ms, where its own timer would take longer); the stuck agent's fenced write is refused
/// and its release says `LeaseLost`; after the release, nothing is held.
pub async fn operations_across_processes(
    stuck: &WorkerArgs,
    next: &WorkerArgs,
    holder: &str,
    lease: Duration,
    operator: &Locker,
) {
    let spawn = |args: &WorkerArgs| ChildProcess::spawn(WORKER, args.to_args());
    let (mut stuck, mut next) = (spawn(stuck), spawn(next));
    for agent in [&mut stuck, &mut next] {
        agent.expect_line("READY", Duration::from_secs(20)).await;
    }
    assert!(!operator.inspect("vault").await.unwrap().held);
    let lease_ms = lease.as_millis();
    let sent = Instant::now();
    let answer = stuck.ask(&format!("HOLD vault {lease_ms} 1")).await;
    let answered = Instant::now();
    let old: u64 = answer
        .strip_prefix("HELD vault fence=")
        .and_then(|f| f.parse().ok())
        .unwrap_or_else(|| panic!("the agent could not hold the lock: {answer}"));
    let state = operator.inspect("vault").await.unwrap();
    let (age_low, age_high) = (answered.elapsed(), sent.elapsed());
    assert!(state.held, "{state:?}");
    assert_eq!(state.holder.as_deref(), Some(holder));
    assert_eq!(state.fence, Some(old));
    assert_eq!(state.waiters, 0);
    let held_for = state.held_for.expect("the age of the lock");
    // Stamped between our command and its answer, within 50 ms of two clocks on one host.
    let slack = Duration::from_millis(50);
    assert!(
        held_for + slack >= age_low && held_for <= age_high + slack,
        "held for {held_for:?}; taken between {age_low:?} and {age_high:?} ago"
    );
    let remaining = state.remaining.expect("the lease left");
    assert!(remaining <= lease, "{remaining:?} left of {lease:?}");
    println!("inspect across processes: held for {held_for:?}, {remaining:?} left");

    // A fenced waiter in the other agent queues.
    next.send("WAIT vault w1 order fenced keep").await;
    eventually("the waiter queued", Duration::from_secs(10), async || {
        operator.inspect("vault").await.unwrap().waiters == 1
    })
    .await;
    let start = Instant::now();
    let removed = operator
        .force_unlock("vault")
        .await
        .unwrap()
        .expect("a held lock removed");
    let done = next.line().await;
    let woken = start.elapsed();
    println!("force_unlock across processes: the waiter was served {woken:?} after the call");
    assert_eq!(removed.holder.as_deref(), Some(holder));
    assert_eq!(removed.fence, Some(old));
    let fence: u64 = done
        .strip_prefix("DONE w1 fence=")
        .and_then(|f| f.parse().ok())
        .unwrap_or_else(|| panic!("the waiter: {done}"));
    assert!(fence > old, "{fence} after {old}");
    assert!(woken < Duration::from_millis(500), "served {woken:?} after");
    assert!(operator.inspect("vault").await.unwrap().held);

    // The new holder writes first; the stuck one's fenced write is refused, its release too.
    assert!(
        next.ask("WRITE vault store")
            .await
            .starts_with("WRITE vault ok")
    );
    let write = stuck.ask("WRITE vault store").await;
    assert!(write.starts_with("WRITE vault rejected"), "{write}");
    assert_eq!(
        stuck.ask("RELEASE vault").await,
        "RELEASED vault err=LeaseLost"
    );
    assert_eq!(next.ask("RELEASE vault").await, "RELEASED vault ok");
    assert_eq!(operator.force_unlock("vault").await.unwrap(), None);
    let after = operator.inspect("vault").await.unwrap();
    assert!(!after.held && after.holder.is_none() && after.held_for.is_none());
}
