//! The cluster harness itself: the cluster comes up whole, serves every shard, reshards and
//! fails over as the tests that use it expect.

#![allow(
    clippy::panic,
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::print_stdout,
    reason = "a test file: its helpers outside #[test] functions assert by panicking and report figures"
)]

use std::collections::BTreeMap;
use std::time::Instant;

use lock_testkit::cluster::{RedisCluster, Role, SLOTS, key_slot};
use redis::AsyncCommands;

/// One key for each primary: `key:<n>` for the first n that lands there.
async fn key_per_primary(cluster: &RedisCluster) -> BTreeMap<usize, String> {
    let primaries = cluster.primaries().await;
    let mut owners = BTreeMap::new();
    for p in &primaries {
        for slot in cluster.slots_of(*p).await {
            owners.insert(slot, *p);
        }
    }
    let mut keys = BTreeMap::new();
    for n in 0.. {
        let key = format!("key:{n}");
        keys.entry(owners[&key_slot(&key)]).or_insert(key);
        if keys.len() == primaries.len() {
            break;
        }
    }
    keys
}

/// Six nodes (3 primaries with a replica each) serve all 16384 slots; the kit's slot function
/// agrees with the server's; a cluster client writes to every shard, and each key is on the
/// primary the kit names.
#[tokio::test]
async fn a_cluster_comes_up_whole_and_serves_every_shard() {
    let started = Instant::now();
    let cluster = RedisCluster::start().await;
    println!("cluster up in {:?}", started.elapsed());
    assert_eq!(cluster.nodes().len(), 6);
    assert_eq!(cluster.urls().len(), 6);
    let primaries = cluster.primaries().await;
    assert_eq!(primaries.len(), 3);
    let mut served = 0;
    for &p in &primaries {
        assert_eq!(cluster.node(p).role().await, Role::Primary);
        let replicas = cluster.replicas_of(p).await;
        assert_eq!(replicas.len(), 1, "one replica per primary");
        assert_eq!(cluster.node(replicas[0]).role().await, Role::Replica);
        served += cluster.slots_of(p).await.len();
    }
    assert_eq!(served, usize::from(SLOTS));
    for node in cluster.nodes() {
        let info: String = node
            .server()
            .query(redis::cmd("CLUSTER").arg("INFO").clone())
            .await;
        assert!(info.contains("cluster_state:ok"), "{info}");
        assert!(info.contains("cluster_slots_assigned:16384"), "{info}");
    }
    let node = cluster.node(0).server();
    for key in [
        "foo",
        "bar",
        "{user1000}.following",
        "a{b}c",
        "{}x",
        "123456789",
    ] {
        assert_eq!(node.keyslot(key).await, key_slot(key), "slot of {key:?}");
    }

    let mut conn = cluster.client().await;
    for (primary, key) in key_per_primary(&cluster).await {
        let () = conn.set(&key, "v").await.unwrap();
        assert_eq!(cluster.primary_for_key(&key).await, primary);
        assert_eq!(
            cluster.node(primary).server().get(&key).await.as_deref(),
            Some("v"),
            "{key} on node {primary}"
        );
    }
    println!("whole test in {:?}", started.elapsed());
}

/// A cluster without replicas: three primaries, nothing else.
#[tokio::test]
async fn a_cluster_without_replicas() {
    let started = Instant::now();
    let cluster = RedisCluster::builder()
        .replicas_per_primary(0)
        .start()
        .await;
    assert_eq!(cluster.nodes().len(), 3);
    assert_eq!(cluster.primaries().await.len(), 3);
    for p in cluster.primaries().await {
        assert!(cluster.replicas_of(p).await.is_empty());
    }
    println!("whole test in {:?}", started.elapsed());
}

