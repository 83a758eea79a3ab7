//! The etcd harness itself: a cluster comes up healthy with a leader, and every fault the
//! consensus tests rely on really happens (a killed leader is replaced and the data stays, a
//! paused member stops answering and comes back, a whole-cluster restart keeps the revision).

#![allow(
    clippy::panic,
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::print_stdout,
    reason = "a test file: its helpers outside #[test] functions assert by panicking and report figures"
)]

use std::time::{Duration, Instant};

use lock_testkit::etcd::{EtcdClient, EtcdCluster};
use serde_json::json;

/// Three members on distinct ports, one leader they all follow, and the JSON client's
/// reads and writes (revisions, prefix ranges, deletes) through any member.
#[tokio::test]
async fn a_cluster_comes_up_with_a_leader_and_serves_reads_and_writes() {
    let started = Instant::now();
    let cluster = EtcdCluster::start().await;
    println!("3-member etcd cluster healthy in {:?}", started.elapsed());
    assert_eq!(cluster.member_count(), 3);
    let urls = cluster.urls();
    assert_eq!(urls.len(), 3);
    assert!(urls.iter().all(|u| u.starts_with("http://127.0.0.1:")));
    assert_ne!(urls[0], urls[1]);
    let leader = cluster.leader().await.expect("a leader");
    assert_eq!(cluster.wait_for_leader().await, leader);
    let ids: Vec<u64> = (0..3).map(|i| cluster.member_id(i)).collect();
    assert!(ids.iter().all(|&id| id != 0));
    assert!(ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2]);

    let etcd = cluster.client();
    let first = etcd.put("lock/a/1", "x").await;
    let second = etcd.put("lock/a/2", "y").await;
    etcd.put("lock/b/1", "z").await;
    assert_eq!(second, first + 1);
    // Written through one member, read through another (linearizable reads).
    let kv = cluster.member_client(2).get("lock/a/1").await.unwrap();
    assert_eq!(kv.value, b"x");
    assert_eq!(
        (kv.create_revision, kv.mod_revision, kv.version),
        (first, first, 1)
    );
    let rewritten = cluster.member_client(1).put("lock/a/1", "x2").await;
    let kv = etcd.get("lock/a/1").await.unwrap();
    assert_eq!(
        (kv.create_revision, kv.mod_revision, kv.version),
        (first, rewritten, 2)
    );
    let keys: Vec<String> = etcd
        .range_prefix("lock/a/")
        .await
        .iter()
        .map(|kv| kv.key_str())
        .collect();
    assert_eq!(keys, ["lock/a/1", "lock/a/2"]);
    assert_eq!(etcd.revision().await, rewritten);
    assert!(etcd.delete("lock/a/1").await);
    assert!(!etcd.delete("lock/a/1").await);
    assert_eq!(etcd.get("lock/a/1").await, None);
    // Binary values, and a value large enough to come back chunked.
    let big = vec![0xffu8; 100_000];
    etcd.put("big", &big).await;
    assert_eq!(etcd.get("big").await.unwrap().value, big);
}

/// A 1-member cluster is healthy at once and leads itself.
#[tokio::test]
async fn a_single_member_cluster_leads_itself() {
    let started = Instant::now();
    let cluster = EtcdCluster::start_single().await;
    println!("1-member etcd cluster healthy in {:?}", started.elapsed());
    assert_eq!(cluster.leader().await, Some(0));
    assert_eq!(cluster.quorum(), 1);
    assert!(cluster.data_dir(0).join("member").is_dir());
    assert!(cluster.log(0).contains("serving client traffic"));
}

