//! `lock-admin` against a real Redis Cluster (three primaries) holding locks on every shard:
//! list reads every primary, inspect and unlock reach the key's shard, unlock still asks.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed expectation fails the test"
)]

mod support;

use std::time::Duration;

use lock_core::{LockError, Locker, RedisClusterBackend};
use lock_testkit::cluster::RedisCluster;
use support::{SOON, admin, until_waiters};

async fn holder(urls: &[String], holder: &str) -> Locker {
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let backend = RedisClusterBackend::builder(&urls)
        .connect_timeout(Duration::from_secs(5))
        .response_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connect to the cluster");
    Locker::builder(backend)
        .prefix("cl:")
        .holder(holder)
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_inspect_and_unlock_on_a_cluster() {
    let cluster = RedisCluster::builder()
        .replicas_per_primary(0)
        .start()
        .await;
    let urls = cluster.urls();
    let hosts: Vec<String> = urls
        .iter()
        .map(|u| {
            u.trim_start_matches("redis://")
                .trim_end_matches('/')
                .to_owned()
        })
        .collect();
    let url = format!("redis+cluster://{}", hosts.join(","));
    let app = holder(&urls, "shard-app").await;
    let mut guards = Vec::new();
    let mut primaries = std::collections::BTreeSet::new();
    for i in 0..12 {
        let key = format!("job:{i}");
        primaries.insert(cluster.primary_for_key(&format!("cl:{{{key}}}")).await);
        guards.push(app.lock(key.as_str()).fenced().await.unwrap());
    }
    assert_eq!(primaries.len(), 3, "the locks span every shard");
    let _other = app.lock("other:1").await.unwrap();

    let base = ["--url", url.as_str(), "--prefix", "cl:"];
    let with = |more: &[&'static str]| -> Vec<String> {
        base.iter().chain(more).map(|s| (*s).to_owned()).collect()
    };
    let run = |args: Vec<String>, input: Option<&'static str>| async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        admin(&args, input).await
    };
    let listed = run(with(&["--json", "list", "job:*"]), None).await;
    assert_eq!(listed.code, 0, "{listed:?}");
    let mut keys: Vec<String> = listed
        .json_lines()
        .iter()
        .map(|s| {
            assert_eq!(s["holder"], "shard-app");
            s["key"].as_str().unwrap().to_owned()
        })
        .collect();
    keys.sort();
    let mut expected: Vec<String> = (0..12).map(|i| format!("job:{i}")).collect();
    expected.sort();
    assert_eq!(keys, expected);
    let all = run(with(&["list"]), None).await;
    assert_eq!(all.stdout.lines().count(), 13, "{all:?}");

    // A waiter on job:3, seen by inspect.
    let next = holder(&urls, "shard-next").await;
    let waiter = tokio::spawn({
        let next = next.clone();
        async move { next.lock("job:3").fenced().wait(SOON).await }
    });
    until_waiters(&app, "job:3", 1).await;
    let inspected = run(with(&["--json", "inspect", "job:3"]), None).await;
    assert_eq!(inspected.code, 0, "{inspected:?}");
    let state = &inspected.json_lines()[0];
    assert_eq!(state["holder"], "shard-app");
    assert_eq!(state["fence"], guards[3].fence().unwrap());
    assert_eq!(state["waiters"], 1);

    // Refused without a yes; removed with one, and the waiter is served.
    let refused = run(with(&["unlock", "job:3"]), Some("n\n")).await;
    assert_eq!(refused.code, 3, "{refused:?}");
    assert!(guards[3].is_held());
    assert_eq!(
        app.inspect("job:3").await.unwrap().holder.as_deref(),
        Some("shard-app")
    );
    let removed = run(with(&["unlock", "job:3"]), Some("y\n")).await;
    assert_eq!(removed.code, 0, "{removed:?}");
    assert!(
        removed.stdout.contains("held by \"shard-app\""),
        "{removed:?}"
    );
    let served = tokio::time::timeout(SOON, waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(served.fence().unwrap() > guards[3].fence().unwrap());
    let yes = run(with(&["--json", "unlock", "job:7", "--yes"]), None).await;
    assert_eq!(yes.code, 0, "{yes:?}");
    assert_eq!(yes.json_lines()[0]["removed"]["holder"], "shard-app");
    // One node's URL as a one-server URL: a listing of that node alone would miss the other
    // shards' locks, silently; refused, naming the cluster scheme.
    let one = format!("redis://{}/", hosts[0]);
    let partial = admin(&["--url", &one, "--prefix", "cl:", "list"], None).await;
    assert_eq!(partial.code, 2, "{partial:?}");
    assert!(
        partial.stderr.contains("redis+cluster://") && partial.stdout.is_empty(),
        "{partial:?}"
    );
    for (i, g) in guards.into_iter().enumerate() {
        let released = g.release().await;
        if i == 3 || i == 7 {
            assert!(
                matches!(released, Err(LockError::LeaseLost { .. })),
                "{released:?}"
            );
        } else {
            released.unwrap();
        }
    }
    served.release().await.unwrap();
}
