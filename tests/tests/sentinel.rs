//! The Redis Sentinel backend on a real local Sentinel set (1 primary, 2 replicas, 3
//! sentinels, started by the test kit): the locker follows a failover without a restart; a
//! lock that reached the replicas stays held and renewed on the new primary; a lock the
//! crashed primary had not replicated is reported lost to its holder at once, never silently;
//! fences never go backwards across either; waiters are woken through the new primary; while
//! no primary answers, locks fail fast with a typed error.

#![allow(
    clippy::panic,
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "a test file: its helpers assert by panicking"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lock_core::{LockError, Locker, RedisSentinelBackend};
use lock_testkit::RedisServer;
use lock_testkit::sentinel::RedisSentinelSet;

/// The guide's Redis chapter, which gives the least-privilege ACL rule.
const README: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../docs/src/backends/redis.md"
));

/// A hang guard for what should happen soon; never a speed claim.
const SOON: Duration = Duration::from_secs(20);

async fn connect(set: &RedisSentinelSet) -> RedisSentinelBackend {
    let urls = set.sentinel_urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    RedisSentinelBackend::builder(&urls, set.master_name())
        .connect_timeout(Duration::from_millis(300))
        .response_timeout(Duration::from_millis(300))
        .connect()
        .await
        .expect("connect through the sentinels")
}

