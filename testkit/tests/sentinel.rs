//! The sentinel harness itself: the set comes up watched by every sentinel, and a failover or
//! a crash of the primary gives a new primary that the sentinels report.

#![allow(
    clippy::panic,
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::print_stdout,
    reason = "a test file: its helpers outside #[test] functions assert by panicking and report figures"
)]

use std::time::{Duration, Instant};

use lock_testkit::sentinel::{MASTER_NAME, RedisSentinelSet};

/// Everything a sentinel reports about the set at start: the primary, both replicas (in sync),
/// the other sentinels.
#[tokio::test]
async fn a_sentinel_set_comes_up_watched() {
    let started = Instant::now();
    let set = RedisSentinelSet::start().await;
    println!("sentinel set up in {:?}", started.elapsed());
    assert_eq!(set.master_name(), MASTER_NAME);
    assert_eq!(set.servers().len(), 3);
    assert_eq!(set.replicas().len(), 2);
    assert_eq!(set.sentinel_urls().len(), 3);
    assert_eq!(set.primary_port().await, set.primary().port());
    assert!(
        set.primary()
            .info("replication")
            .await
            .contains("role:master")
    );
    set.primary().set("k", "v").await;
    for replica in set.replicas() {
        let info = replica.info("replication").await;
        assert!(info.contains("role:slave"), "{info}");
        assert!(
            info.contains(&format!("master_port:{}", set.primary().port())),
            "{info}"
        );
        assert!(info.contains("master_link_status:up"), "{info}");
    }
    for sentinel in set.sentinels() {
        let replicas: Vec<redis::Value> = sentinel
            .query(
                redis::cmd("SENTINEL")
                    .arg("REPLICAS")
                    .arg(MASTER_NAME)
                    .clone(),
            )
            .await;
        assert_eq!(replicas.len(), 2);
        let others: Vec<redis::Value> = sentinel
            .query(
                redis::cmd("SENTINEL")
                    .arg("SENTINELS")
                    .arg(MASTER_NAME)
                    .clone(),
            )
            .await;
        assert_eq!(others.len(), 2);
    }
    println!("whole test in {:?}", started.elapsed());
}

/// SENTINEL FAILOVER promotes a replica that has the data; the old primary becomes a replica.
#[tokio::test]
async fn a_failover_changes_the_primary() {
    let started = Instant::now();
    let mut set = RedisSentinelSet::start().await;
    set.primary().set_replicated("k", "v", 2).await;
    let before = Instant::now();
    let old = set.failover().await;
    println!("failover in {:?}", before.elapsed());
    let new = set.primary().port();
    assert_ne!(new, old);
    assert_eq!(set.primary_port().await, new);
    assert!(
        set.primary()
            .info("replication")
            .await
            .contains("role:master")
    );
    assert_eq!(set.primary().get("k").await.as_deref(), Some("v"));
    // The sentinels demote the old primary some seconds later.
    let before = Instant::now();
    set.wait_until_in_sync(Duration::from_secs(30)).await;
    println!("old primary demoted after {:?} more", before.elapsed());
    let demoted = set.servers().iter().find(|s| s.port() == old).unwrap();
    assert!(demoted.info("replication").await.contains("role:slave"));
    assert_eq!(demoted.get("k").await.as_deref(), Some("v"));
    println!("whole test in {:?}", started.elapsed());
}

/// A crashed primary is replaced: the sentinels agree on a new one, which serves writes.
#[tokio::test]
async fn a_killed_primary_is_replaced() {
    let started = Instant::now();
    let mut set = RedisSentinelSet::start().await;
    let old = set.kill_primary();
    let before = Instant::now();
    let new = set.wait_for_new_primary(old, Duration::from_secs(30)).await;
    println!("new primary after a kill in {:?}", before.elapsed());
    assert_ne!(new, old);
    assert_eq!(set.primary().port(), new);
    assert_eq!(set.primary_port().await, new);
    set.primary().set("k", "v").await;
    assert_eq!(set.primary().get("k").await.as_deref(), Some("v"));
    println!("whole test in {:?}", started.elapsed());
}