/// The short timeouts keep leases whole: a 1-second lease (the shortest with a 250 ms
/// election timeout) is granted as 1 s, and its key disappears once it expires, not before.
#[tokio::test]
async fn one_second_leases_expire_on_time() {
    let cluster = EtcdCluster::start_single().await;
    let etcd = cluster.client();
    let lease = etcd.grant_lease(1).await;
    let granted = Instant::now();
    assert!(matches!(etcd.lease_ttl(lease).await, Some(0..=1)));
    etcd.put_with_lease("leased", "v", lease).await;
    assert_eq!(etcd.get("leased").await.unwrap().lease, lease);
    lock_testkit::eventually(
        "the leased key expired",
        Duration::from_secs(5),
        async || etcd.get("leased").await.is_none(),
    )
    .await;
    assert!(
        granted.elapsed() >= Duration::from_millis(900),
        "{:?}",
        granted.elapsed()
    );
    assert_eq!(etcd.lease_ttl(lease).await, None);
    // Revoking deletes at once.
    let lease = etcd.grant_lease(60).await;
    etcd.put_with_lease("revoked", "v", lease).await;
    etcd.revoke_lease(lease).await;
    assert_eq!(etcd.get("revoked").await, None);
    etcd.revoke_lease(lease).await;
}

/// A killed leader is replaced by one of the two others, the data written before is read
/// back, writes go on, and the killed member restarts on its ports with its data and
/// catches up.
#[tokio::test]
async fn a_killed_leader_is_replaced_and_rejoins_with_its_data() {
    let mut cluster = EtcdCluster::start().await;
    let etcd = cluster.client();
    let before = etcd.put("k", "before").await;

    let killed_at = Instant::now();
    let old = cluster.kill_leader().await;
    assert!(!cluster.is_running(old));
    let new = cluster.wait_for_leader().await;
    println!(
        "new etcd leader elected {:?} after the kill",
        killed_at.elapsed()
    );
    assert_ne!(new, old);
    assert_eq!(etcd.get("k").await.unwrap().mod_revision, before);
    let after = etcd.put("k", "after").await;
    assert!(after > before);

    let old_pid = cluster.pid(new);
    cluster.restart(old).await;
    assert!(cluster.is_running(old));
    assert_eq!(cluster.pid(new), old_pid, "the others were not touched");
    let kv = cluster.member_client(old).get("k").await.unwrap();
    assert_eq!(
        (kv.value.as_slice(), kv.mod_revision),
        (&b"after"[..], after)
    );
    cluster.wait_healthy().await;
}

/// A paused member answers nothing (its client times out) while the others go on; a paused
/// leader is replaced; resumed, both serve again.
#[tokio::test]
async fn a_paused_member_stops_answering_and_comes_back() {
    let mut cluster = EtcdCluster::start().await;
    let leader = cluster.wait_for_leader().await;
    let follower = (leader + 1) % 3;
    cluster.pause(follower);
    assert!(cluster.is_paused(follower));
    let frozen = cluster
        .member_client(follower)
        .timeout(Duration::from_millis(300));
    let err = frozen
        .call("/v3/kv/range", &json!({ "key": "aw==" }))
        .await
        .unwrap_err();
    assert!(err.contains("no answer within"), "{err}");
    let revision = cluster.client().put("k", "v").await;
    cluster.resume(follower);
    assert!(!cluster.is_paused(follower));
    assert_eq!(
        cluster
            .member_client(follower)
            .get("k")
            .await
            .unwrap()
            .mod_revision,
        revision
    );

    let paused_at = Instant::now();
    let old = cluster.pause_leader().await;
    let new = cluster.wait_for_leader().await;
    println!(
        "new etcd leader elected {:?} after pausing the old one",
        paused_at.elapsed()
    );
    assert_ne!(new, old);
    cluster.client().put("k", "while paused").await;
    cluster.resume(old);
    cluster.wait_healthy().await;
    assert_eq!(
        cluster.member_client(old).get("k").await.unwrap().value,
        b"while paused"
    );
}

