//! Many keys in parallel: `c` tasks, each locking and releasing its own keys in a loop, against
//! `redis-benchmark` SET at the same concurrency (and redis-rs SET with `c` tasks on one
//! connection, the same-client floor).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lock_core::{Locker, RedisBackend};
use tokio::task::JoinSet;

use super::Plan;
use crate::designs::{Design, Kind};
use crate::server::Target;
use crate::{Result, progress};

const LEASE: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_secs(5);
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

/// Runs `op(task, iteration)` in a loop on `tasks` tasks; operations per second after `warm`.
async fn throughput<F, Fut>(tasks: usize, warm: Duration, run: Duration, op: F) -> Result<f64>
where
    F: Fn(usize, usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<()>> + Send + 'static,
{
    let count = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut set = JoinSet::new();
    for t in 0..tasks {
        let (op, count, stop) = (op.clone(), count.clone(), stop.clone());
        set.spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                op(t, i).await?;
                count.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
            Ok::<(), crate::BoxError>(())
        });
    }
    tokio::time::sleep(warm).await;
    let c0 = count.load(Ordering::Relaxed);
    let t0 = Instant::now();
    tokio::time::sleep(run).await;
    let c1 = count.load(Ordering::Relaxed);
    let elapsed = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    while let Some(joined) = set.join_next().await {
        joined??;
    }
    Ok((c1 - c0) as f64 / elapsed.as_secs_f64())
}

fn task_keys(prefix: &str, tasks: usize) -> Arc<Vec<Vec<String>>> {
    Arc::new(
        (0..tasks)
            .map(|t| {
                (0..KEYS_PER_TASK)
                    .map(|j| format!("{prefix}:{t}:{j}"))
                    .collect()
            })
            .collect(),
    )
}

/// What one task does per iteration.
#[derive(Clone)]
enum Op {
    /// redis-rs SET (the same-client floor).
    Set(redis::aio::ConnectionManager),
    /// Lock + release through a design.
    Cycle(Design),
    /// Ours with `.watchdog(false)`.
    NoWatchdog(Locker),
}

impl Op {
    async fn once(&self, key: &str) -> Result<()> {
        match self {
            Op::Set(conn) => {
                let mut c = conn.clone();
                redis::cmd("SET")
                    .arg(format!("bench:{key}"))
                    .arg("x")
                    .query_async::<String>(&mut c)
                    .await?;
                Ok(())
            }
            Op::Cycle(d) => {
                let held = d.lock(key, WAIT).await?;
                d.release(held).await
            }
            Op::NoWatchdog(l) => {
                l.lock(key).wait(WAIT).await?.release().await?;
                Ok(())
            }
        }
    }
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
    contenders.push(Op::NoWatchdog(
        Locker::builder(RedisBackend::connect(&target.url).await?)
            .lease(LEASE)
            .watchdog(false)
            .try_build()?,
    ));
    let mut out = Vec::new();
    for &tasks in &plan.concurrency {
        progress(&format!("  {tasks} tasks"));
        let keys = task_keys("mk", tasks);
        let requests = (plan.benchmark_requests)(tasks);
        // redis-benchmark before and after the passes; the mean of the two.
        let first = target.redis_benchmark_set(tasks, requests / 2).await?;
        let mut rates: Vec<Vec<f64>> = vec![Vec::new(); contenders.len()];
        // Every contender runs once per pass, in turn, so a burst of background load hits all
        // of them alike; the figure is the median pass.
        for _ in 0..plan.throughput_passes {
            for (op, rates) in contenders.iter().zip(rates.iter_mut()) {
                let op = op.clone();
                let keys = keys.clone();
                let window =
                    plan.throughput_run / u32::try_from(plan.throughput_passes).unwrap_or(1);
                rates.push(
                    throughput(tasks, plan.throughput_warm, window, move |t, i| {
                        let op = op.clone();
                        let keys = keys.clone();
                        async move { op.once(&keys[t][i % KEYS_PER_TASK]).await }
                    })
                    .await?,
                );
            }
        }
        let second = target.redis_benchmark_set(tasks, requests / 2).await?;
        let redis_benchmark = first.zip(second).map(|(a, b)| (a + b) / 2.0);
        let mut medians = rates.into_iter().map(median);
        let redisrs_set = medians.next().unwrap_or(0.0);
        let cycles = Kind::ALL
            .into_iter()
            .map(|k| (k, medians.next().unwrap_or(0.0)))
            .collect();
        let ours_no_watchdog = medians.next().unwrap_or(0.0);
        out.push(ManyKeys {
            tasks,
            redis_benchmark,
            redisrs_set,
            cycles,
            ours_no_watchdog,
        });
    }
    Ok(out)
}