/// A slot moved half way answers ASK for the keys already moved and serves the others; once
/// finished, its keys are on the target and a client that knew the old layout still reads
/// them.
#[tokio::test]
async fn a_slot_migration_moves_the_keys_and_the_cluster_serves_them() {
    let started = Instant::now();
    let cluster = RedisCluster::start().await;
    let mut conn = cluster.client().await;
    let (a, b) = ("{mig}a", "{mig}b");
    let slot = key_slot(a);
    let () = conn.set(a, "1").await.unwrap();
    let () = conn.set(b, "2").await.unwrap();
    let from = cluster.primary_for_slot(slot).await;
    let to = cluster
        .primaries()
        .await
        .into_iter()
        .find(|&p| p != from)
        .unwrap();

    let migration = cluster.begin_slot_migration(slot, from, to).await;
    cluster.migrate_keys(&migration, &[a]).await;
    let source = cluster.node(from).server();
    let err = source
        .try_query::<Option<String>>(redis::cmd("GET").arg(a).clone())
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.to_uppercase().contains("ASK") && text.contains(&cluster.node(to).port().to_string()),
        "a moved key is redirected with ASK to the target: {text}"
    );
    assert_eq!(source.get(b).await.as_deref(), Some("2"), "not moved yet");
    // The cluster client follows the ASK redirect.
    let got: Option<String> = conn.get(a).await.unwrap();
    assert_eq!(got.as_deref(), Some("1"));

    cluster.finish_slot_migration(migration).await;
    assert_eq!(cluster.primary_for_slot(slot).await, to);
    assert_eq!(cluster.node(to).server().get(b).await.as_deref(), Some("2"));
    let got: Option<String> = conn.get(b).await.unwrap();
    assert_eq!(got.as_deref(), Some("2"), "MOVED is followed");
    let () = conn.set(a, "3").await.unwrap();
    assert_eq!(cluster.node(to).server().get(a).await.as_deref(), Some("3"));

    // migrate_slot moves it all the way back in one call.
    cluster.migrate_slot(slot, to, from).await;
    assert_eq!(cluster.primary_for_slot(slot).await, from);
    assert_eq!(
        cluster.node(from).server().get(a).await.as_deref(),
        Some("3")
    );
    println!("whole test in {:?}", started.elapsed());
}

/// A killed primary is replaced by its replica, which has its data; a manual failover swaps a
/// primary and its replica.
#[tokio::test]
async fn a_killed_primary_is_replaced_by_its_replica() {
    let started = Instant::now();
    let mut cluster = RedisCluster::start().await;
    let mut conn = cluster.client().await;
    let old = cluster.primary_for_key("k").await;
    let replica = cluster.replicas_of(old).await[0];
    // Written on the primary, and on its replica before the crash (WAIT on the same connection).
    cluster.node(old).server().set_replicated("k", "v", 1).await;

    cluster.kill_node(old);
    let kill = Instant::now();
    let promoted = cluster.wait_for_failover(old).await;
    println!("failover after a kill in {:?}", kill.elapsed());
    assert_eq!(promoted, replica);
    assert_eq!(cluster.node(promoted).role().await, Role::Primary);
    assert_eq!(cluster.primary_for_key("k").await, promoted);
    let got: Option<String> = conn.get("k").await.unwrap();
    assert_eq!(got.as_deref(), Some("v"));

    // The old primary comes back (empty, with its nodes.conf) as a replica of the new one.
    cluster.node_mut(old).server_mut().restart();
    cluster.wait_until_ok().await;
    assert_eq!(cluster.node(old).role().await, Role::Replica);
    assert_eq!(cluster.replicas_of(promoted).await, vec![old]);

    // A manual failover gives it its slots back.
    let manual = Instant::now();
    cluster.failover(old).await;
    println!("manual failover in {:?}", manual.elapsed());
    assert_eq!(cluster.primary_for_key("k").await, old);
    assert_eq!(cluster.node(promoted).role().await, Role::Replica);
    assert_eq!(
        cluster.node(old).server().get("k").await.as_deref(),
        Some("v")
    );
    println!("whole test in {:?}", started.elapsed());
}
