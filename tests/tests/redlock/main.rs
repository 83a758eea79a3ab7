//! Redlock (issue 17): one lock over 5 independent redis-server processes, held while 3 of
//! them hold it. Five modules: `faults` (quorum under faults), `connect` (joining, doubles),
//! `waiting` (contention, split votes, take-backs), `renewal` (each lock of a renewal batch on
//! its own: verdict, per-server bound; every server gets an extend; issue 29), `operations`
//! (inspect, force_unlock, list; issue 33).
//!
//! - `every_subset_of_servers_down_or_stalled`: all 32 subsets of 5 servers down (killed) or
//!   stalled (SIGSTOP), both kinds mixed: acquired when 3 or more answer; else refused with a
//!   `Backend` error whose source is `NoQuorum`, within the per-server timeout plus slack (not
//!   the wait); and no key left behind on any server afterwards.
//! - `two_holders_never_overlap_under_server_faults`: child processes of this test binary lock
//!   a few keys in a loop while the parent stalls and kills (restarting after the lease, the
//!   documented rule) up to 2 of the 5 servers at a time; every critical section is recorded
//!   on CLOCK_MONOTONIC and no two of one key overlap. One section in eight spans one to two
//!   leases (renewed by the watchdog through the faults); a section counts only if the lock is
//!   still held at its end (`is_held()`).
//! - `watchdog_keeps_the_lock_across_two_losses_and_reports_the_third`.
//! - `restart_rule_*`: a server restarted empty at once lets a second holder in (the hazard);
//!   restarted after the lease, it does not.
//! - waiting by notification, fencing and fair mode refused, idempotency over a quorum; every
//!   attempt of a waiter writes a token of its own.
//! - one server under two URLs is refused at connect, and left out when it joins later (else,
//!   with 2 of 5 down, it and its double made a majority).
//!
//! - `operations`: inspect, force_unlock and list judged over the quorum (issue 33): a
//!   minority is never held nor listed nor removed, force_unlock removes the quorum's
//!   acquisition only and wakes the waiter, each lock listed once with a server down, too few
//!   servers an error, no token nor its digest in a state, an error or a log line.
//!
//! One set of 5 servers per test, short leases: the binary runs in well under a minute.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "test code: a failed expectation fails the test; figures are printed for the notes"
)]

use std::time::{Duration, Instant};

use lock_core::{LockError, Locker, NoQuorum, RedlockBackend};
use lock_testkit::{RedisServer, eventually};
use lock_tests::chaos::{Rng, now_us};

mod connect;
mod faults;
mod operations;
mod renewal;
mod waiting;

/// The per-server bound the tests configure.
const SERVER_TIMEOUT: Duration = Duration::from_millis(100);

fn servers(n: usize) -> Vec<RedisServer> {
    (0..n).map(|_| RedisServer::start()).collect()
}

fn urls(servers: &[RedisServer]) -> Vec<String> {
    servers.iter().map(RedisServer::url).collect()
}

async fn backend(urls: &[String]) -> RedlockBackend {
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    RedlockBackend::builder(&urls)
        .server_timeout(SERVER_TIMEOUT)
        .response_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap()
}

async fn locker(servers: &[RedisServer], lease: Duration) -> Locker {
    Locker::builder(backend(&urls(servers)).await)
        .lease(lease)
        .build()
}

fn no_quorum(e: &LockError) -> Option<&NoQuorum> {
    match e {
        LockError::Backend { source, .. } => source.downcast_ref::<NoQuorum>(),
        _ => None,
    }
}

/// Until `locker` reaches every server again (a restarted server's connection is re-made in
/// the background): a probe lock is seen on all of them.
async fn all_reachable(locker: &Locker, servers: &[RedisServer]) {
    eventually(
        "every server reachable again",
        Duration::from_secs(10),
        async || {
            let Ok(guard) = locker.try_lock("probe").await else {
                return false;
            };
            let mut everywhere = true;
            for s in servers {
                everywhere &= s.exists("lock:{probe}").await;
            }
            guard.release().await.unwrap();
            everywhere
        },
    )
    .await;
}

/// `key` held by another client (`holder`, no locker) on `servers` for 10 s.
async fn held_elsewhere(servers: &[RedisServer], key: &str, holder: &str) {
    held_elsewhere_for(servers, key, holder, 10_000).await;
}

/// `key` held by another client (`holder`, no locker) on `servers` for `ms` milliseconds.
async fn held_elsewhere_for(servers: &[RedisServer], key: &str, holder: &str, ms: u64) {
    for s in servers {
        let set = redis::cmd("SET")
            .arg(key)
            .arg(holder)
            .arg("PX")
            .arg(ms)
            .clone();
        let _: () = s.query(set).await;
    }
}
