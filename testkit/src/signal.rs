//! Signals to processes the kit started (servers, children): one way to send them, and a
//! check that a stopped process has really stopped.

#![allow(
    clippy::panic,
    reason = "a test harness that cannot do its job fails the test using it, loudly and with the cause"
)]

use std::process::Command;
use std::time::{Duration, Instant};

use crate::eventually::eventually;

/// The signals tests send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGSTOP: freeze (connections stay open, nothing runs).
    Stop,
    /// SIGCONT: thaw a frozen process.
    Cont,
    /// SIGKILL: a crash, nothing is cleaned up.
    Kill,
    /// SIGTERM: a polite shutdown.
    Term,
}

impl Signal {
    /// The name `kill` takes (`STOP`, `CONT`, ...).
    ///
    /// ```
    /// assert_eq!(lock_testkit::signal::Signal::Stop.name(), "STOP");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            Signal::Stop => "STOP",
            Signal::Cont => "CONT",
            Signal::Kill => "KILL",
            Signal::Term => "TERM",
        }
    }
}

/// Sends `signal` to `pid` (with `kill(1)`: the kit has no unsafe code).
///
/// # Panics
/// When `kill` cannot run or fails (no such process).
pub fn send_signal(pid: u32, signal: Signal) {
    let status = Command::new("kill")
        .arg(format!("-{}", signal.name()))
        .arg(pid.to_string())
        .status()
        .unwrap_or_else(|e| panic!("cannot run `kill -{} {pid}`: {e}", signal.name()));
    assert!(
        status.success(),
        "`kill -{} {pid}` failed: {status}",
        signal.name()
    );
}

/// Whether every thread of `pid` is stopped (state `T` or `t` in `/proc/<pid>/task/*/stat`).
/// A signal is only queued when `kill` returns; a thread may still run for a moment.
pub fn is_stopped(pid: u32) -> bool {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    entries.flatten().all(|task| {
        std::fs::read_to_string(task.path().join("stat")).is_ok_and(|stat| {
            // The state is the field after the parenthesised command name.
            stat.rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('T') || rest.starts_with('t'))
        })
    })
}

/// How long a SIGSTOPped process may take to stop.
const STOP_BOUND: Duration = Duration::from_secs(5);

/// Waits (bounded) until every thread of `pid` has stopped.
///
/// # Panics
/// When it has not within 5 s.
pub async fn wait_stopped(pid: u32) {
    eventually(&format!("process {pid} stopped"), STOP_BOUND, async || {
        is_stopped(pid)
    })
    .await;
}

/// [`wait_stopped`] for callers outside a runtime (a server's synchronous `pause`).
///
/// # Panics
/// When it has not within 5 s.
pub fn wait_stopped_blocking(pid: u32) {
    let start = Instant::now();
    while !is_stopped(pid) {
        assert!(
            start.elapsed() < STOP_BOUND,
            "process {pid} stopped: not true within {STOP_BOUND:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}
