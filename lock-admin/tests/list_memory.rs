//! `lock-admin list` over 100,000 held locks prints every one and stays bounded in memory: the
//! child's peak resident set (VmHWM, read from /proc while it runs) stays within a few MB of
//! the same binary's at rest, far below what holding the 100,000 states would take. Its own
//! test binary and server: no other child of this process, no other keys.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout,
    reason = "test code: a failed expectation fails the test; figures are printed for the notes"
)]

mod support;

use std::time::Instant;

use lock_core::LockState;
use lock_testkit::RedisServer;
use support::{exit_code, spawn, stdout_of};

const LOCKS: usize = 100_000;
const HOLDER: &str = "bulk loader";

/// The peak resident set of process `pid` so far, in KiB (`None` once it has exited).
fn peak_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_100_000_locks_prints_them_all_in_bounded_memory() {
    let loading = Instant::now();
    let server = RedisServer::start();
    let url = server.url();
    // Written straight into Redis as held locks look (a token, a stamp and a holder; see
    // lock-core's tests/operations.rs), with a fence counter each and as many keys of
    // another prefix, which the listing skips. A script writes them server-side: a pipeline
    // from this debug build took 9 s.
    let fill = redis::Script::new(
        r"
        for i = tonumber(ARGV[1]), tonumber(ARGV[2]) - 1 do
          local key = 'bulk:{job:' .. i .. '}'
          redis.call('SET', key, string.format('%032x|1764000000000|', i) .. ARGV[3] .. '|', 'PX', 600000)
          redis.call('SET', key .. ':fence', 7)
          redis.call('SET', 'other:{job:' .. i .. '}', 'x')
        end
        return 1",
    );
    let mut conn = server.client().await;
    for from in (0..LOCKS).step_by(20_000) {
        let done: i64 = fill
            .arg(from)
            .arg(from + 20_000)
            .arg(HOLDER)
            .invoke_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(done, 1);
    }
    println!("wrote {LOCKS} locks in {:?}", loading.elapsed());
    // The binary at rest: connected, one lock inspected, waiting for the next look.
    let mut resting = spawn(&[
        "--url",
        &url,
        "--prefix",
        "bulk:",
        "--json",
        "watch",
        "job:1",
        "--interval",
        "1h",
    ]);
    let pid = resting.id().unwrap();
    let first = stdout_of(&mut resting)
        .next()
        .await
        .expect("the first look");
    assert!(first.contains(HOLDER), "{first}");
    let rest_kib = peak_kib(pid).expect("the watch runs");
    resting.kill().await.unwrap();

    println!("loaded {LOCKS} locks; the binary at rest: {rest_kib} KiB");
    let start = Instant::now();
    let mut listing = spawn(&[
        "--url", &url, "--prefix", "bulk:", "--json", "list", "job:*",
    ]);
    let pid = listing.id().unwrap();
    let mut lines = stdout_of(&mut listing);
    let (mut count, mut peak) = (0_usize, 0_u64);
    let mut keys = std::collections::HashSet::new();
    while let Some(line) = lines.next().await {
        count += 1;
        // Sampled as it runs (a process that has exited has no VmHWM left to read).
        if count % 1_000 == 0 {
            peak = peak.max(peak_kib(pid).unwrap_or(0));
        }
        if count % 1_000 == 1 {
            let state: serde_json::Value = serde_json::from_str(&line).unwrap();
            assert_eq!(
                (state["holder"].as_str(), state["fence"].as_u64()),
                (Some(HOLDER), Some(7))
            );
            assert!(
                state["held_for_ms"].is_u64() && state["remaining_ms"].is_u64(),
                "{line}"
            );
        }
        // The key, without parsing every line in this debug build.
        let key = line
            .split_once(r#""key":""#)
            .and_then(|(_, rest)| rest.split_once('"'))
            .map(|(key, _)| key.to_owned());
        keys.insert(key.unwrap_or_else(|| panic!("no key in {line}")));
    }
    let elapsed = start.elapsed();
    assert_eq!(exit_code(&mut listing).await, 0);
    assert_eq!(count, LOCKS, "one line per held lock");
    assert_eq!(keys.len(), LOCKS, "each lock once");

    // What holding the states would take at the least: each state's struct and its two
    // strings (no allocator overhead, no JSON).
    let held_kib = (LOCKS * (std::mem::size_of::<LockState>() + "job:99999".len() + HOLDER.len())
        / 1024) as u64;
    println!(
        "listed {count} locks in {elapsed:?}: peak RSS {peak} KiB, {rest_kib} KiB at rest; holding the states would take at least {held_kib} KiB more"
    );
    assert!(
        peak < rest_kib + held_kib / 4,
        "peak {peak} KiB, {rest_kib} KiB at rest: the listing grew by more than a quarter of the {held_kib} KiB the 100,000 states take"
    );
}
