//! Scenarios 1 and 5 with lock clients in OS processes of their own (`lock-worker` on etcd),
//! beside their in-process versions in `load.rs` and `queue.rs`: nothing is shared but etcd
//! and the store, as between the services of a real deployment.
//!
//! - Three processes of four tasks each on three keys, while the leader is killed and paused
//!   in a loop: every critical section enters and leaves a fence-checking store in Redis
//!   ([`SECTION`]) that refuses, atomically, a fence not above the highest it accepted, and
//!   sees a section entering while another is inside.
//! - Four processes queue a fair waiter each, one after the other: they are served in that
//!   order, each release waking only the next waiter.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use lock_testkit::etcd::EtcdCluster;
use lock_testkit::{ChildProcess, RedisServer, eventually};
use lock_tests::probe::{SECTION, section_keys};
use lock_tests::worker::{SectionsSummary, WorkerArgs};

use super::{
    LEASE, QUEUE_LEASE, contenders, fault_round, hold_queue, locker, shared, until_contenders,
    woken,
};

const WORKER: &str = env!("CARGO_BIN_EXE_lock-worker");

/// Fault rounds of the load test: each one kills the leader, restarts it, pauses the new
/// leader and resumes it, then waits for the cluster to serve again.
const ROUNDS: usize = 3;

/// Starts `n` workers with `args` and waits until each has printed `first`.
async fn workers(args: &WorkerArgs, n: usize, first: &str) -> Vec<ChildProcess> {
    let mut workers = Vec::new();
    for _ in 0..n {
        let mut worker = ChildProcess::spawn(WORKER, args.to_args());
        worker.expect_line(first, Duration::from_secs(20)).await;
        workers.push(worker);
    }
    workers
}

/// The store's counts (`entered`, `left`, `stale`, `overlap`; a count never set is 0).
async fn counts(store: &RedisServer, key: &str) -> HashMap<String, u64> {
    store.query(redis::cmd("HGETALL").arg(key).clone()).await
}

async fn count(store: &RedisServer, key: &str, field: &str) -> u64 {
    counts(store, key).await.get(field).copied().unwrap_or(0)
}

