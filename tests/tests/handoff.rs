//! Waiting without polling (issue 4), against real redis-server processes: notified handoff
//! across processes, no lost wake-up, expiry without release, one subscriber connection per
//! locker, Redis work per handoff independent of the number of waiters, clean cancellation,
//! fair FIFO order across processes, and a subscriber connection that drops.
//!
//! Every lock here has a lease far longer than the bound asserted, so a waiter that missed its
//! wake-up and waited for the lease to run out fails the test.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout,
    reason = "test code: a failed expectation fails the test; figures are printed for the notes"
)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::LockError;
use lock_testkit::{RedisServer, eventually};
use support::{agent, locker, locker_at, queued, until_no_subscriptions, until_queued};
use tokio::sync::Mutex;

/// Client connections that hold at least one (sharded or plain) subscription.
async fn subscriber_connections(server: &RedisServer) -> Vec<u64> {
    let list: String = server.query(redis::cmd("CLIENT").arg("LIST").clone()).await;
    list.lines()
        .filter(|line| {
            line.split(' ').any(|field| {
                ["sub=", "ssub="].iter().any(|p| {
                    field
                        .strip_prefix(p)
                        .and_then(|n| n.parse::<u64>().ok())
                        .is_some_and(|n| n > 0)
                })
            })
        })
        .filter_map(|line| {
            line.split(' ')
                .find_map(|f| f.strip_prefix("id="))
                .and_then(|id| id.parse().ok())
        })
        .collect()
}

