//! The `lock-worker` harness: its command line round-trips and its hold mode really holds.

#![allow(
    clippy::panic,
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "a test file: its helpers outside #[test] functions assert by panicking"
)]

use std::time::Duration;

use lock_testkit::RedisServer;
use lock_tests::worker::{WorkerArgs, WorkerProcess, WorkerSummary};

/// The worker's command line and summary line round-trip.
#[test]
fn worker_args_and_summary_round_trip() {
    let args = WorkerArgs::count("redis://127.0.0.1:1/", "k", 3, "c")
        .fence_key("f")
        .prefix("p:")
        .lease_ms(500)
        .work_us(10)
        .wait_go();
    assert_eq!(WorkerArgs::parse(args.to_args().into_iter()), Ok(args));
    let hold = WorkerArgs::hold("redis://127.0.0.1:1/", "k")
        .fenced()
        .no_watchdog();
    assert_eq!(WorkerArgs::parse(hold.to_args().into_iter()), Ok(hold));
    assert!(
        WorkerArgs::parse(
            ["count", "--url", "u", "--bogus"]
                .map(String::from)
                .into_iter()
        )
        .is_err()
    );
    let s = WorkerSummary {
        pid: 1,
        iterations: 2,
        increments: 2,
        max_fence: 5,
        fence_violations: 0,
        elapsed_ms: 9,
    };
    assert_eq!(WorkerSummary::parse(&s.to_line()), Some(s));
}

/// The worker's hold mode: a fenced lock held by another OS process excludes this one, a
/// crash (SIGKILL) leaves the lock to its lease, and `release` frees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_hold_mode() {
    const WORKER: &str = env!("CARGO_BIN_EXE_lock-worker");
    let server = RedisServer::start();
    let within = Duration::from_secs(30);
    let mut holder =
        WorkerProcess::spawn(WORKER, &WorkerArgs::hold(&server.url(), "held").fenced());
    let acquired = holder.expect_line("acquired", within).await;
    let fence: u64 = acquired
        .strip_prefix("acquired fence=")
        .and_then(|f| f.parse().ok())
        .unwrap_or_else(|| panic!("a fenced hold prints its token: {acquired}"));
    assert!(fence > 0, "{acquired}");
    let locker = lock_core::Locker::redis(&server.url())
        .await
        .expect("connect");
    assert!(locker.try_lock("held").await.is_err());
    holder.send("status").await;
    assert!(
        holder
            .expect_line("status held=true", within)
            .await
            .contains("remaining_ms=")
    );
    holder.send("release").await;
    holder.expect_line("released ok", within).await;
    let out = holder.finish(within).await;
    assert!(out.status.success(), "{}", out.stderr);
    assert!(!server.exists("lock:{held}").await);

    // Crash while holding: the key stays until its lease runs out.
    let mut crashed = WorkerProcess::spawn(
        WORKER,
        &WorkerArgs::hold(&server.url(), "crash").lease_ms(30_000),
    );
    crashed.expect_line("acquired", within).await;
    crashed.kill().await;
    let pttl = server.pttl("lock:{crash}").await;
    assert!(pttl > 0 && pttl <= 30_000, "{pttl}");

    // A busy acquire is reported as an error line and exit code 2.
    let busy = WorkerProcess::spawn(WORKER, &WorkerArgs::hold(&server.url(), "crash").wait_ms(0));
    let out = busy.finish(within).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        out.lines
            .iter()
            .any(|l| l.starts_with("error op=acquire kind=Busy")),
        "{:?}",
        out.lines
    );
}
