//! Many tasks on three lockers contending for a few keys while the leader is killed and
//! paused in a loop: never two holders, every critical section's write accepted by the
//! fence-checking store, and work done throughout.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

use lock_core::LockError;
use lock_testkit::zookeeper::ZooKeeperEnsemble;

use super::{FenceStore, contenders, fault_round, locker};

const KEYS: [&str; 3] = ["acct:1", "acct:2", "acct:3"];

/// What the workers saw.
#[derive(Debug, Default)]
struct Seen {
    inside: [AtomicUsize; KEYS.len()],
    overlaps: AtomicU64,
    sections: AtomicU64,
    /// Writes refused while the writer's guard still said "held".
    refused_while_held: AtomicU64,
    errors: AtomicU64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_two_holders_and_no_stale_write_while_the_leader_is_killed_and_paused() {
    let mut ensemble = ZooKeeperEnsemble::start().await;
    let hosts = ensemble.connect_string();
    let mut lockers = Vec::new();
    for _ in 0..3 {
        lockers.push(locker(&hosts).await);
    }
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
                    let k = n % KEYS.len();
                    let request = locker.lock(KEYS[k]).fenced().wait(Duration::from_secs(20));
                    let guard = match request.await {
                        Ok(guard) => guard,
                        Err(LockError::Backend { .. } | LockError::Timeout { .. }) => {
                            seen.errors.fetch_add(1, SeqCst);
                            continue;
                        }
                        Err(e) => panic!("unexpected: {e:?}"),
                    };
                    let fence = guard.fence().expect("fenced");
                    if seen.inside[k].fetch_add(1, SeqCst) != 0 {
                        seen.overlaps.fetch_add(1, SeqCst);
                    }
                    if !store.write(KEYS[k], fence) && guard.is_held() {
                        seen.refused_while_held.fetch_add(1, SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    seen.sections.fetch_add(1, SeqCst);
                    seen.inside[k].fetch_sub(1, SeqCst);
                    // A release may fail in a fault (the node is then deleted in the
                    // background, or goes with the lease or the session).
                    if guard.release().await.is_err() {
                        seen.errors.fetch_add(1, SeqCst);
                    }
                }
            }));
        }
    }
    let start = Instant::now();
    let mut rounds = 0;
    let mut progress = Vec::new();
    while rounds < 2 || start.elapsed() < Duration::from_secs(20) {
        let before = seen.sections.load(SeqCst);
        fault_round(&mut ensemble).await;
        progress.push(seen.sections.load(SeqCst) - before);
        if progress.last() == Some(&0) {
            let zk = ensemble.client().await;
            for key in KEYS {
                println!("no progress: {key}: {:?}", contenders(&zk, key).await);
            }
        }
        rounds += 1;
    }
    stop.store(true, SeqCst);
    for w in workers {
        tokio::time::timeout(Duration::from_secs(30), w)
            .await
            .expect("a worker stayed stuck")
            .expect("worker");
    }
    let sections = seen.sections.load(SeqCst);
    println!(
        "{rounds} fault rounds in {:?}: {sections} critical sections (per round {progress:?}), \
         {} writes accepted, {} refused, {} lock errors",
        start.elapsed(),
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
    assert!(
        progress.iter().all(|&p| p > 0),
        "a round without progress: {progress:?}"
    );
}
