//! Sequential latencies: PING and SET (the floor), uncontended lock + release on Redis for the
//! three designs, and on the memory backend.

use std::future::Future;
use std::time::{Duration, Instant};

use lock_core::{Locker, RedisBackend};

use super::Plan;
use crate::Result;
use crate::designs::{Design, Kind};
use crate::server::Target;
use crate::stats::{CommandStats, Latencies};

/// The lease of the uncontended scenarios (long enough never to matter).
const LEASE: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_secs(5);
/// Keys cycled through by the uncontended loops.
const KEYS: usize = 16;

/// Uncontended figures on Redis.
#[derive(Debug, Clone, Default)]
pub(crate) struct Uncontended {
    pub(crate) ping: Latencies,
    pub(crate) set: Latencies,
    /// Lock + release, per design, in `Kind::ALL` order.
    pub(crate) lock_release: Vec<(Kind, Latencies)>,
    /// Ours, the two halves of the cycle measured apart.
    pub(crate) ours_acquire: Latencies,
    pub(crate) ours_release: Latencies,
    /// Ours with `.watchdog(false)`: what the watchdog's bookkeeping costs per cycle.
    pub(crate) ours_no_watchdog: Latencies,
    /// Server-side µs (`INFO commandstats` usec): per PING, per SET, per acquire of ours and per
    /// release of ours (every command each one ran, script-internal ones included).
    pub(crate) server_us: [f64; 4],
}

/// Uncontended figures on the memory backend.
#[derive(Debug, Clone, Default)]
pub(crate) struct Memory {
    pub(crate) lock_release: Latencies,
    pub(crate) no_watchdog: Latencies,
    pub(crate) acquire: Latencies,
    pub(crate) release: Latencies,
}

/// Times `n` calls of `op` (the future is built before the clock starts).
async fn time_each<F, Fut>(
    n: usize,
    offset: usize,
    mut op: F,
    out: &mut Vec<Duration>,
) -> Result<()>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    for i in 0..n {
        let fut = op(offset + i);
        let t = Instant::now();
        fut.await?;
        out.push(t.elapsed());
    }
    Ok(())
}

fn keys(prefix: &str) -> Vec<String> {
    (0..KEYS).map(|i| format!("{prefix}:{i}")).collect()
}