/// Killing and restarting all three members keeps every key, and the revision does not go
/// backwards: the next write gets a larger one.
#[tokio::test]
async fn a_full_restart_keeps_the_data_and_the_revision() {
    let mut cluster = EtcdCluster::start().await;
    let etcd = cluster.client();
    for i in 0..20 {
        etcd.put(format!("k{i}"), "v").await;
    }
    let revision = etcd.revision().await;
    let ids: Vec<u64> = (0..3).map(|i| cluster.member_id(i)).collect();

    cluster.kill_all();
    assert!((0..3).all(|i| !cluster.is_running(i)));
    let restarted = Instant::now();
    cluster.restart_all().await;
    println!(
        "etcd cluster restarted (all 3 members) in {:?}",
        restarted.elapsed()
    );
    assert_eq!(etcd.revision().await, revision);
    assert_eq!(etcd.range_prefix("k").await.len(), 20);
    assert!(etcd.put("k0", "again").await > revision);
    // The same members, not a new cluster.
    assert_eq!(
        (0..3).map(|i| cluster.member_id(i)).collect::<Vec<_>>(),
        ids
    );
}

/// Member 0 left alone is a minority of one: it still answers status, but commits nothing;
/// when the others come back the quorum serves again.
#[tokio::test]
async fn a_member_left_alone_commits_nothing_until_the_quorum_returns() {
    let mut cluster = EtcdCluster::start().await;
    cluster.kill_all_but(0);
    assert_eq!(cluster.leader().await, None);
    let lonely = EtcdClient::new([cluster.client_addr(0)]).timeout(Duration::from_millis(700));
    let err = lonely
        .call("/v3/kv/put", &json!({ "key": "aw==", "value": "dg==" }))
        .await
        .unwrap_err();
    println!("a put on a minority member: {err}");
    cluster.restart_killed().await;
    assert!(cluster.leader().await.is_some());
    cluster.member_client(0).put("k", "v").await;
}

/// The kit's message for a missing binary names the install command; it never skips.
#[tokio::test]
#[should_panic(expected = "apt-get install -y etcd-server")]
async fn a_missing_etcd_names_the_install_command() {
    EtcdCluster::builder()
        .binary("/nonexistent/etcd")
        .start()
        .await;
}

/// A proxy in front of a member: a client through it is cut off alone while the direct
/// client goes on, and gets through again after the restore.
#[tokio::test]
async fn a_proxy_cuts_one_client_off() {
    let cluster = EtcdCluster::start_single().await;
    let proxy = cluster.proxy(0).await;
    let through = EtcdClient::new([proxy.addr()]).timeout(Duration::from_millis(500));
    through.put("k", "1").await;
    proxy.cut();
    assert!(
        through
            .call("/v3/kv/range", &json!({ "key": "aw==" }))
            .await
            .is_err()
    );
    cluster.client().put("k", "2").await;
    proxy.restore();
    assert_eq!(through.get("k").await.unwrap().value, b"2");
    proxy.blackhole();
    let err = through
        .call("/v3/kv/range", &json!({ "key": "aw==" }))
        .await
        .unwrap_err();
    assert!(err.contains("no answer within"), "{err}");
    proxy.restore();
    assert_eq!(through.get("k").await.unwrap().value, b"2");
}

/// A reply lost with its connection: the proxy lets the put through and holds its answer
/// back; the put has taken effect in etcd; the cut leaves the caller without an answer.
#[tokio::test]
async fn a_frozen_proxy_loses_the_reply_of_a_request_that_landed() {
    let cluster = EtcdCluster::start_single().await;
    let proxy = cluster.proxy(0).await;
    // The gateway's JSON carries keys in base64 (a gRPC client's would carry them raw).
    proxy.freeze_after(lock_testkit::etcd::encode("lost-reply").as_bytes());
    let through = EtcdClient::new([proxy.addr()]).timeout(Duration::from_secs(10));
    let put = tokio::spawn(async move {
        through
            .call(
                "/v3/kv/put",
                &json!({ "key": lock_testkit::etcd::encode("lost-reply"), "value": "dg==" }),
            )
            .await
    });
    proxy.wait_frozen().await;
    let etcd = cluster.client();
    lock_testkit::eventually("the put landed", Duration::from_secs(5), async || {
        etcd.get("lost-reply").await.is_some()
    })
    .await;
    proxy.cut();
    let err = put.await.unwrap().unwrap_err();
    assert!(!err.contains("no answer within"), "the cut ended it: {err}");
    proxy.restore();
}
