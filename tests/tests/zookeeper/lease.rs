//! A holder cut off from the ensemble past its session (its connections dropped, or kept open
//! with nothing passing, as for a paused process or a partition): it learns of the loss
//! before anyone else gets the lock, its release says `LeaseLost`, the next holder's fence is
//! higher, and the old holder's fenced write is refused.

use std::time::Duration;

use lock_core::LockError;
use lock_testkit::eventually;
use lock_testkit::zookeeper::{ZkClient, ZooKeeperEnsemble, proxied_connect_string};

use super::consensus::lost_before_taken;
use super::{FenceStore, LEASE, SESSION, contenders, locker, tree};

async fn holder_cut_off_past_its_session(blackhole: bool) {
    let hosts = tree(if blackhole { "blackholed" } else { "cut" }).await;
    let root = &hosts[hosts.find('/').unwrap()..];
    let proxies = ZooKeeperEnsemble::shared().await.proxies().await;
    let holder = locker(&format!("{}{root}", proxied_connect_string(&proxies))).await;
    let other = locker(&hosts).await;
    let zk = ZkClient::connect(&hosts).await;
    let store = FenceStore::default();

    let guard = holder.lock("acct").fenced().await.expect("lock");
    let old = guard.fence().expect("fenced");
    let old_node = contenders(&zk, "acct").await.remove(0);
    assert_eq!(old_node.fence(), old);
    assert!(store.write("acct", old));
    for p in &proxies {
        if blackhole {
            p.blackhole();
        } else {
            p.cut();
        }
    }
    let what = if blackhole { "blackholed" } else { "cut" };
    println!("{what}: session {SESSION:?}, lease {LEASE:?}");
    let bound = LEASE + Duration::from_secs(1);
    let next = lost_before_taken(&guard, &other, "acct", bound, &store, what).await;
    let new = next.fence().expect("fenced");
    // Its node went with its session.
    let old_path = format!("{}/{}", super::lock_dir("acct"), old_node.name);
    assert!(
        !super::exists(&zk, &old_path).await,
        "the old holder's node is still there"
    );
    // It reaches the ensemble again (the pause ends, the partition heals): its client finds
    // its session expired and the backend starts another.
    proxies.iter().for_each(|p| p.restore());
    eventually(
        "the holder's locker works again",
        Duration::from_secs(15),
        // Released here: a guard dropped is released in the background, and its node would
        // be counted below.
        async || match holder.try_lock("probe").await {
            Ok(probe) => probe.release().await.is_ok(),
            Err(_) => false,
        },
    )
    .await;
    let released = tokio::time::timeout(Duration::from_secs(5), guard.release())
        .await
        .expect("release hung");
    assert!(
        matches!(released, Err(LockError::LeaseLost { .. })),
        "release after the loss: {released:?}"
    );
    // Only the new holder's node remains.
    let nodes = contenders(&zk, "acct").await;
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    assert_eq!(nodes[0].fence(), new);
    next.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_connections_are_cut_loses_the_lock_and_its_fence() {
    holder_cut_off_past_its_session(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_traffic_is_blackholed_loses_the_lock_and_its_fence() {
    holder_cut_off_past_its_session(true).await;
}
