//! The scenarios, the plan of a quick or full run, and the run itself.

mod handoff;
mod hot;
mod latency;
mod layer;
mod throughput;
mod watchdog;

use std::time::Duration;

use crate::designs::Kind;
use crate::machine::Machine;
use crate::report::{self, Results};
use crate::server::Target;
use crate::stats::CommandStats;
use crate::{Options, Result, progress};

pub(crate) use handoff::{Handoff, HandoffFloors};
pub(crate) use hot::HotFigures;
pub(crate) use latency::{Memory, Uncontended};
pub(crate) use layer::Layer;
pub(crate) use throughput::ManyKeys;
pub(crate) use watchdog::Watchdog;

/// Sample counts and durations of one run.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) quick: bool,
    /// Sequential latency samples per measured operation (PING, SET, lock + release).
    pub(crate) latency_n: usize,
    /// Latency measurements are split in this many rounds, each measuring every operation in
    /// turn, so a burst of background load hits all of them alike.
    pub(crate) rounds: usize,
    pub(crate) warmup: usize,
    pub(crate) memory_n: usize,
    pub(crate) concurrency: Vec<usize>,
    pub(crate) throughput_warm: Duration,
    /// Measured time per contender, split in `throughput_passes` windows.
    pub(crate) throughput_run: Duration,
    pub(crate) throughput_passes: usize,
    /// `redis-benchmark -n` for `c` clients.
    pub(crate) benchmark_requests: fn(usize) -> usize,
    /// Handoff samples per design (ours, seed, rslock) and warm-up rounds.
    pub(crate) handoff_n: [usize; 3],
    pub(crate) handoff_warm: usize,
    /// The holder keeps the lock for a random time in this range after the waiter started, so
    /// a polling waiter is at a random phase of its sleep when the release comes.
    pub(crate) hold: (Duration, Duration),
    pub(crate) waiters: Vec<usize>,
    pub(crate) hot_warm: Duration,
    pub(crate) hot_run: Duration,
    pub(crate) watchdog_locks: usize,
    pub(crate) watchdog_lease: Duration,
    pub(crate) watchdog_window: Duration,
    pub(crate) layer_n: usize,
}

impl Plan {
    pub(crate) fn new(quick: bool) -> Self {
        if quick {
            Plan {
                quick,
                latency_n: 120,
                rounds: 2,
                warmup: 20,
                memory_n: 5_000,
                concurrency: vec![16, 64, 256],
                throughput_warm: Duration::from_millis(20),
                throughput_run: Duration::from_millis(60),
                throughput_passes: 2,
                benchmark_requests: |c| (c * 10).max(2_000),
                handoff_n: [20, 10, 3],
                handoff_warm: 2,
                hold: (Duration::from_millis(2), Duration::from_millis(12)),
                waiters: vec![1, 10, 100],
                hot_warm: Duration::from_millis(30),
                hot_run: Duration::from_millis(100),
                watchdog_locks: 1000,
                watchdog_lease: Duration::from_secs(1),
                watchdog_window: Duration::from_millis(700),
                layer_n: 2_000,
            }
        } else {
            Plan {
                quick,
                latency_n: 5_000,
                rounds: 25,
                warmup: 300,
                memory_n: 300_000,
                concurrency: vec![16, 64, 256],
                throughput_warm: Duration::from_millis(150),
                throughput_run: Duration::from_secs(2),
                throughput_passes: 4,
                benchmark_requests: |c| (c * 500).max(150_000),
                handoff_n: [800, 300, 100],
                handoff_warm: 20,
                hold: (Duration::from_millis(2), Duration::from_millis(12)),
                waiters: vec![1, 10, 100],
                hot_warm: Duration::from_millis(300),
                hot_run: Duration::from_secs(2),
                watchdog_locks: 1000,
                watchdog_lease: Duration::from_secs(3),
                watchdog_window: Duration::from_secs(6),
                layer_n: 200_000,
            }
        }
    }
}

/// Runs every scenario against one Redis and writes the report and the plot.
pub(crate) async fn run_all(options: &Options) -> Result<()> {
    let started = std::time::Instant::now();
    let plan = Plan::new(options.quick);
    // Fail now, not after minutes of measuring, if the report cannot be written.
    let dir = match options.out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    if !dir.is_dir() {
        return Err(format!(
            "cannot write the report to {}: {} is not a directory",
            options.out.display(),
            dir.display()
        )
        .into());
    }
    let mut machine = Machine::probe();
    let target = Target::open(options.redis_url.as_deref())?;
    let mut stats_conn = target.manager().await?;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut stats_conn)
        .await?;
    machine.redis_version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .map_or_else(|| "unknown".to_owned(), |v| v.trim().to_owned());
    machine.redis_where = match &target.started {
        Some(s) => format!(
            "started by the bench on 127.0.0.1:{} (no RDB/AOF, temporary dir)",
            s.port
        ),
        None => "given by --redis-url/REDIS_URL (shared: other clients may add load)".to_owned(),
    };
    progress(&format!(
        "{} mode; Redis {} at {}",
        if plan.quick { "quick" } else { "full" },
        machine.redis_version,
        target.url
    ));
    // Sanity: commandstats must be readable, the call-count figures depend on it.
    CommandStats::fetch(&mut stats_conn).await?;

    progress("latency: PING, SET, uncontended lock + release (Redis)");
    let uncontended = latency::redis_latencies(&plan, &target).await?;
    progress("latency: uncontended lock + release (memory)");
    let memory = latency::memory_latencies(&plan).await?;
    progress("throughput: many keys in parallel");
    let many = throughput::many_keys(&plan, &target).await?;
    progress("handoff across two processes");
    let (ours_handoff, handoff_floors) = handoff::ours_and_floors(&plan, &target).await?;
    let mut handoffs = vec![ours_handoff];
    for (kind, n) in [
        (Kind::Seed, plan.handoff_n[1]),
        (Kind::Rslock, plan.handoff_n[2]),
    ] {
        handoffs.push(handoff::peer(&plan, &target, kind, n).await?);
    }
    progress("hot key with waiters");
    let hot = hot::hot_keys(&plan, &target, &mut stats_conn).await?;
    progress("watchdog cost");
    let watchdog = watchdog::watchdog(&plan, &target, &mut stats_conn).await?;
    progress("layer overhead");
    let layer = layer::layer(&plan, &target).await?;

    machine.load_end = crate::machine::load_average();
    let results = Results {
        machine,
        plan,
        uncontended,
        memory,
        many,
        handoffs,
        handoff_floors,
        hot,
        watchdog,
        layer,
        elapsed: started.elapsed(),
    };
    report::write(&results, &options.out)?;
    drop(target);
    Ok(())
}

/// A uniformly random duration in `[lo, hi]`.
pub(crate) fn random_between(lo: Duration, hi: Duration) -> Duration {
    let r = getrandom::u32().unwrap_or(0);
    lo + (hi.saturating_sub(lo)).mul_f64(f64::from(r) / f64::from(u32::MAX))
}
