//! What several test files share on top of `lock_testkit`: lock clients in their own OS
//! processes (`lock-worker serve`), a locker with its own timeouts, and the pub/sub view.

#![allow(
    dead_code,
    unreachable_pub,
    clippy::expect_used,
    clippy::panic,
    reason = "test support shared by test files: a failure here fails the test that uses it"
)]

use std::time::Duration;

pub mod store;

use lock_core::{Locker, RedisBackend};
use lock_testkit::{ChildProcess, RedisServer, eventually};
use lock_tests::worker::WorkerArgs;

/// Starts a `lock-worker serve` process (a lock client in its own OS process, driven line by
/// line; see `lock_tests::worker`) connected to `url`, and waits until it is ready. Its `HOLD`
/// waits up to 10 s for a lock.
pub async fn agent(url: &str) -> ChildProcess {
    let args = WorkerArgs::serve(url).wait_ms(10_000);
    ready(ChildProcess::spawn(
        env!("CARGO_BIN_EXE_lock-worker"),
        args.to_args(),
    ))
    .await
}

/// Waits (within the child's answer timeout) for its first line, which must be `READY`.
pub async fn ready(mut child: ChildProcess) -> ChildProcess {
    let first = child.line().await;
    assert_eq!(first, "READY");
    child
}

/// Holds `key` in an agent; returns its fencing token (when fenced).
pub async fn hold(agent: &mut ChildProcess, key: &str, lease_ms: u64, fenced: bool) -> Option<u64> {
    let answer = agent
        .ask(&format!("HOLD {key} {lease_ms} {}", u8::from(fenced)))
        .await;
    let fence = answer
        .strip_prefix(&format!("HELD {key} fence="))
        .unwrap_or_else(|| panic!("agent could not hold {key}: {answer}"));
    fence.parse().ok()
}

/// A locker on `server` with its own connections; `timeout` bounds connecting and each answer.
pub async fn locker(server: &RedisServer, timeout: Duration) -> Locker {
    locker_at(&server.url(), timeout).await
}

/// [`locker`] for a server known by its URL (from a thread that does not own the server).
pub async fn locker_at(url: &str, timeout: Duration) -> Locker {
    let backend = RedisBackend::builder(url)
        .response_timeout(timeout)
        .connect_timeout(timeout)
        .connect()
        .await
        .expect("connect");
    Locker::builder(backend).build()
}

/// Waits (bounded) until no channel has a subscriber any more: unsubscribing happens on the
/// subscriber connection's own task, with no signal to the test.
pub async fn until_no_subscriptions(server: &RedisServer) {
    eventually(
        "subscriptions dropped",
        Duration::from_secs(5),
        async || server.subscribed_channels().await.is_empty(),
    )
    .await;
}

/// How many waiters have an entry in the queue of lock-core's lock `key` (default prefix) in
/// Redis.
pub async fn queued(server: &RedisServer, key: &str) -> i64 {
    server
        .query(
            redis::cmd("HLEN")
                .arg(format!("lock:{{{key}}}:waiters"))
                .clone(),
        )
        .await
}

/// Waits (bounded) until `n` waiters queue for `key` in Redis.
pub async fn until_queued(server: &RedisServer, key: &str, n: i64) {
    eventually(
        "the waiters queued in Redis",
        Duration::from_secs(5),
        async || queued(server, key).await == n,
    )
    .await;
}