/// Waits until `backend` talks to the primary on `port`.
async fn follows(backend: &RedisSentinelBackend, port: u16) {
    let want = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + SOON;
    while backend.primary() != want {
        assert!(
            Instant::now() < deadline,
            "the backend still talks to {} instead of {want}",
            backend.primary()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Makes sure every write made on `primary` so far reached both replicas (replication keeps
/// order: a write acknowledged by the replicas was preceded by every earlier one).
async fn replicated(primary: &RedisServer) {
    primary.set_replicated("sync-mark", "1", 2).await;
}

/// Cuts the replicas off the primary and keeps them off (a wrong password for it): what is
/// written now does not reach them. `false` lets them back.
async fn cut_replication(set: &RedisSentinelSet, cut: bool) {
    let password = if cut { "wrong" } else { "" };
    for replica in set.replicas() {
        let () = replica
            .query(
                redis::cmd("CONFIG")
                    .arg("SET")
                    .arg("masterauth")
                    .arg(password)
                    .clone(),
            )
            .await;
    }
    if cut {
        let _: i64 = set
            .primary()
            .query(
                redis::cmd("CLIENT")
                    .arg("KILL")
                    .arg("TYPE")
                    .arg("replica")
                    .clone(),
            )
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connects_through_the_sentinels_and_locks_on_the_primary() {
    let set = RedisSentinelSet::start().await;
    let urls = set.sentinel_urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let locker = Locker::redis_sentinel(&urls, set.master_name())
        .await
        .expect("Locker::redis_sentinel");
    let guard = locker.lock("plain").fenced().await.expect("lock");
    assert!(guard.fence().is_some());
    assert!(
        set.primary().exists("lock:{plain}").await,
        "the lock lives on the primary"
    );
    guard.release().await.expect("release");
    assert!(!set.primary().exists("lock:{plain}").await);
    // A wrong name and a sentinel that is not there are typed errors, not hangs.
    match RedisSentinelBackend::builder(&urls, "no-such-primary")
        .connect()
        .await
    {
        Err(LockError::Backend { .. }) => {}
        other => panic!("an unknown primary name: expected a Backend error, got {other:?}"),
    }
    match RedisSentinelBackend::builder(&[], "mymaster")
        .connect()
        .await
    {
        Err(LockError::InvalidConfig { .. }) => {}
        other => panic!("no sentinel: expected InvalidConfig, got {other:?}"),
    }
}

/// `SENTINEL FAILOVER` while a lock is held: the lock had reached the replicas, so it is kept;
/// its renewals go to the new primary once the sentinels name it (the old one still takes
/// writes for seconds before they demote it); fences keep rising.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failover_keeps_a_replicated_lock_renewed_on_the_new_primary() {
    let mut set = RedisSentinelSet::start().await;
    let backend = connect(&set).await;
    let locker = Locker::builder(backend.clone()).build();
    let lease = Duration::from_secs(6);
    let guard = locker
        .lock("held")
        .lease(lease)
        .fenced()
        .await
        .expect("lock");
    let first = guard.fence().expect("fence");
    replicated(set.primary()).await;
    let old = set.failover().await;
    let new = set.primary().port();
    assert_ne!(old, new);
    follows(&backend, new).await;
    // A renewal reaches the new primary: its lease there goes back up. (Renewals that stayed
    // on the old primary, a primary still for seconds, would let the lock run out here while
    // its holder believes it holds it.)
    let mut lowest = i64::MAX;
    let deadline = Instant::now() + SOON;
    loop {
        let pttl = set.primary().pttl("lock:{held}").await;
        assert!(
            pttl > 0,
            "the lock ran out on the new primary (PTTL {pttl})"
        );
        if pttl > lowest.saturating_add(500) {
            break;
        }
        lowest = lowest.min(pttl);
        assert!(
            Instant::now() < deadline,
            "no renewal reached the new primary"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(guard.is_held(), "the replicated lock is kept");
    let other = Locker::builder(connect(&set).await).build();
    assert!(
        matches!(other.try_lock("held").await, Err(LockError::Busy { .. })),
        "another locker finds the lock held on the new primary"
    );
    guard.release().await.expect("release on the new primary");
    let again = other
        .lock("held")
        .fenced()
        .await
        .expect("lock after the failover");
    assert!(
        again.fence().expect("fence") > first,
        "fences never go backwards across a failover"
    );
    again.release().await.expect("release");
}

/// The primary crashes before a lock reached its replicas: the new primary lacks it. Locks
/// fail fast with a typed error while no primary answers; once the sentinels promote a
/// replica, the same locker serves locks again, the holder of the lost lock is told at once
/// (not at its next regular renewal, a lease-third later), and the next fence is larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crash_before_replication_is_reported_lost_at_once_and_fences_never_go_back() {
    let mut set = RedisSentinelSet::start().await;
    let backend = connect(&set).await;
    let locker = Locker::builder(backend.clone()).build();
    // The lock taken now is not replicated before the crash.
    cut_replication(&set, true).await;
    // A long lease: its regular renewal (a third of it) comes long after the failover.
    let guard = locker
        .lock("lost")
        .lease(Duration::from_secs(120))
        .fenced()
        .await
        .expect("lock");
    let first = guard.fence().expect("fence");
    let old = set.kill_primary();
    cut_replication(&set, false).await;
    let started = Instant::now();
    match locker.lock("other").await {
        Err(LockError::Backend { .. }) => {}
        other => {
            panic!("a lock while the primary is down: expected a Backend error, got {other:?}")
        }
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "failed fast, not after {:?}",
        started.elapsed()
    );
    let new = set.wait_for_new_primary(old, Duration::from_secs(30)).await;
    assert!(
        !set.primary().exists("lock:{lost}").await,
        "set-up: the lock was not to reach the replica before the crash"
    );
    tokio::time::timeout(SOON, guard.lost())
        .await
        .expect("the holder is told of the loss at once, not at its next renewal");
    assert!(!guard.is_held());
    follows(&backend, new).await;
    // The same locker, no restart.
    let deadline = Instant::now() + SOON;
    let again = loop {
        match locker.lock("lost").fenced().await {
            Ok(guard) => break guard,
            Err(e) if Instant::now() < deadline => {
                assert!(matches!(e, LockError::Backend { .. }), "{e:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("no lock after the failover: {e}"),
        }
    };
    assert!(
        again.fence().expect("fence") > first,
        "the fence counter was lost with the primary, yet the next fence is larger"
    );
    again.release().await.expect("release");
}

/// A waiter queued before a failover is woken by the release on the new primary: the
/// subscription moved there (the old primary, still a primary for seconds, never hears it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiter_is_woken_through_the_new_primary() {
    let mut set = RedisSentinelSet::start().await;
    let holder = Locker::builder(connect(&set).await).build();
    let waiter_backend = connect(&set).await;
    let waiter = Locker::builder(waiter_backend.clone()).build();
    let guard = holder
        .lock("q")
        .lease(Duration::from_secs(30))
        .await
        .expect("lock");
    let released = Arc::new(AtomicBool::new(false));
    let waiting = {
        let released = released.clone();
        tokio::spawn(async move {
            let got = waiter
                .lock("q")
                .wait(SOON * 3)
                .await
                .expect("the waiter gets the lock");
            assert!(
                released.load(Ordering::SeqCst),
                "the waiter got the lock while it was held"
            );
            got.release().await.expect("waiter release");
        })
    };
    let deadline = Instant::now() + SOON;
    while !set
        .primary()
        .subscribed_channels()
        .await
        .iter()
        .any(|c| c.contains("{q}"))
    {
        assert!(Instant::now() < deadline, "the waiter never subscribed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    replicated(set.primary()).await;
    let old = set.primary().port();
    set.failover().await;
    follows(&waiter_backend, set.primary().port()).await;
    let deadline = Instant::now() + SOON;
    while !set
        .primary()
        .subscribed_channels()
        .await
        .iter()
        .any(|c| c.contains("{q}"))
    {
        assert!(
            Instant::now() < deadline,
            "the waiter's subscription did not move to the new primary"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let old = set.servers().iter().find(|s| s.port() == old).unwrap();
    assert!(
        old.info("replication").await.contains("role:master"),
        "the subscription moved only when the old primary was demoted (its connections closed), not when the locker followed the new one"
    );
    assert!(!waiting.is_finished(), "the waiter still waits");
    released.store(true, Ordering::SeqCst);
    guard.release().await.expect("release on the new primary");
    tokio::time::timeout(SOON, waiting)
        .await
        .expect("the waiter was woken")
        .expect("waiter task");
}

/// `SENTINEL FAILOVER` after a lock was taken that the replicas never got: no connection of
/// the holder drops (the old primary stays up, a primary still until the sentinels demote it
/// seconds later), yet the holder is told of the loss as soon as its locker follows the new
/// primary, not at the demotion nor at its next regular renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lock_the_new_primary_lacks_is_reported_lost_as_soon_as_the_locker_follows() {
    // One replica, cut off until it is promoted: the new primary surely lacks the lock.
    let mut set = RedisSentinelSet::builder().replicas(1).start().await;
    let backend = connect(&set).await;
    let locker = Locker::builder(backend.clone()).build();
    cut_replication(&set, true).await;
    let guard = locker
        .lock("unreplicated")
        .lease(Duration::from_secs(120))
        .await
        .expect("lock");
    let old_index = set
        .servers()
        .iter()
        .position(|s| s.port() == set.primary().port())
        .unwrap();
    set.failover().await;
    // The old primary may follow the new one when the sentinels demote it.
    cut_replication(&set, false).await;
    assert!(
        !set.primary().exists("lock:{unreplicated}").await,
        "set-up: the new primary was not to have the lock"
    );
    tokio::time::timeout(SOON, guard.lost())
        .await
        .expect("the holder is told of the loss");
    let old_role = set.servers()[old_index].info("replication").await;
    assert!(
        old_role.contains("role:master"),
        "told only once the old primary was demoted, not when the locker followed the new one"
    );
    follows(&backend, set.primary().port()).await;
}

/// The README's least-privilege ACL rule, set on every data node (ACLs are per server, and a
/// replica is the next primary), is enough through a failover: the primary's role is read
/// with `HELLO` (`@connection`), not `ROLE` (`@dangerous`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_readme_acl_rule_is_enough_through_a_failover() {
    let mut set = RedisSentinelSet::builder().replicas(1).start().await;
    let rule: Vec<String> = README
        .lines()
        .find_map(|l| l.trim().strip_prefix("ACL SETUSER "))
        .expect("the README gives an `ACL SETUSER` rule")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let user = lock_testkit::AclUser::from_setuser(rule.iter().cloned()).expect("a password");
    for server in set.servers() {
        let () = server
            .query(redis::cmd("ACL").arg("SETUSER").arg(&rule).clone())
            .await;
    }
    let urls = set.sentinel_urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let backend = RedisSentinelBackend::builder(&urls, set.master_name())
        .master_auth(Some(user.name()), Some(user.password()))
        .connect()
        .await
        .expect("connect as the README's user");
    backend
        .check_permissions("lock:")
        .await
        .expect("the README's rule passes the permission check");
    let locker = Locker::builder(backend.clone()).build();
    locker
        .lock("acl")
        .fenced()
        .await
        .expect("lock as the README's user")
        .release()
        .await
        .expect("release");
    set.failover().await;
    follows(&backend, set.primary().port()).await;
    locker
        .lock("acl")
        .fenced()
        .await
        .expect("lock on the new primary as the README's user")
        .release()
        .await
        .expect("release");
}

/// The host of the primary and of the sentinel the locker listens to goes silent (both
/// stopped, not refused): the other sentinels fail over, and the locker, with no command in
/// flight to notice anything, follows the new primary all the same (its listener's
/// connection is pinged, and one that does not answer is left for the next sentinel).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silent_primary_and_listened_sentinel_are_left_for_the_new_primary() {
    let mut set = RedisSentinelSet::start().await;
    let backend = connect(&set).await;
    let locker = Locker::builder(backend.clone()).build();
    drop(locker.lock("before").await.expect("lock before"));
    // The locker listens to the first sentinel that answered: the first one.
    set.sentinel_mut(0).pause();
    let old = set.primary().port();
    set.primary_mut().pause();
    let new = set.wait_for_new_primary(old, Duration::from_secs(30)).await;
    follows(&backend, new).await;
    locker
        .lock("after")
        .await
        .expect("lock on the new primary")
        .release()
        .await
        .expect("release");
    set.sentinel_mut(0).resume();
    let index = set.servers().iter().position(|s| s.port() == old).unwrap();
    set.server_mut(index).resume();
}

/// An acquire answered by the old primary after the locker followed the new one (the old
/// primary takes writes until it is demoted) is sent again to the new primary: the lock the
/// caller gets is on the new primary, not only on the old one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_answer_of_the_old_primary_after_the_move_is_not_taken() {
    let mut set = RedisSentinelSet::start().await;
    let urls = set.sentinel_urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    // Answers may take seconds here (the old primary's writes are paused): no timeout cuts
    // the acquire short.
    let backend = RedisSentinelBackend::builder(&urls, set.master_name())
        .response_timeout(Duration::from_secs(15))
        .connect()
        .await
        .expect("connect");
    let locker = Locker::builder(backend.clone()).build();
    drop(locker.lock("warm").await.expect("lock"));
    let old_index = set
        .servers()
        .iter()
        .position(|s| s.port() == set.primary().port())
        .unwrap();
    let () = set
        .primary()
        .query(
            redis::cmd("CLIENT")
                .arg("PAUSE")
                .arg(15_000)
                .arg("WRITE")
                .clone(),
        )
        .await;
    let acquiring = {
        let locker = locker.clone();
        tokio::spawn(async move { locker.lock("in-flight").wait(SOON).await })
    };
    set.failover().await;
    follows(&backend, set.primary().port()).await;
    assert!(
        !acquiring.is_finished(),
        "the acquire waits on the paused old primary"
    );
    let () = set.servers()[old_index]
        .query(redis::cmd("CLIENT").arg("UNPAUSE").clone())
        .await;
    let guard = tokio::time::timeout(SOON, acquiring)
        .await
        .expect("the acquire ends")
        .expect("task")
        .expect("lock");
    assert!(
        set.primary().exists("lock:{in-flight}").await,
        "the lock the caller got is on the new primary"
    );
    guard.release().await.expect("release");
}
