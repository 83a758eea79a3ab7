//! The child-process driver against a child everyone has: `cat`, which answers each line with
//! itself.

#![allow(
    clippy::panic,
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "a test file: a failed expectation fails the test"
)]

use std::time::Duration;

use lock_testkit::ChildProcess;
use lock_testkit::signal::is_stopped;

/// Lines go in and come back; `finish` collects every line and the exit status.
#[tokio::test]
async fn asks_and_finishes() {
    let mut cat = ChildProcess::spawn("cat", std::iter::empty::<&str>());
    assert_eq!(cat.ask("READY").await, "READY");
    cat.send("two").await;
    assert_eq!(cat.expect_line("tw", Duration::from_secs(5)).await, "two");
    let out = cat.finish(Duration::from_secs(5)).await;
    assert!(out.status.success());
    assert_eq!(out.lines, ["READY", "two"]);
}

/// A paused child has stopped (every thread) and answers nothing until resumed.
#[tokio::test]
async fn pause_stops_every_thread_until_resume() {
    let mut cat = ChildProcess::spawn("cat", std::iter::empty::<&str>());
    cat.pause().await;
    assert!(is_stopped(cat.pid().unwrap()));
    cat.send("late").await;
    let silent = tokio::time::timeout(Duration::from_millis(200), cat.line()).await;
    assert!(silent.is_err(), "a paused child must not answer");
    cat.resume();
    assert_eq!(cat.line().await, "late");
    cat.kill().await;
}

/// A child that prints nothing fails the test with what it did print, instead of hanging it.
#[tokio::test]
#[should_panic(expected = "printed no line within")]
async fn a_silent_child_fails_within_the_bound() {
    let mut cat = ChildProcess::spawn("cat", std::iter::empty::<&str>());
    cat.next_line(Duration::from_millis(50)).await;
}
