//! A holder cut off from the cluster past its lease (its connections dropped, or kept open
//! with nothing passing, as for a paused process or a partition): it learns of the loss
//! before anyone else gets the lock, its release says `LeaseLost`, the next holder's fence is
//! higher, and the old holder's fenced write is refused.

use std::time::Duration;

use lock_core::LockError;
use lock_testkit::eventually;

use super::consensus::lost_before_taken;
use super::{FenceStore, LEASE, contenders, locker, shared, through};

async fn holder_cut_off_past_its_lease(blackhole: bool) {
    let cluster = shared().await;
    let namespace = if blackhole { "blackholed/" } else { "cut/" };
    let proxies = cluster.proxies().await;
    let holder = locker(&through(&proxies), namespace).await;
    let other = locker(&cluster.urls(), namespace).await;
    let store = FenceStore::default();

    let guard = holder.lock("acct").fenced().await.expect("lock");
    let old = guard.fence().expect("fenced");
    assert!(store.write("acct", old));
    for p in &proxies {
        if blackhole {
            p.blackhole();
        } else {
            p.cut();
        }
    }
    let what = if blackhole { "blackholed" } else { "cut" };
    let bound = LEASE + Duration::from_secs(1);
    let next = lost_before_taken(&guard, &other, "acct", bound, &store, what).await;
    let new = next.fence().expect("fenced");
    // It reaches the cluster again (the pause ends, the partition heals), its client back on
    // working connections (the first request on a connection dropped meanwhile fails: see
    // the report), and releases.
    proxies.iter().for_each(|p| p.restore());
    eventually(
        "the holder's client works again",
        Duration::from_secs(10),
        // Released here: a guard dropped is released in the background, and its key would
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
    // The old holder's key is gone; only the new holder's remains.
    let keys = contenders(&cluster.client(), namespace).await;
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert_eq!(u64::try_from(keys[0].create_revision).unwrap(), new);
    next.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_connections_are_cut_loses_the_lock_and_its_fence() {
    holder_cut_off_past_its_lease(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_traffic_is_blackholed_loses_the_lock_and_its_fence() {
    holder_cut_off_past_its_lease(true).await;
}
