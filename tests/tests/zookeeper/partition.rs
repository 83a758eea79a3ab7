//! A follower cut off from the quorum (its links to the other members silent, both ways)
//! while its clients still reach it: it answers reads from its aging copy until its sync
//! limit runs out, while the leader expires the sessions it no longer hears of. A holder on
//! it learns of the loss before a locker on the majority gets the lock (its renewals need a
//! sync through the leader), and a client on it gets no lock.

use std::time::{Duration, Instant};

use lock_core::Locker;
use lock_testkit::zookeeper::{ZkClient, ZooKeeperEnsemble, connect_string};

use super::consensus::lost_before_taken;
use super::{FenceStore, REQUEST_TIMEOUT, backend_with, contenders, locker};

/// The holder's session: short, so that the leader expires it well within the cut follower's
/// sync limit.
const SHORT_SESSION: Duration = Duration::from_secs(2);

/// The followers' sync limit in ticks (200 ms): a cut follower answers reads for this long
/// (5 s), well past [`SHORT_SESSION`] and its lease, which a renewal read alone would extend.
const SYNC_LIMIT: u32 = 25;

/// An ensemble whose members can be cut off from each other, the follower to cut, and the
/// connect string of the other two (the majority).
async fn partitionable() -> (ZooKeeperEnsemble, usize, String) {
    let ensemble = ZooKeeperEnsemble::builder()
        .quorum_links(true)
        .sync_limit(SYNC_LIMIT)
        .start()
        .await;
    let leader = ensemble.wait_for_leader().await;
    let follower = (leader + 1) % ensemble.member_count();
    let majority = connect_string(
        (0..ensemble.member_count())
            .filter(|&i| i != follower)
            .map(|i| ensemble.client_addr(i)),
    );
    (ensemble, follower, majority)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_on_a_follower_cut_from_the_quorum_learns_before_another_takes_the_lock() {
    let (mut ensemble, follower, majority) = partitionable().await;
    // The holder reaches the follower alone.
    let only_follower = ensemble.client_addr(follower).to_string();
    let backend = backend_with(&only_follower, SHORT_SESSION, Duration::from_millis(400)).await;
    assert_eq!(
        backend.session_timeout(),
        SHORT_SESSION,
        "the session granted"
    );
    let lease = SHORT_SESSION / 4 * 3;
    let holder = Locker::builder(backend).lease(lease).build();
    let other = locker(&majority).await;
    let zk = ZkClient::connect(&majority).await;
    let store = FenceStore::default();

    let guard = holder.lock("ledger").fenced().await.expect("lock");
    let old = guard.fence().expect("fenced");
    let node = contenders(&zk, "ledger").await.remove(0);
    assert_eq!(node.fence(), old);
    assert!(store.write("ledger", old));
    // A renewal answered after the lock was taken: the follower serves it.
    let renewals = holder.stats().renewal_calls;
    lock_testkit::eventually(
        "a renewal through the follower",
        Duration::from_secs(5),
        async || holder.stats().renewal_calls > renewals,
    )
    .await;
    assert!(guard.is_held());

    ensemble.isolate(follower);
    let isolated = Instant::now();
    println!(
        "cut a follower off the quorum: session {SHORT_SESSION:?}, lease {lease:?}, sync \
         limit {:?}",
        ensemble.sync_timeout()
    );
    let bound = lease + Duration::from_secs(1);
    let next = lost_before_taken(&guard, &other, "ledger", bound, &store, "quorum cut").await;
    // The cut follower still served reads when the lock moved: the stale read was there to
    // be had.
    assert!(
        isolated.elapsed() < ensemble.sync_timeout(),
        "the lock moved only after the follower stopped serving ({:?}): the test proves nothing",
        isolated.elapsed()
    );
    let new = next.fence().expect("fenced");
    let nodes = contenders(&zk, "ledger").await;
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    assert_eq!(nodes[0].fence(), new);
    ensemble.heal(follower);
    next.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_on_a_follower_cut_from_the_quorum_gets_no_lock() {
    let (mut ensemble, follower, majority) = partitionable().await;
    let cut = locker(&ensemble.client_addr(follower).to_string()).await;
    let other = locker(&majority).await;
    let zk = ZkClient::connect(&majority).await;
    // It works while the follower is in the quorum.
    let guard = cut.lock("job").fenced().await.expect("lock");
    let fence = guard.fence().expect("fenced");
    guard.release().await.expect("release");

    ensemble.isolate(follower);
    let isolated = Instant::now();
    let wait = Duration::from_secs(2);
    let start = Instant::now();
    let waited = cut.lock("job").fenced().wait(wait).await;
    let took = start.elapsed();
    assert!(
        waited.is_err(),
        "granted through a cut follower: {waited:?}"
    );
    assert!(
        took <= wait + REQUEST_TIMEOUT,
        "the error came {took:?} into a {wait:?} wait: {waited:?}"
    );
    let start = Instant::now();
    let tried = cut.try_lock("job").fenced().await;
    let single = start.elapsed();
    assert!(tried.is_err(), "granted through a cut follower: {tried:?}");
    assert!(
        single <= REQUEST_TIMEOUT * 2 + Duration::from_millis(500),
        "a single attempt's error came after {single:?}: {tried:?}"
    );
    println!(
        "through a cut follower: {:?} after {took:?} (wait {wait:?}), {:?} after {single:?}; \
         the follower still serving reads: {}",
        waited.as_ref().err().map(ToString::to_string),
        tried.as_ref().err().map(ToString::to_string),
        ensemble.mode(follower).await.is_some()
    );
    // The attempts were made while the follower still answered reads (the sync limit).
    assert!(isolated.elapsed() < ensemble.sync_timeout() + wait);
    // Nothing of theirs reached the quorum: the majority's locker takes the lock at once.
    assert!(contenders(&zk, "job").await.is_empty());
    let taken = other
        .try_lock("job")
        .fenced()
        .await
        .expect("the majority's lock");
    assert!(taken.fence().expect("fenced") > fence);
    ensemble.heal(follower);
    taken.release().await.expect("release");
}
