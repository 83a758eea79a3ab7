//! Group commit in the Redis backend (lock-core's backend/redis/batch.rs): plain acquires and
//! releases asked for while others are in flight go out together, as one script call over
//! many keys. Per key nothing may change: these tests drive many concurrent requests through
//! one backend (so batches form) and check each key's outcome, against real redis-server.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed expectation fails the test"
)]

use std::sync::Arc;
use std::time::Duration;

use lock_core::{LockError, Locker, RedisBackend};
use lock_testkit::{RedisServer, eventually};
use tokio::sync::Barrier;
use tokio::task::JoinSet;

mod support;
use support::until_queued;

const LEASE: Duration = Duration::from_secs(30);
/// Beyond the 64 requests of a kind that go out alone (batch.rs's `DIRECT`), so batches form.
const TASKS: usize = 256;

async fn locker(server: &RedisServer) -> Locker {
    let backend = RedisBackend::builder(&server.url())
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("connect");
    Locker::builder(backend).lease(LEASE).build()
}

/// Many callers lock one key at the same moment: exactly one wins, whether their requests
/// went out alone or several in one batch; the others find it held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_acquires_of_one_key_let_exactly_one_win() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    for round in 0..5 {
        let start = Arc::new(Barrier::new(TASKS));
        let mut set = JoinSet::new();
        for _ in 0..TASKS {
            let (locker, start) = (locker.clone(), start.clone());
            set.spawn(async move {
                start.wait().await;
                let got = locker.lock("b:same").wait(Duration::from_millis(300)).await;
                if let Ok(guard) = &got {
                    // Held past every other caller's wait.
                    tokio::time::sleep(Duration::from_millis(600)).await;
                    assert!(guard.is_held());
                }
                got
            });
        }
        let mut guards = Vec::new();
        while let Some(joined) = set.join_next().await {
            match joined.unwrap() {
                Ok(g) => guards.push(g),
                Err(LockError::Timeout { .. }) => {}
                Err(e) => panic!("round {round}: {e:?}"),
            }
        }
        assert_eq!(guards.len(), 1, "round {round}: winners");
        for g in guards {
            g.release().await.unwrap();
        }
    }
}

/// A batch over free keys and keys held by another locker: exactly the free ones are taken,
/// the held ones keep their owner (whose releases still succeed), and batches did form.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_takes_the_free_keys_and_leaves_the_held_ones() {
    let server = RedisServer::start();
    let ours = locker(&server).await;
    let other = locker(&server).await;
    let mut theirs = Vec::new();
    for i in (0..TASKS).step_by(4) {
        theirs.push(other.lock(format!("b:k{i}")).await.unwrap());
    }
    let before = ours.stats().batched_requests;
    let mut set = JoinSet::new();
    for i in 0..TASKS {
        let ours = ours.clone();
        set.spawn(async move { ours.lock(format!("b:f{i}")).wait(LEASE).await.unwrap() });
    }
    let free: Vec<_> = set.join_all().await;
    assert!(
        ours.stats().batched_requests > before,
        "no batch formed for {TASKS} concurrent acquires"
    );
    drop(free);
    eventually(
        "the free keys released",
        Duration::from_secs(2),
        async || server.dbsize().await == i64::try_from(TASKS / 4).unwrap(),
    )
    .await;
    let start = Arc::new(Barrier::new(TASKS));
    let mut set = JoinSet::new();
    for i in 0..TASKS {
        let (ours, start) = (ours.clone(), start.clone());
        set.spawn(async move {
            start.wait().await;
            let got = ours
                .lock(format!("b:k{i}"))
                .wait(Duration::from_millis(200))
                .await;
            (i, got)
        });
    }
    let mut mine = Vec::new();
    while let Some(joined) = set.join_next().await {
        match joined.unwrap() {
            (i, Ok(g)) => {
                assert_ne!(i % 4, 0, "b:k{i} is held by the other locker");
                mine.push(g);
            }
            (i, Err(LockError::Timeout { .. })) => assert_eq!(i % 4, 0, "b:k{i} was free"),
            (i, Err(e)) => panic!("b:k{i}: {e:?}"),
        }
    }
    assert_eq!(mine.len(), TASKS - TASKS / 4);
    // Released concurrently (in batches too): every release was ours.
    let mut releases = JoinSet::new();
    for g in mine {
        releases.spawn(async move { g.release().await });
    }
    while let Some(joined) = releases.join_next().await {
        joined.unwrap().unwrap();
    }
    for g in theirs {
        g.release().await.unwrap();
    }
    assert_eq!(server.dbsize().await, 0);
}