pub(crate) async fn redis_latencies(plan: &Plan, target: &Target) -> Result<Uncontended> {
    let conn = target.manager().await?;
    let mut designs = Vec::new();
    for kind in Kind::ALL {
        designs.push((kind, Design::connect(kind, target, LEASE).await?));
    }
    let ours = Locker::builder(RedisBackend::connect(&target.url).await?)
        .lease(LEASE)
        .try_build()?;
    let ours_nowd = Locker::builder(RedisBackend::connect(&target.url).await?)
        .lease(LEASE)
        .watchdog(false)
        .try_build()?;
    let keys = keys("uc");
    let set_keys = keys
        .iter()
        .map(|k| format!("bench:{k}"))
        .collect::<Vec<_>>();

    let mut ping = Vec::new();
    let mut set = Vec::new();
    let mut cycles: Vec<Vec<Duration>> = vec![Vec::new(); designs.len()];
    let mut acquire = Vec::new();
    let mut release = Vec::new();
    let mut nowd = Vec::new();
    let per_round = plan.latency_n / plan.rounds;
    // Round 0 is the warm-up: connections, scripts, caches; its samples are dropped.
    for round in 0..=plan.rounds {
        let n = if round == 0 { plan.warmup } else { per_round };
        let mut scratch = Vec::new();
        let keep = round > 0;
        {
            let out = if keep { &mut ping } else { &mut scratch };
            time_each(
                n,
                0,
                |_| {
                    let mut c = conn.clone();
                    async move {
                        redis::cmd("PING").query_async::<String>(&mut c).await?;
                        Ok(())
                    }
                },
                out,
            )
            .await?;
        }
        {
            let out = if keep { &mut set } else { &mut scratch };
            time_each(
                n,
                0,
                |i| {
                    let mut c = conn.clone();
                    let k = set_keys[i % KEYS].clone();
                    async move {
                        redis::cmd("SET")
                            .arg(k)
                            .arg("x")
                            .query_async::<String>(&mut c)
                            .await?;
                        Ok(())
                    }
                },
                out,
            )
            .await?;
        }
        for ((_, design), samples) in designs.iter().zip(cycles.iter_mut()) {
            let out = if keep { samples } else { &mut scratch };
            time_each(
                n,
                0,
                |i| {
                    let d = design.clone();
                    let k = keys[i % KEYS].clone();
                    async move {
                        let held = d.lock(&k, WAIT).await?;
                        d.release(held).await
                    }
                },
                out,
            )
            .await?;
        }
        for i in 0..n {
            let k = &keys[i % KEYS];
            let t = Instant::now();
            let guard = ours.lock(k).wait(WAIT).await?;
            let t_acq = t.elapsed();
            let t = Instant::now();
            guard.release().await?;
            let t_rel = t.elapsed();
            if keep {
                acquire.push(t_acq);
                release.push(t_rel);
            }
        }
        {
            let out = if keep { &mut nowd } else { &mut scratch };
            time_each(
                n,
                0,
                |i| {
                    let l = ours_nowd.clone();
                    let k = keys[i % KEYS].clone();
                    async move {
                        let g = l.lock(&k).wait(WAIT).await?;
                        g.release().await?;
                        Ok(())
                    }
                },
                out,
            )
            .await?;
        }
    }
    // Server-side cost per call (commandstats usec) of each step alone, between snapshots:
    // PINGs, SETs, our acquires (of distinct keys, held), then their releases.
    let mut info = conn.clone();
    let n = per_round.max(100);
    let s0 = CommandStats::fetch(&mut info).await?;
    for _ in 0..n {
        redis::cmd("PING").query_async::<String>(&mut info).await?;
    }
    let s1 = CommandStats::fetch(&mut info).await?;
    for k in set_keys.iter().cycle().take(n) {
        redis::cmd("SET")
            .arg(k)
            .arg("x")
            .query_async::<String>(&mut info)
            .await?;
    }
    let s2 = CommandStats::fetch(&mut info).await?;
    let mut guards = Vec::with_capacity(n);
    for i in 0..n {
        guards.push(ours.lock(format!("srv:{i}")).wait(WAIT).await?);
    }
    let s3 = CommandStats::fetch(&mut info).await?;
    for g in guards {
        g.release().await?;
    }
    let s4 = CommandStats::fetch(&mut info).await?;
    Ok(Uncontended {
        server_us: [
            s1.usec_per_call_since(&s0, "ping"),
            s2.usec_per_call_since(&s1, "set"),
            s3.usec_total_since(&s2) as f64 / n as f64,
            s4.usec_total_since(&s3) as f64 / n as f64,
        ],
        ping: Latencies::from_durations(&ping),
        set: Latencies::from_durations(&set),
        lock_release: designs
            .iter()
            .map(|(k, _)| *k)
            .zip(cycles.iter().map(|c| Latencies::from_durations(c)))
            .collect(),
        ours_acquire: Latencies::from_durations(&acquire),
        ours_release: Latencies::from_durations(&release),
        ours_no_watchdog: Latencies::from_durations(&nowd),
    })
}

pub(crate) async fn memory_latencies(plan: &Plan) -> Result<Memory> {
    let keys = keys("mem");
    let mut results = Vec::new();
    for watchdog in [true, false] {
        let locker = Locker::builder(lock_core::MemoryBackend::new())
            .lease(LEASE)
            .watchdog(watchdog)
            .try_build()?;
        let mut samples = Vec::with_capacity(plan.memory_n);
        let mut scratch = Vec::new();
        for (n, out) in [
            (plan.memory_n / 10, &mut scratch),
            (plan.memory_n, &mut samples),
        ] {
            time_each(
                n,
                0,
                |i| {
                    let l = locker.clone();
                    let k = keys[i % KEYS].clone();
                    async move {
                        let g = l.lock(&k).await?;
                        g.release().await?;
                        Ok(())
                    }
                },
                out,
            )
            .await?;
        }
        results.push(Latencies::from_durations(&samples));
    }
    // The halves, with the default (watchdog on).
    let locker = Locker::memory();
    let mut acquire = Vec::with_capacity(plan.memory_n / 4);
    let mut release = Vec::with_capacity(plan.memory_n / 4);
    for i in 0..plan.memory_n / 4 {
        let t = Instant::now();
        let g = locker.lock(&keys[i % KEYS]).await?;
        let t_acq = t.elapsed();
        let t = Instant::now();
        g.release().await?;
        release.push(t.elapsed());
        acquire.push(t_acq);
    }
    let no_watchdog = results.pop().unwrap_or_default();
    let lock_release = results.pop().unwrap_or_default();
    Ok(Memory {
        lock_release,
        no_watchdog,
        acquire: Latencies::from_durations(&acquire),
        release: Latencies::from_durations(&release),
    })
}
