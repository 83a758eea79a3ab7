//! `lock-admin` on the consensus backends, against real servers: an etcd member and a
//! ZooKeeper server started by the test kit, a lock held by a `Locker` there with a holder
//! name, and the binary's `inspect`, `list` and `unlock --yes` on it through `etcd://` and
//! `zookeeper://` URLs.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "tests"
)]

mod support;

use std::time::Duration;

use lock_core::{EtcdBackend, Locker, ZooKeeperBackend};
use lock_testkit::etcd::EtcdCluster;
use lock_testkit::zookeeper::ZooKeeperEnsemble;

use support::{SOON, admin, until_waiters};

const HOLDER: &str = "consensus holder/pid 7";

/// Holds `order:1` on `holder` while another locker waits for it, then has `lock-admin` at
/// `url` inspect, list and free it: the waiter is served, the holder learns.
async fn inspect_list_and_unlock(url: &str, holder: Locker, waiter: Locker) {
    let held = holder.lock("order:1").await.expect("acquire");
    let waiting = tokio::spawn(async move { waiter.lock("order:1").wait(SOON).await });
    until_waiters(&holder, "order:1", 1).await;

    let ran = admin(&["--url", url, "--json", "inspect", "order:1"], None).await;
    assert_eq!(ran.code, 0, "{ran:?}");
    let state = &ran.json_lines()[0];
    assert_eq!(state["held"], true, "{ran:?}");
    assert_eq!(state["holder"], HOLDER, "{ran:?}");
    assert_eq!(state["waiters"], 1, "{ran:?}");

    let ran = admin(&["--url", url, "--json", "list", "order:*"], None).await;
    assert_eq!(ran.code, 0, "{ran:?}");
    let listed = ran.json_lines();
    assert_eq!(listed.len(), 1, "{ran:?}");
    assert_eq!(listed[0]["key"], "order:1", "{ran:?}");

    let ran = admin(&["--url", url, "unlock", "order:1", "--yes"], None).await;
    assert_eq!(ran.code, 0, "{ran:?}");
    assert!(
        ran.stdout.contains(HOLDER),
        "prints the holder removed: {ran:?}"
    );
    let served = tokio::time::timeout(SOON, waiting)
        .await
        .expect("the waiter served after the unlock")
        .expect("waiter task")
        .expect("the waiter's lock");
    tokio::time::timeout(SOON, held.lost())
        .await
        .expect("the evicted holder learns");
    served.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_locks_are_inspected_listed_and_freed() {
    let cluster = EtcdCluster::start_single().await;
    let urls = cluster.urls();
    let endpoints: Vec<&str> = urls.iter().map(String::as_str).collect();
    let locker = async |name: &str| {
        let backend = EtcdBackend::builder(&endpoints)
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .expect("connect to etcd");
        Locker::builder(backend).holder(name).build()
    };
    let hosts: Vec<&str> = urls
        .iter()
        .map(|u| u.trim_start_matches("http://"))
        .collect();
    let url = format!("etcd://{}", hosts.join(","));
    inspect_list_and_unlock(&url, locker(HOLDER).await, locker("waiter").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_locks_are_inspected_listed_and_freed() {
    let server = ZooKeeperEnsemble::start_single().await;
    let hosts = server.connect_string();
    let locker = async |name: &str| {
        let backend = ZooKeeperBackend::builder(&hosts)
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .expect("connect to ZooKeeper");
        Locker::builder(backend).holder(name).build()
    };
    let url = format!("zookeeper://{hosts}");
    inspect_list_and_unlock(&url, locker(HOLDER).await, locker("waiter").await).await;
}
