//! What a Redis backend learns and checks of its server when it connects (issue 12, holes 5
//! and 6), against real redis-server processes:
//!
//! - least privilege: every feature works for a user restricted by exactly the ACL rule of the
//!   README (read from it); a user missing any part of it is refused before any lock is taken,
//!   with an `InvalidConfig` error that names what is missing;
//! - eviction: the server's `maxmemory-policy` is read and reported.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout,
    reason = "test code: a failed expectation fails the test"
)]

use std::future::Future;
use std::time::Duration;

use lock_core::{LockError, Locker, RedisBackend};
use lock_testkit::{AclUser, RedisServer, eventually};

/// A hang guard for things expected to happen soon: generous, never a speed claim.
const SOON: Duration = Duration::from_secs(10);

/// The guide's Redis chapter, which gives the least-privilege ACL rule.
const README: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../docs/src/backends/redis.md"
));

async fn soon<F: Future>(what: &str, fut: F) -> F::Output {
    tokio::time::timeout(SOON, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: not done within {SOON:?}"))
}

/// The words of the README's `ACL SETUSER` rule after `ACL SETUSER` (user name first).
fn readme_rule() -> Vec<String> {
    let line = README
        .lines()
        .find_map(|l| l.trim().strip_prefix("ACL SETUSER "))
        .expect("the README gives an `ACL SETUSER` rule");
    line.split_whitespace().map(str::to_owned).collect()
}

/// A server with the admin protected by a password and one more user defined by `rule`
/// (the words of an `ACL SETUSER` rule, user name first), and the URL that logs in as it.
fn server_with_user(rule: &[String]) -> (RedisServer, String) {
    let user = AclUser::from_setuser(rule.iter().cloned()).expect("the rule sets a password");
    let server = RedisServer::builder()
        .requirepass("adminpw")
        .user(&user)
        .start();
    let url = server.url_for(&user);
    (server, url)
}

#[track_caller]
fn assert_permission_error<T: std::fmt::Debug>(r: Result<T, LockError>, names: &[&str]) -> String {
    match r {
        Err(LockError::InvalidConfig { what, .. }) => {
            assert!(
                what.contains("docs/src/backends/redis.md") && what.contains("Permissions"),
                "the error points at the guide's ACL rule: {what}"
            );
            for name in names {
                assert!(what.contains(name), "the error names {name:?}: {what}");
            }
            what
        }
        other => panic!("expected InvalidConfig naming {names:?}, got {other:?}"),
    }
}

/// Every feature (plain, fenced, busy, a waiter handed the lock through the subscriber, fair
/// waiters, a waiter that gives up and leaves the queue, the watchdog, `run`, `extend`) works
/// for a user restricted by exactly the README's rule: keys and channels `lock:*`, no
/// `@dangerous` command (so no INFO, no CONFIG).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_feature_works_under_exactly_the_readme_acl_rule() {
    let rule = readme_rule();
    assert!(
        rule.iter().any(|w| w == "-@dangerous"),
        "the rule excludes @dangerous: {rule:?}"
    );
    let (server, url) = server_with_user(&rule);
    // The user really is refused INFO and CONFIG.
    let mut restricted = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    for cmd in [redis::cmd("INFO"), {
        let mut c = redis::cmd("CONFIG");
        c.arg("GET").arg("maxmemory-policy");
        c
    }] {
        let refused: redis::RedisResult<redis::Value> = cmd.query_async(&mut restricted).await;
        assert_eq!(
            refused.as_ref().err().and_then(|e| e.code()),
            Some("NOPERM"),
            "{refused:?}"
        );
    }

    let a = soon("connect", Locker::redis(&url))
        .await
        .expect("the restricted user connects");
    let b = soon("connect", Locker::redis(&url))
        .await
        .expect("the restricted user connects");
    assert_eq!(a.stats().eviction_risk, None, "the policy cannot be read");

    // Plain and fenced locks, busy.
    let plain = a.lock("lp:plain").await.expect("plain lock");
    assert!(server.exists("lock:{lp:plain}").await);
    assert!(matches!(
        b.try_lock("lp:plain").await,
        Err(LockError::Busy { .. })
    ));
    plain.release().await.expect("plain release");
    assert!(!server.exists("lock:{lp:plain}").await);
    let fenced = a.lock("lp:fenced").fenced().await.expect("fenced lock");
    let first = fenced.fence().expect("a fence");
    fenced.release().await.expect("fenced release");
    let again = a.lock("lp:fenced").fenced().await.expect("fenced lock");
    assert!(again.fence().expect("a fence") > first);

    // A waiter in another locker is handed the lock through the subscriber connection.
    let b2 = b.clone();
    let waiter = tokio::spawn(async move { b2.lock("lp:fenced").fenced().wait(SOON).await });
    eventually("the waiter subscribed", SOON, async || {
        !server.subscribed_channels().await.is_empty()
    })
    .await;
    let held_fence = again.fence();
    again.release().await.expect("release to the waiter");
    let handed = soon("hand-over", waiter)
        .await
        .unwrap()
        .expect("the waiter gets the lock");
    assert!(handed.fence() > held_fence);
    handed.release().await.expect("release");

    // Fair waiters queued in Redis, each handed the lock by the release before it (each
    // releases in its own task: the queue order is not the spawn order).
    let holder = a.lock("lp:fair").await.expect("lock");
    let mut fair = Vec::new();
    for _ in 0..2 {
        let b = b.clone();
        fair.push(tokio::spawn(async move {
            let g = b.lock("lp:fair").fair().wait(SOON).await?;
            let waited = g.waited();
            g.release().await.map(|()| waited)
        }));
    }
    eventually("both fair waiters queued", SOON, async || {
        let queued: i64 = server
            .query(redis::cmd("LLEN").arg("lock:{lp:fair}:queue").clone())
            .await;
        queued == 2
    })
    .await;
    holder.release().await.expect("release");
    for t in fair {
        let waited = soon("fair waiter", t).await.unwrap().expect("fair lock");
        assert!(waited, "the fair waiter waited for the lock");
    }

    // A waiter that gives up leaves the queue (leave script).
    let holder = a.lock("lp:leave").await.expect("lock");
    let gave_up = b
        .lock("lp:leave")
        .fair()
        .wait(Duration::from_millis(200))
        .await;
    assert!(
        matches!(gave_up, Err(LockError::Timeout { .. })),
        "{gave_up:?}"
    );
    holder.release().await.expect("release after a waiter left");

    // The watchdog renews a short lease many times over; extend and run work.
    let lease = Duration::from_millis(300);
    let renewed = a.lock("lp:watchdog").lease(lease).await.expect("lock");
    let calls = a.stats().renewal_calls;
    eventually("five renewals", SOON, async || {
        a.stats().renewal_calls >= calls + 5
    })
    .await;
    assert!(renewed.is_held());
    assert!(server.pttl("lock:{lp:watchdog}").await > 0);
    renewed
        .extend(Duration::from_secs(2))
        .await
        .expect("extend");
    renewed.release().await.expect("release");
    let out = a.lock("lp:run").run(async { 7 }).await.expect("run");
    assert_eq!(out, 7);
    for name in ["plain", "fenced", "fair", "leave", "watchdog", "run"] {
        assert!(
            !server.exists(&format!("lock:{{lp:{name}}}")).await,
            "{name} released"
        );
    }
}

