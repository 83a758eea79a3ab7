//! What the etcd backend owes the engine beside the lock itself: fair waiters of other
//! processes heard by a holder passing the lock between its tasks, and locks the watchdog does
//! not renew ending at their lease though the etcd lease they share lives on.

use std::sync::atomic::Ordering;

use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;

use super::*;

/// Polls `done` every 10 ms until it holds (within the test bound).
async fn until(mut done: impl FnMut() -> bool) {
    within(async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_waiter_of_another_locker_ends_the_local_turns() {
    let etcd = Etcd::start().await;
    let backend = etcd.backend().await;
    let a = Locker::builder(backend.clone())
        .local_turns(100)
        .local_hold(Duration::from_secs(30))
        .build();
    let b = etcd.locker().await;
    let first = a.lock("hot").await.unwrap();
    let (order, mut served) = mpsc::unbounded_channel();
    let go: Vec<Arc<Notify>> = (0..2).map(|_| Arc::new(Notify::new())).collect();
    // Three tasks of `a` queue behind the holder, in this order; a2 and a3 wait for their
    // `go` before they release.
    let mut tasks = Vec::new();
    for (i, name) in ["a2", "a3", "a4"].into_iter().enumerate() {
        let (locker, order, go) = (a.clone(), order.clone(), go.get(i).cloned());
        tasks.push(tokio::spawn(async move {
            let guard = locker
                .lock("hot")
                .wait(Duration::from_secs(20))
                .await
                .unwrap();
            order.send(name).unwrap();
            if let Some(go) = go {
                go.notified().await;
            }
            guard.release().await.unwrap();
        }));
        until(|| a.stats().waiters == i + 1).await;
    }
    // The holder from before the queue formed releases in etcd; a2 takes it there. Its
    // release, the first local turn, asks etcd (nobody else queues) and passes it to a3.
    first.release().await.unwrap();
    assert_eq!(within(served.recv()).await, Some("a2"));
    go[0].notify_one();
    assert_eq!(within(served.recv()).await, Some("a3"));
    assert_eq!(a.stats().local_handoffs, 1);
    // A fair waiter of another locker queues; `a` hears of it.
    let heard = backend.inner.fair_heard.load(Ordering::Relaxed);
    tasks.push(tokio::spawn({
        let order = order.clone();
        async move {
            let guard = b
                .lock("hot")
                .fair()
                .wait(Duration::from_secs(20))
                .await
                .unwrap();
            order.send("b").unwrap();
            guard.release().await.unwrap();
        }
    }));
    etcd.until_contenders("hot", 2).await;
    until(|| backend.inner.fair_heard.load(Ordering::Relaxed) > heard).await;
    // a3's release gives the lock back to etcd, whose queue serves b before a4.
    go[1].notify_one();
    for t in tasks {
        within(t).await.unwrap();
    }
    let rest = [served.recv().await, served.recv().await];
    assert_eq!(rest, [Some("b"), Some("a4")], "a4 overtook the fair waiter");
    assert_eq!(etcd.contenders("hot").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_without_the_watchdog_ends_at_its_lease_while_others_are_renewed() {
    let etcd = Etcd::start().await;
    let (a, b) = (etcd.locker().await, etcd.locker().await);
    // Renewed: keeps the etcd lease of this lease length alive, for every key on it.
    let kept = a.lock("kept").lease(ETCD_MIN_LEASE).await.unwrap();
    let start = Instant::now();
    let free = a
        .lock("free")
        .lease(ETCD_MIN_LEASE)
        .watchdog(false)
        .await
        .unwrap();
    let next = b
        .lock("free")
        .wait(Duration::from_secs(8))
        .await
        .expect("the unrenewed lock outlived its lease");
    assert!(
        start.elapsed() >= ETCD_MIN_LEASE,
        "taken over {:?} after the acquire began, within its lease",
        start.elapsed()
    );
    assert!(!free.is_held());
    assert!(matches!(
        free.release().await,
        Err(LockError::LeaseLost { .. })
    ));
    next.release().await.unwrap();
    // An extend moves its end: a lease from the extend.
    let long = a
        .lock("long")
        .lease(ETCD_MIN_LEASE)
        .watchdog(false)
        .await
        .unwrap();
    let extended = Instant::now();
    long.extend(2 * ETCD_MIN_LEASE).await.unwrap();
    let next = b.lock("long").wait(Duration::from_secs(10)).await.unwrap();
    assert!(
        extended.elapsed() >= 2 * ETCD_MIN_LEASE,
        "taken over {:?} after the extend, within its lease",
        extended.elapsed()
    );
    next.release().await.unwrap();
    assert!(kept.is_held());
    kept.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_past_its_max_hold_ends_at_its_lease_while_others_are_renewed() {
    let etcd = Etcd::start().await;
    let (a, b) = (etcd.locker().await, etcd.locker().await);
    let kept = a.lock("kept").lease(ETCD_MIN_LEASE).await.unwrap();
    // Held by a task that never lets go: the watchdog stops renewing it at its max hold.
    let hung = a
        .lock("hung")
        .lease(ETCD_MIN_LEASE)
        .max_hold(Duration::from_secs(1))
        .await
        .unwrap();
    let next = b
        .lock("hung")
        .wait(Duration::from_secs(10))
        .await
        .expect("a lock no longer renewed outlived its lease");
    assert!(!hung.is_held());
    next.release().await.unwrap();
    assert!(kept.is_held());
    kept.release().await.unwrap();
}
