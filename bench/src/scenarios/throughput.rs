//! Many keys in parallel: `c` tasks, each locking and releasing its own keys in a loop, against
//! `redis-benchmark` SET at the same concurrency (and redis-rs SET with `c` tasks on one
//! connection, the same-client floor); Redis's CPU and the client's (this process's) per cycle
//! over the same windows; and Redis server time per uncontended cycle of each design (`INFO
//! commandstats`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use redis::aio::ConnectionManager;

use super::{Op, Plan};
use crate::designs::{Design, Kind};
use crate::server::Target;
use crate::stats::{CYCLE_REQUESTS, CommandStats};
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
    pub(crate) cycles: [f64; 3],
    /// Redis CPU (`INFO cpu`, user + sys) per cycle in µs, per design, over the same windows.
    pub(crate) cpu_us: [f64; 3],
    /// This process's CPU (user + sys) per cycle in µs, per design, over the same windows: the
    /// client's share of the machine.
    pub(crate) client_us: [f64; 3],
}

/// Many keys with the client and the server on cores of their own (as on separate hosts).
#[derive(Debug, Clone)]
pub(crate) struct Pinned {
    pub(crate) tasks: usize,
    /// The client's tokio runtime: `current` or `multi`.
    pub(crate) runtime: &'static str,
    /// Lock + release cycles/s per design, in `Kind::ALL` order (the median window).
    pub(crate) cycles: [f64; 3],
}

/// The many-keys section.
#[derive(Debug, Clone, Default)]
pub(crate) struct Throughput {
    pub(crate) levels: Vec<ManyKeys>,
    /// The pinned levels; empty when the server was not started by the bench (it cannot be
    /// pinned) or the machine has a single core.
    pub(crate) pinned: Vec<Pinned>,
    /// Redis server time per uncontended lock cycle (commandstats usec of the commands the
    /// client sent, see [`CYCLE_REQUESTS`]), per design in `Kind::ALL` order.
    pub(crate) server_us: [f64; 3],
    /// Cycles each design ran for `server_us` (on fresh keys).
    pub(crate) server_n: usize,
    /// Every command Redis ran per cycle, by name (in-script calls included), per design.
    pub(crate) server_calls: [String; 3],
}

/// The CPU time so far of these Redis servers (`used_cpu_sys` + `used_cpu_user`, summed), in
/// seconds.
async fn redis_cpu(servers: &mut [ConnectionManager]) -> Result<f64> {
    let mut sum = 0.0;
    for conn in servers {
        let info: String = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
        let field = |name: &str| {
            let v = info
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'));
            v.and_then(|v| v.trim().parse::<f64>().ok()).unwrap_or(0.0)
        };
        sum += field("used_cpu_sys") + field("used_cpu_user");
    }
    Ok(sum)
}

/// This process's CPU time so far (user + sys, all threads), in seconds, from
/// `/proc/self/stat` (in clock ticks of 1/100 s, the `USER_HZ` of Linux's `/proc`); 0 where it
/// cannot be read.
fn client_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime: fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// One window of [`throughput`]: operations/s, and the CPU µs per operation of the servers and
/// of this process.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Window {
    pub(crate) rate: f64,
    pub(crate) server_us: f64,
    pub(crate) client_us: f64,
}

