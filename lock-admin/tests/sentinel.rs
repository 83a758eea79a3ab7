//! `lock-admin` through Sentinel (`redis+sentinel://s1,s2,s3/MASTER`): the sentinels name the
//! primary, and the commands reach the locks on it.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed expectation fails the test"
)]

mod support;

use lock_testkit::sentinel::RedisSentinelSet;
use support::{admin, holder};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_inspect_and_unlock_through_sentinel() {
    let set = RedisSentinelSet::builder().replicas(1).start().await;
    let hosts: Vec<String> = set
        .sentinel_urls()
        .iter()
        .map(|u| {
            u.trim_start_matches("redis://")
                .trim_end_matches('/')
                .to_owned()
        })
        .collect();
    let url = format!("redis+sentinel://{}/{}", hosts.join(","), set.master_name());
    let app = holder(&set.primary().url(), "st:", "primary-app").await;
    let guard = app.lock("job").fenced().await.unwrap();
    let base = ["--url", url.as_str(), "--prefix", "st:", "--json"];
    let run = |more: &'static [&'static str]| {
        let args: Vec<&str> = base.iter().copied().chain(more.iter().copied()).collect();
        async move { admin(&args, None).await }
    };
    let listed = run(&["list"]).await;
    assert_eq!(listed.code, 0, "{listed:?}");
    assert_eq!(listed.json_lines()[0]["key"], "job");
    let inspected = run(&["inspect", "job"]).await;
    assert_eq!(inspected.json_lines()[0]["fence"], guard.fence().unwrap());
    let removed = run(&["unlock", "job", "--yes"]).await;
    assert_eq!(removed.code, 0, "{removed:?}");
    assert_eq!(removed.json_lines()[0]["removed"]["holder"], "primary-app");
    assert!(!app.inspect("job").await.unwrap().held);
}
