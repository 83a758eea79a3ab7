//! The one-key release and the waiter's mark (issue 15), against real redis-server processes.
//!
//! A release that knows of no waiter sends a one-key compare-and-delete. What keeps that safe
//! is the mark: a waiter that queues behind a holder appends `+` to the lock's value, and a
//! marked lock is never deleted by the one-key release; the full release (the hand-over)
//! follows. These tests watch the mark in Redis and the hand-over that depends on it. Each
//! locker here has its own connections: to Redis, two lockers are two processes.
//!
//! A waiter that is not handed the lock still gets it on its own next attempt (its ticket is
//! refreshed every 750 ms or so), so each test counts the hand-overs the waiter's locker
//! received (`stats().handovers`): a release that deleted a marked lock instead of handing it
//! over fails there.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed expectation fails the test"
)]

mod support;

use std::time::Duration;

use lock_core::Locker;
use lock_testkit::{RedisServer, eventually};
use support::{locker, until_queued};
use tokio::sync::oneshot;

/// The holders' lease.
const LEASE: Duration = Duration::from_secs(60);
/// How long a waiter may take to get a lock released to it.
const HANDED_WITHIN: Duration = Duration::from_secs(10);

/// The value of lock-core's lock `key` in Redis (its holder's token, marked or not).
async fn value(server: &RedisServer, key: &str) -> Option<String> {
    server
        .query(redis::cmd("GET").arg(format!("lock:{{{key}}}")).clone())
        .await
}

/// A waiter of another process: it takes `key`, says so, holds it until told, releases it.
struct Waiter {
    locker: Locker,
    /// The hand-overs its locker had received before.
    handovers: u64,
    acquired: oneshot::Receiver<()>,
    release: oneshot::Sender<()>,
    done: tokio::task::JoinHandle<()>,
}

fn wait_for(locker: Locker, key: &'static str) -> Waiter {
    let (acquired_tx, acquired) = oneshot::channel();
    let (release, release_rx) = oneshot::channel::<()>();
    let own = locker.clone();
    let handovers = locker.stats().handovers;
    let done = tokio::spawn(async move {
        let guard = locker
            .lock(key)
            .lease(LEASE)
            .wait(HANDED_WITHIN * 3)
            .await
            .expect("the waiter's lock");
        acquired_tx.send(()).unwrap();
        release_rx.await.unwrap();
        guard.release().await.expect("the waiter's release");
    });
    Waiter {
        locker: own,
        handovers,
        acquired,
        release,
        done,
    }
}

impl Waiter {
    /// Bounded: a waiter that does not get the lock fails here.
    async fn got_lock(&mut self, what: &str) {
        tokio::time::timeout(HANDED_WITHIN, &mut self.acquired)
            .await
            .unwrap_or_else(|_| panic!("{what}: no lock within {HANDED_WITHIN:?}"))
            .unwrap();
    }

    /// As [`got_lock`](Self::got_lock), and a waiter that got it otherwise than by a
    /// hand-over fails here too.
    async fn acquired(&mut self, what: &str) {
        self.got_lock(what).await;
        assert_eq!(
            self.locker.stats().handovers - self.handovers,
            1,
            "{what} took the lock itself: the release did not hand it over"
        );
    }

    async fn release(self) {
        self.release.send(()).unwrap();
        self.done.await.unwrap();
    }
}

/// An uncontended release is the one-key release: it never reads a queue (the full release
/// always does, with `LINDEX`), and writes no mark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_release_reads_no_queue() {
    let server = RedisServer::start();
    let locker = locker(&server, Duration::from_secs(2)).await;
    // The first lock of a prefix checks the Redis user's permissions.
    locker
        .lock("warm-up")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    server.reset_stats().await;
    for i in 0..50 {
        let guard = locker.lock(format!("k{i}")).await.unwrap();
        guard.release().await.unwrap();
    }
    let stats = server.commandstats().await;
    assert_eq!(stats.get("lindex"), None, "{stats:?}");
    assert_eq!(stats.get("lpop"), None, "{stats:?}");
    assert_eq!(stats.get("append"), None, "{stats:?}");
    assert_eq!(stats.get("del"), Some(&50), "{stats:?}");
    for i in 0..50 {
        assert_eq!(value(&server, &format!("k{i}")).await, None);
    }
}

