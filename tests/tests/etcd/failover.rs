//! Cluster faults: fences across a leader SIGKILL, a paused leader and a whole-cluster
//! restart; a lock held through a leader kill; a client left on a minority.

use std::time::{Duration, Instant};

use lock_core::Locker;
use lock_testkit::etcd::EtcdCluster;

use super::consensus::held_while_others_try;
use super::{LEASE, REQUEST_TIMEOUT, contenders, lock_through_faults, locker};

/// Takes `key` fenced on `locker`, checks the fence against etcd, releases it, and returns
/// the fence. An attempt that meets an election fails (`Backend`) and is tried again, within
/// a bound.
async fn fence_of(cluster: &EtcdCluster, locker: &Locker, key: &str) -> u64 {
    let (guard, failed) = lock_through_faults(locker, key).await;
    if failed > 0 {
        println!("{failed} attempts failed before fence {:?}", guard.fence());
    }
    let fence = guard.fence().expect("fenced");
    let keys = contenders(&cluster.client(), "fences/").await;
    // The holder's key is the first; a key of an earlier release that met a fault may still
    // be behind it, going in the background.
    assert_eq!(
        fence,
        u64::try_from(keys[0].create_revision).unwrap(),
        "{keys:?}"
    );
    if let Err(e) = guard.release().await {
        println!("release of fence {fence} failed (deleted in the background): {e}");
    }
    fence
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_increase_across_leader_kill_leader_pause_and_full_restart() {
    let mut cluster = EtcdCluster::start().await;
    let urls = cluster.urls();
    let (a, b) = (
        locker(&urls, "fences/").await,
        locker(&urls, "fences/").await,
    );
    let mut fences = vec![
        fence_of(&cluster, &a, "ledger").await,
        fence_of(&cluster, &b, "ledger").await,
    ];

    let killed = cluster.kill_leader().await;
    fences.push(fence_of(&cluster, &a, "ledger").await);
    fences.push(fence_of(&cluster, &b, "ledger").await);
    cluster.restart(killed).await;

    let paused = cluster.pause_leader().await;
    let elected = cluster.wait_for_leader().await;
    assert_ne!(elected, paused, "the paused leader is still the leader");
    fences.push(fence_of(&cluster, &b, "ledger").await);
    cluster.resume(paused);
    fences.push(fence_of(&cluster, &a, "ledger").await);

    cluster.kill_all();
    cluster.restart_all().await;
    fences.push(fence_of(&cluster, &a, "ledger").await);
    fences.push(fence_of(&cluster, &b, "ledger").await);

    println!("fences: {fences:?}");
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences not strictly increasing: {fences:?}"
    );
}

/// The lease of the lock held through a leader kill: a renewal that meets the kill waits for
/// an election and a member to answer, which on a loaded two-core machine (six etcd members of
/// two tests) takes more than the shortest lease's margin. The guarantee is for a lease longer
/// than the failover, which this one is.
const HELD_LEASE: Duration = Duration::from_secs(4);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_granted_before_the_leader_is_killed_stays_held_and_renewed() {
    let mut cluster = EtcdCluster::start().await;
    let urls = cluster.urls();
    let (holder, other) = (locker(&urls, "held/").await, locker(&urls, "held/").await);
    let etcd = cluster.client();
    let guard = holder
        .lock("vault")
        .lease(HELD_LEASE)
        .fenced()
        .await
        .expect("lock");
    let fence = guard.fence().expect("fenced");
    let entry = contenders(&etcd, "held/").await.remove(0);
    let renewals = holder.stats().renewal_calls;

    let killed = cluster.kill_leader().await;
    let start = Instant::now();
    // Two leases after the kill: the holder keeps it, nobody else gets it.
    let (busy, errors) = held_while_others_try(&guard, &other, "vault", HELD_LEASE * 2).await;
    cluster.restart(killed).await;
    let renewed = holder.stats().renewal_calls - renewals;
    let now = contenders(&etcd, "held/").await;
    assert_eq!(now, vec![entry.clone()], "the holder's key changed");
    assert!(
        etcd.lease_ttl(entry.lease).await.is_some_and(|ttl| ttl > 0),
        "the holder's etcd lease is gone"
    );
    println!(
        "held {:?} past the kill: {renewed} renewals, {busy} Busy, {errors} errors",
        start.elapsed()
    );
    assert!(busy > 0, "no try_lock was answered");
    assert!(renewed >= 4, "{renewed} renewals in two leases");
    release_or_deleted(
        &etcd,
        guard,
        "the holder's release after the kill and restart",
    )
    .await;
    let (next, failed) = lock_through_faults(&other, "vault").await;
    println!("the next holder after {failed} failed attempts");
    assert!(next.fence().unwrap() > fence);
    release_or_deleted(&etcd, next, "the next holder's release").await;
}

