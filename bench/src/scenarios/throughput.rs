//! Many keys in parallel: `c` tasks, each locking and releasing its own keys in a loop, against
//! `redis-benchmark` SET at the same concurrency (and redis-rs SET with `c` tasks on one
//! connection, the same-client floor).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use super::{Op, Plan};
use crate::designs::{self, Design, Kind};
use crate::server::Target;
use crate::{Result, progress};

const LEASE: Duration = Duration::from_secs(30);
/// Keys per task (each task cycles through its own).
const KEYS_PER_TASK: usize = 4;

/// One concurrency level.
#[derive(Debug, Clone, Default)]
pub(crate) struct ManyKeys {
    pub(crate) tasks: usize,
    /// `redis-benchmark -t set -c tasks` requests/s; `None` when the binary is missing.
    pub(crate) redis_benchmark: Option<f64>,
    /// redis-rs SET/s with `tasks` tasks on one `ConnectionManager`.
    pub(crate) redisrs_set: f64,
    /// Lock + release cycles/s per design, in `Kind::ALL` order.
    pub(crate) cycles: Vec<(Kind, f64)>,
    /// Ours with `.watchdog(false)`.
    pub(crate) ours_no_watchdog: f64,
}

/// Runs `op` in a loop on `tasks` tasks, each over its own keys; operations per second after
/// `warm`.
async fn throughput(op: &Op, tasks: usize, warm: Duration, run: Duration) -> Result<f64> {
    let count = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut set = JoinSet::new();
    for t in 0..tasks {
        let (op, count, stop) = (op.clone(), count.clone(), stop.clone());
        let keys: Vec<String> = (0..KEYS_PER_TASK).map(|j| format!("mk:{t}:{j}")).collect();
        set.spawn(async move {
            for key in keys.iter().cycle() {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                op.once(key).await?;
                count.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<(), crate::BoxError>(())
        });
    }
    tokio::time::sleep(warm).await;
    let (c0, t0) = (count.load(Ordering::Relaxed), Instant::now());
    tokio::time::sleep(run).await;
    let (c1, elapsed) = (count.load(Ordering::Relaxed), t0.elapsed());
    stop.store(true, Ordering::Relaxed);
    while let Some(joined) = set.join_next().await {
        joined??;
    }
    Ok((c1 - c0) as f64 / elapsed.as_secs_f64())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

pub(crate) async fn many_keys(plan: &Plan, target: &Target) -> Result<Vec<ManyKeys>> {
    let mut contenders = vec![Op::Set(target.manager().await?)];
    for kind in Kind::ALL {
        contenders.push(Op::Cycle(Design::connect(kind, target, LEASE).await?));
    }
    let no_watchdog = designs::ours(target, LEASE, false).await?;
    contenders.push(Op::Cycle(Design::Ours(no_watchdog)));
    let window = plan.throughput_run / u32::try_from(plan.throughput_passes).unwrap_or(1);
    let mut out = Vec::new();
    for &tasks in &plan.concurrency {
        progress(&format!("  {tasks} tasks"));
        let requests = (plan.benchmark_requests)(tasks);
        // redis-benchmark before and after the passes; the mean of the two.
        let first = target.redis_benchmark_set(tasks, requests / 2).await?;
        let mut rates: Vec<Vec<f64>> = vec![Vec::new(); contenders.len()];
        // Every contender runs once per pass, in turn, so a burst of background load hits all
        // of them alike; the figure is the median pass.
        for _ in 0..plan.throughput_passes {
            for (op, rates) in contenders.iter().zip(rates.iter_mut()) {
                rates.push(throughput(op, tasks, plan.throughput_warm, window).await?);
            }
        }
        let second = target.redis_benchmark_set(tasks, requests / 2).await?;
        let mut medians = rates.into_iter().map(median);
        let mut next = || medians.next().unwrap_or(0.0);
        out.push(ManyKeys {
            tasks,
            redis_benchmark: first.zip(second).map(|(a, b)| (a + b) / 2.0),
            redisrs_set: next(),
            cycles: Kind::ALL.map(|k| (k, next())).to_vec(),
            ours_no_watchdog: next(),
        });
    }
    Ok(out)
}
