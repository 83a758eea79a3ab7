//! The loops the consensus sections (etcd, ZooKeeper) share: each measures its store's floors
//! with its own client, in the same interleaved rounds and chunks, and counts the watchdog's
//! traffic over the same window.

use std::time::{Duration, Instant};

use lock_core::Locker;
use lock_testkit::proxy::Proxy;

use super::Plan;
use crate::Result;
use crate::stats::Latencies;

/// The handoff and its floor are measured in this many interleaved chunks.
pub(crate) const CHUNKS: usize = 10;

/// A read floor, a write floor and lock + release on `locker` (over `keys`), `n` samples each,
/// in `plan.rounds` interleaved rounds after a warm-up round. Returns the three latencies and
/// `LockerStats::backend_calls` per cycle.
pub(crate) async fn interleaved_rounds<R, W>(
    plan: &Plan,
    n: usize,
    locker: &Locker,
    keys: &[String],
    mut read: impl AsyncFnMut() -> Result<R>,
    mut write: impl AsyncFnMut() -> Result<W>,
) -> Result<([Latencies; 3], f64)> {
    let [mut reads, mut writes, mut cycles] = [(); 3].map(|()| Latencies::default());
    let per_round = n / plan.rounds;
    let mut calls = 0;
    for r in 0..=plan.rounds {
        let (n, keep) = if r == 0 {
            (plan.warmup, false)
        } else {
            (per_round, true)
        };
        for _ in 0..n {
            let t = Instant::now();
            read().await?;
            keep_since(keep, &mut reads, t);
        }
        for _ in 0..n {
            let t = Instant::now();
            write().await?;
            keep_since(keep, &mut writes, t);
        }
        let before = locker.stats().backend_calls;
        for key in keys.iter().cycle().take(n) {
            let t = Instant::now();
            locker.lock(key).await?.release().await?;
            keep_since(keep, &mut cycles, t);
        }
        if keep {
            calls += locker.stats().backend_calls - before;
        }
    }
    let cycle_calls = calls as f64 / (per_round * plan.rounds).max(1) as f64;
    Ok(([reads, writes, cycles], cycle_calls))
}

/// Records the time since `start` into `into`, unless this is a warm-up (`keep` false).
fn keep_since(keep: bool, into: &mut Latencies, start: Instant) {
    if keep {
        into.record_since(start);
    }
}

/// `n` handoffs (each a sample `handoff` returns) and as many watch events (`event`'s
/// samples) in `CHUNKS` interleaved chunks after a warm-up chunk. Returns both latencies and
/// the `waiter`'s `LockerStats::backend_calls` per handoff.
pub(crate) async fn handoff_chunks(
    plan: &Plan,
    n: usize,
    waiter: &Locker,
    mut handoff: impl AsyncFnMut() -> Result<Duration>,
    mut event: impl AsyncFnMut() -> Result<Duration>,
) -> Result<(Latencies, Latencies, f64)> {
    let (mut handoffs, mut events) = (Latencies::default(), Latencies::default());
    let per_chunk = (n / CHUNKS).max(1);
    let mut calls = 0;
    for chunk in 0..=CHUNKS {
        let (n, keep) = match chunk {
            0 => (plan.handoff_warm, false),
            _ => (per_chunk, true),
        };
        let before = waiter.stats().backend_calls;
        for _ in 0..n {
            let took = handoff().await?;
            if keep {
                handoffs.record_duration(took);
            }
        }
        if keep {
            calls += waiter.stats().backend_calls - before;
        }
        for _ in 0..n {
            let took = event().await?;
            if keep {
                events.record_duration(took);
            }
        }
    }
    Ok((handoffs, events, calls as f64 / (per_chunk * CHUNKS) as f64))
}

/// What a watchdog window saw: the `Locker`'s renewal calls, the proxy's bytes
/// `(to the server, back)`, and the server's counters before and after.
pub(crate) struct Window<T> {
    pub(crate) renewal_calls: u64,
    pub(crate) wire: (u64, u64),
    pub(crate) before: T,
    pub(crate) after: T,
}

/// Holds `plan.watchdog_locks` locks on `locker` (which talks through `proxy`) and reads
/// `counters` before and after `plan.watchdog_window` of renewals, then releases them all
/// (an error naming `what` if one was lost).
pub(crate) async fn held_window<T>(
    plan: &Plan,
    locker: &Locker,
    proxy: &Proxy,
    what: &str,
    mut counters: impl AsyncFnMut() -> Result<T>,
) -> Result<Window<T>> {
    let guards = super::watchdog::hold(locker, plan.watchdog_locks).await?;
    let (calls, wire) = (locker.stats().renewal_calls, proxy.forwarded());
    let before = counters().await?;
    tokio::time::sleep(plan.watchdog_window).await;
    let after = counters().await?;
    let (calls, wire) = (
        locker.stats().renewal_calls - calls,
        (proxy.forwarded().0 - wire.0, proxy.forwarded().1 - wire.1),
    );
    super::watchdog::release_all(guards, what).await?;
    Ok(Window {
        renewal_calls: calls,
        wire,
        before,
        after,
    })
}
