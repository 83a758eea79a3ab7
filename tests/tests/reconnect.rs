//! A lost connection makes the watchdog check every held lock at once (issue 12, hole 4):
//! after a server restart without persistence the held locks are gone with the data, and the
//! holder must learn it within about one round trip of the reconnect, not at the next regular
//! renewal (lease/3 later). After a `CLIENT KILL` the data is still there: the locks are checked
//! and kept. Against real redis-server processes; the bounds are correctness bounds (the loss is
//! reported long before the next regular renewal), not speed claims.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout,
    reason = "test code: a failed expectation fails the test; figures are printed for the notes"
)]

use std::time::{Duration, Instant};

use lock_core::{Locker, RedisBackend};
use lock_testkit::{RedisServer, eventually};

/// Long enough that the next regular renewal (lease/3) is far beyond the bound below.
const LEASE: Duration = Duration::from_secs(30);
/// How long after the restart the loss must be reported: well under LEASE/3.
const BOUND: Duration = Duration::from_secs(3);

async fn backend(server: &RedisServer) -> RedisBackend {
    RedisBackend::builder(&server.url())
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("connect")
}

/// Locks held by two lockers sharing one backend (plain, fenced, and one taken by a fair
/// waiter's path) are all reported lost soon after a restart without persistence emptied
/// the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_persistence_reports_every_held_lock_lost_at_once() {
    let mut server = RedisServer::start();
    let backend = backend(&server).await;
    let a = Locker::builder(backend.clone()).lease(LEASE).build();
    let b = Locker::builder(backend).lease(LEASE).build();
    let guards = vec![
        a.lock("r:plain").await.unwrap(),
        a.lock("r:fenced").fenced().await.unwrap(),
        b.lock("r:fair").fair().await.unwrap(),
    ];
    let restart = Instant::now();
    server.restart();
    let restarted = restart.elapsed();
    for g in &guards {
        tokio::time::timeout(BOUND, g.lost())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{} not reported lost within {BOUND:?} of the restart (next regular renewal {:?} after the acquire)",
                    g.key(),
                    LEASE / 3
                )
            });
        assert!(!g.is_held(), "{}", g.key());
    }
    println!(
        "restart took {restarted:?}; every lock reported lost {:?} after the restart began",
        restart.elapsed()
    );
}

/// `CLIENT KILL` drops the connections but not the data: the locks are checked at once (a
/// renewal call goes out) and kept, with their lease reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_kill_checks_the_held_locks_and_keeps_them() {
    let server = RedisServer::start();
    let locker = Locker::builder(backend(&server).await).lease(LEASE).build();
    let guard = locker.lock("r:kept").fenced().await.unwrap();
    // Let the lease age, so a renewal shows in its TTL (the next regular one is LEASE/3 away).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let aged = server.pttl("lock:{r:kept}").await;
    assert!(aged < 28_500, "PTTL {aged}");
    let calls = locker.stats().renewal_calls;
    let killed = Instant::now();
    assert!(server.client_kill_all().await >= 1);
    // The check may hit the dropped connection first; it is retried until it succeeds.
    eventually("the lease renewed after the kill", BOUND, async || {
        server.pttl("lock:{r:kept}").await > aged + 1_000
    })
    .await;
    println!(
        "lease renewed {:?} after the kill ({} renewal calls)",
        killed.elapsed(),
        locker.stats().renewal_calls - calls
    );
    assert!(guard.is_held());
    assert!(
        tokio::time::timeout(Duration::from_millis(100), guard.lost())
            .await
            .is_err(),
        "the lock was not reported lost"
    );
    guard.release().await.expect("still ours");
}
