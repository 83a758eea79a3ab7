//! The `lock-worker` harness: its command line round-trips, its serving mode really holds
//! locks for another OS process, and its count mode reports failures.

#![allow(
    clippy::panic,
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "a test file: its helpers outside #[test] functions assert by panicking"
)]

mod support;

use std::time::Duration;

use lock_testkit::{ChildProcess, RedisServer};
use lock_tests::worker::{WorkerArgs, WorkerSummary};

const WORKER: &str = env!("CARGO_BIN_EXE_lock-worker");

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
    let serve = WorkerArgs::serve("redis://127.0.0.1:1/")
        .prefix("p:")
        .wait_ms(0);
    assert_eq!(WorkerArgs::parse(serve.to_args().into_iter()), Ok(serve));
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

/// The serving worker: a fenced lock held by another OS process excludes this one, its status
/// and extension are reported, `RELEASE` frees it, a crash (SIGKILL) leaves the lock to its
/// lease, and a busy acquire is reported with its error kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_serve_mode_holds_for_another_process() {
    let server = RedisServer::start();
    let mut holder = support::agent(&server.url()).await;
    let fence = support::hold(&mut holder, "held", 30_000, true)
        .await
        .expect("a fenced hold prints its token");
    assert!(fence > 0);
    let locker = lock_core::Locker::redis(&server.url())
        .await
        .expect("connect");
    assert!(locker.try_lock("held").await.is_err());
    let status = holder.ask("STATUS held").await;
    assert!(
        status.starts_with("STATUS held held=true remaining_ms="),
        "{status}"
    );
    assert_eq!(holder.ask("EXTEND held 20000").await, "EXTENDED held ok");
    assert_eq!(holder.ask("RELEASE held").await, "RELEASED held ok");
    assert!(!server.exists("lock:{held}").await);
    assert_eq!(holder.ask("STATUS held").await, "ERR held not held");

    // Crash while holding: the key stays until its lease runs out.
    support::hold(&mut holder, "crash", 30_000, false).await;
    holder.kill().await;
    let pttl = server.pttl("lock:{crash}").await;
    assert!(pttl > 0 && pttl <= 30_000, "{pttl}");

    // A busy acquire is an answer naming the error kind; the worker goes on serving.
    let args = WorkerArgs::serve(&server.url()).wait_ms(0);
    let mut busy = support::ready(ChildProcess::spawn(WORKER, args.to_args())).await;
    let answer = busy.ask("HOLD crash 1000 0").await;
    assert!(answer.starts_with("ERR crash Busy "), "{answer}");
    let out = busy.finish(Duration::from_secs(30)).await;
    assert!(out.status.success(), "{}", out.stderr);
}

/// The counting worker reports a failure as an error line and exit code 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_count_mode_reports_failures() {
    let server = RedisServer::start();
    let locker = lock_core::Locker::redis(&server.url())
        .await
        .expect("connect");
    let _held = locker.lock("taken").await.expect("lock");
    let args = WorkerArgs::count(&server.url(), "taken", 1, "c").wait_ms(0);
    let out = ChildProcess::spawn(WORKER, args.to_args())
        .finish(Duration::from_secs(30))
        .await;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        out.lines
            .iter()
            .any(|l| l.starts_with("error op=lock kind=Busy")),
        "{:?}",
        out.lines
    );
}
