//! `lock-admin` as a Redis ACL user limited to the lock's prefix by the guide's rule (read
//! from docs/src/backends/redis.md): list, inspect and unlock work; a user missing a part of
//! the rule is told which permission is missing, and nothing is removed.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed expectation fails the test"
)]

mod support;

use lock_testkit::RedisServer;
use support::{admin, holder, shared_server, until_waiters};

/// The guide's Redis chapter, which gives the least-privilege ACL rule.
const GUIDE: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../docs/src/backends/redis.md"
));

/// The guide's `ACL SETUSER` rule for prefix `prefix`, for user `name` (password `pw`),
/// with the words in `drop` left out and `add` appended.
fn guide_rule(name: &str, prefix: &str, drop: &[&str], add: &[&str]) -> Vec<String> {
    let line = GUIDE
        .lines()
        .find_map(|l| l.trim().strip_prefix("ACL SETUSER "))
        .expect("the guide gives an `ACL SETUSER` rule");
    let mut words: Vec<String> = line
        .split_whitespace()
        .skip(1)
        .filter(|w| !drop.contains(w))
        .map(|w| {
            w.replace("~lock:*", &format!("~{prefix}*"))
                .replace("&lock:*", &format!("&{prefix}*"))
        })
        .map(|w| {
            if w.starts_with('>') {
                ">pw".to_owned()
            } else {
                w
            }
        })
        .collect();
    assert!(
        words.iter().any(|w| w == &format!("~{prefix}*")) || drop.contains(&"~lock:*"),
        "the rule limits the keys to the prefix: {words:?}"
    );
    words.extend(add.iter().map(|w| (*w).to_owned()));
    words.insert(0, name.to_owned());
    words
}

/// Defines the user of `rule` on `server`; its URL.
async fn user(server: &RedisServer, rule: &[String]) -> String {
    let () = server
        .query(redis::cmd("ACL").arg("SETUSER").arg(rule).clone())
        .await;
    format!("redis://{}:pw@127.0.0.1:{}/", rule[0], server.port())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_limited_to_the_prefix_by_the_guides_rule_lists_inspects_and_unlocks() {
    let server = shared_server();
    let url = user(&server, &guide_rule("ops", "acl:", &[], &[])).await;
    let app = holder(&server.url(), "acl:", "app-1").await;
    let a = app.lock("order:1").fenced().await.unwrap();
    let _b = app.lock("order:2").await.unwrap();
    let next = holder(&server.url(), "acl:", "app-2").await;
    let waiter = tokio::spawn({
        let next = next.clone();
        async move { next.lock("order:1").wait(support::SOON).await }
    });
    until_waiters(&app, "order:1", 1).await;
    // Locks of another prefix, out of the user's keys: not listed, not touched.
    let elsewhere = holder(&server.url(), "other:", "app-3").await;
    let _c = elsewhere.lock("order:1").await.unwrap();

    let base = ["--url", url.as_str(), "--prefix", "acl:", "--json"];
    let run = |more: &'static [&'static str]| {
        let args: Vec<&str> = base.iter().copied().chain(more.iter().copied()).collect();
        async move { admin(&args, None).await }
    };
    let listed = run(&["list"]).await;
    assert_eq!(listed.code, 0, "{listed:?}");
    assert_eq!(listed.json_lines().len(), 2, "{listed:?}");
    let inspected = run(&["inspect", "order:1"]).await;
    assert_eq!(inspected.code, 0, "{inspected:?}");
    let state = &inspected.json_lines()[0];
    assert_eq!(
        (state["holder"].as_str(), state["waiters"].as_u64()),
        (Some("app-1"), Some(1))
    );
    let unlocked = run(&["unlock", "order:1", "--yes"]).await;
    assert_eq!(unlocked.code, 0, "{unlocked:?}");
    assert_eq!(unlocked.json_lines()[0]["removed"]["holder"], "app-1");
    // The waiter is handed the lock: the hand-over ran under the user's permissions.
    let served = tokio::time::timeout(support::SOON, waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(served.fence().is_some_and(|f| f > a.fence().unwrap()) || served.fence().is_none());
    assert_eq!(
        app.inspect("order:1").await.unwrap().holder.as_deref(),
        Some("app-2")
    );
    // Nothing refused but the connect's probes of the server (INFO, CONFIG GET), which a
    // user without @dangerous may be refused (the library reads the policy if it can).
    let log: Vec<Vec<(String, redis::Value)>> =
        server.query(redis::cmd("ACL").arg("LOG").clone()).await;
    for entry in &log {
        let field = |name: &str| {
            entry
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        if field("username") != Some(redis::Value::BulkString(b"ops".to_vec())) {
            continue;
        }
        let probe = matches!(field("object"), Some(redis::Value::BulkString(o)) if o.as_slice() == b"info" || o.starts_with(b"config"));
        assert!(probe, "refused {entry:?}");
    }
    served.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_missing_a_permission_is_told_which_and_nothing_is_removed() {
    let server = shared_server();
    let app = holder(&server.url(), "np:", "app-1").await;
    let guard = app.lock("job").await.unwrap();
    for (name, drop, add, names) in [
        (
            "noscript",
            &["+@scripting"][..],
            &[][..],
            &["EVALSHA", "+@scripting"][..],
        ),
        (
            "nokeys",
            &["~lock:*"][..],
            &["~other:*"][..],
            &["~np:*"][..],
        ),
        ("notime", &["+time"][..], &[][..], &["TIME", "+time"][..]),
        ("nohvals", &[][..], &["-hvals"][..], &["HVALS"][..]),
        ("noread", &["+@read"][..], &[][..], &["+@read"][..]),
    ] {
        let mut rule = guide_rule(name, "np:", drop, add);
        if drop.contains(&"~lock:*") {
            rule.retain(|w| w != "~lock:*");
        }
        let url = user(&server, &rule).await;
        for command in [
            &["list"][..],
            &["inspect", "job"],
            &["unlock", "job", "--yes"],
        ] {
            // Only the reads run HVALS (an unlock --yes would succeed, and remove the lock).
            if name == "nohvals" && command[0] == "unlock" {
                continue;
            }
            let args: Vec<&str> = ["--url", url.as_str(), "--prefix", "np:"]
                .into_iter()
                .chain(command.iter().copied())
                .collect();
            let ran = admin(&args, None).await;
            println!("{name} {command:?}: {}", ran.stderr.trim());
            // Every command is refused as not permitted (never a generic failure, code 1).
            assert_eq!(ran.code, 5, "{name} {command:?}: {ran:?}");
            for wanted in names.iter().chain(&["docs/src/backends/redis.md"]) {
                assert!(
                    ran.stderr.to_lowercase().contains(&wanted.to_lowercase()),
                    "{name} {command:?} names {wanted}: {ran:?}"
                );
            }
            assert!(guard.is_held());
            assert_eq!(
                app.inspect("job").await.unwrap().holder.as_deref(),
                Some("app-1")
            );
        }
    }
    guard.release().await.unwrap();
}
