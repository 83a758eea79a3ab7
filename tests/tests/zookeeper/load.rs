//! Many tasks on three lockers contending for a few keys while the leader is killed and
//! paused in a loop: never two holders, every critical section's write accepted by the
//! fence-checking store, and work done throughout.

use std::time::{Duration, Instant};

use lock_testkit::zookeeper::ZooKeeperEnsemble;

use super::consensus::{LOAD_KEYS, Load};
use super::{LEASE, contenders, fault_round, locker};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_two_holders_and_no_stale_write_while_the_leader_is_killed_and_paused() {
    let mut ensemble = ZooKeeperEnsemble::start().await;
    let hosts = ensemble.connect_string();
    let mut lockers = Vec::new();
    for _ in 0..3 {
        lockers.push(locker(&hosts).await);
    }
    let load = Load::start(&lockers);
    let start = Instant::now();
    let mut rounds = 0;
    let mut progress = Vec::new();
    while rounds < 2 || start.elapsed() < Duration::from_secs(20) {
        let before = load.sections();
        fault_round(&mut ensemble).await;
        progress.push(load.sections() - before);
        if progress.last() == Some(&0) {
            let zk = ensemble.client().await;
            for key in LOAD_KEYS {
                let nodes = contenders(&zk, key).await;
                let releases = load.seen.releases.lock().unwrap();
                let granted: Vec<_> = nodes.iter().map(|n| releases.get(&n.fence())).collect();
                println!("no progress: {key}: {nodes:?}; granted and released: {granted:?}");
            }
        }
        rounds += 1;
    }
    let took = start.elapsed();
    load.stop_and_check(rounds, took, &progress).await;
    // Every lock was released or given up: no node is left once the background deletes ran
    // (a release lost in a fault ends at its lease).
    let zk = ensemble.client().await;
    let mut left = Vec::new();
    for key in LOAD_KEYS {
        left.extend(contenders(&zk, key).await);
    }
    if !left.is_empty() {
        tokio::time::sleep(LEASE).await;
        left.clear();
        for key in LOAD_KEYS {
            left.extend(contenders(&zk, key).await);
        }
    }
    assert!(left.is_empty(), "nodes left behind: {left:?}");
}
