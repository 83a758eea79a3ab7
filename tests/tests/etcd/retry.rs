//! Lost replies: an acquire whose reply never came back is recognised on retry (the token is
//! in the contender key's name) and leaves no orphan; a release whose reply was lost, sent
//! again after another locker took the lock, deletes nothing of the new holder's.

use std::time::{Duration, Instant};

use lock_core::{LockError, LockGuard};
use lock_testkit::etcd::{EtcdClient, KeyValue};
use lock_testkit::eventually;
use lock_testkit::proxy::Proxy;

use super::{LEASE, contenders, locker, shared, through};

/// Freezes the connection of `proxy` after the first request naming `name`, checks that
/// the request created a contender key under `ns`, then drops the connection: the reply is
/// lost. Returns that key.
async fn lose_the_reply(proxy: &Proxy, etcd: &EtcdClient, ns: &str, before: usize) -> KeyValue {
    proxy.wait_frozen().await;
    eventually(
        "the acquire took effect",
        Duration::from_secs(5),
        async || contenders(etcd, ns).await.len() == before + 1,
    )
    .await;
    let entry = contenders(etcd, ns).await.remove(before);
    proxy.cut();
    proxy.restore();
    entry
}

/// Releases `guard` (the only lock under `ns`, taken through `proxy`) in a task, freezing the
/// proxy's connection once the release's delete went out, and waits until the delete took
/// effect: the release's answer is held up. The needle is the delete operation of a
/// transaction (`RequestOp.request_delete_range` holding `DeleteRangeRequest.key`), not the
/// renewal's read of the same key.
async fn release_with_its_answer_held(
    proxy: &Proxy,
    etcd: &EtcdClient,
    ns: &str,
    guard: LockGuard,
) -> tokio::task::JoinHandle<Result<(), LockError>> {
    let key = contenders(etcd, ns).await.remove(0).key;
    let len = u8::try_from(key.len()).expect("a short key");
    assert!(len < 126, "one-byte lengths only");
    let mut needle = vec![0x1a, len + 2, 0x0a, len];
    needle.extend_from_slice(&key);
    proxy.freeze_after(&needle);
    let release = tokio::spawn(guard.release());
    proxy.wait_frozen().await;
    eventually(
        "the release took effect",
        Duration::from_secs(5),
        async || contenders(etcd, ns).await.is_empty(),
    )
    .await;
    release
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_acquire_whose_reply_is_lost_finds_its_own_key_on_retry() {
    let cluster = shared().await;
    let (etcd, ns) = (cluster.client(), "queued-reply-lost/");
    let proxy = cluster.proxy(0).await;
    let holder = locker(&cluster.urls(), ns).await;
    let lost = locker(&through(std::slice::from_ref(&proxy)), ns).await;
    let held = holder.lock("queued-lost").fenced().await.expect("lock");
    // The waiter's queue transaction reaches etcd; its answer does not come back. The needle
    // is that transaction's compare on its own key (`Compare{target: CREATE, key}` with the
    // length of a contender key), which the plain attempt before it (a compare on the
    // whole prefix) does not have.
    let held_key = contenders(&etcd, ns).await.remove(0).key;
    let prefix = format!("{ns}lock:{{queued-lost}}/q/");
    assert!(held_key.starts_with(prefix.as_bytes()));
    let mut needle = vec![0x10, 0x01, 0x1a, u8::try_from(held_key.len()).unwrap()];
    needle.extend_from_slice(prefix.as_bytes());
    proxy.freeze_after(&needle);
    let acquire = tokio::spawn({
        let lost = lost.clone();
        async move {
            lost.lock("queued-lost")
                .fenced()
                .wait(Duration::from_secs(20))
                .await
        }
    });
    let entry = lose_the_reply(&proxy, &etcd, ns, 1).await;
    // The waiter, patient, asks again on a new connection and finds its key in the queue.
    eventually(
        "the waiter asks again",
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
    let keys = contenders(&etcd, ns).await;
    assert_eq!(keys.len(), 1, "an orphan entry: {keys:?}");
    assert_eq!(
        guard.fence(),
        Some(u64::try_from(entry.create_revision).unwrap()),
        "the retry did not take the key its lost attempt created (it queued again, last)"
    );
    guard.release().await.expect("release");
    assert!(contenders(&etcd, ns).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_acquire_whose_reply_is_lost_leaves_no_orphan() {
    let cluster = shared().await;
    let (etcd, ns) = (cluster.client(), "first-reply-lost/");
    let proxy = cluster.proxy(0).await;
    let lost = locker(&through(std::slice::from_ref(&proxy)), ns).await;
    let other = locker(&cluster.urls(), ns).await;
    proxy.freeze_after(b"first-lost");
    let acquire = tokio::spawn({
        let lost = lost.clone();
        async move {
            lost.lock("first-lost")
                .fenced()
                .wait(Duration::from_secs(20))
                .await
        }
    });
    let entry = lose_the_reply(&proxy, &etcd, ns, 0).await;
    let answer = tokio::time::timeout(Duration::from_secs(20), acquire)
        .await
        .expect("the acquire never ended")
        .expect("task");
    println!(
        "a first attempt whose reply was lost: {:?}",
        answer.as_ref().map(|g| g.fence())
    );
    match answer {
        // Granted: on its own key, and no other.
        Ok(guard) => {
            assert_eq!(
                guard.fence(),
                Some(u64::try_from(entry.create_revision).unwrap())
            );
            assert_eq!(contenders(&etcd, ns).await, vec![entry], "an orphan entry");
            guard.release().await.expect("release");
        }
        // Failed: then the key it created is not left holding the lock. Another locker
        // gets it within the lease (the etcd lease runs a second longer), and so does the
        // same locker.
        Err(_) => {
            let bound = Duration::from_secs(10);
            let start = Instant::now();
            let next = other
                .lock("first-lost")
                .fenced()
                .wait(bound)
                .await
                .expect("the lock stays taken by the failed attempt's key");
            println!(
                "another locker got it {:?} after the failed attempt",
                start.elapsed()
            );
            assert!(next.fence().unwrap() > u64::try_from(entry.create_revision).unwrap());
            next.release().await.expect("release");
            let again = lost
                .lock("first-lost")
                .wait(bound)
                .await
                .expect("the same locker");
            again.release().await.expect("release");
        }
    }
    eventually("no orphan", Duration::from_secs(5), async || {
        contenders(&etcd, ns).await.is_empty()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_sent_again_after_its_reply_was_lost_spares_the_next_holder() {
    let cluster = shared().await;
    let (etcd, ns) = (cluster.client(), "release-lost/");
    let proxy = cluster.proxy(0).await;
    let first = locker(&through(std::slice::from_ref(&proxy)), ns).await;
    let second = locker(&cluster.urls(), ns).await;
    let third = locker(&cluster.urls(), ns).await;
    let guard = first.lock("pay").fenced().await.expect("lock");
    let old = guard.fence().unwrap();
    // The release's delete reaches etcd; its answer does not come back.
    let release = release_with_its_answer_held(&proxy, &etcd, ns, guard).await;
    let next = second
        .lock("pay")
        .fenced()
        .wait(Duration::from_secs(10))
        .await
        .expect("the second locker takes the released lock");
    let new = next.fence().unwrap();
    assert!(new > old);
    let entry = contenders(&etcd, ns).await;
    // The first release ends (an error: its answer was lost), and is sent again on a new
    // connection (in the background) once the connection drops.
    let answer = tokio::time::timeout(Duration::from_secs(10), release)
        .await
        .expect("the release hung")
        .expect("task");
    proxy.cut();
    proxy.restore();
    // The first locker works again through the proxy: its retried release has gone out.
    eventually(
        "the first locker reconnects",
        Duration::from_secs(10),
        async || first.try_lock("other").await.is_ok(),
    )
    .await;
    // The replay (every few hundred milliseconds until etcd answers) had a lease to go out.
    tokio::time::sleep(LEASE).await;
    // It deleted nothing: the new holder keeps its key, and the lock.
    let now: Vec<_> = contenders(&etcd, ns)
        .await
        .into_iter()
        .filter(|kv| kv.key_str().contains("{pay}"))
        .collect();
    assert_eq!(now, entry, "the new holder's key changed");
    assert!(next.is_held());
    let intruder = third.try_lock("pay").await;
    assert!(
        matches!(intruder, Err(LockError::Busy { .. })),
        "another locker's try_lock: {intruder:?}"
    );
    println!("first release (reply lost): {answer:?}; fences {old} then {new}");
    next.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_sent_again_after_it_went_through_says_ok() {
    let cluster = shared().await;
    let (etcd, ns) = (cluster.client(), "release-resent/");
    let proxy = cluster.proxy(0).await;
    let first = locker(&through(std::slice::from_ref(&proxy)), ns).await;
    let second = locker(&cluster.urls(), ns).await;
    let guard = first.lock("pay").fenced().await.expect("lock");
    // The release's delete reaches etcd; its answer is lost with the connection, which drops:
    // the release is sent again on a new one and finds no key.
    let release = release_with_its_answer_held(&proxy, &etcd, ns, guard).await;
    // Another locker takes the lock meanwhile: the release sent again must not count its
    // key, nor call the first holder's release a loss.
    let next = second.lock("pay").fenced().await.expect("lock");
    proxy.cut();
    proxy.restore();
    let answer = tokio::time::timeout(Duration::from_secs(10), release)
        .await
        .expect("the release hung")
        .expect("task");
    assert!(
        answer.is_ok(),
        "a release that went through, its answer lost: {answer:?}"
    );
    assert!(proxy.accepted() >= 2, "the release was not sent again");
    assert!(next.is_held());
    assert_eq!(contenders(&etcd, ns).await.len(), 1);
    next.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_requests_after_a_dropped_connection_are_served() {
    let cluster = shared().await;
    let ns = "reconnect/";
    let proxy = cluster.proxy(0).await;
    let locker = locker(&through(std::slice::from_ref(&proxy)), ns).await;
    // Every etcd request, the keepalive stream too, goes over the one connection the proxy
    // drops; the member behind it never stops serving.
    for round in 0..10 {
        let guard = locker.lock("again").fenced().await.expect("lock");
        proxy.cut();
        proxy.restore();
        guard
            .release()
            .await
            .unwrap_or_else(|e| panic!("round {round}: the release after the drop: {e:?}"));
        let guard = locker.lock("again").fenced().await.expect("lock");
        guard.release().await.expect("release");
        proxy.cut();
        proxy.restore();
        let guard = locker
            .lock("again")
            .fenced()
            .wait(Duration::from_secs(10))
            .await
            .unwrap_or_else(|e| panic!("round {round}: the acquire after the drop: {e:?}"));
        guard.release().await.expect("release");
    }
    assert!(proxy.accepted() > 10, "the connection was never dropped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contender_key_nobody_holds_stops_blocking_its_lock_though_its_lease_lives() {
    let cluster = shared().await;
    let (etcd, ns) = (cluster.client(), "orphan/");
    let owner = locker(&cluster.urls(), ns).await;
    let other = locker(&cluster.urls(), ns).await;
    // The owner holds another lock: its watchdog keeps its etcd lease alive.
    let kept = owner.lock("kept").fenced().await.expect("lock");
    let kept_key = contenders(&etcd, ns).await.remove(0);
    // An acquire of the owner's that etcd applied only after its release had run (a request
    // held up in a connection): the key of a token nobody uses, on the owner's lease, at the
    // head of the queue of "blocked".
    let orphan = format!("{ns}lock:{{blocked}}/q/0123456789abcdef0123456789abcdef");
    etcd.put_with_lease(&orphan, "", kept_key.lease).await;
    let start = Instant::now();
    let guard = other
        .lock("blocked")
        .fenced()
        .wait(Duration::from_secs(10))
        .await
        .expect("the orphan key kept blocking the lock");
    println!(
        "the lock behind an orphan key served after {:?}",
        start.elapsed()
    );
    assert!(etcd.get(&orphan).await.is_none(), "the orphan key is back");
    // The owner's own lock is untouched.
    assert!(kept.is_held());
    assert_eq!(etcd.get(&kept_key.key).await, Some(kept_key));
    guard.release().await.expect("release");
    kept.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_out_holder_whose_release_is_sent_again_hears_lease_lost() {
    let cluster = shared().await;
    let (etcd, ns) = (cluster.client(), "forced-resent/");
    let proxy = cluster.proxy(0).await;
    let first = locker(&through(std::slice::from_ref(&proxy)), ns).await;
    let operator = locker(&cluster.urls(), ns).await;
    let guard = first.lock("pay").fenced().await.expect("lock");
    let key = contenders(&etcd, ns).await.remove(0).key;
    let len = u8::try_from(key.len()).expect("a short key");
    assert!(len < 126, "one-byte lengths only");
    let mut needle = vec![0x1a, len + 2, 0x0a, len];
    needle.extend_from_slice(&key);
    // An operator removes the holder's key, before the holder's next renewal (a third of the
    // lease) tells it.
    let removed = operator.force_unlock("pay").await.expect("force_unlock");
    assert!(removed.is_some());
    // The holder's release finds its key gone; its answer is lost with the connection, and the
    // release sent again on a new one finds the key gone too, while the holder's lease lives:
    // the key went by the operator's hand, not the release's.
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
    // Nothing of the removal is left behind once the holder knows.
    eventually("no key left", Duration::from_secs(5), async || {
        etcd.range_prefix(ns).await.is_empty()
    })
    .await;
}
