//! A holder process killed with SIGKILL: another process acquires within the lease + 100 ms.
//!
//! In a test binary of its own, so that no other test shares the machine while the bound (a
//! correctness bound from the issue, not a speed claim) is measured.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout,
    reason = "test code: a failed expectation fails the test; figures are printed for the notes"
)]

mod support;

use std::time::{Duration, Instant};

use lock_core::LockError;
use lock_testkit::RedisServer;
use lock_testkit::signal::Signal;
use support::{agent, hold, locker};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holder_process_frees_the_lock_within_its_lease() {
    let server = RedisServer::start();
    let lease = Duration::from_millis(1000);
    let mut agent = agent(&server.url()).await;
    hold(&mut agent, "job", lease.as_millis() as u64, false).await;
    let locker = locker(&server, Duration::from_millis(500)).await;
    assert!(matches!(
        locker.try_lock("job").await,
        Err(LockError::Busy { .. })
    ));
    agent.signal(Signal::Kill);
    let killed_at = Instant::now();
    let pttl_at_kill = server.pttl("lock:{job}").await;
    let guard = locker
        .lock("job")
        .wait(Duration::from_secs(5))
        .await
        .unwrap();
    let took = killed_at.elapsed();
    println!(
        "acquired {took:?} after the holder was killed (lease {lease:?}, PTTL then {pttl_at_kill} ms)"
    );
    assert!(took <= lease + Duration::from_millis(100), "{took:?}");
    guard.release().await.unwrap();
}
