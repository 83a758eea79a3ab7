//! Lost replies: an acquire whose reply never came back is recognised on retry (the token is
//! in the contender node's name) and leaves no orphan; a release whose reply was lost, sent
//! again after another locker took the lock, deletes nothing of the new holder's (it names
//! its own node: token and sequence).

use std::time::Duration;

use lock_core::{LockError, Locker};
use lock_testkit::eventually;
use lock_testkit::proxy::Proxy;
use lock_testkit::zookeeper::{ZkClient, ZooKeeperEnsemble, proxied_connect_string};

use super::{
    LEASE, Node, REQUEST_TIMEOUT, SESSION, backend, backend_with, contenders, lock_dir, locker,
    tree,
};

/// A test's tree, a client looking inside it, and a proxy in front of member 0 with the
/// connect string through it (same chroot).
async fn tree_and_proxy(name: &str) -> (String, ZkClient, Proxy, String) {
    let hosts = tree(name).await;
    let zk = ZkClient::connect(&hosts).await;
    let proxy = ZooKeeperEnsemble::shared().await.proxy(0).await;
    let through = format!(
        "{}{}",
        proxied_connect_string(std::slice::from_ref(&proxy)),
        root(&hosts)
    );
    (hosts, zk, proxy, through)
}

/// The chroot part of a connect string.
fn root(hosts: &str) -> &str {
    &hosts[hosts.find('/').unwrap()..]
}