fn total_calls(stats: &std::collections::BTreeMap<String, u64>) -> u64 {
    stats.values().sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_release_wakes_a_waiter_in_another_process() {
    let server = RedisServer::start();
    let holder = locker(&server, Duration::from_secs(2)).await;
    let mut agents = [agent(&server.url()).await, agent(&server.url()).await];
    let guard = holder.lock("hot").await.unwrap();
    for id in 0..20 {
        agents[id % 2].send(&format!("WAIT hot {id} order")).await;
    }
    // Each agent's waiters share one subscription, on one connection per agent.
    eventually(
        "both agents subscribed",
        Duration::from_secs(5),
        async || subscriber_connections(&server).await.len() == 2,
    )
    .await;
    assert_eq!(
        server.subscribed_channels().await,
        vec!["lock:{hot}:released"]
    );
    let start = Instant::now();
    guard.release().await.unwrap();
    let mut done = 0;
    for agent in &mut agents {
        for _ in 0..10 {
            let line = agent.line().await;
            assert!(line.starts_with("DONE "), "{line}");
            done += 1;
        }
    }
    let took = start.elapsed();
    println!("20 waiters in 2 processes served in {took:?}");
    assert_eq!(done, 20);
    // The default lease is 30 s: one handoff that waited for expiry would blow this.
    assert!(took < Duration::from_secs(10), "{took:?}");
    let order: Vec<String> = server
        .query(redis::cmd("LRANGE").arg("order").arg(0).arg(-1).clone())
        .await;
    assert_eq!(order.len(), 20);
    until_no_subscriptions(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_racing_the_subscription_is_never_missed() {
    let server = RedisServer::start();
    let holder = locker(&server, Duration::from_secs(2)).await;
    let waiter = locker(&server, Duration::from_secs(2)).await;
    let lease = Duration::from_secs(5);
    let mut worst = Duration::ZERO;
    for i in 0..100u64 {
        // A fresh key each time, so each waiter goes through subscribing.
        let key = format!("race:{i}");
        let guard = holder.lock(&key).lease(lease).await.unwrap();
        let w = waiter.clone();
        let k = key.clone();
        let task = tokio::spawn(async move {
            let g = w.lock(&k).wait(Duration::from_secs(20)).await;
            (g, Instant::now())
        });
        // Release at varying points of the waiter's attempt / subscribe / attempt sequence.
        for _ in 0..(i % 7) {
            tokio::task::yield_now().await;
        }
        if i % 3 == 0 {
            tokio::time::sleep(Duration::from_micros(100 * (i % 10))).await;
        }
        let released = Instant::now();
        guard.release().await.unwrap();
        let (g, at) = task.await.unwrap();
        g.unwrap().release().await.unwrap();
        worst = worst.max(at.saturating_duration_since(released));
    }
    println!("worst acquire after release over 100 races: {worst:?} (lease {lease:?})");
    assert!(
        worst < Duration::from_secs(2),
        "a wake-up was lost: {worst:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_without_release_wakes_the_waiter_when_the_ttl_runs_out() {
    let server = RedisServer::start();
    let holder = locker(&server, Duration::from_secs(2)).await;
    let waiter = locker(&server, Duration::from_secs(2)).await;
    let lease = Duration::from_millis(600);
    let acquired_at = Instant::now();
    let guard = holder.lock("k").lease(lease).watchdog(false).await.unwrap();
    let g = waiter
        .lock("k")
        .wait(Duration::from_secs(10))
        .await
        .unwrap();
    let waited = acquired_at.elapsed();
    println!("expiry handoff after {waited:?} (lease {lease:?})");
    assert!(waited >= lease - Duration::from_millis(50), "{waited:?}");
    assert!(waited <= lease + Duration::from_millis(200), "{waited:?}");
    drop(guard);
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_local_waiters_cost_o1_redis_commands_per_handoff_and_drain_in_order() {
    let server = RedisServer::start();
    let holder = locker(&server, Duration::from_secs(2)).await;
    let waiters = locker(&server, Duration::from_secs(2)).await;
    let guard = holder.lock("hot").await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..1000u32 {
        let (w, order) = (waiters.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            w.lock("hot")
                .wait(Duration::from_secs(60))
                .run(async {
                    order.lock().await.push(i);
                })
                .await
                .unwrap();
        }));
        // Arrival order: the next waiter starts once this one has joined the queue.
        let expected = i as usize + 1;
        while waiters.stats().waiters < expected {
            tokio::task::yield_now().await;
        }
    }
    assert_eq!(subscriber_connections(&server).await.len(), 1);
    let before = server.commandstats().await;
    guard.release().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    let after = server.commandstats().await;
    // INFO commandstats counts the commands a script runs too. The requests the lockers send
    // here are queue attempts and releases (one EVALSHA each) and plain acquires (a pipelined
    // `SET NX GET` + `PTTL`: one PTTL each); scripts may run PTTL too, so EVALSHA + PTTL is an
    // upper bound on round trips. The INFO call that read `before` is counted in `after`.
    let delta =
        |name: &str| after.get(name).copied().unwrap_or(0) - before.get(name).copied().unwrap_or(0);
    let all = total_calls(&after) - total_calls(&before) - 1;
    let sent = delta("pttl") + delta("evalsha");
    println!(
        "1000 waiters: at most {sent} round trips ({:.2} per handoff: {} EVALSHA, {} PTTL), {all} commands executed counting script internals ({:.2} per handoff)",
        sent as f64 / 1000.0,
        delta("evalsha"),
        delta("pttl"),
        all as f64 / 1000.0
    );
    // Two requests per handoff (the next head's attempt, the holder's release) and a bounded
    // number of commands inside them, however many wait.
    assert!(sent <= 3 * 1000, "{sent} round trips for 1000 handoffs");
    assert!(
        all <= 10 * 1000,
        "{all} commands executed for 1000 handoffs"
    );
    assert_eq!(*order.lock().await, (0..1000).collect::<Vec<_>>());
    assert_eq!(waiters.stats().waiting_keys, 0);
    until_no_subscriptions(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_100_waiters_leaves_no_queue_entries_and_no_subscriptions() {
    let server = RedisServer::start();
    let holder = locker(&server, Duration::from_secs(2)).await;
    let waiters = locker(&server, Duration::from_secs(2)).await;
    let guard = holder.lock("k").await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..100 {
        let w = waiters.clone();
        tasks.push(tokio::spawn(async move { w.lock("k").await.map(drop) }));
    }
    eventually(
        "waiters queued and subscribed",
        Duration::from_secs(5),
        async || waiters.stats().waiters == 100 && !server.subscribed_channels().await.is_empty(),
    )
    .await;
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        assert!(t.await.unwrap_err().is_cancelled());
    }
    assert_eq!(waiters.stats().waiters, 0);
    assert_eq!(waiters.stats().waiting_keys, 0);
    until_no_subscriptions(&server).await;
    assert!(guard.is_held());
    guard.release().await.unwrap();
    waiters
        .try_lock("k")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_mode_serves_five_waiters_in_three_processes_in_arrival_order() {
    let server = RedisServer::start();
    let holder = locker(&server, Duration::from_secs(2)).await;
    let mut agents = [
        agent(&server.url()).await,
        agent(&server.url()).await,
        agent(&server.url()).await,
    ];
    let guard = holder.lock("fair").fair().await.unwrap();
    for id in 0..5usize {
        agents[id % 3]
            .send(&format!("WAIT fair {id} order fair"))
            .await;
        let queued = id as i64 + 1;
        eventually(
            "waiter queued in Redis",
            Duration::from_secs(5),
            async || {
                let n: i64 = server
                    .query(redis::cmd("LLEN").arg("lock:{fair}:queue").clone())
                    .await;
                n == queued
            },
        )
        .await;
    }
    guard.release().await.unwrap();
    let mut done = 0;
    for (i, agent) in agents.iter_mut().enumerate() {
        for _ in 0..if i < 2 { 2 } else { 1 } {
            let line = agent.line().await;
            assert!(line.starts_with("DONE "), "{line}");
            done += 1;
        }
    }
    assert_eq!(done, 5);
    let order: Vec<String> = server
        .query(redis::cmd("LRANGE").arg("order").arg(0).arg(-1).clone())
        .await;
    assert_eq!(order, ["0", "1", "2", "3", "4"]);
    assert!(!server.exists("lock:{fair}:queue").await);
    assert!(!server.exists("lock:{fair}:waiters").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_fall_back_to_bounded_retries_while_the_subscriber_is_down() {
    let server = RedisServer::start();
    let holder = locker(&server, Duration::from_secs(2)).await;
    let waiters = locker(&server, Duration::from_secs(2)).await;
    let guard = holder.lock("k").await.unwrap();
    let w = waiters.clone();
    let patient = tokio::spawn(async move {
        let g = w.lock("k").wait(Duration::from_secs(20)).await;
        (g, Instant::now())
    });
    eventually("waiter subscribed", Duration::from_secs(5), async || {
        !subscriber_connections(&server).await.is_empty()
    })
    .await;
    for id in subscriber_connections(&server).await {
        let _: i64 = server
            .query(redis::cmd("CLIENT").arg("KILL").arg("ID").arg(id).clone())
            .await;
    }
    // A waiter with a short wait is not kept past its deadline meanwhile.
    let start = Instant::now();
    let short = waiters.lock("k").wait(Duration::from_millis(300)).await;
    assert!(matches!(short, Err(LockError::Timeout { .. })), "{short:?}");
    assert!(start.elapsed() < Duration::from_secs(2));
    let released = Instant::now();
    guard.release().await.unwrap();
    let (g, at) = patient.await.unwrap();
    let took = at - released;
    println!("handoff with the subscriber killed: {took:?}");
    // The lease is 30 s: the waiter did not wait for it to run out.
    assert!(took < Duration::from_secs(3), "{took:?}");
    g.unwrap().release().await.unwrap();
    // Notifications come back: the subscription is restored for the next waiter.
    let guard = holder.lock("k").await.unwrap();
    let w = waiters.clone();
    let next =
        tokio::spawn(async move { w.lock("k").wait(Duration::from_secs(20)).await.map(drop) });
    eventually(
        "subscription restored",
        Duration::from_secs(5),
        async || !server.subscribed_channels().await.is_empty(),
    )
    .await;
    guard.release().await.unwrap();
    next.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_costs_the_waiter_no_request_after_the_release() {
    let server = RedisServer::start();
    let holder = locker(&server, Duration::from_secs(2)).await;
    let waiter = locker(&server, Duration::from_secs(2)).await;
    // Scripts loaded first (renewal's, and both releases': a contended release of another
    // key), so no NOSCRIPT retry shows in the counts below.
    let warm = holder.lock("warm").await.unwrap();
    warm.extend(Duration::from_secs(30)).await.unwrap();
    let warm_waiter = tokio::spawn({
        let waiter = waiter.clone();
        async move {
            let g = waiter.lock("warm").wait(Duration::from_secs(10)).await;
            g.unwrap().release().await.unwrap();
        }
    });
    until_queued(&server, "warm", 1).await;
    warm.release().await.unwrap();
    warm_waiter.await.unwrap();
    let handovers = waiter.stats().handovers;
    let guard = holder.lock("k").fenced().await.unwrap();
    let held_fence = guard.fence().expect("fenced");
    let task = tokio::spawn({
        let waiter = waiter.clone();
        async move {
            waiter
                .lock("k")
                .fenced()
                .wait(Duration::from_secs(10))
                .await
        }
    });
    until_queued(&server, "k", 1).await;
    let calls = waiter.stats().backend_calls;
    let renewals = waiter.stats().renewal_calls;
    let holder_renewals = holder.stats().renewal_calls;
    let before = server.commandstats().await;
    guard.release().await.unwrap();
    let g = task.await.unwrap().unwrap();
    // The lock came with the short hand-over lease; the watchdog takes it to the full lease at
    // once, in the background (the caller already holds the lock). Counted once it is done.
    eventually(
        "renewed to the full lease",
        Duration::from_secs(2),
        async || waiter.stats().renewal_calls > renewals,
    )
    .await;
    let after = server.commandstats().await;
    let stats = waiter.stats();
    assert_eq!(
        stats.backend_calls - calls,
        stats.renewal_calls - renewals,
        "the waiter sent no acquire after the release, only the watchdog's renewal"
    );
    assert_eq!(stats.handovers - handovers, 1);
    let delta =
        |name: &str| after.get(name).copied().unwrap_or(0) - before.get(name).copied().unwrap_or(0);
    // The release and the watchdogs' renewals (the waiter's, and one the holder's may have
    // sent before its release) are the only requests between the two snapshots: no acquire
    // (script or pipelined SET + PTTL) from the waiter; the lock was set inside the release
    // script. The release is two calls: this is the first contended release of "k" on the
    // holder's backend, so its one-key release goes first, finds the lock marked by the
    // waiter and leaves it; the full release hands it over.
    let holder_renewals = holder.stats().renewal_calls - holder_renewals;
    assert_eq!(
        delta("evalsha"),
        2 + (stats.renewal_calls - renewals) + holder_renewals,
        "requests: {after:?}"
    );
    assert_eq!(delta("pttl"), 0);
    assert_eq!(
        delta("set"),
        2,
        "the release script set the lock to the waiter's token, and the fence counter"
    );
    assert!(g.is_held());
    assert!(g.fence().expect("fenced") > held_fence);
    g.release().await.unwrap();
    assert_eq!(queued(&server, "k").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_killed_in_the_queue_holds_a_handed_over_lock_only_briefly() {
    let server = RedisServer::start();
    let holder = locker(&server, Duration::from_secs(2)).await;
    let next = locker(&server, Duration::from_secs(2)).await;
    let mut agent = agent(&server.url()).await;
    let guard = holder.lock("k").await.unwrap();
    agent.send("WAIT k dead order").await;
    until_queued(&server, "k", 1).await;
    agent.kill().await;
    let task = tokio::spawn(async move {
        let g = next.lock("k").wait(Duration::from_secs(20)).await;
        (g, Instant::now())
    });
    until_queued(&server, "k", 2).await;
    let released = Instant::now();
    guard.release().await.unwrap();
    // The dead waiter's ticket was still live: the lock went to it, with the short handover
    // lease (3 s), not the 30 s lease it asked for.
    let pttl = server.pttl("lock:{k}").await;
    assert!(
        (1..=3_000).contains(&pttl),
        "handed to the dead waiter: PTTL {pttl}"
    );
    let (g, at) = task.await.unwrap();
    let g = g.unwrap();
    let after = at - released;
    println!("next owner {after:?} after the release that went to a killed waiter");
    assert!(after <= Duration::from_millis(3_500), "{after:?}");
    g.release().await.unwrap();
}

/// A release hands the lock to a waiter that gives up before it heard of the hand-over: its
/// leaving passes the lock on to the next waiter at once, as a release would, instead of
/// leaving it under a gone waiter's token for the 3 s hand-over lease. The giving-up waiter
/// runs on a runtime of its own, frozen (its thread blocked) from before the release until its
/// task is aborted, so the hand-over's message is never read before it leaves (found by a
/// mutation audit: no test made a hand-over land between a waiter giving up and its leave).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_giving_up_as_the_lock_is_handed_to_it_passes_it_on() {
    let server = RedisServer::start();
    let holder = locker(&server, Duration::from_secs(2)).await;
    let next = locker(&server, Duration::from_secs(2)).await;
    let guard = holder.lock("k").await.unwrap();
    let (freeze, to_freeze) = tokio::sync::oneshot::channel::<()>();
    let (frozen, is_frozen) = tokio::sync::oneshot::channel::<()>();
    let (let_go, frozen_here) = std::sync::mpsc::channel::<()>();
    let (done, all_done) = tokio::sync::oneshot::channel::<()>();
    let url = server.url();
    let giver = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let gives_up = locker_at(&url, Duration::from_secs(2)).await;
            let waiter = tokio::spawn({
                let gives_up = gives_up.clone();
                async move { gives_up.lock("k").wait(Duration::from_secs(20)).await }
            });
            // Queued (the test waits for its ticket), then frozen: this thread blocks, so no
            // task of this runtime runs, and no message is read, until it is let go.
            to_freeze.await.unwrap();
            // The answer to the waiter's queued attempt is in its socket already (the server
            // wrote it before the test saw the ticket): a pause on the driver reads it, so the
            // waiter is registered in the queue when frozen, and its abort leaves the queue
            // (unread, the abort would release its attempt instead, and the test would not
            // reach the leave: too short a pause makes the test miss its case, never fail).
            tokio::time::sleep(Duration::from_millis(50)).await;
            let _ = frozen.send(());
            frozen_here.recv().unwrap();
            // Let go: the waiter is aborted before the runtime reads its sockets again.
            waiter.abort();
            assert!(waiter.await.unwrap_err().is_cancelled());
            // Kept running for the leave, sent in the background.
            let _ = all_done.await;
            drop(gives_up);
        });
    });
    until_queued(&server, "k", 1).await;
    freeze.send(()).unwrap();
    // The thread blocks right after it said so.
    is_frozen.await.unwrap();
    let task = tokio::spawn({
        let next = next.clone();
        async move { next.lock("k").wait(Duration::from_secs(20)).await }
    });
    until_queued(&server, "k", 2).await;
    guard.release().await.unwrap();
    // Handed to the frozen waiter (its ticket taken, the next one's left), not to the next one.
    assert_eq!(
        queued(&server, "k").await,
        1,
        "the hand-over skipped the frozen waiter"
    );
    let pttl = server.pttl("lock:{k}").await;
    assert!(
        (1..=3_000).contains(&pttl),
        "handed to the frozen waiter with the 3 s hand-over lease: PTTL {pttl}"
    );
    let_go.send(()).unwrap();
    let g = task.await.unwrap().expect("the next waiter gets the lock");
    // Handed over by the leave, not taken by its own attempt once the gone waiter's hand-over
    // lease (3 s) ran out.
    assert_eq!(
        next.stats().handovers,
        1,
        "the leaving waiter did not pass the lock on"
    );
    assert!(g.is_held());
    g.release().await.unwrap();
    let _ = done.send(());
    giver.join().unwrap();
    assert_eq!(queued(&server, "k").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_received_late_is_confirmed_or_given_up() {
    let server = RedisServer::start();
    let holder = locker(&server, Duration::from_secs(2)).await;
    let mut agent = agent(&server.url()).await;

    // Paused for 2 s right after the handover: too little of the 3 s handover lease is left
    // to trust, so the agent confirms it with one renewal (the lock is still its own).
    let guard = holder.lock("k").await.unwrap();
    agent.send("WAIT k late order").await;
    until_queued(&server, "k", 1).await;
    agent.pause().await;
    guard.release().await.unwrap();
    let handed = server.get("lock:{k}").await;
    assert!(handed.is_some(), "handed to the paused waiter");
    tokio::time::sleep(Duration::from_secs(2)).await;
    agent.resume();
    assert_eq!(agent.line().await, "DONE late");
    let order: Vec<String> = server
        .query(redis::cmd("LRANGE").arg("order").arg(0).arg(-1).clone())
        .await;
    assert_eq!(order, ["late"]);

    // Paused past the handover lease: it ran out meanwhile and another waiter took the lock.
    // The resumed agent must not act on the stale handover while that waiter holds it.
    let guard = holder.lock("k").await.unwrap();
    agent.send("WAIT k stale order").await;
    until_queued(&server, "k", 1).await;
    agent.pause().await;
    guard.release().await.unwrap();
    let other = locker(&server, Duration::from_secs(2)).await;
    // `other` gets the lock only once the handover's lease has run out.
    let g = other.lock("k").wait(Duration::from_secs(10)).await.unwrap();
    agent.resume();
    // An observation window, not a synchronization: the agent gets 500 ms to misbehave.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let order: Vec<String> = server
        .query(redis::cmd("LRANGE").arg("order").arg(0).arg(-1).clone())
        .await;
    assert_eq!(
        order,
        ["late"],
        "the agent acted while another waiter held the lock"
    );
    assert!(g.is_held());
    g.release().await.unwrap();
    assert_eq!(agent.line().await, "DONE stale");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_attempts_lost_to_a_stalled_server_never_make_two_holders() {
    let server = RedisServer::start();
    let holder = locker(&server, Duration::from_secs(5)).await;
    // These waiters give up on an answer after 200 ms: their refresh attempts fail while the
    // server stalls, and each failed attempt's token is released in the background.
    let waiters = [
        locker(&server, Duration::from_millis(200)).await,
        locker(&server, Duration::from_millis(200)).await,
    ];
    let inside = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let overlaps = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let guard = holder.lock("k").await.unwrap();
    let mut tasks = Vec::new();
    for w in &waiters {
        for _ in 0..3 {
            let (w, inside, overlaps) = (w.clone(), inside.clone(), overlaps.clone());
            tasks.push(tokio::spawn(async move {
                w.lock("k")
                    .wait(Duration::from_secs(30))
                    .run(async {
                        if inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst) > 0 {
                            overlaps.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    })
                    .await
            }));
        }
    }
    until_queued(&server, "k", 2).await;
    // Writes stall for 1.5 s: longer than a ticket's refresh interval (1 s), so each waiting
    // head sends a refresh that times out; the stalled commands, this release among them (its
    // locker waits up to 5 s for an answer), run when the pause ends.
    server
        .query::<()>(
            redis::cmd("CLIENT")
                .arg("PAUSE")
                .arg(1_500)
                .arg("WRITE")
                .clone(),
        )
        .await;
    guard.release().await.unwrap();
    for t in tasks {
        t.await
            .unwrap()
            .expect("every waiter gets the lock once the server is back");
    }
    assert_eq!(overlaps.load(std::sync::atomic::Ordering::SeqCst), 0);
    eventually("no ticket left", Duration::from_secs(5), async || {
        queued(&server, "k").await == 0
    })
    .await;
}
