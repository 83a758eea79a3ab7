//! The benchmark harness keeps running: quick mode end to end against a real redis-server, and
//! its failure modes. Nothing here asserts on a measured figure: speed claims live in
//! BENCHMARKS.md, never in tests.

use std::path::PathBuf;
use std::process::Command;

/// Every row the report must carry, in order.
const ROWS: &[&str] = &[
    "Baseline: PING round trip",
    "Baseline: SET round trip",
    "Uncontended lock + release (Redis)",
    "Uncontended lock + release (memory)",
    "Client instructions per uncontended lock cycle, 1 task (callgrind)",
    "Many keys in parallel, 16 tasks (lock cycles/s)",
    "Many keys in parallel, 64 tasks (lock cycles/s)",
    "Many keys in parallel, 256 tasks (lock cycles/s)",
    "Many keys in parallel, pinned, 16 tasks, current-thread runtime (lock cycles/s)",
    "Many keys in parallel, pinned, 16 tasks, multi-thread runtime (lock cycles/s)",
    "Many keys in parallel, pinned, 256 tasks, multi-thread runtime (lock cycles/s)",
    "Redis server time per uncontended lock cycle (commandstats usec)",
    "Contended handoff across 2 processes (latency)",
    "Handoff: the waiter's own part (notification reached B → B's acquire returned)",
    "Handoff: speed-up over the polling designs (p50)",
    "Hot key, 1 waiter, 1 process",
    "Hot key, 10 waiters, 1 process",
    "Hot key, 10 waiters, 1 process: local hand-off on / off",
    "Hot key, 100 waiters, 1 process",
    "Hot key, 100 waiters, 1 process: local hand-off on / off",
    "Hot key, 1 waiter, 2 processes",
    "Hot key, 10 waiters, 2 processes",
    "Hot key, 10 waiters, 2 processes: wait of a waiter in the other process",
    "Hot key, 100 waiters, 2 processes",
    "Hot key, 100 waiters, 2 processes: wait of a waiter in the other process",
    "Watchdog: 1,000 held locks, renewal traffic",
    "Layer overhead per request (memory, distinct keys)",
    "Layer overhead per request (memory, one hot key)",
    "Layer overhead per request (Redis, distinct keys)",
    "Idempotency: replayed request, layer overhead (memory)",
    "Idempotency: replayed request (Redis)",
    "Redis Cluster, 3 primaries: many keys in parallel, 64 tasks (lock cycles/s)",
    "Redis Cluster, 3 primaries: many keys in parallel, 256 tasks (lock cycles/s)",
    "Redis Cluster, 3 primaries: uncontended lock + release",
    "Redlock, 5 servers: uncontended lock + release",
];

/// The etcd section's rows (six columns: scenario, ours, floor, ratio, goal, met?), when the
/// bench is built with its `etcd` feature.
const ETCD_ROWS: &[&str] = &[
    "etcd: Range round trip (linearizable read)",
    "etcd: Put round trip (one Raft write)",
    "etcd: uncontended lock + release",
    "etcd: contended handoff between two Lockers (latency)",
    "etcd: watchdog, 1,000 held locks on one Locker, traffic per tick",
];

/// The ZooKeeper section's rows (columns as etcd's), when the bench is built with its
/// `zookeeper` feature.
#[cfg(feature = "zookeeper")]
const ZOOKEEPER_ROWS: &[&str] = &[
    "ZooKeeper: exists round trip (read)",
    "ZooKeeper: set_data round trip (one write)",
    "ZooKeeper: uncontended lock + release",
    "ZooKeeper: contended handoff between two Lockers (latency)",
    "ZooKeeper: watchdog, 1,000 held locks on one Locker, traffic per tick",
];

fn scratch_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("lock-bench-{name}-{}", std::process::id()))
}

/// The bench runs of this file, one at a time: each starts its own servers (Redis, and etcd
/// and ZooKeeper for theirs) and holds 1,000 locks with short leases; side by side on a
/// 2-core machine they starved each other (a ZooKeeper watchdog lock not taken within its
/// 10 s wait), which is load, not what these tests check.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static BENCH: std::sync::Mutex<()> = std::sync::Mutex::new(());
    BENCH
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn bench() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lock-bench"));
    // Always the bench's own redis-server, whatever the environment points at.
    cmd.env_remove("REDIS_URL");
    cmd
}