/// Runs `op` in a loop on `tasks` tasks, each over its own keys; operations per second after
/// `warm`, and the CPU µs per operation of the servers `info` reaches and of this process over
/// the same time.
async fn throughput(
    op: &Op,
    tasks: usize,
    (warm, run): (Duration, Duration),
    info: &mut [ConnectionManager],
) -> Result<Window> {
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
    let cpu0 = redis_cpu(info).await?;
    let (c0, t0, client0) = (count.load(Ordering::Relaxed), Instant::now(), client_cpu());
    tokio::time::sleep(run).await;
    let (c1, elapsed) = (count.load(Ordering::Relaxed), t0.elapsed());
    let client = client_cpu() - client0;
    let cpu = redis_cpu(info).await? - cpu0;
    stop.store(true, Ordering::Relaxed);
    while let Some(joined) = set.join_next().await {
        joined??;
    }
    let ops = (c1 - c0).max(1) as f64;
    Ok(Window {
        rate: ops / elapsed.as_secs_f64(),
        server_us: cpu * 1e6 / ops,
        client_us: client * 1e6 / ops,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Each contender at `tasks` tasks in `plan.throughput_passes` windows, in turn, so a burst of
/// background load hits all of them alike: per contender, the median window's operations/s,
/// and the median CPU µs per operation of the servers `info` reaches and of this process.
pub(crate) async fn passes(
    plan: &Plan,
    contenders: &[Op],
    tasks: usize,
    info: &mut [ConnectionManager],
) -> Result<Vec<Window>> {
    let window = plan.throughput_run / u32::try_from(plan.throughput_passes).unwrap_or(1);
    let mut windows = vec![Vec::new(); contenders.len()];
    for _ in 0..plan.throughput_passes {
        for (op, windows) in contenders.iter().zip(windows.iter_mut()) {
            let times = (plan.throughput_warm, window);
            windows.push(throughput(op, tasks, times, info).await?);
        }
    }
    let medians = windows.into_iter().map(|w| Window {
        rate: median(w.iter().map(|w| w.rate).collect()),
        server_us: median(w.iter().map(|w| w.server_us).collect()),
        client_us: median(w.iter().map(|w| w.client_us).collect()),
    });
    Ok(medians.collect())
}

/// Redis server time per uncontended lock cycle of each design, on fresh keys, in
/// interleaved rounds: the commandstats usec of the commands the clients sent.
async fn server_time(
    plan: &Plan,
    designs: &[Op],
    info: &mut ConnectionManager,
) -> Result<([f64; 3], [String; 3])> {
    let run = format!("{:08x}", getrandom::u32().unwrap_or(0));
    let per_round = (plan.latency_n / plan.rounds).max(1);
    let mut deltas = [(); 3].map(|()| CommandStats::default());
    for round in 0..plan.rounds {
        for (d, (op, delta)) in designs.iter().zip(deltas.iter_mut()).enumerate() {
            let before = CommandStats::fetch(info).await?;
            for i in 0..per_round {
                op.once(&format!("st:{run}:{d}:{round}:{i}")).await?;
            }
            *delta = delta.plus(&CommandStats::fetch(info).await?.since(&before));
        }
    }
    let n = per_round * plan.rounds;
    let usec = deltas
        .each_ref()
        .map(|d| d.usec(CYCLE_REQUESTS) as f64 / n as f64);
    let n = u64::try_from(n).unwrap_or(u64::MAX);
    Ok((usec, deltas.map(|d| d.breakdown(n, &d.names()))))
}

pub(crate) async fn many_keys(plan: &Plan, target: &Target) -> Result<Throughput> {
    let mut contenders = vec![Op::Set(target.manager().await?)];
    for kind in Kind::ALL {
        contenders.push(Op::Cycle(Design::connect(kind, target, LEASE).await?));
    }
    let mut info = target.manager().await?;
    progress("  server time per uncontended cycle (commandstats)");
    let (server_us, server_calls) = server_time(plan, &contenders[1..], &mut info).await?;
    let mut levels = Vec::new();
    for &tasks in &plan.concurrency {
        progress(&format!("  {tasks} tasks"));
        let requests = (plan.benchmark_requests)(tasks);
        // redis-benchmark before and after the passes; the mean of the two.
        let first = target.redis_benchmark_set(tasks, requests / 2).await?;
        let one = std::slice::from_mut(&mut info);
        let medians = passes(plan, &contenders, tasks, one).await?;
        let second = target.redis_benchmark_set(tasks, requests / 2).await?;
        levels.push(ManyKeys {
            tasks,
            redis_benchmark: first.zip(second).map(|(a, b)| (a + b) / 2.0),
            redisrs_set: medians[0].rate,
            cycles: [1, 2, 3].map(|i| medians[i].rate),
            cpu_us: [1, 2, 3].map(|i| medians[i].server_us),
            client_us: [1, 2, 3].map(|i| medians[i].client_us),
        });
    }
    let pinned = pinned(plan, target).await?;
    Ok(Throughput {
        levels,
        pinned,
        server_us,
        server_n: (plan.latency_n / plan.rounds).max(1) * plan.rounds,
        server_calls,
    })
}

/// The pinned levels: the redis-server (every thread) on the first core, each design's client a
/// process of its own (`lock-bench --rate`) on the second, at each of `plan.concurrency` tasks on
/// a current-thread and on a multi-thread runtime, the designs' windows in turn over
/// `plan.throughput_passes` passes. The server's affinity is given back to every core after.
async fn pinned(plan: &Plan, target: &Target) -> Result<Vec<Pinned>> {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let Some(pid) = target.started.as_ref().and_then(|s| s.pid()) else {
        return Ok(Vec::new());
    };
    if cores < 2 {
        return Ok(Vec::new());
    }
    let pid = pid.to_string();
    taskset(&["-a", "-p", "-c", "0", &pid]).await?;
    let measured = async {
        let exe = std::env::current_exe()?;
        let window = plan.throughput_run / u32::try_from(plan.throughput_passes).unwrap_or(1);
        let ms = |d: Duration| d.as_millis().to_string();
        let (warm, window) = (ms(plan.throughput_warm), ms(window));
        let mut out = Vec::new();
        for &tasks in &plan.concurrency {
            for runtime in ["current", "multi"] {
                progress(&format!(
                    "  pinned: {tasks} tasks, {runtime}-thread runtime"
                ));
                let mut rates = [(); 3].map(|()| Vec::new());
                for _ in 0..plan.throughput_passes {
                    for (kind, rates) in Kind::ALL.iter().zip(rates.iter_mut()) {
                        let tasks = tasks.to_string();
                        let keys = KEYS_PER_TASK.to_string();
                        let run = tokio::process::Command::new("taskset")
                            .args(["-c", "1"])
                            .arg(&exe)
                            .arg(crate::cycles::RATE_FLAG)
                            .args([kind.name(), &tasks, &keys, runtime, &warm, &window])
                            .env("REDIS_URL", &target.url)
                            .kill_on_drop(true)
                            .output()
                            .await?;
                        let said = String::from_utf8_lossy(&run.stdout);
                        let rate = said.trim().parse::<f64>().map_err(|_| {
                            let err = String::from_utf8_lossy(&run.stderr);
                            format!(
                                "lock-bench --rate {} failed ({}): {err}",
                                kind.name(),
                                run.status
                            )
                        })?;
                        rates.push(rate);
                    }
                }
                out.push(Pinned {
                    tasks,
                    runtime,
                    cycles: rates.map(median),
                });
            }
        }
        Ok::<_, crate::BoxError>(out)
    }
    .await;
    taskset(&["-a", "-p", "-c", &format!("0-{}", cores - 1), &pid]).await?;
    measured
}

/// Runs `taskset` with these arguments (util-linux; on every Debian).
async fn taskset(args: &[&str]) -> Result<()> {
    let run = tokio::process::Command::new("taskset")
        .args(args)
        .output()
        .await
        .map_err(|e| format!("taskset (util-linux) could not run: {e}"))?;
    if !run.status.success() {
        let err = String::from_utf8_lossy(&run.stderr);
        return Err(format!("taskset {}: {err}", args.join(" ")).into());
    }
    Ok(())
}