/// Releases in one batch hand a lock to a waiter of another process at once, as a lone
/// release does (the batch's one-key release finds the lock marked by the waiter, and the full
/// release that follows hands it over; no wait for the lease, nor for the waiter's own next
/// attempt: the waiter's locker counts the hand-over). The server is frozen while the
/// other releases go out, so they stay in flight and the one with the waiter must queue: it
/// goes out in a batch, whatever the timing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batched_release_hands_the_lock_to_a_queued_waiter() {
    let mut server = RedisServer::start();
    let ours = locker(&server).await;
    let other = locker(&server).await;
    let mut guards = Vec::new();
    for i in 0..TASKS {
        guards.push(ours.lock(format!("b:h{i}")).await.unwrap());
    }
    let handed = guards.remove(7);
    let waiter = tokio::spawn(async move {
        let g = other
            .lock("b:h7")
            .wait(Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(other.stats().handovers, 1, "the lock was not handed over");
        g.release().await.unwrap();
    });
    eventually("the waiter queued", Duration::from_secs(5), async || {
        let queues: Vec<String> = server
            .query(redis::cmd("KEYS").arg("*b:h7*queue*").clone())
            .await;
        !queues.is_empty()
    })
    .await;
    let sent = ours.stats().backend_calls;
    let batched = ours.stats().batched_requests;
    server.pause();
    let mut releases = JoinSet::new();
    for g in guards {
        releases.spawn(async move { g.release().await });
    }
    let others = u64::try_from(TASKS - 1).unwrap();
    eventually(
        "the other releases sent",
        Duration::from_secs(1),
        async || ours.stats().backend_calls >= sent + others,
    )
    .await;
    releases.spawn(async move { handed.release().await });
    server.resume();
    while let Some(joined) = releases.join_next().await {
        joined.unwrap().unwrap();
    }
    assert!(
        ours.stats().batched_requests > batched,
        "no release went out in a batch"
    );
    tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .expect("the waiter was not handed the lock promptly")
        .unwrap();
}

/// A batch that mixes keys where waiters were met lately (their releases go straight to the
/// full release) with the others goes out as two calls: the others keep the one-key release,
/// which reads no queue. Before, one such key made the whole batch full releases, each with
/// its queue lookup (`LINDEX`). The hinted key's lock is still handed over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_with_waiters_does_not_make_its_whole_batch_full_releases() {
    let mut server = RedisServer::start();
    let ours = locker(&server).await;
    let other = locker(&server).await;
    // "b:hot" meets a waiter once: its later releases on `ours` skip the one-key release.
    let guard = ours.lock("b:hot").await.unwrap();
    let first = tokio::spawn({
        let other = other.clone();
        async move {
            let g = other.lock("b:hot").wait(Duration::from_secs(10)).await;
            g.unwrap().release().await.unwrap();
        }
    });
    until_queued(&server, "b:hot", 1).await;
    guard.release().await.unwrap();
    first.await.unwrap();
    let mut guards = Vec::new();
    for i in 0..TASKS - 1 {
        guards.push(ours.lock(format!("b:m{i}")).await.unwrap());
    }
    // In the middle: not among the first releases, which go out alone (the server is
    // frozen, so they stay in flight), but queued with others for one batch.
    guards.insert(TASKS / 2, ours.lock("b:hot").await.unwrap());
    let waiter = tokio::spawn({
        let other = other.clone();
        async move {
            let g = other.lock("b:hot").wait(Duration::from_secs(10)).await;
            let handed = other.stats().handovers;
            g.unwrap().release().await.unwrap();
            handed
        }
    });
    until_queued(&server, "b:hot", 1).await;
    let batched = ours.stats().batched_requests;
    server.reset_stats().await;
    // Frozen while every release is asked for: they queue and go out in batches.
    server.pause();
    let sent = ours.stats().backend_calls;
    let mut releases = JoinSet::new();
    for g in guards {
        releases.spawn(async move { g.release().await });
    }
    let all = u64::try_from(TASKS).unwrap();
    eventually(
        "every release asked for",
        Duration::from_secs(2),
        async || ours.stats().backend_calls >= sent + all,
    )
    .await;
    server.resume();
    while let Some(joined) = releases.join_next().await {
        joined.unwrap().unwrap();
    }
    let handovers = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter was not handed the lock")
        .unwrap();
    assert_eq!(handovers, 2, "both releases of b:hot handed it over");
    assert!(
        ours.stats().batched_requests > batched,
        "no release went out in a batch"
    );
    let stats = server.commandstats().await;
    // A full release pops its queue's head (`LPOP`): b:hot's hands the lock over, the
    // waiter's own (full: it queued lately) finds the queue empty; the 63 one-key releases never
    // look at a queue (a batch made all full would look 64 times). `LINDEX` counts too: the
    // queued attempts read the head with it.
    let lookups = ["lindex", "lpop"]
        .iter()
        .map(|c| stats.get(*c).copied().unwrap_or(0))
        .sum::<u64>();
    assert!(lookups <= 4, "{lookups} queue lookups: {stats:?}");
}