fn lease_ms() -> u64 {
    u64::try_from(LEASE.as_millis()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_never_overlap_nor_write_a_stale_fence_while_the_leader_is_killed_and_paused() {
    let started = Instant::now();
    let mut cluster = EtcdCluster::start().await;
    let store = RedisServer::start();
    let args = WorkerArgs::sections(&store.url(), "acct", "fence")
        .etcd(&cluster.urls().join(","))
        .etcd_namespace("procs-load/")
        .keys(3)
        .tasks(4)
        .work_us(3_000)
        .lease_ms(lease_ms())
        .wait_ms(10_000);
    let counts_key = args.counts_key().unwrap();
    let workers = workers(&args, 3, "ready").await;
    eventually("sections done", Duration::from_secs(10), async || {
        count(&store, &counts_key, "left").await >= 10
    })
    .await;
    let mut progress = Vec::new();
    for _ in 0..ROUNDS {
        let before = count(&store, &counts_key, "left").await;
        fault_round(&mut cluster).await;
        progress.push(count(&store, &counts_key, "left").await - before);
    }
    let mut summaries = Vec::new();
    for worker in workers {
        let out = worker.finish(Duration::from_secs(30)).await;
        let summary = out
            .lines
            .iter()
            .rev()
            .find_map(|l| SectionsSummary::parse(l));
        assert!(
            out.status.success() && summary.is_some(),
            "a worker failed ({}): {:?}\n{}",
            out.status,
            out.lines,
            out.stderr
        );
        summaries.extend(summary);
    }
    let seen = counts(&store, &counts_key).await;
    println!(
        "{ROUNDS} fault rounds, {:?} in all: store counts {seen:?}, sections per round \
         {progress:?}; per process {summaries:?}",
        started.elapsed()
    );
    let field = |name: &str| seen.get(name).copied().unwrap_or(0);
    assert_eq!(
        field("overlap"),
        0,
        "a section entered while another was inside"
    );
    assert_eq!(field("stale"), 0, "the store refused a stale fence");
    assert_eq!(
        summaries.iter().map(|s| s.sections).sum::<u64>(),
        field("left"),
        "the workers' count of sections is not the store's"
    );
    assert!(
        summaries.iter().all(|s| s.sections > 0 && s.refused == 0),
        "a process did no section or was refused: {summaries:?}"
    );
    assert!(
        progress.iter().all(|&p| p > 0),
        "a round without progress: {progress:?}"
    );
    // The store itself refuses a fence that is not above the highest it accepted.
    let [highest, marker] = section_keys("fence-0");
    let highest_fence: u64 = store.get(&highest).await.unwrap().parse().unwrap();
    let mut conn = store.client().await;
    let answer: String = redis::Script::new(SECTION)
        .key(&highest)
        .key(&marker)
        .key(&counts_key)
        .arg("enter")
        .arg(highest_fence)
        .arg("stale-check")
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(answer, "stale", "the store accepted a repeated fence");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_waiters_of_four_processes_are_served_in_creation_order_one_wakeup_each() {
    let started = Instant::now();
    let cluster = shared().await;
    let (urls, etcd, ns) = (cluster.urls(), cluster.client(), "procs-fair/");
    let store = RedisServer::start();
    let holder = locker(&urls, ns).await;
    let args = WorkerArgs::serve(&store.url())
        .etcd(&urls.join(","))
        .etcd_namespace(ns)
        .lease_ms(u64::try_from(QUEUE_LEASE.as_millis()).unwrap());
    let mut workers = workers(&args, 4, "READY").await;
    let guard = hold_queue(&holder).await;
    for (i, worker) in workers.iter_mut().enumerate() {
        worker
            .send(&format!("WAIT queue {i} order fair fenced keep"))
            .await;
        // Queued before the next one starts: creation order is the start order.
        until_contenders(&etcd, ns, i + 2).await;
    }
    let queue = contenders(&etcd, ns).await;
    let mut before = attempts(&mut workers).await;
    let released = Instant::now();
    guard.release().await.expect("release");
    let (mut order, mut wakeups) = (Vec::new(), Vec::new());
    for turn in 0..workers.len() {
        eventually(
            &format!("turn {turn} served"),
            Duration::from_secs(10),
            async || served(&store).await.len() > turn,
        )
        .await;
        let i: usize = served(&store).await[turn].parse().unwrap();
        order.push(i);
        let done = workers[i].line().await;
        assert_eq!(
            done,
            format!("DONE {i} fence={}", queue[turn + 1].create_revision),
            "turn {turn} went to another key"
        );
        let after = attempts(&mut workers).await;
        wakeups.push(woken(&order, &before, &after));
        before = after;
        assert_eq!(workers[i].ask("RELEASE queue").await, "RELEASED queue ok");
    }
    let served_in = released.elapsed();
    eventually("queue empty", Duration::from_secs(5), async || {
        contenders(&etcd, ns).await.is_empty()
    })
    .await;
    println!(
        "served in order {order:?} within {:?} of the first release; acquire calls of each \
         woken waiter: {wakeups:?}; {:?} in all",
        served_in,
        started.elapsed()
    );
    assert_eq!(order, [0, 1, 2, 3], "not served in creation order");
    assert!(
        wakeups.iter().all(|&w| w <= 1),
        "more than one acquire call per wake-up: {wakeups:?}"
    );
}

/// The ids in the order their waiters got the lock.
async fn served(store: &RedisServer) -> Vec<String> {
    store
        .query(redis::cmd("LRANGE").arg("order").arg(0).arg(-1).clone())
        .await
}

/// Each worker's backend calls other than renewals.
async fn attempts(workers: &mut [ChildProcess]) -> Vec<u64> {
    let mut all = Vec::new();
    for worker in workers {
        let stats = worker.ask("STATS").await;
        let attempts = stats
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix("attempts="))
            .and_then(|n| n.parse().ok());
        all.push(attempts.unwrap_or_else(|| panic!("not a STATS line: {stats}")));
    }
    all
}
