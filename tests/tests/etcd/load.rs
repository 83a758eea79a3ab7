//! Many tasks on three lockers contending for a few keys while the leader is killed and
//! paused in a loop: never two holders, every critical section's write accepted by the
//! fence-checking store, and work done throughout.

use std::time::{Duration, Instant};

use lock_testkit::etcd::EtcdCluster;

use super::consensus::Load;
use super::locker;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_two_holders_and_no_stale_write_while_the_leader_is_killed_and_paused() {
    let mut cluster = EtcdCluster::start().await;
    let urls = cluster.urls();
    let mut lockers = Vec::new();
    for _ in 0..3 {
        lockers.push(locker(&urls, "load/").await);
    }
    let load = Load::start(&lockers);
    let start = Instant::now();
    let mut rounds = 0;
    let mut progress = Vec::new();
    while start.elapsed() < Duration::from_secs(20) {
        let before = load.sections();
        super::fault_round(&mut cluster).await;
        progress.push(load.sections() - before);
        if progress.last() == Some(&0) {
            let etcd = cluster.client();
            for kv in super::contenders(&etcd, "load/").await {
                let ttl = etcd.lease_ttl(kv.lease).await;
                let granted = load
                    .seen
                    .releases
                    .lock()
                    .unwrap()
                    .get(&u64::try_from(kv.create_revision).unwrap())
                    .cloned();
                println!(
                    "no progress: {} rev {} lease {:x} ttl {ttl:?}; granted and released: {granted:?}",
                    kv.key_str(),
                    kv.create_revision,
                    kv.lease
                );
            }
        }
        rounds += 1;
    }
    load.stop_and_check(rounds, start.elapsed(), &progress)
        .await;
}