/// Bytes waiting in the kernel to be read by the server listening on `port` (the sum of
/// `rx_queue` in /proc/net/tcp over its accepted connections): what clients have sent it that it
/// has not read yet.
fn unread_by_server(port: u16) -> u64 {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    let local_port = format!(":{port:04X}");
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (local, state, queues) = (fields.get(1)?, fields.get(3)?, fields.get(4)?);
            // 01: ESTABLISHED (the listening socket is 0A).
            if !local.ends_with(&local_port) || *state != "01" {
                return None;
            }
            u64::from_str_radix(queues.split_once(':')?.1, 16).ok()
        })
        .sum()
}

/// A request that queues behind the ones in flight does not wait for their answers: with the
/// server frozen (nothing is answered), the queued acquires still reach its socket, in one
/// batch. Before, they waited for an in-flight call to come back, so only the first ones got
/// out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_requests_go_out_without_waiting_for_the_ones_in_flight() {
    const N: usize = 128;
    let mut server = RedisServer::start();
    let ours = locker(&server).await;
    // The prefix's permission check is done before the server freezes.
    ours.lock("b:q-warm")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    server.pause();
    let batched = ours.stats().batched_requests;
    let mut set = JoinSet::new();
    for i in 0..N {
        let ours = ours.clone();
        set.spawn(async move { ours.lock(format!("b:q{i}")).wait(LEASE).await });
    }
    // Each SET NX PX GET carries its key (11 bytes at least), its 32-digit token and the
    // token's stamp (`|<13 digits>|<holder>|`): at least that much, and about 45 bytes more
    // of the protocol. If the queued ones waited for an answer, only those sent alone (a
    // few) would be there: far under N times the least.
    let least = 11 + 32 + 16 + ours.holder().len();
    let all = u64::try_from(least * N).unwrap();
    eventually(
        "every acquire written to the frozen server",
        Duration::from_secs(1),
        async || unread_by_server(server.port()) >= all,
    )
    .await;
    server.resume();
    for guard in set.join_all().await {
        guard.unwrap().release().await.unwrap();
    }
    assert!(ours.stats().batched_requests > batched);
}

/// Callers that give up while their acquires wait for a batch leave no lock behind: a lock
/// taken for nobody is released at once, not left for its 30 s lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_callers_leave_no_lock_behind() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    for round in 0..10 {
        let mut set = JoinSet::new();
        for i in 0..TASKS {
            let locker = locker.clone();
            set.spawn(async move {
                let _ = locker
                    .lock(format!("b:d{i}"))
                    .wait(Duration::from_secs(5))
                    .await;
            });
        }
        // Cancelled at various points: before sending, queued, in flight, answered.
        tokio::time::sleep(Duration::from_micros(200 * round)).await;
        set.abort_all();
        while set.join_next().await.is_some() {}
    }
    eventually("every lock released", Duration::from_secs(5), async || {
        server.dbsize().await == 0
    })
    .await;
}

/// Connections dropped while batches are in flight: every acquire that reports success
/// really holds its lock (its release finds it ours), every other outcome is a typed error,
/// and nothing stays locked afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_connections_mid_batch_never_fake_a_lock() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut set = JoinSet::new();
    for t in 0..TASKS {
        let (locker, stop) = (locker.clone(), stop.clone());
        set.spawn(async move {
            let (mut ok, mut failed) = (0u32, 0u32);
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                i += 1;
                let key = format!("b:c{t}:{}", i % 4);
                match locker.lock(&key).wait(Duration::from_secs(1)).await {
                    Ok(g) => match g.release().await {
                        Ok(()) => ok += 1,
                        // The answer of a release that went through was lost with the
                        // connection: never reported as a clean release.
                        Err(LockError::LeaseLost { .. } | LockError::Backend { .. }) => {
                            failed += 1;
                        }
                        Err(e) => panic!("release of {key}: {e:?}"),
                    },
                    Err(LockError::Backend { .. } | LockError::Timeout { .. }) => failed += 1,
                    Err(e) => panic!("acquire of {key}: {e:?}"),
                }
            }
            (ok, failed)
        });
    }
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        server.client_kill_all().await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut total = 0;
    while let Some(joined) = set.join_next().await {
        let (ok, _) = joined.unwrap();
        total += ok;
    }
    assert!(total > 0);
    eventually("every lock released", Duration::from_secs(5), async || {
        server.dbsize().await == 0
    })
    .await;
}
