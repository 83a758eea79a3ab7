//! Checks the consensus backends (etcd, ZooKeeper) owe the engine in the same words, written
//! once: each backend's tests run them on a store of its own ([`Store`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, mpsc};

use crate::LockerBuilder;
use crate::backend::IntoBackend;
use crate::test_support::within;

/// A real store for one test, and what the checks need to see inside it.
pub(crate) trait Store {
    type Backend: IntoBackend + Clone;

    /// A backend of its own (one "process").
    async fn backend(&self) -> Self::Backend;

    /// A locker's builder on `backend`, with the lease the backend's tests use.
    fn builder(&self, backend: Self::Backend) -> LockerBuilder;

    /// How many contender entries lock `key` has in the store.
    async fn contenders(&self, key: &str) -> usize;

    /// How many fair waiters of other processes `backend` has heard of.
    fn fair_heard(backend: &Self::Backend) -> u64;
}

/// Polls `done` every 10 ms until it holds (within the test bound).
pub(crate) async fn until(mut done: impl FnMut() -> bool) {
    within(async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// Polls the store until lock `key` has `n` contender entries (within the test bound).
pub(crate) async fn until_contenders(store: &impl Store, key: &str, n: usize) {
    within(async {
        while store.contenders(key).await != n {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// Fair waiters of three lockers queued one after the other are served in that order, with
/// rising fences, and leave no entry behind.
pub(crate) async fn waiters_are_served_in_creation_order(store: &impl Store) {
    let holder = store.builder(store.backend().await).build();
    let held = holder.lock("job").await.unwrap();
    let (order_tx, mut order_rx) = mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for i in 0..3 {
        let locker = store.builder(store.backend().await).build();
        let order = order_tx.clone();
        tasks.push(tokio::spawn(async move {
            let guard = locker
                .lock("job")
                .fair()
                .fenced()
                .wait(Duration::from_secs(15))
                .await
                .unwrap();
            order.send((i, guard.fence().unwrap())).unwrap();
            guard.release().await.unwrap();
        }));
        until_contenders(store, "job", i + 2).await;
    }
    held.release().await.unwrap();
    for t in tasks {
        within(t).await.unwrap();
    }
    let mut served = Vec::new();
    while let Ok(x) = order_rx.try_recv() {
        served.push(x);
    }
    let order: Vec<_> = served.iter().map(|(i, _)| *i).collect();
    assert_eq!(order, [0, 1, 2]);
    assert!(served.windows(2).all(|w| w[0].1 < w[1].1), "{served:?}");
    assert_eq!(store.contenders("job").await, 0);
}

/// A locker passing a lock between its tasks (local hand-off) stops when a fair waiter of
/// another locker queues: the next release goes to the store, whose queue serves that waiter
/// before the locker's next task.
pub(crate) async fn a_fair_waiter_of_another_locker_ends_the_local_turns<S: Store>(store: &S) {
    let backend = store.backend().await;
    let a = store
        .builder(backend.clone())
        .local_turns(100)
        .local_hold(Duration::from_secs(30))
        .build();
    let b = store.builder(store.backend().await).build();
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
    // The holder from before the queue formed releases in the store; a2 takes it there. Its
    // release, the first local turn, asks the store (nobody else queues) and passes it to a3.
    first.release().await.unwrap();
    assert_eq!(within(served.recv()).await, Some("a2"));
    go[0].notify_one();
    assert_eq!(within(served.recv()).await, Some("a3"));
    assert_eq!(a.stats().local_handoffs, 1);
    // A fair waiter of another locker queues; `a` hears of it.
    let heard = S::fair_heard(&backend);
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
    until_contenders(store, "hot", 2).await;
    until(|| S::fair_heard(&backend) > heard).await;
    // a3's release gives the lock back to the store, whose queue serves b before a4.
    go[1].notify_one();
    for t in tasks {
        within(t).await.unwrap();
    }
    let rest = [served.recv().await, served.recv().await];
    assert_eq!(rest, [Some("b"), Some("a4")], "a4 overtook the fair waiter");
    assert_eq!(store.contenders("hot").await, 0);
}
