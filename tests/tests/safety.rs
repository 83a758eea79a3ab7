//! Regression tests for the holes of the adversarial review (issue 12) that live in the Redis
//! paths: a "not ours" answer reported as success, fences going backwards after data loss, the
//! wait bound under a stalled server, and the small ones (queue keys without a TTL, quadratic
//! fair queues). Each test failed before its fix.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout,
    reason = "test code: a failed expectation fails the test; figures are printed for the notes"
)]

mod support;

use std::time::Duration;

use lock_core::LockError;
use lock_tests::redis::RedisServer;
use support::locker;

/// A restart without persistence empties the server; another owner takes the key; the first
/// holder's release goes out on a dropped connection, is retried on a new one, and the script
/// answers "not ours". That is never a clean release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_retried_after_a_restart_reports_the_lock_lost() {
    let mut server = RedisServer::start();
    let a = locker(&server, Duration::from_secs(2)).await;
    let guard = a
        .lock("k")
        .lease(Duration::from_secs(30))
        .await
        .expect("acquire");
    server.restart();
    let b = locker(&server, Duration::from_secs(2)).await;
    let other = b.try_lock("k").await.expect("the emptied server gives k to b");
    let released = guard.release().await;
    assert!(
        matches!(released, Err(LockError::LeaseLost { .. })),
        "a release answered \"not ours\" must not be Ok: {released:?}"
    );
    assert!(other.is_held());
    assert!(server.exists("lock:{k}").await, "b's lock was not touched");
    other.release().await.expect("b releases its own lock");
}
