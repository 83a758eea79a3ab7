//! The Redis Sentinel backend takes only a primary that a majority of the configured sentinels
//! name (issue 29, item 8), on every path that picks one: at connect, when a command says the
//! primary may have moved (a stall, `READONLY`, a dropped connection), and when a sentinel
//! announces a failover (`+switch-master`). A stale sentinel (one left naming another server:
//! an old configuration, a partition) never moves the locker to a server the others do not
//! name; while no address has a majority, lock requests fail with `LockError::Backend` and the
//! locker serves locks again once the sentinels agree.
//!
//! Each locker here is given three sentinels: first a stale one (the test kit's
//! `lone_sentinel`: it names a standalone `redis-server`, a primary nobody else uses, under the
//! group's name, and shares no server with the set, so no sentinel hears of the other's
//! configuration), then two sentinels of the set.

#![allow(
    clippy::panic,
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "a test file: its helpers assert by panicking"
)]

use std::time::{Duration, Instant};

use lock_core::{LockError, Locker, RedisSentinelBackend};
use lock_testkit::RedisServer;
use lock_testkit::sentinel::{RedisSentinelSet, lone_sentinel};

/// A hang guard for what should happen soon; never a speed claim.
const SOON: Duration = Duration::from_secs(20);

/// How long a locker is watched not to move after a stale sentinel's announcement: longer than
/// the backend's own retries of an announced address (5 connect timeouts, 1.5 s here).
const WATCH: Duration = Duration::from_secs(3);

/// How long a primary stalls in [`the_longest_connect_timeout_does_not_panic_when_following`].
const STALL: Duration = Duration::from_secs(2);

/// A set whose sentinels never fail the primary over on their own during a test's stall.
async fn start_set() -> RedisSentinelSet {
    RedisSentinelSet::builder()
        .down_after(Duration::from_secs(60))
        .start()
        .await
}

/// A standalone server and a stale sentinel that names it.
struct Stale {
    server: RedisServer,
    sentinel: RedisServer,
}

impl Stale {
    fn start() -> Self {
        let server = RedisServer::start();
        let sentinel = lone_sentinel(server.port());
        Stale { server, sentinel }
    }
}

/// Connects through the stale sentinel and the set's first two.
async fn try_connect(
    set: &RedisSentinelSet,
    stale: &Stale,
) -> Result<RedisSentinelBackend, LockError> {
    let set_urls = set.sentinel_urls();
    let urls = [stale.sentinel.url().as_str(), &set_urls[0], &set_urls[1]].map(str::to_owned);
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    RedisSentinelBackend::builder(&urls, set.master_name())
        .connect_timeout(Duration::from_millis(300))
        .response_timeout(Duration::from_millis(300))
        .connect()
        .await
}

async fn connect(set: &RedisSentinelSet, stale: &Stale) -> RedisSentinelBackend {
    try_connect(set, stale)
        .await
        .expect("connect through the sentinels")
}

fn addr(server: &RedisServer) -> String {
    format!("127.0.0.1:{}", server.port())
}

/// Takes `key` on `locker`, retrying while the backend answers with a `Backend` error (the
/// sentinels not agreeing yet, a connection being re-made) for at most [`SOON`].
async fn take(locker: &Locker, key: &str) -> lock_core::LockGuard {
    let deadline = Instant::now() + SOON;
    loop {
        match locker.try_lock(key).await {
            Ok(guard) => return guard,
            Err(LockError::Backend { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("take {key:?}: {e:?}"),
        }
    }
}

/// At connect: two of three sentinels answer, one names the primary and one (stale) another
/// server. That tie is no majority of the three configured sentinels: the connect fails with a
/// `Backend` error (before: the first answer of the tie was taken, the stale one, and every lock
/// went to a server nobody else uses). Once the third sentinel is back, the connect reaches the
/// primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tie_of_the_answering_sentinels_is_no_majority_at_connect() {
    let mut set = start_set().await;
    let stale = Stale::start();
    set.sentinel_mut(1).stop();
    match try_connect(&set, &stale).await {
        Err(LockError::Backend { .. }) => {}
        Ok(backend) => panic!(
            "connected to {} with one sentinel naming it and one naming {}",
            backend.primary(),
            addr(set.primary())
        ),
        Err(e) => panic!("expected a Backend error, got {e:?}"),
    }
    set.sentinel_mut(1).restart();
    let deadline = Instant::now() + SOON;
    let backend = loop {
        match try_connect(&set, &stale).await {
            Ok(backend) => break backend,
            Err(LockError::Backend { .. }) if Instant::now() < deadline => {}
            Err(e) => panic!("connect once two sentinels agree: {e:?}"),
        }
    };
    assert_eq!(backend.primary(), addr(set.primary()));
}

/// At connect while the primary stalls (SIGSTOP, shorter than the sentinels' `down-after`):
/// the majority's primary does not answer its `HELLO`, and the connect fails with a `Backend`
/// error instead of taking the address only the stale sentinel names (before: it took that
/// one, and stayed there for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stalled_primary_is_not_replaced_at_connect_by_a_stale_sentinels_server() {
    let mut set = start_set().await;
    let stale = Stale::start();
    set.primary_mut().pause();
    let during = try_connect(&set, &stale).await.map(|b| b.primary());
    set.primary_mut().resume();
    match during {
        Err(LockError::Backend { .. }) => {}
        Ok(primary) => panic!(
            "connected to {primary} while the majority names the stalled {}",
            addr(set.primary())
        ),
        Err(e) => panic!("expected a Backend error, got {e:?}"),
    }
    let backend = connect(&set, &stale).await;
    assert_eq!(backend.primary(), addr(set.primary()));
}

