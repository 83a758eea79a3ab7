//! Tokens after `fork`: a process that forks after drawing owner tokens (a pre-fork server, a
//! daemonizing job runner) must not have its child draw the same tokens, or both "hold" one
//! lock (issue 12, hole 8).

#![allow(
    clippy::expect_used,
    reason = "test code: a failed expectation fails the test"
)]

use lock_testkit::RedisServer;

#[test]
fn a_forked_child_never_shares_its_parents_tokens() {
    let server = RedisServer::start();
    for round in 0..5 {
        // A fresh key per round: the previous round's winner still holds the old one.
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_lock-fork-probe"))
            .arg(server.url())
            .arg(format!("fork-probe-{round}"))
            .output()
            .expect("run lock-fork-probe");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "round {round}: {stdout}");
        let held = stdout.lines().filter(|l| l.starts_with("HELD ")).count();
        let busy = stdout.lines().filter(|l| l.starts_with("BUSY ")).count();
        assert_eq!(
            (held, busy),
            (1, 1),
            "round {round}: exactly one of parent and child holds the lock:\n{stdout}"
        );
    }
}

/// The same for a waiter's ticket, which a hand-over message names: a parent and its child
/// queued for one key must not both take one hand-over (two holders with one fence).
#[test]
fn a_forked_child_never_shares_its_parents_waiter_tickets() {
    let server = RedisServer::start();
    for round in 0..3 {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_lock-fork-probe"))
            .arg(server.url())
            .arg(format!("fork-fair-{round}"))
            .arg("fair")
            .output()
            .expect("run lock-fork-probe");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "round {round}: {stdout}");
        let held = stdout.lines().filter(|l| l.starts_with("HELD ")).count();
        let timed_out = stdout.lines().filter(|l| l.starts_with("TIMEOUT ")).count();
        assert_eq!(
            (held, timed_out),
            (1, 1),
            "round {round}: one waiter gets the lock, the other waits on:\n{stdout}"
        );
    }
}
