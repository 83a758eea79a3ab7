//! The fair queue: waiters from four lockers are served in the order their keys were
//! created, each release waking only the next waiter; a waiter that cancels or times out
//! leaves the queue at once, one whose process died leaves it when its lease ends.

use std::time::{Duration, Instant};

use lock_core::LockError;

use super::consensus::fair_waiters_are_served_in_order;
use super::{
    LEASE, QUEUE_LEASE, contenders, hold_queue, locker, queue_fences, shared, through,
    until_contenders,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_waiters_of_four_lockers_are_served_in_creation_order_one_wakeup_each() {
    let cluster = shared().await;
    let (urls, etcd, ns) = (cluster.urls(), cluster.client(), "fair/");
    let holder = locker(&urls, ns).await;
    let mut waiters = Vec::new();
    for _ in 0..4 {
        waiters.push(locker(&urls, ns).await);
    }
    let guard = hold_queue(&holder).await;
    fair_waiters_are_served_in_order(
        guard,
        &waiters,
        "queue",
        QUEUE_LEASE,
        async |n| until_contenders(&etcd, ns, n).await,
        async || queue_fences(&etcd, ns).await,
    )
    .await;
}

/// Queues `a` then `b` behind the holder of `key` on `holder`; `a` leaves by `leave`; then
/// the holder releases and `b` must be served within `bound` of the release.
async fn a_waiter_leaves(ns: &str, leave: Leave, bound: Duration) {
    let cluster = shared().await;
    let (urls, etcd) = (cluster.urls(), cluster.client());
    let proxies = cluster.proxies().await;
    let holder = locker(&urls, ns).await;
    let a = locker(
        &if matches!(leave, Leave::Dies) {
            through(&proxies)
        } else {
            urls.clone()
        },
        ns,
    )
    .await;
    let b = locker(&urls, ns).await;
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
    until_contenders(&etcd, ns, 2).await;
    let a_key = contenders(&etcd, ns).await[1].key.clone();
    let b_task = tokio::spawn({
        let (b, etcd, a_key) = (b.clone(), cluster.client(), a_key.clone());
        async move {
            let guard = b.lock("line").fair().wait(Duration::from_secs(30)).await;
            let at = Instant::now();
            // Never served while the waiter ahead of it still has its key.
            let a_left = etcd.get(&a_key).await.is_none();
            (at, a_left, guard)
        }
    });
    until_contenders(&etcd, ns, 3).await;
    let left = Instant::now();
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
        Leave::Dies => {
            // Nothing of it reaches etcd any more, and it goes away without a word.
            proxies.iter().for_each(|p| p.blackhole());
            a_task.abort();
            drop(a);
        }
    }
    guard.release().await.expect("release");
    let released = Instant::now();
    let (served, a_left, guard) = tokio::time::timeout(Duration::from_secs(20), b_task)
        .await
        .expect("b never served")
        .expect("task");
    let guard = guard.expect("b is served");
    println!(
        "{leave:?}: b served {:?} after the holder's release ({:?} after a left)",
        served - released,
        served - left
    );
    assert!(a_left, "b was served while a's key was still in the queue");
    assert!(
        served - released <= bound,
        "b served {:?} after the release (bound {bound:?})",
        served - released
    );
    guard.release().await.expect("release");
    let keys = contenders(&etcd, ns).await;
    assert!(keys.is_empty(), "left behind: {keys:?}");
}

#[derive(Debug, Clone, Copy)]
enum Leave {
    Cancels,
    TimesOut,
    Dies,
}

/// Well under the lease: served "at once", not when a's lease would have ended.
const AT_ONCE: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_waiter_stops_blocking_the_queue_at_once() {
    a_waiter_leaves("leave-cancel/", Leave::Cancels, AT_ONCE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_waiter_stops_blocking_the_queue_at_once() {
    a_waiter_leaves("leave-timeout/", Leave::TimesOut, AT_ONCE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_waiter_stops_blocking_the_queue_when_its_lease_ends() {
    // Its etcd lease runs a second past the lock's lease; then a watch event and a grant.
    let bound = LEASE + Duration::from_secs(1) + Duration::from_secs(2);
    a_waiter_leaves("leave-dead/", Leave::Dies, bound).await;
}
