//! Scenarios 1 and 5 with lock clients in OS processes of their own (`lock-worker` on
//! ZooKeeper, each with its own session), beside their in-process versions in `load.rs` and
//! `queue.rs`: nothing is shared but the ensemble and the store, as between the services of a
//! real deployment.
//!
//! - Three processes of four tasks each on three keys, while the leader is killed and paused
//!   in rounds: every critical section enters and leaves a fence-checking store in Redis
//!   ([`SECTION`](lock_tests::probe::SECTION)) that refuses, atomically, a fence not above the
//!   highest it accepted, and sees a section entering while another is inside.
//! - Four processes queue a fair waiter each, one after the other: they are served in that
//!   order, each release waking only the next waiter.
//! - An operator of this process inspects a lock an agent process holds, and forces it open:
//!   the waiting agent is served at once, the stuck one's fenced write and release refused.

use std::time::Duration;

use lock_testkit::RedisServer;
use lock_testkit::zookeeper::{ZkClient, ZooKeeperEnsemble};
use lock_tests::worker::WorkerArgs;

use super::consensus::{
    fair_workers_are_served_in_order, operations_across_processes, sections_through_faults,
};
use super::{
    LEASE, SESSION, contenders, fault_round, hold_queue, locker, queue_fences, tree,
    until_contenders,
};

/// Fault rounds of the load test: each one kills the leader, restarts it, pauses the new
/// leader past the sync limit and resumes it, then waits a session for the ensemble to serve
/// again.
const ROUNDS: usize = 2;

/// The fewest critical sections the load test accepts (its first ten come before the faults).
const FLOOR: u64 = 50;

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap()
}

/// A worker's command line on ZooKeeper: `hosts`, sessions of [`SESSION`], leases of
/// [`LEASE`].
fn on_zookeeper(args: WorkerArgs, hosts: &str) -> WorkerArgs {
    args.zookeeper(hosts)
        .session_ms(ms(SESSION))
        .lease_ms(ms(LEASE))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_never_overlap_nor_write_a_stale_fence_while_the_leader_is_killed_and_paused() {
    let mut ensemble = ZooKeeperEnsemble::start().await;
    let store = RedisServer::start();
    let args = WorkerArgs::sections(&store.url(), "acct", "fence")
        .keys(3)
        .tasks(4)
        .work_us(3_000)
        .wait_ms(10_000);
    let args = on_zookeeper(args, &ensemble.connect_string()).zookeeper_root("/procs-load");
    sections_through_faults(&args, &store, 3, ROUNDS, FLOOR, async || {
        fault_round(&mut ensemble).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_waiters_of_four_processes_are_served_in_creation_order_one_wakeup_each() {
    let hosts = tree("procs-fair").await;
    let zk = ZkClient::connect(&hosts).await;
    let store = RedisServer::start();
    let holder = locker(&hosts).await;
    let args = on_zookeeper(WorkerArgs::serve(&store.url()), &hosts);
    let guard = hold_queue(&holder).await;
    fair_workers_are_served_in_order(
        &args,
        &store,
        guard,
        async |n| until_contenders(&zk, "queue", n).await,
        async || queue_fences(&zk).await,
        async || contenders(&zk, "queue").await.is_empty(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_inspects_and_forces_open_a_lock_another_process_holds() {
    let hosts = tree("procs-operations").await;
    let store = RedisServer::start();
    let args = on_zookeeper(WorkerArgs::serve(&store.url()), &hosts).wait_ms(10_000);
    let holder = "agent-7/pid of a lock-worker";
    let operator = locker(&hosts).await;
    operations_across_processes(
        &args.clone().holder(holder),
        &args.holder("agent-8"),
        holder,
        LEASE,
        &operator,
    )
    .await;
}
