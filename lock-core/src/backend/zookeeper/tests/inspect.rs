//! Inspection, force unlock and listing on a real ZooKeeper: what the conformance kit cannot
//! see from outside (a hand-over's age, the condition of the delete, nodes of older versions,
//! pages of the root's children).

use std::time::{Duration, Instant};

use super::{LEASE, Tree};
use crate::backend::stamp::{self, Since};
use crate::key::LockKey;
use crate::test_support::within;
use crate::{LockError, Locker};

/// The path of lock `key`'s container (default prefix and root).
fn dir(key: &str) -> String {
    let name = LockKey::new(crate::DEFAULT_PREFIX, key).unwrap();
    format!("{}/{}", super::DEFAULT_ROOT, super::escape(name.name()))
}

/// A waiter handed the lock shows an age counted from the grant, never from its queueing; and
/// the waiter behind it, whose watch sees the rewrite of the stamp ahead, keeps its place and
/// is served at the next release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_over_lock_shows_its_age_from_the_grant() {
    let tree = Tree::new("zk-inspect-age").await;
    let tree = &tree;
    let locker = |who: &'static str| async move {
        Locker::builder(tree.backend().await)
            .lease(LEASE)
            .holder(who)
            .build()
    };
    let (a, b, c) = (locker("a").await, locker("b").await, locker("c").await);
    let inspector = tree.locker().await;
    let held = a.lock("job").await.unwrap();
    let b_waits = tokio::spawn(async move {
        let guard = b.lock("job").wait(Duration::from_secs(10)).await.unwrap();
        (guard, Instant::now())
    });
    tree.until_contenders("job", 2).await;
    let c_waits =
        tokio::spawn(async move { c.lock("job").wait(Duration::from_secs(10)).await.unwrap() });
    tree.until_contenders("job", 3).await;
    // The waiters queue long enough that an age counted from their queueing would show.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let before = inspector.inspect("job").await.unwrap();
    assert_eq!(before.holder.as_deref(), Some("a"), "{before:?}");
    assert_eq!(before.waiters, 2, "{before:?}");
    held.release().await.unwrap();
    let (guard, granted) = within(b_waits).await.unwrap();
    within(async {
        loop {
            let state = inspector.inspect("job").await.unwrap();
            assert!(state.held, "{state:?}");
            assert_eq!(state.holder.as_deref(), Some("b"), "{state:?}");
            assert_eq!(state.waiters, 1, "{state:?}");
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
    let last = within(c_waits).await.unwrap();
    assert_eq!(
        inspector.inspect("job").await.unwrap().holder.as_deref(),
        Some("c")
    );
    last.release().await.unwrap();
    assert_eq!(tree.contenders("job").await.len(), 0);
}

/// The delete of a force unlock is conditioned on the holder node it read: a holder that
/// released, and a new holder that took the lock between the read and the delete, is not
/// removed, however often the delete is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_unlock_removes_only_the_holder_it_read() {
    let tree = Tree::new("zk-inspect-exact").await;
    let operator = tree.backend().await;
    let a = tree.locker().await;
    let b = Locker::builder(tree.backend().await)
        .lease(LEASE)
        .holder("b")
        .build();
    let key = LockKey::new(crate::DEFAULT_PREFIX, "job").unwrap();
    let session = operator.inner.sessions.current().await.unwrap();
    let first = a.lock("job").fenced().await.unwrap();
    let read = || async {
        operator
            .read_holder(&session, &key, "force_unlock")
            .await
            .unwrap()
            .unwrap()
    };
    let (stale, again) = (read().await, read().await);
    first.release().await.unwrap();
    let second = b.lock("job").fenced().await.unwrap();
    for read in [stale, again] {
        let removed = operator.remove_holder(&session, &key, read).await.unwrap();
        assert_eq!(removed, None);
        let state = operator.inspect_lock(&key).await.unwrap();
        assert!(state.held, "{state:?}");
        assert_eq!(state.fence, second.fence());
        assert_eq!(state.holder.as_deref(), Some("b"));
    }
    second.release().await.unwrap();
}

/// A contender node without a stamp (made by an older version: no data) is a holder without a
/// name, an age or a lease; force unlock removes it all the same, and the next node holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_without_a_stamp_are_held_without_a_holder() {
    let tree = Tree::new("zk-inspect-old").await;
    let old = dir("old");
    tree.client
        .create(&format!("{old}/q-00aa-0000000001"), b"")
        .await;
    tree.client
        .create(&format!("{old}/q-00bb-0000000002"), b"")
        .await;
    let locker = tree.locker().await;
    let state = locker.inspect("old").await.unwrap();
    assert!(state.held, "{state:?}");
    assert_eq!(
        (state.holder, state.held_for, state.remaining),
        (None, None, None)
    );
    assert_eq!(state.waiters, 1);
    assert!(state.fence.is_some());
    let removed = locker.force_unlock("old").await.unwrap().unwrap();
    assert_eq!(removed.holder, None);
    assert_eq!(locker.inspect("old").await.unwrap().waiters, 0);
}

/// A holder whose lock was forced open learns at its next renewal (`lost()`, then `LeaseLost`
/// on release), and a store that saw the next holder's fence refuses its fenced writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_out_holder_learns_at_its_renewal() {
    let tree = Tree::new("zk-inspect-forced").await;
    let a = Locker::builder(tree.backend().await)
        .lease(LEASE)
        .holder("a")
        .build();
    let operator = tree.locker().await;
    let held = a.lock("job").fenced().await.unwrap();
    let removed = operator.force_unlock("job").await.unwrap().unwrap();
    assert_eq!(removed.fence, held.fence());
    assert_eq!(removed.holder.as_deref(), Some("a"));
    assert_eq!(removed.remaining, Some(LEASE));
    let next = operator.lock("job").fenced().await.unwrap();
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
    assert!(matches!(
        held.release().await,
        Err(LockError::LeaseLost { .. })
    ));
    assert!(operator.inspect("job").await.unwrap().held);
    next.release().await.unwrap();
}

/// A listing reads the root's children a page of 100 locks at a time: each held lock once,
/// hashed keys (a brace) as the caller named them, a container without contenders not at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_in_pages_lists_each_held_lock_once() {
    let tree = Tree::new("zk-inspect-list").await;
    let data = stamp::value(None, Since::Held(stamp::now_ms()), LEASE, "raw");
    let mut keys: Vec<String> = (0..230).map(|i| format!("k{i:03}")).collect();
    keys.push("a{b}/q/c".to_owned());
    for key in &keys {
        let path = format!("{}/q-00aa-0000000001", dir(key));
        tree.client.create(&path, &data).await;
    }
    tree.client
        .create(&format!("{}/result", dir("record")), b"x")
        .await;
    let locker = tree.locker().await;
    let mut held = locker.list("*");
    let mut listed = Vec::new();
    while let Some(state) = held.next().await {
        assert!(held.buffered() <= 100, "{}", held.buffered());
        let state = state.unwrap();
        assert_eq!(state.holder.as_deref(), Some("raw"));
        listed.push(state.key);
    }
    let total = listed.len();
    listed.sort();
    listed.dedup();
    assert_eq!(listed.len(), total, "a lock listed twice");
    assert_eq!(total, keys.len());
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