/// A command times out on a stalled primary (SIGSTOP, shorter than the sentinels'
/// `down-after`): the locker asks the sentinels, the majority still names the stalled primary,
/// and the request fails with a `Backend` error; the locker stays on the primary. Before: it
/// moved to the stale sentinel's server, took the lock there, and another locker took the same
/// lock on the primary once it woke up: two holders, without any failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stalled_primary_is_not_left_for_a_stale_sentinels_server() {
    let mut set = start_set().await;
    let stale = Stale::start();
    let a = connect(&set, &stale).await;
    let b = connect(&set, &stale).await;
    let (locker_a, locker_b) = (
        Locker::builder(a.clone()).build(),
        Locker::builder(b).build(),
    );
    set.primary_mut().pause();
    let during = locker_a.try_lock("k").await;
    set.primary_mut().resume();
    match during {
        Err(LockError::Backend { .. }) => {}
        Ok(_) => panic!(
            "took the lock on {} while the primary {} stalled",
            a.primary(),
            addr(set.primary())
        ),
        Err(e) => panic!("expected a Backend error, got {e:?}"),
    }
    assert_eq!(a.primary(), addr(set.primary()), "the locker moved");
    let held = take(&locker_a, "k").await;
    assert!(
        matches!(locker_b.try_lock("k").await, Err(LockError::Busy { .. })),
        "two holders: the lock was taken on {} and on {}",
        a.primary(),
        addr(set.primary())
    );
    assert!(!stale.server.exists("lock:{k}").await);
    held.release().await.expect("release");
}