/// A user without channel permission is refused by `Locker::redis` at connect, with an error
/// that says which permission is missing, instead of getting `Err` from a release whose script
/// had already deleted the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_channel_permission_is_refused_at_connect() {
    let rule: Vec<String> = readme_rule()
        .into_iter()
        .filter(|w| !w.starts_with('&'))
        .collect();
    let (server, url) = server_with_user(&rule);
    let what = assert_permission_error(
        soon("connect", Locker::redis(&url)).await,
        &["SPUBLISH", "lock:{__lock_probe__}:released", "channel"],
    );
    println!("{what}");
    assert_eq!(server.dbsize().await, 0, "the check wrote nothing");
}

/// With a custom prefix the backend cannot know at connect, the first lock of that prefix is
/// refused with the same error, and takes nothing; another attempt is refused again (the
/// check's failure is not remembered as a success), and a prefix the user may use works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_prefix_without_channel_permission_is_refused_at_its_first_lock() {
    let rule: Vec<String> = readme_rule()
        .into_iter()
        .map(|w| match w.as_str() {
            "~lock:*" => "~*".to_owned(),
            _ => w,
        })
        .collect();
    let (server, url) = server_with_user(&rule);
    let backend = soon("connect", RedisBackend::connect(&url))
        .await
        .expect("the backend connects: it knows no prefix yet");
    let shop = Locker::builder(backend.clone()).prefix("shop:").build();
    for _ in 0..2 {
        assert_permission_error(
            soon("lock", async { shop.lock("k").no_wait().await }).await,
            &["SPUBLISH", "shop:{__lock_probe__}:released", "&shop:*"],
        );
        assert!(!server.exists("shop:{k}").await, "nothing was taken");
    }
    assert_permission_error(
        soon("check", backend.check_permissions("shop:")).await,
        &["SPUBLISH"],
    );
    let plain = Locker::builder(backend.clone()).build();
    let g = plain
        .lock("k")
        .await
        .expect("the default prefix is allowed");
    g.release().await.expect("release");
    backend
        .check_permissions("lock:")
        .await
        .expect("the default prefix passes the check");
}

/// Taking away any one grant of the README's rule (a key or channel pattern, a command
/// category, `time`) makes the user fail at connect with `InvalidConfig`: each part is needed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_part_of_the_readme_acl_rule_is_needed() {
    let rule = readme_rule();
    let grants: Vec<String> = rule
        .iter()
        .filter(|w| w.starts_with('+') || w.starts_with('~') || w.starts_with('&'))
        .cloned()
        .collect();
    assert!(grants.len() >= 4, "{grants:?}");
    for grant in &grants {
        let reduced: Vec<String> = rule.iter().filter(|w| *w != grant).cloned().collect();
        let (_server, url) = server_with_user(&reduced);
        let what = assert_permission_error(soon(grant, Locker::redis(&url)).await, &[]);
        println!("without {grant}: {what}");
    }
}