/// A waiter that queues marks the holder's lock; the holder's release (which met no waiter
/// on this key before, so it tries the one-key release first) leaves the marked lock to the
/// full release, which hands it over, and reports a clean release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_waiter_marks_the_lock_and_is_handed_it() {
    let server = RedisServer::start();
    let holder = locker(&server, Duration::from_secs(2)).await;
    let guard = holder.lock("sku").lease(LEASE).await.unwrap();
    let token = value(&server, "sku").await.expect("the lock is held");
    assert!(!token.ends_with('+'), "{token}");
    let mut waiter = wait_for(locker(&server, Duration::from_secs(2)).await, "sku");
    until_queued(&server, "sku", 1).await;
    assert_eq!(
        value(&server, "sku").await,
        Some(format!("{token}+")),
        "the queued waiter marks the lock"
    );
    guard
        .release()
        .await
        .expect("a marked lock is still its holder's: a clean release");
    waiter.acquired("the queued waiter").await;
    let handed = value(&server, "sku").await.expect("the waiter holds it");
    assert!(
        !handed.ends_with('+') && handed != token,
        "nobody else waits: {handed}"
    );
    waiter.release().await;
    assert_eq!(value(&server, "sku").await, None);
}

/// A lock handed over while other waiters still queue stays marked for them, so whoever
/// holds it next hands it on, whatever its release tries first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_handed_over_while_others_queue_stays_marked() {
    let server = RedisServer::start();
    let holder = locker(&server, Duration::from_secs(2)).await;
    let guard = holder.lock("draw").lease(LEASE).await.unwrap();
    let mut first = wait_for(locker(&server, Duration::from_secs(2)).await, "draw");
    until_queued(&server, "draw", 1).await;
    let mut second = wait_for(locker(&server, Duration::from_secs(2)).await, "draw");
    until_queued(&server, "draw", 2).await;
    guard.release().await.unwrap();
    first.acquired("the first waiter").await;
    let handed = value(&server, "draw")
        .await
        .expect("the first waiter holds it");
    assert!(handed.ends_with('+'), "the second still waits: {handed}");
    first.release().await;
    second.acquired("the second waiter").await;
    let last = value(&server, "draw")
        .await
        .expect("the second waiter holds it");
    assert!(!last.ends_with('+'), "nobody waits any more: {last}");
    second.release().await;
}

/// The watchdog renews a marked lock (it is still its holder's) for several leases, and the
/// holder then releases it to the waiter. (Whether by the hand-over or by the waiter's own
/// attempt is not asserted here: with a 600 ms lease the waiter tries again every few hundred
/// ms, and an attempt may land between the hand-over and its message.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_keeps_a_marked_lock() {
    let server = RedisServer::start();
    let lease = Duration::from_millis(600);
    let holder = locker(&server, Duration::from_secs(2)).await;
    let guard = holder.lock("job").lease(lease).await.unwrap();
    let mut waiter = wait_for(locker(&server, Duration::from_secs(2)).await, "job");
    until_queued(&server, "job", 1).await;
    assert!(value(&server, "job").await.unwrap().ends_with('+'));
    // Five leases: the lock lives on renewals alone.
    let lost = tokio::time::timeout(lease * 5, guard.lost()).await;
    assert!(lost.is_err(), "the watchdog let a marked lock go");
    assert!(value(&server, "job").await.unwrap().ends_with('+'));
    guard.release().await.expect("still the holder's");
    waiter.got_lock("the waiter").await;
    waiter.release().await;
}

/// A one-key release that times out (the server stalled) may still run when the server
/// resumes, find the lock marked and answer nobody: the full release follows it, in the
/// background, so the waiter is handed the lock rather than left to the holder's lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_key_release_that_timed_out_is_followed_by_the_full_release() {
    let mut server = RedisServer::start();
    let holder = locker(&server, Duration::from_millis(300)).await;
    let other = locker(&server, Duration::from_secs(2)).await;
    // Scripts loaded, so that the stalled one-key release runs (and finds the mark) when the
    // server resumes, rather than answering NOSCRIPT.
    load_every_script(&server, &holder, &other).await;
    let guard = holder.lock("stall").lease(LEASE).await.unwrap();
    let mut waiter = wait_for(other, "stall");
    until_queued(&server, "stall", 1).await;
    server.pause();
    let released = guard.release().await;
    assert!(
        matches!(released, Err(lock_core::LockError::Backend { .. })),
        "{released:?}"
    );
    server.resume();
    waiter.acquired("the queued waiter").await;
    waiter.release().await;
}

