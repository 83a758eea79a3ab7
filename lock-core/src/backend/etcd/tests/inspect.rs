//! Inspection, force unlock and listing on a real etcd: what the conformance kit cannot see
//! from outside (a hand-over's age, the condition of the delete, entries of older versions,
//! pages that cut a lock's keys).

use std::time::{Duration, Instant};

use etcd_client::{PutOptions, Txn, TxnOp};

use super::Etcd;
use crate::backend::consensus_tests::Store;
use crate::backend::stamp::{self, Since};
use crate::key::LockKey;
use crate::test_support::within;
use crate::{ETCD_MIN_LEASE, LockError, Locker};

/// A waiter handed the lock shows an age counted from the grant, never from its queueing:
/// none until its stamp is rewritten (in the background), then one within the time since it
/// was handed the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_over_lock_shows_its_age_from_the_grant() {
    let etcd = Etcd::start().await;
    let a = Locker::builder(etcd.backend().await).holder("a").build();
    let b = Locker::builder(etcd.backend().await).holder("b").build();
    let inspector = etcd.locker().await;
    let held = a.lock("job").await.unwrap();
    let waiting = tokio::spawn(async move {
        let guard = b.lock("job").wait(Duration::from_secs(10)).await.unwrap();
        (guard, Instant::now())
    });
    etcd.until_contenders("job", 2).await;
    // The waiter queues long enough that an age counted from its queueing would show.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let before = inspector.inspect("job").await.unwrap();
    assert_eq!(before.holder.as_deref(), Some("a"), "{before:?}");
    assert_eq!(before.waiters, 1, "{before:?}");
    held.release().await.unwrap();
    let (guard, granted) = within(waiting).await.unwrap();
    within(async {
        loop {
            let state = inspector.inspect("job").await.unwrap();
            assert!(state.held, "{state:?}");
            assert_eq!(state.holder.as_deref(), Some("b"), "{state:?}");
            if let Some(age) = state.held_for {
                let bound = granted.elapsed() + Duration::from_millis(50);
                assert!(age <= bound, "held for {age:?}, granted {bound:?} ago");
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    guard.release().await.unwrap();
}

/// The delete of a force unlock is conditioned on the holder key it read: a holder that
/// released, and a new holder that took the lock between the read and the delete, is not
/// removed, however often the delete is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_unlock_removes_only_the_holder_it_read() {
    let etcd = Etcd::start().await;
    let operator = etcd.backend().await;
    let a = etcd.locker().await;
    let b = Locker::builder(etcd.backend().await).holder("b").build();
    let key = LockKey::new(crate::DEFAULT_PREFIX, "job").unwrap();
    let first = a.lock("job").fenced().await.unwrap();
    let read = operator.read_holder(&key, "force_unlock").await.unwrap();
    first.release().await.unwrap();
    let second = b.lock("job").fenced().await.unwrap();
    for _ in 0..2 {
        assert_eq!(
            operator.remove_holder(&key, &read).await.unwrap(),
            super::super::inspect::Removal::Gone
        );
        let state = operator.inspect_lock(&key).await.unwrap();
        assert!(state.held, "{state:?}");
        assert_eq!(state.fence, second.fence());
        assert_eq!(state.holder.as_deref(), Some("b"));
    }
    second.release().await.unwrap();
}

/// A contender key without a stamp (written by an older version: an empty value, or a fair
/// waiter's `fair:<ticket>` alone) is a holder without a name or an age; force unlock removes
/// it all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_without_a_stamp_are_held_without_a_holder() {
    let etcd = Etcd::start().await;
    let mut raw = etcd.raw().await;
    raw.put("lock:{old}/q/00aa", "", None).await.unwrap();
    raw.put("lock:{old}/q/00bb", "fair:t1", None).await.unwrap();
    raw.put("lock:{fair}/q/00cc", "fair:t2", None)
        .await
        .unwrap();
    let locker = etcd.locker().await;
    for (key, waiters) in [("old", 1), ("fair", 0)] {
        let state = locker.inspect(key).await.unwrap();
        assert!(state.held, "{state:?}");
        assert_eq!((state.holder, state.held_for), (None, None));
        assert_eq!(state.waiters, waiters);
        assert!(state.fence.is_some());
        // No lease on the key: etcd keeps it until deleted.
        assert_eq!(state.remaining, None);
    }
    let mut listed = Vec::new();
    let mut held = locker.list("*");
    while let Some(state) = held.next().await {
        listed.push(state.unwrap().key);
    }
    listed.sort();
    assert_eq!(listed, ["fair", "old"]);
    let removed = locker.force_unlock("old").await.unwrap().unwrap();
    assert_eq!(removed.holder, None);
    // The key queued behind it holds now.
    assert_eq!(locker.inspect("old").await.unwrap().waiters, 0);
}

/// A holder whose lock was forced open learns at its next renewal (`lost()`, then `LeaseLost`
/// on release), and a store that saw the next holder's fence refuses its fenced writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_out_holder_learns_at_its_renewal() {
    let etcd = Etcd::start().await;
    let a = Locker::builder(etcd.backend().await)
        .lease(ETCD_MIN_LEASE)
        .holder("a")
        .build();
    let operator = etcd.locker().await;
    let held = a.lock("job").fenced().await.unwrap();
    let removed = operator.force_unlock("job").await.unwrap().unwrap();
    assert_eq!(removed.fence, held.fence());
    assert_eq!(removed.holder.as_deref(), Some("a"));
    let next = operator.lock("job").fenced().await.unwrap();
    // A store keeping the largest fence it saw: the new holder writes first.
    let mut largest = 0;
    let mut write = |fence: Option<u64>| {
        let fence = fence.unwrap();
        let accepted = fence > largest;
        largest = largest.max(fence);
        accepted
    };
    assert!(write(next.fence()));
    assert!(
        !write(held.fence()),
        "the evicted holder's fenced write was accepted"
    );
    within(held.lost()).await;
    assert_eq!(marks(&etcd).await.len(), 1, "the removal's mark");
    assert!(matches!(
        held.release().await,
        Err(LockError::LeaseLost { .. })
    ));
    assert!(operator.inspect("job").await.unwrap().held);
    next.release().await.unwrap();
    // The evicted holder's release, which read the mark, deleted it.
    let gone = Instant::now();
    while !marks(&etcd).await.is_empty() {
        assert!(gone.elapsed() < Duration::from_secs(5), "the mark stayed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The marks force unlock left under `lock:{job}/forced/`: each one's etcd lease.
async fn marks(etcd: &Etcd) -> Vec<i64> {
    let options = etcd_client::GetOptions::new().with_prefix();
    let mut raw = etcd.raw().await;
    let answer = raw.get("lock:{job}/forced/", Some(options)).await.unwrap();
    answer
        .kvs()
        .iter()
        .map(etcd_client::KeyValue::lease)
        .collect()
}

/// A holder key moved to another etcd lease (an `extend`) between a force unlock's read and its
/// delete is read again and removed (the same key: its create revision), its mark on the lease
/// the key was on; the evicted holder's release reads the mark (`LeaseLost`) and deletes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_moved_to_another_lease_is_read_again_and_its_mark_goes_with_its_release() {
    let etcd = Etcd::start().await;
    let operator = etcd.backend().await;
    let a = Locker::builder(etcd.backend().await)
        .lease(ETCD_MIN_LEASE)
        .holder("a")
        .build();
    let key = LockKey::new(crate::DEFAULT_PREFIX, "job").unwrap();
    let held = a.lock("job").fenced().await.unwrap();
    let read = operator.read_holder(&key, "force_unlock").await.unwrap();
    held.extend(ETCD_MIN_LEASE * 4).await.unwrap();
    assert_eq!(
        operator.remove_holder(&key, &read).await.unwrap(),
        super::super::inspect::Removal::Moved
    );
    assert!(operator.inspect_lock(&key).await.unwrap().held);
    let removed = operator.force_unlock_lock(&key).await.unwrap().unwrap();
    assert_eq!(removed.fence, held.fence());
    assert_eq!(removed.holder.as_deref(), Some("a"));
    let on = marks(&etcd).await;
    assert_eq!(on.len(), 1, "one mark");
    assert_ne!(on[0], 0, "the mark is on the holder's lease");
    assert!(matches!(
        held.release().await,
        Err(LockError::LeaseLost { .. })
    ));
    let gone = Instant::now();
    while !marks(&etcd).await.is_empty() {
        assert!(gone.elapsed() < Duration::from_secs(5), "the mark stayed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A listing reads pages of at most 500 keys: a lock whose keys run past a page's end is
/// listed once, with all its waiters; hashed keys (a brace) come back as the caller named
/// them; records alone are no lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_in_pages_lists_each_held_lock_once() {
    let etcd = Etcd::start().await;
    let mut raw = etcd.raw().await;
    let value = stamp::value(
        None,
        Since::Held(stamp::now_ms()),
        Duration::from_secs(30),
        "raw",
    );
    let mut keys = Vec::new();
    for i in 0..300 {
        keys.push(format!("lock:{{k{i:03}}}/q/{:04x}", i));
    }
    // 520 contenders of one lock: they cross a page's end.
    for i in 0..520 {
        keys.push(format!("lock:{{k150x}}/q/{:04x}", i));
    }
    let hashed = LockKey::new(crate::DEFAULT_PREFIX, "a{b}/q/c").unwrap();
    keys.push(format!("{}/q/00ff", hashed.name()));
    for chunk in keys.chunks(100) {
        let puts: Vec<TxnOp> = chunk
            .iter()
            .map(|k| TxnOp::put(k.as_str(), value.clone(), None::<PutOptions>))
            .collect();
        raw.txn(Txn::new().and_then(puts)).await.unwrap();
    }
    raw.put("lock:{record}/result", "x", None).await.unwrap();
    let locker = etcd.locker().await;
    let mut held = locker.list("*");
    let mut listed = Vec::new();
    while let Some(state) = held.next().await {
        assert!(held.buffered() <= 500, "{}", held.buffered());
        let state = state.unwrap();
        assert_eq!(state.holder.as_deref(), Some("raw"));
        if state.key == "k150x" {
            assert_eq!(state.waiters, 519);
        }
        listed.push(state.key);
    }
    let total = listed.len();
    listed.sort();
    listed.dedup();
    assert_eq!(listed.len(), total, "a lock listed twice");
    assert_eq!(total, 302);
    assert!(listed.contains(&"a{b}/q/c".to_owned()));
    let mut some = locker.list("k15?");
    let mut matched = Vec::new();
    while let Some(state) = some.next().await {
        matched.push(state.unwrap().key);
    }
    matched.sort();
    assert_eq!(
        matched,
        (150..160).map(|i| format!("k{i}")).collect::<Vec<_>>()
    );
}
