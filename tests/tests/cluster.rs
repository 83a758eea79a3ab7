//! The Redis Cluster backend on a real local cluster (3 primaries, 3 replicas, started by the
//! test kit): many keys over every shard from several tasks and two lockers (no overlap, no lost
//! update; also from several OS processes), a primary killed (its locks fail fast with a typed
//! error, the other shards keep working, the same locker serves new locks after the failover),
//! a manual failover while a fenced lock is held (kept, renewed on the new primary, fences
//! rising), resharding while a lock is held and a waiter queues (the half-way ASK state
//! included), a stalled primary (with short leases and default timeouts too, and after a slot
//! moved to it: no other lock is lost), one renewal script call per primary per tick, and no
//! pile of renewal connections after failovers.

#![allow(
    clippy::panic,
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "a test file: its helpers assert by panicking"
)]

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lock_core::{LockError, Locker, RedisClusterBackend};
use lock_testkit::cluster::{RedisCluster, Role, key_slot};
use lock_testkit::{ChildProcess, RedisServer};
use lock_tests::worker::{WorkerArgs, WorkerSummary};

const SOON: Duration = Duration::from_secs(20);

fn urls(cluster: &RedisCluster) -> Vec<String> {
    cluster.urls()
}

async fn locker(cluster: &RedisCluster) -> Locker {
    let urls = urls(cluster);
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    Locker::redis_cluster(&urls)
        .await
        .expect("connect to the cluster")
}

