//! What the etcd backend owes the engine beside the lock itself: fair waiters of other
//! processes heard by a holder passing the lock between its tasks, and locks the watchdog does
//! not renew ending at their lease though the etcd lease they share lives on.

use tokio::time::Instant;

use super::*;
use crate::backend::consensus_tests;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_waiter_of_another_locker_ends_the_local_turns() {
    consensus_tests::a_fair_waiter_of_another_locker_ends_the_local_turns(&Etcd::start().await)
        .await;
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