/// Releases `guard`. Just after a member's restart a release may fail (the client's channel to
/// that member can fail a request or two, and the backend sends it again at most twice); the
/// backend then goes on deleting the key in the background, which this checks: no contender
/// key is left under `held/` within a bound.
async fn release_or_deleted(
    etcd: &lock_testkit::etcd::EtcdClient,
    guard: lock_core::LockGuard,
    what: &str,
) {
    if let Err(e) = guard.release().await {
        println!("{what} failed (the key is deleted in the background): {e}");
        lock_testkit::eventually(
            "the key deleted in the background",
            Duration::from_secs(10),
            async || contenders(etcd, "held/").await.is_empty(),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_on_a_minority_gets_no_lock_and_is_served_once_the_quorum_is_back() {
    let mut cluster = EtcdCluster::start().await;
    let alone = 0;
    let lonely = locker(&[cluster.client_url(alone)], "minority/").await;
    // It works while the cluster is whole.
    let guard = lonely.lock("job").fenced().await.expect("lock");
    let fence = guard.fence().unwrap();
    guard.release().await.expect("release");

    cluster.kill_all_but(alone);
    let wait = Duration::from_secs(2);
    let minority = Instant::now();
    let mut answers = Vec::new();
    // Waiters and single attempts for a few seconds: an error each time, within its wait.
    while minority.elapsed() < Duration::from_secs(5) {
        let start = Instant::now();
        let answer = if answers.len() % 2 == 0 {
            lonely.lock("job").fenced().wait(wait).await
        } else {
            lonely.try_lock("job").fenced().await
        };
        let took = start.elapsed();
        assert!(answer.is_err(), "granted on a minority: {answer:?}");
        assert!(
            took <= wait + REQUEST_TIMEOUT * 2,
            "the error came {took:?} into a {wait:?} wait"
        );
        answers.push((took, answer.unwrap_err().to_string()));
    }
    let slowest = answers.iter().map(|(took, _)| *took).max();
    let mut kinds: Vec<&str> = answers
        .iter()
        .map(|(_, e)| e.rsplit("message: ").next().unwrap_or(e))
        .collect();
    kinds.sort_unstable();
    kinds.dedup();
    println!(
        "on a minority: {} attempts, all errors, slowest {slowest:?}: {kinds:?}",
        answers.len()
    );

    cluster.restart_killed().await;
    let healthy = Instant::now();
    // The next waiter (on the same client, whose failed attempts may have been committed
    // after all once the quorum is back, and then end with their lease).
    let (guard, errors) = lock_through_faults(&lonely, "job").await;
    let served = healthy.elapsed();
    let bound = LEASE + Duration::from_secs(1) + cluster.election_timeout() * 2 + REQUEST_TIMEOUT;
    println!(
        "served {served:?} after the quorum was back ({errors} errors first; bound {bound:?})"
    );
    assert!(guard.fence().unwrap() > fence);
    assert!(
        served <= bound,
        "served {served:?} after the quorum came back"
    );
    guard.release().await.expect("release");
    let keys = contenders(&cluster.client(), "minority/").await;
    assert!(keys.is_empty(), "left behind: {keys:?}");
}