/// A `+switch-master` from one sentinel is a hint, not a verdict: the locker follows an
/// announced address only once a majority of the sentinels name it. Here the stale sentinel,
/// the one the locker listens to, fails its own server over alone (`SENTINEL FAILOVER`, which
/// asks no other sentinel) and announces the promoted replica. Before: the locker moved there
/// at once (it answers as a primary) and took there a lock another locker held on the primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_switch_announced_by_one_stale_sentinel_is_not_followed() {
    let set = start_set().await;
    let server = RedisServer::start();
    let port = server.port().to_string();
    let stray_replica = RedisServer::start_with(["--replicaof", "127.0.0.1", port.as_str()]);
    lock_testkit::eventually("the stray replica in sync", SOON, async || {
        stray_replica
            .info("replication")
            .await
            .contains("master_link_status:up")
    })
    .await;
    // Started once the replica is in sync: it learns the replica from its first INFO.
    let sentinel = lone_sentinel(server.port());
    let stale = Stale { server, sentinel };
    let a = connect(&set, &stale).await;
    let b = connect(&set, &stale).await;
    let (locker_a, locker_b) = (
        Locker::builder(a.clone()).build(),
        Locker::builder(b).build(),
    );
    let held = locker_b.lock("k").await.expect("lock on the primary");
    // Both lockers listen to their first sentinel, the stale one: fail over once both are
    // subscribed there.
    lock_testkit::eventually(
        "both lockers listen to the stale sentinel",
        SOON,
        async || {
            let clients: String = stale
                .sentinel
                .query(redis::cmd("CLIENT").arg("LIST").clone())
                .await;
            clients.lines().filter(|l| l.contains(" sub=1 ")).count() >= 2
        },
    )
    .await;
    lock_testkit::eventually("the stale sentinel's own failover", SOON, async || {
        stale
            .sentinel
            .try_query::<()>(
                redis::cmd("SENTINEL")
                    .arg("FAILOVER")
                    .arg(set.master_name())
                    .clone(),
            )
            .await
            .is_ok()
    })
    .await;
    // The promotion closes the replica's normal connections (Sentinel's `CLIENT KILL TYPE
    // normal`), this poll's own among them: an error is asked again.
    lock_testkit::eventually("the stray replica promoted", SOON, async || {
        stray_replica
            .try_query::<String>(redis::cmd("INFO").arg("replication").clone())
            .await
            .is_ok_and(|info| info.contains("role:master"))
    })
    .await;
    let until = Instant::now() + WATCH;
    while Instant::now() < until {
        assert_eq!(
            a.primary(),
            addr(set.primary()),
            "followed one sentinel's announcement"
        );
        match locker_a.try_lock("k").await {
            Err(LockError::Busy { .. }) => {}
            Ok(_) => panic!("two holders: the lock was taken on {}", a.primary()),
            Err(e) => panic!("expected Busy, got {e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    held.release().await.expect("release");
}

/// One sentinel given twice would vote twice: with the stale sentinel under two URLs and one
/// sentinel of the set, the stale one's server had "two of three" and the locker took every
/// lock there. The same sentinel twice is refused at connect with `InvalidConfig`, whether
/// under the same URL or another name of the same address (`localhost` and `127.0.0.1`), as
/// Redlock refuses one server under two URLs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sentinel_given_twice_is_refused_at_connect() {
    let set = start_set().await;
    let stale = Stale::start();
    let set_urls = set.sentinel_urls();
    let port = stale.sentinel.port();
    let twice = [
        [
            stale.sentinel.url(),
            stale.sentinel.url(),
            set_urls[0].clone(),
        ],
        [
            format!("redis://127.0.0.1:{port}/"),
            format!("redis://localhost:{port}"),
            set_urls[0].clone(),
        ],
    ];
    for urls in &twice {
        let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
        let connected = RedisSentinelBackend::builder(&urls, set.master_name())
            .connect_timeout(Duration::from_millis(300))
            .response_timeout(Duration::from_millis(300))
            .connect()
            .await;
        match connected {
            Err(LockError::InvalidConfig { .. }) => {}
            Ok(backend) => panic!(
                "connected to {} with one sentinel given twice ({urls:?})",
                backend.primary()
            ),
            Err(e) => panic!("expected InvalidConfig for {urls:?}, got {e:?}"),
        }
    }
}

/// Timeouts are caller input: the longest connect timeout a builder accepts
/// ([`lock_core::MAX_TIMEOUT`]; `Duration::MAX` is refused at connect, see lock-core's
/// `every_builder_refuses_a_timeout_above_the_maximum`) must not panic when a command times
/// out and the sentinels are asked again (before: with `Duration::MAX`, the bound of that
/// resolution, connect + response timeout, overflowed and the caller's request panicked). With
/// so long a connect bound, the request waits for the stalled primary's `HELLO`: the stall is
/// a fault of [`STALL`], then the primary resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_longest_connect_timeout_does_not_panic_when_following() {
    let mut set = start_set().await;
    let urls = set.sentinel_urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let backend = RedisSentinelBackend::builder(&urls, set.master_name())
        .connect_timeout(lock_core::MAX_TIMEOUT)
        .response_timeout(Duration::from_millis(300))
        .connect()
        .await
        .expect("connect through the sentinels");
    let locker = Locker::builder(backend.clone()).build();
    set.primary_mut().pause();
    let mut request = tokio::spawn(async move { locker.try_lock("k").await.map(drop) });
    // The stall's length, not a synchronization: the request may end before or after it.
    let early = tokio::time::timeout(STALL, &mut request).await.ok();
    set.primary_mut().resume();
    let during = match early {
        Some(during) => during,
        None => tokio::time::timeout(SOON, request)
            .await
            .expect("the request ends once the primary answers"),
    };
    match during {
        Ok(Err(LockError::Backend { .. })) => {}
        Ok(other) => panic!("expected a Backend error, got {other:?}"),
        Err(e) => panic!("the lock request panicked: {e}"),
    }
    assert_eq!(backend.primary(), addr(set.primary()));
}
