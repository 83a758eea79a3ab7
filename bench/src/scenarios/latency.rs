//! Sequential latencies: PING and SET (the floor), uncontended lock + release on Redis for the
//! three designs, and on the memory backend.

use std::time::{Duration, Instant};

use lock_core::{Locker, MemoryBackend};

use super::{Op, Plan};
use crate::Result;
use crate::designs::{self, Design, Kind};
use crate::server::Target;
use crate::stats::Latencies;

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
}

/// Uncontended figures on the memory backend.
#[derive(Debug, Clone, Default)]
pub(crate) struct Memory {
    pub(crate) lock_release: Latencies,
    pub(crate) acquire: Latencies,
    pub(crate) release: Latencies,
}

fn keys(prefix: &str) -> Vec<String> {
    (0..KEYS).map(|i| format!("{prefix}:{i}")).collect()
}

/// Times `n` lock + release cycles of `locker` split in halves, into `acquire` and `release`
/// (`None`: a warm-up, not kept).
async fn halves(
    locker: &Locker,
    keys: &[String],
    n: usize,
    wait: Option<Duration>,
    mut out: Option<(&mut Latencies, &mut Latencies)>,
) -> Result<()> {
    for key in keys.iter().cycle().take(n) {
        let t = Instant::now();
        let guard = match wait {
            Some(wait) => locker.lock(key).wait(wait).await?,
            None => locker.lock(key).await?,
        };
        let t_acq = t.elapsed();
        let t = Instant::now();
        guard.release().await?;
        if let Some((acquire, release)) = out.as_mut() {
            acquire.record_duration(t_acq);
            release.record_since(t);
        }
    }
    Ok(())
}

/// One round: `n` timed calls of each op in turn, cycling over `keys`; the samples go to
/// `out` (one `Latencies` per op), or nowhere for a warm-up round.
async fn round(
    ops: &[Op],
    keys: &[String],
    n: usize,
    mut out: Option<&mut [Latencies]>,
) -> Result<()> {
    for (i, op) in ops.iter().enumerate() {
        for key in keys.iter().cycle().take(n) {
            let fut = op.once(key);
            let t = Instant::now();
            fut.await?;
            if let Some(out) = out.as_deref_mut() {
                out[i].record_since(t);
            }
        }
    }
    Ok(())
}

/// `ops` measured in `plan.rounds` interleaved rounds after a warm-up round, over the
/// uncontended keys: one `Latencies` per op.
pub(crate) async fn interleaved(plan: &Plan, ops: &[Op]) -> Result<Vec<Latencies>> {
    let keys = keys("uc");
    let mut samples = vec![Latencies::default(); ops.len()];
    round(ops, &keys, plan.warmup, None).await?;
    for _ in 0..plan.rounds {
        round(ops, &keys, plan.latency_n / plan.rounds, Some(&mut samples)).await?;
    }
    Ok(samples)
}

pub(crate) async fn redis_latencies(plan: &Plan, target: &Target) -> Result<Uncontended> {
    let conn = target.manager().await?;
    let mut ops = vec![Op::Ping(conn.clone()), Op::Set(conn.clone())];
    for kind in Kind::ALL {
        ops.push(Op::Cycle(Design::connect(kind, target, LEASE).await?));
    }
    let ours = designs::ours(target, LEASE, true).await?;
    let keys = keys("uc");
    let mut samples = vec![Latencies::default(); ops.len()];
    let (mut acquire, mut release) = (Latencies::default(), Latencies::default());
    let per_round = plan.latency_n / plan.rounds;
    // Round 0 is the warm-up: connections, scripts, caches; its samples are dropped.
    for r in 0..=plan.rounds {
        let n = if r == 0 { plan.warmup } else { per_round };
        round(&ops, &keys, n, (r > 0).then_some(&mut samples[..])).await?;
        let out = (r > 0).then_some((&mut acquire, &mut release));
        halves(&ours, &keys, n, Some(WAIT), out).await?;
    }
    let mut samples = samples.into_iter();
    let mut next = || samples.next().unwrap_or_default();
    Ok(Uncontended {
        ping: next(),
        set: next(),
        lock_release: Kind::ALL.map(|k| (k, next())).to_vec(),
        ours_acquire: acquire,
        ours_release: release,
    })
}

pub(crate) async fn memory_latencies(plan: &Plan) -> Result<Memory> {
    let keys = keys("mem");
    let locker = Locker::builder(MemoryBackend::new()).lease(LEASE).build();
    let mut lock_release = Latencies::default();
    for (n, keep) in [(plan.memory_n / 10, false), (plan.memory_n, true)] {
        for key in keys.iter().cycle().take(n) {
            let t = Instant::now();
            locker.lock(key).await?.release().await?;
            if keep {
                lock_release.record_since(t);
            }
        }
    }
    // The halves, with the default (watchdog on).
    let (mut acquire, mut release) = (Latencies::default(), Latencies::default());
    let out = Some((&mut acquire, &mut release));
    halves(&Locker::memory(), &keys, plan.memory_n / 4, None, out).await?;
    Ok(Memory {
        lock_release,
        acquire,
        release,
    })
}