/// The `EVALSHA` calls the holder's release of `key` takes when a waiter of another locker
/// queues for it: the waiter's own calls and the holder's renewals in the meantime (both
/// counted by their lockers) are taken out of the server's count.
async fn contended_release_calls(server: &RedisServer, holder: &Locker, other: &Locker) -> u64 {
    let guard = holder.lock("hot").lease(LEASE).await.unwrap();
    let handovers = other.stats().handovers;
    let (acquired_tx, acquired) = oneshot::channel();
    let (release_tx, release_rx) = oneshot::channel::<()>();
    let waiter = tokio::spawn({
        let other = other.clone();
        async move {
            let g = other.lock("hot").lease(LEASE).wait(HANDED_WITHIN).await;
            acquired_tx.send(()).unwrap();
            release_rx.await.unwrap();
            g.unwrap().release().await.unwrap();
        }
    });
    until_queued(server, "hot", 1).await;
    let (calls, renewals) = (other.stats().backend_calls, holder.stats().renewal_calls);
    let handed_renewals = other.stats().renewal_calls;
    let before = server.commandstats().await;
    guard.release().await.unwrap();
    tokio::time::timeout(HANDED_WITHIN, acquired)
        .await
        .expect("not handed the lock")
        .unwrap();
    // A handed-over lock comes with a short lease, which the new holder's watchdog renews at
    // once, in the background: counted once it is done.
    eventually(
        "renewed to the full lease",
        Duration::from_secs(2),
        async || other.stats().renewal_calls > handed_renewals,
    )
    .await;
    let others = (other.stats().backend_calls - calls) + (holder.stats().renewal_calls - renewals);
    // The lockers count a call as it is sent: wait until the server has run them all besides
    // the release's (at least one: the release returned).
    let evalsha = |stats: &std::collections::BTreeMap<String, u64>| {
        stats.get("evalsha").copied().unwrap_or(0)
    };
    let at_least = evalsha(&before) + others + 1;
    eventually(
        "the calls counted ran",
        Duration::from_secs(2),
        async || evalsha(&server.commandstats().await) >= at_least,
    )
    .await;
    let after = server.commandstats().await;
    assert_eq!(other.stats().handovers - handovers, 1, "not a hand-over");
    release_tx.send(()).unwrap();
    waiter.await.unwrap();
    evalsha(&after) - evalsha(&before) - others
}

/// Loads every script a contended release runs (the renewal's, the one-key release's, the
/// full release's) with a contended release of another key, so that no NOSCRIPT retry (a
/// second call) shows in a test's counts or stands in for a script run.
async fn load_every_script(server: &RedisServer, holder: &Locker, other: &Locker) {
    let guard = holder.lock("warm-up").lease(LEASE).await.unwrap();
    guard.extend(LEASE).await.unwrap();
    let mut warm = wait_for(other.clone(), "warm-up");
    until_queued(server, "warm-up", 1).await;
    guard.release().await.unwrap();
    warm.acquired("the warm-up waiter").await;
    warm.release().await;
}

/// A key's first contended release tries the one-key release, finds the lock marked and
/// sends the full release (two calls); the next one, seconds later, goes straight to the full
/// release (one call): the backend met waiters on that key lately.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_that_met_waiters_lately_goes_straight_to_the_hand_over() {
    let server = RedisServer::start();
    let holder = locker(&server, Duration::from_secs(2)).await;
    let other = locker(&server, Duration::from_secs(2)).await;
    load_every_script(&server, &holder, &other).await;
    assert_eq!(contended_release_calls(&server, &holder, &other).await, 2);
    assert_eq!(contended_release_calls(&server, &holder, &other).await, 1);
}
