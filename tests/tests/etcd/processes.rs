//! Scenarios 1 and 5 with lock clients in OS processes of their own (`lock-worker` on etcd),
//! beside their in-process versions in `load.rs` and `queue.rs`: nothing is shared but etcd
//! and the store, as between the services of a real deployment.
//!
//! - Three processes of four tasks each on three keys, while the leader is killed and paused
//!   in a loop: every critical section enters and leaves a fence-checking store in Redis
//!   ([`SECTION`](lock_tests::probe::SECTION)) that refuses, atomically, a fence not above the highest it accepted, and
//!   sees a section entering while another is inside.
//! - Four processes queue a fair waiter each, one after the other: they are served in that
//!   order, each release waking only the next waiter.
//! - An operator of this process inspects a lock an agent process holds, and forces it open:
//!   the waiting agent is served at once, the stuck one's fenced write and release refused.

use std::time::Duration;

use lock_testkit::RedisServer;
use lock_testkit::etcd::EtcdCluster;
use lock_tests::worker::WorkerArgs;

use super::consensus::{
    fair_workers_are_served_in_order, operations_across_processes, sections_through_faults,
};
use super::{
    LEASE, QUEUE_LEASE, contenders, fault_round, hold_queue, locker, queue_fences, shared,
    until_contenders,
};

/// Fault rounds of the load test: each one kills the leader, restarts it, pauses the new
/// leader and resumes it, then waits for the cluster to serve again.
const ROUNDS: usize = 3;

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_never_overlap_nor_write_a_stale_fence_while_the_leader_is_killed_and_paused() {
    let mut cluster = EtcdCluster::start().await;
    let store = RedisServer::start();
    let args = WorkerArgs::sections(&store.url(), "acct", "fence")
        .etcd(&cluster.urls().join(","))
        .etcd_namespace("procs-load/")
        .keys(3)
        .tasks(4)
        .work_us(3_000)
        .lease_ms(ms(LEASE))
        .wait_ms(10_000);
    sections_through_faults(&args, &store, 3, ROUNDS, 10, async || {
        fault_round(&mut cluster).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_waiters_of_four_processes_are_served_in_creation_order_one_wakeup_each() {
    let cluster = shared().await;
    let (urls, etcd, ns) = (cluster.urls(), cluster.client(), "procs-fair/");
    let store = RedisServer::start();
    let holder = locker(&urls, ns).await;
    let args = WorkerArgs::serve(&store.url())
        .etcd(&urls.join(","))
        .etcd_namespace(ns)
        .lease_ms(ms(QUEUE_LEASE));
    let guard = hold_queue(&holder).await;
    fair_workers_are_served_in_order(
        &args,
        &store,
        guard,
        async |n| until_contenders(&etcd, ns, n).await,
        async || queue_fences(&etcd, ns).await,
        async || contenders(&etcd, ns).await.is_empty(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_inspects_and_forces_open_a_lock_another_process_holds() {
    let cluster = shared().await;
    let (urls, ns) = (cluster.urls(), "procs-operations/");
    let store = RedisServer::start();
    let args = WorkerArgs::serve(&store.url())
        .etcd(&urls.join(","))
        .etcd_namespace(ns)
        .wait_ms(10_000);
    let holder = "agent-7/pid of a lock-worker";
    let operator = locker(&urls, ns).await;
    // A lease of whole seconds: etcd's remaining time is counted in them.
    operations_across_processes(
        &args.clone().holder(holder),
        &args.holder("agent-8"),
        holder,
        Duration::from_secs(10),
        &operator,
    )
    .await;
}