/// Keys whose locks live on every primary (the default prefix's lock names hash by the key).
async fn keys_on_every_shard(cluster: &RedisCluster, n: usize) -> Vec<String> {
    let keys: Vec<String> = (0..n).map(|i| format!("spread-{i}")).collect();
    let mut shards = HashSet::new();
    for k in &keys {
        shards.insert(cluster.primary_for_key(&format!("lock:{{{k}}}")).await);
    }
    assert_eq!(shards.len(), 3, "the keys cover all 3 shards");
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_keys_on_every_shard_from_two_lockers_never_overlap_nor_lose_an_update() {
    let cluster = RedisCluster::start().await;
    let keys = Arc::new(keys_on_every_shard(&cluster, 12).await);
    let lockers = [locker(&cluster).await, locker(&cluster).await];
    let rounds = 20;
    let mut tasks = Vec::new();
    for t in 0..8usize {
        let locker = lockers[t % 2].clone();
        let keys = keys.clone();
        let mut conn = cluster.client().await;
        tasks.push(tokio::spawn(async move {
            for r in 0..rounds {
                let key = &keys[(t + r) % keys.len()];
                let guard = locker
                    .lock(key.as_str())
                    .lease(Duration::from_secs(5))
                    .wait(SOON)
                    .await
                    .unwrap_or_else(|e| panic!("lock {key}: {e}"));
                // A deliberately non-atomic increment, beside the lock in its hash slot.
                let counter = format!("count:{{{key}}}");
                let v: Option<u64> = redis::cmd("GET")
                    .arg(&counter)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                tokio::task::yield_now().await;
                let () = redis::cmd("SET")
                    .arg(&counter)
                    .arg(v.unwrap_or(0) + 1)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                guard.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let mut conn = cluster.client().await;
    let mut total = 0;
    for key in keys.iter() {
        let v: Option<u64> = redis::cmd("GET")
            .arg(format!("count:{{{key}}}"))
            .query_async(&mut conn)
            .await
            .unwrap();
        total += v.unwrap_or(0);
    }
    assert_eq!(total, 8 * rounds as u64, "no increment lost");
}

/// Several OS processes, each with its own cluster locker, lock keys spread over every shard
/// and do a deliberately non-atomic, fenced increment of each key's counter (kept on a plain
/// server beside the cluster): no update is lost and no fence is ever at or below the highest
/// one its key's storage saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn processes_on_every_shard_never_overlap_nor_lose_an_update() {
    let cluster = RedisCluster::start().await;
    let storage = RedisServer::start();
    let keys = 12u64;
    // The worker's keys are `spread-<i>`: check they cover every shard.
    let names = keys_on_every_shard(&cluster, keys as usize).await;
    assert_eq!(names[0], "spread-0");
    let (processes, iterations) = (3u64, 60u64);
    let workers: Vec<ChildProcess> = (0..processes)
        .map(|_| {
            let args = WorkerArgs::count(&urls(&cluster).join(","), "spread", iterations, "count")
                .cluster()
                .storage_url(&storage.url())
                .keys(keys)
                .fence_key("fence")
                .lease_ms(5_000);
            ChildProcess::spawn(env!("CARGO_BIN_EXE_lock-worker"), args.to_args())
        })
        .collect();
    let mut summaries = Vec::new();
    for worker in workers {
        let out = worker.finish(Duration::from_secs(120)).await;
        let summary = WorkerSummary::find(&out.lines)
            .unwrap_or_else(|| panic!("a worker failed: {:?} {}", out.lines, out.stderr));
        summaries.push(summary);
    }
    for s in &summaries {
        assert_eq!(s.increments, iterations, "{s:?}");
        assert_eq!(s.fence_violations, 0, "a fence went backwards: {s:?}");
    }
    let mut total = 0;
    for i in 0..keys {
        total += storage
            .get(&format!("count-{i}"))
            .await
            .map_or(0, |v| v.parse::<u64>().expect("a number"));
    }
    assert_eq!(total, processes * iterations, "no increment lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_primary_fails_its_locks_fast_others_work_and_the_locker_recovers() {
    let mut cluster = RedisCluster::builder()
        .node_timeout(Duration::from_millis(1000))
        .start()
        .await;
    let urls = urls(&cluster);
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let backend = RedisClusterBackend::builder(&urls)
        .response_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300))
        .connect()
        .await
        .expect("connect");
    let locker = Locker::builder(backend).build();
    let keys = keys_on_every_shard(&cluster, 12).await;
    let victim = cluster
        .primary_for_key(&format!("lock:{{{}}}", keys[0]))
        .await;
    let mut on_victim = Vec::new();
    let mut elsewhere = Vec::new();
    for k in &keys {
        if cluster.primary_for_key(&format!("lock:{{{k}}}")).await == victim {
            on_victim.push(k.clone());
        } else {
            elsewhere.push(k.clone());
        }
    }
    // Every shard answers before the kill (the connections are up).
    for k in &keys {
        drop(locker.lock(k.as_str()).await.expect("lock before the kill"));
    }
    cluster.kill_node(victim);
    let started = Instant::now();
    match locker.lock(on_victim[0].as_str()).await {
        Err(LockError::Backend { .. }) => {}
        other => panic!("a lock on the dead primary: expected a Backend error, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "failed fast, not after {:?}",
        started.elapsed()
    );
    for k in &elsewhere {
        let guard = locker
            .lock(k.as_str())
            .await
            .unwrap_or_else(|e| panic!("a lock on a live shard ({k}): {e}"));
        guard.release().await.expect("release");
    }
    cluster.wait_for_failover(victim).await;
    // The same locker, no restart: the lock on the failed-over shard is served again (its
    // slot map is refreshed by the first redirection; a request or two may still fail).
    let deadline = Instant::now() + SOON;
    let guard = loop {
        match locker.lock(on_victim[0].as_str()).await {
            Ok(guard) => break guard,
            Err(e) if Instant::now() < deadline => {
                assert!(matches!(e, LockError::Backend { .. }), "{e:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("no lock after the failover: {e}"),
        }
    };
    guard.release().await.expect("release after the failover");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn resharding_while_held_keeps_the_lock_and_wakes_the_queued_waiter() {
    let cluster = RedisCluster::start().await;
    let holder = locker(&cluster).await;
    let waiter = locker(&cluster).await;
    let key = "moving";
    let name = format!("lock:{{{key}}}");
    let slot = key_slot(&name);
    let from = cluster.primary_for_key(&name).await;
    let to = cluster
        .primaries()
        .await
        .into_iter()
        .find(|&p| p != from)
        .unwrap();
    let lease = Duration::from_millis(900);
    let guard = holder.lock(key).lease(lease).await.expect("lock");
    let released = Arc::new(AtomicBool::new(false));
    let waiting = {
        let waiter = waiter.clone();
        let released = released.clone();
        tokio::spawn(async move {
            let got = waiter
                .lock(key)
                .wait(SOON * 2)
                .await
                .expect("the waiter gets the lock");
            assert!(
                released.load(Ordering::SeqCst),
                "the waiter got the lock while it was held"
            );
            got.release().await.expect("waiter release");
        })
    };
    // The waiter queues in the backend.
    let mut conn = cluster.client().await;
    let deadline = Instant::now() + SOON;
    loop {
        let n: i64 = redis::cmd("HLEN")
            .arg(format!("{name}:waiters"))
            .query_async(&mut conn)
            .await
            .unwrap();
        if n == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Half way: the lock itself moved, its queue not yet (the source answers ASK for it).
    let migration = cluster.begin_slot_migration(slot, from, to).await;
    cluster.migrate_keys(&migration, &[name.as_str()]).await;
    // Several leases pass in the ASK state: the watchdog keeps the lock (renewals follow ASK).
    tokio::time::sleep(lease * 3).await;
    assert!(
        guard.is_held(),
        "the watchdog kept the lock through the ASK state"
    );
    cluster.finish_slot_migration(migration).await;
    assert_eq!(cluster.primary_for_key(&name).await, to);
    tokio::time::sleep(lease * 3).await;
    assert!(guard.is_held(), "the watchdog kept the lock after the move");
    assert!(!waiting.is_finished(), "the waiter still waits");
    let handovers = waiter.stats().handovers;
    released.store(true, Ordering::SeqCst);
    guard.release().await.expect("release after the move");
    tokio::time::timeout(SOON, waiting)
        .await
        .expect("the waiter was woken")
        .expect("waiter task");
    // It took the lock from the release's hand-over message, which reached it through its
    // subscription on the slot's new owner (the old owner dropped it when the slot moved); its
    // own retries (every 750 ms) would have found the lock already set to its token instead.
    assert_eq!(
        waiter.stats().handovers - handovers,
        1,
        "the waiter was woken by the hand-over message, not by a retry"
    );
}

/// The watchdog renews each shard's locks on its own: a primary that stops answering (paused,
/// not failed over) loses its own locks once their leases run out unrenewed (their holders are
/// told), while the locks on the other shards stay held through several leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stalled_shard_loses_only_its_own_locks() {
    stalled_shard_loses_only_its_own_locks(Some(Duration::from_millis(200))).await;
}

/// The body of the stalled-shard tests: a lease of 2 s, the backend's timeouts `timeouts`
/// (`None`: the defaults, 2 s).
async fn stalled_shard_loses_only_its_own_locks(timeouts: Option<Duration>) {
    // A long node timeout: the paused primary is not failed over during the test.
    let mut cluster = RedisCluster::builder()
        .node_timeout(Duration::from_secs(60))
        .start()
        .await;
    let locker = backend_with(&cluster, timeouts).await;
    let keys = keys_on_every_shard(&cluster, 12).await;
    let stalled = cluster
        .primary_for_key(&format!("lock:{{{}}}", keys[0]))
        .await;
    let lease = Duration::from_millis(2000);
    let mut guards = Vec::new();
    for k in &keys {
        let on_stalled = cluster.primary_for_key(&format!("lock:{{{k}}}")).await == stalled;
        let guard = locker.lock(k.as_str()).lease(lease).await.expect("lock");
        guards.push((k.clone(), on_stalled, guard));
    }
    cluster.node_mut(stalled).server_mut().pause();
    // Several leases pass (the property is about time: unrenewed leases run out).
    tokio::time::sleep(lease * 3).await;
    let held: Vec<bool> = guards.iter().map(|(_, _, g)| g.is_held()).collect();
    cluster.node_mut(stalled).server_mut().resume();
    for ((k, on_stalled, _), held) in guards.iter().zip(held) {
        if *on_stalled {
            assert!(!held, "{k}: its shard stalled, the lease ran out");
        } else {
            assert!(held, "{k}: renewed on its own shard");
        }
    }
}

/// `CLUSTER FAILOVER` (a manual failover: the replica catches up first) while a fenced lock is
/// held: the lock is kept and renewed on the new primary through several leases (redis-rs
/// follows the MOVED answers), another locker finds it held, and the next fence is larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_manual_failover_keeps_a_held_lock_and_fences_keep_rising() {
    let cluster = RedisCluster::start().await;
    let holder = locker(&cluster).await;
    let other = locker(&cluster).await;
    let key = "failing-over";
    let name = format!("lock:{{{key}}}");
    let old = cluster.primary_for_key(&name).await;
    let lease = Duration::from_millis(1500);
    let guard = holder.lock(key).lease(lease).fenced().await.expect("lock");
    let first = guard.fence().expect("fence");
    let replica = cluster.replicas_of(old).await[0];
    cluster.failover(replica).await;
    assert_eq!(cluster.primary_for_key(&name).await, replica);
    // Three leases on the new primary: unrenewed, the lock would be gone within one.
    let until = Instant::now() + lease * 3;
    while Instant::now() < until {
        assert!(
            cluster.node(replica).server().exists(&name).await,
            "the lock ran out on the new primary"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(guard.is_held(), "the lock is kept across the failover");
    assert!(
        matches!(other.try_lock(key).await, Err(LockError::Busy { .. })),
        "another locker finds it held"
    );
    guard.release().await.expect("release on the new primary");
    let again = other
        .lock(key)
        .fenced()
        .await
        .expect("lock after the failover");
    assert!(
        again.fence().expect("fence") > first,
        "fences never go backwards across a failover"
    );
    again.release().await.expect("release");
}

/// A backend on `cluster` with `response_timeout` (connect timeout the same), or the defaults.
async fn backend_with(cluster: &RedisCluster, response_timeout: Option<Duration>) -> Locker {
    let urls = urls(cluster);
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let mut builder = RedisClusterBackend::builder(&urls);
    if let Some(timeout) = response_timeout {
        builder = builder.response_timeout(timeout).connect_timeout(timeout);
    }
    let backend = builder.connect().await.expect("connect");
    assert_eq!(backend.maxmemory_policy(), Some("noeviction"));
    Locker::builder(backend).build()
}

/// `n` keys whose locks live on primary `shard`, each in a slot of its own.
async fn keys_on(cluster: &RedisCluster, shard: usize, n: usize, tag: &str) -> Vec<String> {
    let slots = cluster.slots_of(shard).await;
    let mut seen = HashSet::new();
    let keys: Vec<String> = (0..)
        .map(|i| format!("{tag}-{i}"))
        .filter(|k| {
            let slot = key_slot(format!("lock:{{{k}}}"));
            slots.contains(&slot) && seen.insert(slot)
        })
        .take(n)
        .collect();
    keys
}

/// Issue 29, item 4: after a slot moved from primary A to primary B (the locker's slot map
/// still says A), B stops answering (SIGSTOP, no failover). The lock whose slot stayed on A,
/// renewed in the same call as the moved one, stays held through several leases, as does a
/// lock on the third shard; the moved lock is lost (its new owner does not answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_moved_slot_whose_new_owner_stalls_costs_no_other_lock() {
    let mut cluster = RedisCluster::builder()
        .node_timeout(Duration::from_secs(60))
        .start()
        .await;
    let locker = backend_with(&cluster, Some(Duration::from_millis(300))).await;
    let primaries = cluster.primaries().await;
    let (a, b, c) = (primaries[0], primaries[1], primaries[2]);
    let on_a = keys_on(&cluster, a, 2, "moved").await;
    let on_c = keys_on(&cluster, c, 1, "third").await;
    let lease = Duration::from_millis(1500);
    let moved = locker
        .lock(on_a[0].as_str())
        .lease(lease)
        .await
        .expect("lock");
    let stays = locker
        .lock(on_a[1].as_str())
        .lease(lease)
        .await
        .expect("lock");
    let third = locker
        .lock(on_c[0].as_str())
        .lease(lease)
        .await
        .expect("lock");
    cluster
        .migrate_slot(key_slot(format!("lock:{{{}}}", on_a[0])), a, b)
        .await;
    cluster.node_mut(b).server_mut().pause();
    tokio::time::sleep(lease * 3).await;
    let (stays_held, third_held, moved_held) = (stays.is_held(), third.is_held(), moved.is_held());
    cluster.node_mut(b).server_mut().resume();
    assert!(stays_held, "the lock whose slot stayed on A is kept");
    assert!(third_held, "the lock on the third shard is kept");
    assert!(
        !moved_held,
        "the moved lock's new owner stalled: its lease ran out"
    );
}

/// Issue 29, item 5: the same as `a_stalled_shard_loses_only_its_own_locks` with the default
/// timeouts (2 s) and a lease as short as them (2 s): the other shards keep their locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stalled_shard_loses_only_its_own_locks_with_default_timeouts_and_a_short_lease() {
    stalled_shard_loses_only_its_own_locks(None).await;
}

/// Issue 29, item 6: many held locks over many slots of every shard: each primary gets at
/// most one renewal script call per watchdog call (the watchdog sends one call per shard per
/// tick), not one per slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_watchdog_sends_one_renewal_call_per_shard_per_tick() {
    let cluster = RedisCluster::start().await;
    let locker = locker(&cluster).await;
    let primaries = cluster.primaries().await;
    let lease = Duration::from_millis(900);
    let mut keys = Vec::new();
    for (i, &p) in primaries.iter().enumerate() {
        keys.extend(keys_on(&cluster, p, 40, &format!("many{i}")).await);
    }
    let tasks: Vec<_> = keys
        .iter()
        .map(|k| {
            let (locker, k) = (locker.clone(), k.clone());
            tokio::spawn(async move { locker.lock(k.as_str()).lease(lease).await })
        })
        .collect();
    let mut guards = Vec::new();
    for task in tasks {
        guards.push(task.await.expect("task").expect("lock"));
    }
    // One tick first: the scripts are loaded on every primary.
    tokio::time::sleep(lease / 2).await;
    let before_calls = locker.stats().renewal_calls;
    let mut before = Vec::new();
    for &p in &primaries {
        before.push(script_calls(&cluster, p).await);
    }
    tokio::time::sleep(lease * 3).await;
    let watchdog_calls = locker.stats().renewal_calls - before_calls;
    for (&p, before) in primaries.iter().zip(before) {
        let calls = script_calls(&cluster, p).await - before;
        assert!(
            calls <= watchdog_calls / 3 + 2,
            "primary {p}: {calls} script calls for {watchdog_calls} watchdog calls over 3 shards"
        );
    }
    assert!(
        watchdog_calls >= 3,
        "the watchdog renewed ({watchdog_calls})"
    );
    for g in &guards {
        assert!(g.is_held(), "every lock is kept");
    }
}

/// `EVALSHA` and `EVAL` calls a node has served (INFO commandstats).
async fn script_calls(cluster: &RedisCluster, node: usize) -> u64 {
    let info: String = cluster
        .node(node)
        .server()
        .query(redis::cmd("INFO").arg("commandstats").clone())
        .await;
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// The client connections open on each node, but replication links (the caller's own
/// `CLIENT LIST` excluded): how many in all, and how many named as the backend's renewal
/// connections.
async fn client_connections(cluster: &RedisCluster) -> Vec<(usize, usize)> {
    let mut counts = Vec::new();
    for node in cluster.nodes() {
        let list: String = node
            .server()
            .query(redis::cmd("CLIENT").arg("LIST").clone())
            .await;
        let clients: Vec<&str> = list
            .lines()
            .filter(|l| !l.contains("cmd=client|list"))
            .filter(|l| {
                l.split(' ')
                    .find_map(|f| f.strip_prefix("flags="))
                    .is_some_and(|f| !f.contains('S') && !f.contains('M'))
            })
            .collect();
        let renewals = clients
            .iter()
            .filter(|l| l.split(' ').any(|f| f == "name=lock-core:renewal"))
            .count();
        counts.push((clients.len(), renewals));
    }
    counts
}

/// Issue 29, item 7: the renewal connections of former primaries are dropped: after a
/// failover of every shard (each promotes a new address), with a lock held and renewed on
/// each shard throughout, the nodes hold no more client connections than before.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn renewal_connections_of_former_primaries_do_not_pile_up() {
    let cluster = RedisCluster::start().await;
    let locker = locker(&cluster).await;
    let lease = Duration::from_millis(900);
    let keys = keys_on_every_shard(&cluster, 12).await;
    let mut guards = Vec::new();
    for k in &keys {
        guards.push(locker.lock(k.as_str()).lease(lease).await.expect("lock"));
    }
    tokio::time::sleep(lease).await;
    let total = |counts: &[(usize, usize)]| counts.iter().map(|c| c.0).sum::<usize>();
    let before = total(&client_connections(&cluster).await);
    let failovers = cluster.primaries().await.len();
    for p in cluster.primaries().await {
        let replica = cluster.replicas_of(p).await[0];
        cluster.failover(replica).await;
        // Renewed on the new primary a few times.
        tokio::time::sleep(lease * 2).await;
    }
    tokio::time::sleep(lease).await;
    let after = client_connections(&cluster).await;
    for g in &guards {
        assert!(g.is_held(), "every lock is kept across the failovers");
    }
    // The command connection (redis-rs's) keeps its link to a former primary and opens one to
    // the new primary: one more per failover, at most.
    assert!(
        total(&after) <= before + failovers,
        "{before} client connections before {failovers} failovers, {} after",
        total(&after)
    );
    let primaries = cluster.primaries().await;
    for (i, (_, renewals)) in after.iter().enumerate() {
        let expected = usize::from(primaries.contains(&i));
        assert_eq!(
            *renewals, expected,
            "node {i}: one renewal connection on a primary, none on a replica"
        );
    }
}

/// A primary stalled (SIGSTOP) long enough to be failed over, with the default 2 s timeouts:
/// the same locker takes a lock of its slots on the new primary (at first its acquires time
/// out: redis-rs reads its slot map again on MOVED or a dropped connection, never on a
/// timeout) and keeps it through several leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lock_taken_after_a_stalled_primary_failed_over_is_kept() {
    let mut cluster = RedisCluster::builder()
        .node_timeout(Duration::from_millis(1000))
        .start()
        .await;
    let locker = backend_with(&cluster, None).await;
    let victim = cluster.primaries().await[0];
    let keys = keys_on(&cluster, victim, 2, "stalled-over").await;
    let lease = Duration::from_millis(1500);
    let before = locker
        .lock(keys[0].as_str())
        .lease(lease)
        .await
        .expect("lock");
    cluster.node_mut(victim).server_mut().pause();
    cluster.wait_for_failover(victim).await;
    let deadline = Instant::now() + SOON;
    let guard = loop {
        match locker.lock(keys[1].as_str()).lease(lease).await {
            Ok(guard) => break guard,
            Err(e) if Instant::now() < deadline => {
                assert!(matches!(e, LockError::Backend { .. }), "{e:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("no lock after the failover: {e}"),
        }
    };
    tokio::time::sleep(lease * 3).await;
    let held = guard.is_held();
    cluster.node_mut(victim).server_mut().resume();
    assert!(held, "renewed on the new primary");
    drop(before);
}

/// Issue 29, items 4-5 (review): a primary A is failed over (`CLUSTER FAILOVER`: A now answers
/// its renewals with READONLY) while another primary B, the first the slot map names after A,
/// is stalled (SIGSTOP, not failed over). The slot map is read again from a primary that
/// answers without first waiting out the stalled one's timeout, so A's shard keeps its lock
/// (renewed on the promoted replica), as does the third shard's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failover_while_another_primary_stalls_keeps_the_failed_over_shard_s_lock() {
    let mut cluster = RedisCluster::builder()
        .node_timeout(Duration::from_secs(60))
        .start()
        .await;
    let locker = backend_with(&cluster, Some(Duration::from_millis(1000))).await;
    let primaries = cluster.primaries().await;
    let a = primaries[0];
    // B: the other primary whose address sorts first (the order the map is read in).
    let mut others: Vec<usize> = primaries[1..].to_vec();
    others.sort_by_key(|&p| format!("127.0.0.1:{}", cluster.node(p).port()));
    let (b, c) = (others[0], others[1]);
    let lease = Duration::from_millis(1500);
    let on_a = keys_on(&cluster, a, 1, "failed-over").await;
    let on_c = keys_on(&cluster, c, 1, "bystander").await;
    let mut guards = Vec::new();
    for key in [&on_a[0], &on_c[0]] {
        guards.push(locker.lock(key.as_str()).lease(lease).await.expect("lock"));
    }
    cluster.node_mut(b).server_mut().pause();
    let replica = cluster.replicas_of(a).await[0];
    // `RedisCluster::failover` waits for every live node to see the cluster whole, which a
    // paused node prevents: the roles are awaited here instead.
    let () = cluster
        .node(replica)
        .server()
        .query(redis::cmd("CLUSTER").arg("FAILOVER").clone())
        .await;
    lock_testkit::eventually("the roles swapped", SOON, async || {
        cluster.node(replica).role().await == Role::Primary
            && cluster.node(a).role().await == Role::Replica
    })
    .await;
    tokio::time::sleep(lease * 3).await;
    let (failed_over_held, bystander_held) = (guards[0].is_held(), guards[1].is_held());
    cluster.node_mut(b).server_mut().resume();
    assert!(bystander_held, "the third shard's lock is kept");
    assert!(
        failed_over_held,
        "the failed-over shard's lock is kept: renewed on its new primary"
    );
}
