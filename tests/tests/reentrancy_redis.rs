//! Issue 12, holes 1 to 3 on a real redis-server: reentrancy never crosses tasks, a reentrant
//! body ends when the outer lock ends, and `run` never reports `Ok` when its final release found
//! the lock no longer ours. The `timeout`s are bounds that turn a hang into a failure, never a
//! way to wait for something.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed expectation fails the test"
)]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lock_core::LockError;
use lock_testkit::RedisServer;
use support::locker;
use tokio::sync::oneshot;

/// Bounds connecting and each answer.
const ANSWER: Duration = Duration::from_secs(2);
/// Far longer than anything here should take; far shorter than the default lease (30 s).
const BOUND: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_spawned_from_a_run_does_not_carry_the_outer_lock() {
    let server = RedisServer::start();
    let a = locker(&server, ANSWER).await;
    let l = a.clone();
    let (outer, inner) = a
        .lock("outer")
        .run(async move {
            let guard = l.lock("inner").await.unwrap();
            let l2 = l.clone();
            let task = tokio::spawn(guard.scope(async move {
                let outer = l2.try_lock("outer").await.map(|g| g.is_reentrant());
                let inner = l2.try_lock("inner").await.map(|g| g.is_reentrant());
                (outer, inner)
            }));
            let seen = task.await.unwrap();
            guard.release().await.unwrap();
            seen
        })
        .await
        .unwrap();
    assert!(matches!(outer, Err(LockError::Busy { .. })), "{outer:?}");
    assert!(matches!(inner, Ok(true)), "{inner:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reentrant_run_in_another_task_ends_when_the_outer_guard_is_released() {
    let server = RedisServer::start();
    let a = locker(&server, ANSWER).await;
    let b = locker(&server, ANSWER).await;
    let guard = a.lock("k").await.unwrap();
    let (started_tx, started) = oneshot::channel();
    let escaped = Arc::new(AtomicBool::new(false));
    let flag = escaped.clone();
    let l = a.clone();
    let task = tokio::spawn(guard.scope(async move {
        l.lock("k")
            .run(async move {
                started_tx.send(()).unwrap();
                std::future::pending::<()>().await;
                flag.store(true, Ordering::SeqCst);
            })
            .await
    }));
    started.await.unwrap();
    guard.release().await.unwrap();
    let released_at = Instant::now();
    // Another owner holds "k" now, in the server.
    let other = b.try_lock("k").await.unwrap();
    let r = tokio::time::timeout(BOUND, task)
        .await
        .expect("the reentrant body kept running under another owner's lock")
        .unwrap();
    assert!(matches!(r, Err(LockError::LeaseLost { .. })), "{r:?}");
    assert!(!escaped.load(Ordering::SeqCst));
    println!(
        "reentrant body ended {:?} after the release",
        released_at.elapsed()
    );
    other.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_returns_lease_lost_when_its_final_release_finds_the_key_taken_after_a_del() {
    let server = RedisServer::start();
    let a = locker(&server, ANSWER).await;
    let b = locker(&server, ANSWER).await;
    let mut taken = None;
    let r = a
        .lock("k")
        .watchdog(false)
        .lease(Duration::from_secs(60))
        .run(async {
            assert_eq!(server.del("lock:{k}").await, 1);
            taken = Some(b.try_lock("k").await.unwrap());
        })
        .await;
    assert!(matches!(r, Err(LockError::LeaseLost { .. })), "{r:?}");
    let other = taken.unwrap();
    // The other owner's lock is untouched.
    assert!(server.exists("lock:{k}").await);
    other.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_returns_lease_lost_when_the_server_restarted_empty_and_another_owner_took_the_key() {
    let mut server = RedisServer::start();
    let a = locker(&server, ANSWER).await;
    let (restarted_tx, restarted) = oneshot::channel();
    let (taken_tx, taken) = oneshot::channel::<()>();
    let body = a
        .lock("k")
        .watchdog(false)
        .lease(Duration::from_secs(60))
        .run(async move {
            restarted_tx.send(()).unwrap();
            taken.await.unwrap();
        });
    let driver = async {
        restarted.await.unwrap();
        // No persistence: the restarted server is empty, and another owner takes "k".
        server.restart();
        let b = locker(&server, ANSWER).await;
        let other = b.try_lock("k").await.unwrap();
        taken_tx.send(()).unwrap();
        (b, other)
    };
    let (r, (_b, other)) = tokio::join!(body, driver);
    // The holder's connection died with the old server: its release ran on a new connection
    // and was answered "not ours".
    assert!(matches!(r, Err(LockError::LeaseLost { .. })), "{r:?}");
    assert!(other.is_held());
    other.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_returns_the_body_output_when_its_final_release_cannot_reach_the_server() {
    let mut server = RedisServer::start();
    let a = locker(&server, Duration::from_millis(500)).await;
    let (stopped_tx, stopped) = oneshot::channel();
    let (go_tx, go) = oneshot::channel::<()>();
    let body = a
        .lock("k")
        .watchdog(false)
        .lease(Duration::from_secs(60))
        .run(async move {
            stopped_tx.send(()).unwrap();
            go.await.unwrap();
            7
        });
    let driver = async {
        stopped.await.unwrap();
        server.stop();
        go_tx.send(()).unwrap();
    };
    let (r, ()) = tokio::join!(body, driver);
    // Unknown outcome (the server is unreachable): the body ran while the lease was valid, and
    // the lease expires on its own.
    assert!(matches!(r, Ok(7)), "{r:?}");
}