#[test]
fn quick_mode_writes_every_scenario_row_and_the_plot() {
    let serial = one_at_a_time();
    let dir = scratch_dir("quick");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("BENCH.md");
    let run = bench()
        .arg("--quick")
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    drop(serial);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "lock-bench --quick failed:\n{stderr}");

    let md = std::fs::read_to_string(&out).unwrap();
    let (head, all) = md
        .split_once("## All figures")
        .unwrap_or_else(|| panic!("no `## All figures` section:\n{md}"));
    let table: Vec<&str> = all.lines().filter(|l| l.starts_with("| ")).collect();
    // The headline: every full row with a verdict (the etcd table's too), as scenario | ratio
    // | goal | verdict: the first cell and the last three.
    let headline: Vec<&str> = head
        .split_once("## Headline")
        .unwrap_or_else(|| panic!("no `## Headline` section:\n{md}"))
        .1
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| Scenario"))
        .collect();
    let judged: Vec<&str> = table
        .iter()
        .filter(|l| l.ends_with("| **yes** |") || l.ends_with("| **NO** |"))
        .copied()
        .collect();
    assert!(!judged.is_empty(), "no row with a verdict:\n{md}");
    assert_eq!(headline.len(), judged.len(), "{md}");
    for (short, full) in headline.iter().zip(&judged) {
        let cells: Vec<&str> = full.trim_matches('|').split(" | ").map(str::trim).collect();
        let [scenario, .., ratio, goal, verdict] = cells[..] else {
            panic!("a row with a verdict has too few cells: {full}");
        };
        let want = format!("| {scenario} | {ratio} | {goal} | {verdict} |");
        assert_eq!(*short, want);
    }
    let mut last = 0;
    for row in ROWS {
        let at = table
            .iter()
            .position(|l| l.starts_with(&format!("| {row} |")))
            .unwrap_or_else(|| panic!("row `{row}` missing from the report:\n{md}"));
        assert!(at >= last, "row `{row}` out of order");
        last = at;
        // Eight columns: scenario, ours, seed, rslock, floor, ratio, goal, met?
        assert_eq!(table[at].matches(" | ").count(), 7, "{}", table[at]);
    }
    let (all, etcd) = all
        .split_once("## etcd")
        .unwrap_or_else(|| panic!("no `## etcd` section:\n{md}"));
    assert!(
        all.contains("| Redlock, 5 servers"),
        "the etcd section comes last"
    );
    if cfg!(feature = "etcd") {
        for row in ETCD_ROWS {
            let line = etcd
                .lines()
                .find(|l| l.starts_with(&format!("| {row} |")))
                .unwrap_or_else(|| panic!("etcd row `{row}` missing from the report:\n{md}"));
            // Six columns: scenario, ours, floor, ratio, goal, met?
            assert_eq!(line.matches(" | ").count(), 5, "{line}");
        }
        assert!(etcd.contains("--features etcd -- --only etcd"), "{etcd}");
    } else {
        assert!(etcd.contains("built without the `etcd` feature"), "{etcd}");
    }
    for section in [
        "## Machine",
        "| redis-server | ",
        "| load average",
        "| mode | quick",
    ] {
        assert!(md.contains(section), "`{section}` missing:\n{md}");
    }
    assert!(
        md.contains("(BENCH-handoff.svg)"),
        "the report must link the plot"
    );

    let svg = std::fs::read_to_string(dir.join("BENCH-handoff.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert_eq!(
        svg.matches("<polyline").count(),
        3,
        "ours, seed and rslock curves"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The standard output of a successful `lock-bench --quick --only section`.
#[allow(
    clippy::unwrap_used,
    reason = "a test helper: a bench that cannot be started fails the test"
)]
fn partial_run(section: &str) -> String {
    let _serial = one_at_a_time();
    let run = bench()
        .args(["--quick", "--only", section])
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    String::from_utf8_lossy(&run.stdout).into_owned()
}

#[test]
fn a_partial_run_prints_its_rows_and_the_note() {
    let stdout = partial_run("watchdog");
    assert!(
        stdout.starts_with("| Watchdog: 1,000 held locks"),
        "{stdout}"
    );
    assert!(
        stdout.contains("**partial run** (`lock-bench --only watchdog`"),
        "{stdout}"
    );
}

/// A consensus section alone (`--only section`): exactly its `rows`, in order, and the note
/// naming the server the bench started for it (`server`).
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
fn assert_partial_section(section: &str, rows: &[&str], server: &str) {
    let stdout = partial_run(section);
    let lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with("| ")).collect();
    assert_eq!(lines.len(), rows.len(), "{stdout}");
    for (line, row) in lines.iter().zip(rows) {
        assert!(line.starts_with(&format!("| {row} |")), "{line}");
    }
    let note = format!("(`lock-bench --only {section}`, quick-mode sample counts, {server}");
    assert!(stdout.contains(&note), "{stdout}");
}

/// The etcd section alone: its rows, from an etcd member the bench started.
#[cfg(feature = "etcd")]
#[test]
fn a_partial_etcd_run_prints_its_rows_and_names_its_member() {
    assert_partial_section("etcd", ETCD_ROWS, "its own etcd member");
}

/// The ZooKeeper section alone: its rows, from a ZooKeeper server the bench started.
#[cfg(feature = "zookeeper")]
#[test]
fn a_partial_zookeeper_run_prints_its_rows_and_names_its_server() {
    assert_partial_section("zookeeper", ZOOKEEPER_ROWS, "its own ZooKeeper server");
}

#[test]
fn missing_redis_server_names_the_install_command() {
    let dir = scratch_dir("nopath");
    std::fs::create_dir_all(&dir).unwrap();
    let run = bench()
        .arg("--quick")
        .arg("--out")
        .arg(dir.join("B.md"))
        .env("PATH", &dir) // an empty directory: no redis-server, no redis-benchmark
        // ... and no fallback: the test kit also looks at /usr/bin, unless told a binary.
        .env("LOCK_TESTS_REDIS_SERVER", dir.join("redis-server"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success());
    assert!(
        stderr.contains("apt-get install -y redis-server"),
        "unhelpful error: {stderr}"
    );
    assert!(!dir.join("B.md").exists(), "no report from a failed run");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_arguments_print_usage() {
    let run = bench().arg("--frobnicate").output().unwrap();
    assert_eq!(run.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains("unknown argument `--frobnicate`") && stderr.contains("usage: lock-bench")
    );

    let run = bench()
        .arg("--out")
        .arg("/nonexistent-dir/B.md")
        .arg("--quick")
        .output()
        .unwrap();
    assert!(!run.status.success());
    assert!(String::from_utf8_lossy(&run.stderr).contains("is not a directory"));
}
