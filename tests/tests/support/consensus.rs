//! What the consensus backends' fault tests (`etcd/`, `zookeeper/`) share: the fence-checking
//! store a lock protects, and the counts of a fair queue's wake-ups.

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
