//! The fair queue: waiters from four lockers are served in the order their nodes were
//! created, each release waking only the next waiter (each watches only the node just ahead
//! of it); a waiter that cancels or times out leaves the queue at once, and so does one whose
//! locker closes its session; one whose client is cut off leaves it when its session expires.

use std::time::{Duration, Instant};

use lock_core::LockError;
use lock_testkit::zookeeper::{ZkClient, ZooKeeperEnsemble, proxied_connect_string};

use super::consensus::fair_waiters_are_served_in_order;
use super::{
    LEASE, SESSION, contenders, exists, hold_queue, lock_dir, locker, queue_fences, tree,
    until_contenders,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_waiters_of_four_lockers_are_served_in_creation_order_one_wakeup_each() {
    let hosts = tree("fair").await;
    let zk = ZkClient::connect(&hosts).await;
    let holder = locker(&hosts).await;
    let mut waiters = Vec::new();
    for _ in 0..4 {
        waiters.push(locker(&hosts).await);
    }
    let guard = hold_queue(&holder).await;
    fair_waiters_are_served_in_order(
        guard,
        &waiters,
        "queue",
        LEASE,
        async |n| until_contenders(&zk, "queue", n).await,
        async || queue_fences(&zk).await,
    )
    .await;
}

#[derive(Debug, Clone, Copy)]
enum Leave {
    /// Its task is dropped.
    Cancels,
    /// Its wait ends.
    TimesOut,
    /// Its locker (every clone, and the backend) is dropped: the session is closed.
    Closes,
    /// Its client is cut off from every member and it goes away without a word: its session
    /// expires.
    Dies,
}

/// Queues `a` then `b` behind the holder of `line`; `a` leaves by `leave`; then the holder
/// releases and `b` must be served within `bound` of `a`'s leaving or of the release,
/// whichever is later, and never while `a`'s node is still there.
async fn a_waiter_leaves(name: &str, leave: Leave, bound: Duration) {
    let hosts = tree(name).await;
    let zk = ZkClient::connect(&hosts).await;
    let proxies = ZooKeeperEnsemble::shared().await.proxies().await;
    let holder = locker(&hosts).await;
    let a = if matches!(leave, Leave::Dies) {
        let root = &hosts[hosts.find('/').unwrap()..];
        locker(&format!("{}{root}", proxied_connect_string(&proxies))).await
    } else {
        locker(&hosts).await
    };
    let b = locker(&hosts).await;
    let guard = holder.lock("line").fair().await.expect("lock");
    let a_wait = if matches!(leave, Leave::TimesOut) {
        Duration::from_millis(1500)
    } else {
        Duration::from_secs(30)
    };
    let a_task = tokio::spawn({
        let a = a.clone();
        async move { a.lock("line").fair().wait(a_wait).await.map(drop) }
    });
    until_contenders(&zk, "line", 2).await;
    let a_node = contenders(&zk, "line").await[1].clone();
    let a_path = format!("{}/{}", lock_dir("line"), a_node.name);
    let b_task = tokio::spawn({
        let (b, zk, a_path) = (b.clone(), zk.clone(), a_path.clone());
        async move {
            let guard = b.lock("line").fair().wait(Duration::from_secs(30)).await;
            let at = Instant::now();
            // Never served while the waiter ahead of it still has its node.
            let a_left = !exists(&zk, &a_path).await;
            (at, a_left, guard)
        }
    });
    until_contenders(&zk, "line", 3).await;
    match leave {
        Leave::Cancels => {
            a_task.abort();
            assert!(a_task.await.unwrap_err().is_cancelled());
        }
        Leave::TimesOut => {
            let answer = a_task.await.expect("task");
            assert!(
                matches!(answer, Err(LockError::Timeout { .. })),
                "{answer:?}"
            );
        }
        Leave::Closes => {
            a_task.abort();
            let _ = a_task.await;
            drop(a);
        }
        Leave::Dies => {
            // Nothing of it reaches ZooKeeper any more, and it goes away without a word.
            proxies.iter().for_each(|p| p.blackhole());
            a_task.abort();
            drop(a);
        }
    }
    let left = Instant::now();
    // The holder releases once a is gone from the queue or when `bound` has passed.
    let gone = tokio::time::timeout(bound, async {
        while exists(&zk, &a_path).await {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let gone_after = left.elapsed();
    assert!(
        gone.is_ok(),
        "{leave:?}: a's node still queued {gone_after:?} after it left (bound {bound:?})"
    );
    let released = Instant::now();
    guard.release().await.expect("release");
    let (served, a_left, guard) = tokio::time::timeout(Duration::from_secs(10), b_task)
        .await
        .expect("b never served")
        .expect("task");
    let guard = guard.expect("b is served");
    println!(
        "{leave:?}: a's node gone {gone_after:?} after it left; b served {:?} after the \
         holder's release began",
        served - released,
    );
    assert!(a_left, "b was served while a's node was still in the queue");
    assert!(served > released, "b was served before the holder released");
    assert!(
        served - released <= AT_ONCE,
        "b served {:?} after the release",
        served - released
    );
    guard.release().await.expect("release");
    let nodes = contenders(&zk, "line").await;
    assert!(nodes.is_empty(), "left behind: {nodes:?}");
}

/// Well under the lease: "at once", not when a session or a lease would have ended.
const AT_ONCE: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_waiter_stops_blocking_the_queue_at_once() {
    a_waiter_leaves("leave-cancel", Leave::Cancels, AT_ONCE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_waiter_stops_blocking_the_queue_at_once() {
    a_waiter_leaves("leave-timeout", Leave::TimesOut, AT_ONCE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_locker_is_dropped_stops_blocking_the_queue_at_once() {
    a_waiter_leaves("leave-closed", Leave::Closes, AT_ONCE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_waiter_stops_blocking_the_queue_when_its_session_expires() {
    // ZooKeeper deletes a session's ephemerals once it heard nothing for the session timeout
    // (tick-aligned, a tick or two late).
    a_waiter_leaves("leave-dead", Leave::Dies, SESSION + Duration::from_secs(1)).await;
}