/// With `--maxmemory-policy volatile-lru` the backend reports the policy and the locker an
/// eviction risk; with the default policy (`noeviction`) there is none; the memory backend
/// has none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_maxmemory_policy_is_read_and_an_eviction_risk_reported() {
    let evicting = RedisServer::start_with(["--maxmemory-policy", "volatile-lru"]);
    let backend = RedisBackend::connect(&evicting.url()).await.unwrap();
    assert_eq!(backend.maxmemory_policy(), Some("volatile-lru"));
    let locker = Locker::builder(backend).build();
    assert_eq!(locker.stats().eviction_risk, Some(true));

    let default = RedisServer::start();
    let backend = RedisBackend::connect(&default.url()).await.unwrap();
    assert_eq!(backend.maxmemory_policy(), Some("noeviction"));
    assert_eq!(
        Locker::builder(backend).build().stats().eviction_risk,
        Some(false)
    );
    assert_eq!(Locker::memory().stats().eviction_risk, Some(false));
}

/// A user allowed `INFO` but not `CONFIG` still gets the policy (from `INFO memory`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_is_read_from_info_when_config_is_refused() {
    let app = AclUser::new("app", "pw").rules(["~*", "&*", "+@all", "-config"]);
    let server = RedisServer::builder()
        .args(["--maxmemory-policy", "allkeys-lru"])
        .user(&app)
        .start();
    let backend = RedisBackend::connect(&server.url_for(&app)).await.unwrap();
    assert_eq!(backend.maxmemory_policy(), Some("allkeys-lru"));
}

/// A cluster whose every node has one more user defined by `rule` (the words of an
/// `ACL SETUSER` rule, user name first), and the URLs that log in as it.
async fn cluster_with_user(rule: &[String]) -> (lock_testkit::cluster::RedisCluster, Vec<String>) {
    let cluster = lock_testkit::cluster::RedisCluster::start().await;
    for node in cluster.nodes() {
        let () = node
            .server()
            .query(redis::cmd("ACL").arg("SETUSER").arg(rule).clone())
            .await;
    }
    let password = rule
        .iter()
        .find_map(|w| w.strip_prefix('>'))
        .expect("the rule sets a password");
    let login = format!("redis://{}:{password}@", rule[0]);
    let urls: Vec<String> = cluster
        .urls()
        .iter()
        .map(|u| u.replacen("redis://", &login, 1))
        .collect();
    (cluster, urls)
}

/// On a Redis Cluster the watchdog renews every lock a primary serves in one script call that
/// touches keys it did not declare (issue 29, item 6): it runs for a user restricted by the
/// README's rule plus `+cluster|slots` (which the cluster client needs to learn the slot map;
/// the rule alone refuses it). Locks on every shard stay held through several leases, and no
/// node logs a refused command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_renewals_run_under_the_readme_acl_rule_with_cluster_slots() {
    let mut rule = readme_rule();
    rule.push("+cluster|slots".to_owned());
    let (cluster, urls) = cluster_with_user(&rule).await;
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let locker = soon("connect", Locker::redis_cluster(&urls))
        .await
        .expect("connect as the restricted user");
    let lease = Duration::from_millis(600);
    let mut guards = Vec::new();
    for i in 0..12 {
        let key = format!("acl-{i}");
        guards.push(
            soon("lock", locker.lock(key.as_str()).lease(lease).into_future())
                .await
                .expect("lock"),
        );
    }
    let calls = locker.stats().renewal_calls;
    tokio::time::sleep(lease * 3).await;
    assert!(locker.stats().renewal_calls > calls, "the watchdog renewed");
    for g in &guards {
        assert!(g.is_held(), "renewed under the restricted user");
    }
    // The connect's probes of the server (INFO, CONFIG GET) may be refused: they are allowed
    // to be (see `the_policy_is_read_from_info_when_config_is_refused`); nothing else is.
    for node in cluster.nodes() {
        let log: Vec<Vec<(String, redis::Value)>> = node
            .server()
            .query(redis::cmd("ACL").arg("LOG").clone())
            .await;
        for entry in &log {
            let object = entry.iter().find(|(k, _)| k == "object").map(|(_, v)| v);
            let probe = matches!(object, Some(redis::Value::BulkString(o)) if o.as_slice() == b"info" || o.starts_with(b"config"));
            assert!(probe, "node {}: refused {entry:?}", node.port());
        }
    }
}

/// A cluster user under the guide's rule without `+cluster|slots` (which the cluster client
/// needs to learn the slot map) is refused at connect with an `InvalidConfig` error that names
/// the missing permission, before any lock, not a bare backend error (issue 29, items 4-7).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_user_without_cluster_slots_is_refused_at_connect_naming_it() {
    let rule = readme_rule();
    let (_cluster, urls) = cluster_with_user(&rule).await;
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let refused = soon("connect", Locker::redis_cluster(&urls)).await;
    let what = assert_permission_error(refused, &["cluster|slots"]);
    assert!(
        what.contains("docs/src/backends/cluster.md"),
        "the error points at the cluster chapter: {what}"
    );
}