/// Waits until `proxy` froze the connection after the first request naming its needle,
/// checks that the request created a contender node of `key` (the `before`-th), then drops
/// the connection: the reply is lost. Returns that node.
async fn lose_the_reply(proxy: &Proxy, zk: &ZkClient, key: &str, before: usize) -> Node {
    proxy.wait_frozen().await;
    eventually(
        "the create took effect",
        Duration::from_secs(5),
        async || contenders(zk, key).await.len() == before + 1,
    )
    .await;
    let node = contenders(zk, key).await.remove(before);
    proxy.cut();
    proxy.restore();
    node
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_acquire_whose_reply_is_lost_finds_its_own_node_on_retry() {
    let (hosts, zk, proxy, through) = tree_and_proxy("queued-reply-lost").await;
    let holder = locker(&hosts).await;
    let lost = locker(&through).await;
    let held = holder.lock("queued-lost").fenced().await.expect("lock");
    // The fair waiter's create reaches ZooKeeper; its answer does not come back. Its node is
    // `f-<token>-`: no single attempt (`t-`) nor any other request names that.
    proxy.freeze_after(b"lock:{queued-lost}/f-");
    let acquire = tokio::spawn({
        let lost = lost.clone();
        async move {
            lost.lock("queued-lost")
                .fair()
                .fenced()
                .wait(Duration::from_secs(20))
                .await
        }
    });
    let node = lose_the_reply(&proxy, &zk, "queued-lost", 1).await;
    // The waiter asks again on a new connection and finds its node in the queue.
    eventually(
        "the waiter reconnects",
        Duration::from_secs(10),
        async || proxy.accepted() >= 2,
    )
    .await;
    held.release().await.expect("release");
    let guard = tokio::time::timeout(Duration::from_secs(20), acquire)
        .await
        .expect("the acquire never ended")
        .expect("task")
        .expect("granted after the lost reply");
    let nodes = contenders(&zk, "queued-lost").await;
    assert_eq!(nodes, vec![node.clone()], "an orphan node");
    assert_eq!(
        guard.fence(),
        Some(node.fence()),
        "the retry did not take the node its lost create made (it queued again, last)"
    );
    guard.release().await.expect("release");
    assert!(contenders(&zk, "queued-lost").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_acquire_whose_reply_is_lost_leaves_no_orphan() {
    let (_, zk, proxy, through) = tree_and_proxy("first-reply-lost").await;
    let lost = locker(&through).await;
    // The lock's parent exists already: the first create naming the lock makes the node (the
    // first attempt's, a single one: `t-<token>-`).
    zk.create(&lock_dir("first-lost"), b"").await;
    proxy.freeze_after(b"lock:{first-lost}/t-");
    let acquire = tokio::spawn({
        let lost = lost.clone();
        async move {
            lost.lock("first-lost")
                .fenced()
                .wait(Duration::from_secs(20))
                .await
        }
    });
    let node = lose_the_reply(&proxy, &zk, "first-lost", 0).await;
    let guard = tokio::time::timeout(Duration::from_secs(20), acquire)
        .await
        .expect("the acquire never ended")
        .expect("task")
        .expect("granted after the lost reply");
    // Granted on its own node, and no other.
    assert_eq!(guard.fence(), Some(node.fence()));
    assert_eq!(
        contenders(&zk, "first-lost").await,
        vec![node],
        "an orphan node"
    );
    guard.release().await.expect("release");
    assert!(contenders(&zk, "first-lost").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_sent_again_after_its_reply_was_lost_spares_the_next_holder() {
    let (hosts, zk, proxy, through) = tree_and_proxy("release-lost").await;
    // Its requests wait longer than the connection's drop: the release is sent again on the
    // next connection instead of going on in the background.
    let patient = backend_with(&through, SESSION, Duration::from_secs(5)).await;
    let first = Locker::builder(patient).lease(LEASE).build();
    let second = locker(&hosts).await;
    let third = Locker::builder(backend(&hosts).await).lease(LEASE).build();
    let guard = first.lock("pay").fenced().await.expect("lock");
    let old = contenders(&zk, "pay").await.remove(0);
    assert_eq!(guard.fence(), Some(old.fence()));
    // The release's delete (opcode 2, then the node's full path) reaches ZooKeeper; its
    // answer does not come back. Renewals read the same path in a multi-read, whose ops are
    // framed otherwise.
    let path = format!("{}{}/{}", root(&hosts), lock_dir("pay"), old.name);
    let mut needle = vec![0, 0, 0, 2];
    needle.extend_from_slice(&u32::try_from(path.len()).unwrap().to_be_bytes());
    needle.extend_from_slice(path.as_bytes());
    proxy.freeze_after(&needle);
    let release = tokio::spawn(guard.release());
    proxy.wait_frozen().await;
    eventually(
        "the release took effect",
        Duration::from_secs(5),
        async || contenders(&zk, "pay").await.is_empty(),
    )
    .await;
    let next = second
        .lock("pay")
        .fenced()
        .wait(Duration::from_secs(10))
        .await
        .expect("the second locker takes the released lock");
    let new = contenders(&zk, "pay").await;
    assert_eq!(new.len(), 1);
    assert_eq!(next.fence(), Some(new[0].fence()));
    // Names carry the token and a sequence: the old path cannot name the new node.
    assert_ne!(new[0].token(), old.token());
    assert_ne!(new[0].name, old.name);
    // The connection drops: the delete is sent again on a new one, finds no node on the same
    // live session, and says the release went through.
    proxy.cut();
    proxy.restore();
    let answer = tokio::time::timeout(Duration::from_secs(10), release)
        .await
        .expect("the release hung")
        .expect("task");
    assert!(proxy.accepted() >= 2, "the release was not sent again");
    assert!(
        answer.is_ok(),
        "a release that went through, its answer lost: {answer:?}"
    );
    // It deleted nothing of the new holder's: its node and the lock are untouched.
    assert_eq!(
        contenders(&zk, "pay").await,
        new,
        "the new holder's node changed"
    );
    assert!(next.is_held());
    let intruder = third.try_lock("pay").await;
    assert!(
        matches!(intruder, Err(LockError::Busy { .. })),
        "another locker's try_lock: {intruder:?}"
    );
    println!(
        "first release (reply lost, sent again): {answer:?}; nodes {} then {}",
        old.name, new[0].name
    );
    next.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_giving_up_while_its_create_is_unanswered_leaves_no_node() {
    let (hosts, zk, proxy, through) = tree_and_proxy("gave-up-unanswered").await;
    let holder = locker(&hosts).await;
    // A session longer than the whole blackout (its client notices a silent connection only
    // after two fifths of it): the session outlives the fault, and so would an orphan node.
    let long = backend_with(&through, Duration::from_secs(10), REQUEST_TIMEOUT).await;
    let gives_up = Locker::builder(long).lease(LEASE).build();
    let other = locker(&hosts).await;
    let held = holder.lock("unanswered").fenced().await.expect("lock");
    // The waiter's create reaches ZooKeeper; nothing more passes on its connection.
    proxy.freeze_after(b"lock:{unanswered}/f-");
    let wait = Duration::from_millis(1500);
    let answer = gives_up.lock("unanswered").fair().wait(wait).await;
    assert!(answer.is_err(), "{answer:?}");
    let node = contenders(&zk, "unanswered").await.remove(1);
    // Its leave (in the background) meets the same silence for a while; then the connection
    // drops and the client reconnects, same session.
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.cut();
    proxy.restore();
    // (The first request on the dropped connection may fail: try again.)
    let start = std::time::Instant::now();
    let probe = loop {
        match gives_up.try_lock("probe").await {
            Ok(probe) => break probe,
            Err(e) => assert!(
                start.elapsed() < Duration::from_secs(5),
                "the waiter's locker does not work again: {e:?}"
            ),
        }
    };
    let probe_node = contenders(&zk, "probe").await.remove(0);
    probe.release().await.expect("release");
    assert_eq!(
        probe_node.owner, node.owner,
        "the waiter's session ended (its nodes went with it): the test proves nothing"
    );
    held.release().await.expect("release");
    // The waiter's node goes: the next locker is served, not blocked by it.
    let next = other
        .lock("unanswered")
        .fenced()
        .wait(Duration::from_secs(5))
        .await;
    let left = contenders(&zk, "unanswered").await;
    assert!(
        next.is_ok(),
        "the node of a waiter that gave up blocks the lock: {next:?}; nodes {left:?} (the \
         waiter's was {node:?})"
    );
    next.unwrap().release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_out_holder_whose_release_is_sent_again_hears_lease_lost() {
    let (hosts, zk, proxy, through) = tree_and_proxy("forced-resent").await;
    // Its requests wait longer than the connection's drop: the release is sent again on the
    // next connection instead of going on in the background.
    let patient = backend_with(&through, SESSION, Duration::from_secs(5)).await;
    let first = Locker::builder(patient).lease(LEASE).build();
    let operator = locker(&hosts).await;
    let guard = first.lock("pay").fenced().await.expect("lock");
    let old = contenders(&zk, "pay").await.remove(0);
    let path = format!("{}{}/{}", root(&hosts), lock_dir("pay"), old.name);
    let mut needle = vec![0, 0, 0, 2];
    needle.extend_from_slice(&u32::try_from(path.len()).unwrap().to_be_bytes());
    needle.extend_from_slice(path.as_bytes());
    // An operator removes the holder's node, before the holder's next renewal tells it.
    let removed = operator.force_unlock("pay").await.expect("force_unlock");
    assert!(removed.is_some());
    // The holder's release finds its node gone; its answer is lost with the connection, and
    // the delete sent again on the same live session finds no node either: the operator's
    // removal, not the release's own first delete.
    proxy.freeze_after(&needle);
    let release = tokio::spawn(guard.release());
    proxy.wait_frozen().await;
    proxy.cut();
    proxy.restore();
    let answer = tokio::time::timeout(Duration::from_secs(10), release)
        .await
        .expect("the release hung")
        .expect("task");
    assert!(proxy.accepted() >= 2, "the release was not sent again");
    assert!(
        matches!(answer, Err(LockError::LeaseLost { .. })),
        "a release of a lock an operator removed: {answer:?}"
    );
}
