//! One hot key, W waiters: W + 1 tasks lock, release and lock again, in one process or split
//! over two. Every acquisition is recorded with the shared clock and the task's id; merged and
//! sorted, an acquisition by a different task than the previous one is a handoff (a polling
//! design's releaser often takes the lock straight back: that is an acquisition, not a
//! handoff). Redis work is the `INFO commandstats` delta over the same window.

use std::time::Duration;

use redis::aio::ConnectionManager;

use super::Plan;
use crate::Result;
use crate::child::{ChildProc, HotTasks, LEASE, Record};
use crate::clock::shared_now_ns;
use crate::designs::{Design, Kind};
use crate::server::Target;
use crate::stats::CommandStats;

/// Task ids of the second process start here.
const REMOTE_ID_BASE: &str = "1000000";

/// One design at one (waiters, processes) point.
#[derive(Debug, Clone)]
pub(crate) struct HotFigures {
    pub(crate) kind: Kind,
    pub(crate) waiters: usize,
    pub(crate) processes: usize,
    pub(crate) acquisitions_per_s: f64,
    pub(crate) handoffs_per_s: f64,
    /// Every command Redis ran (script-internal ones included) per handoff.
    pub(crate) commands_per_handoff: f64,
    /// Requests (round trips) per handoff.
    pub(crate) requests_per_handoff: f64,
    /// Requests per handoff by command.
    pub(crate) breakdown: String,
}

pub(crate) async fn hot_keys(
    plan: &Plan,
    target: &Target,
    stats: &mut ConnectionManager,
) -> Result<Vec<HotFigures>> {
    let mut out = Vec::new();
    for processes in [1, 2] {
        for &waiters in &plan.waiters {
            for kind in Kind::ALL {
                let name = kind.name();
                crate::progress(&format!(
                    "  {waiters} waiters, {processes} process(es), {name}"
                ));
                out.push(hot_key(plan, target, stats, kind, waiters, processes).await?);
            }
        }
    }
    Ok(out)
}

async fn hot_key(
    plan: &Plan,
    target: &Target,
    stats: &mut ConnectionManager,
    kind: Kind,
    waiters: usize,
    processes: usize,
) -> Result<HotFigures> {
    let key = format!("hot:{}:{waiters}w:{processes}p", kind.name());
    let tasks = waiters + 1;
    let local = if processes == 1 {
        tasks
    } else {
        tasks.div_ceil(2)
    };
    let design = Design::connect(kind, target, LEASE).await?;
    design
        .release(design.lock(&key, Duration::from_secs(10)).await?)
        .await?;
    let mut child = match tasks - local {
        0 => None,
        remote => {
            let args = [
                "hot",
                kind.name(),
                &key,
                &remote.to_string(),
                REMOTE_ID_BASE,
            ];
            Some(ChildProc::spawn(&args, &target.url).await?)
        }
    };
    let hot = HotTasks::spawn(&design, &key, local, 0).go();
    if let Some(c) = child.as_mut() {
        c.send("go").await;
    }
    tokio::time::sleep(plan.hot_warm).await;
    let calls_before = our_calls(&design, child.as_mut()).await?;
    let before = CommandStats::fetch(stats).await?;
    let t_begin = shared_now_ns();
    tokio::time::sleep(plan.hot_run).await;
    let t_end = shared_now_ns();
    let redis = CommandStats::fetch(stats).await?.since(&before);
    let calls_after = our_calls(&design, child.as_mut()).await?;
    let mut records = hot.stop().await?;
    if let Some(mut c) = child {
        records.extend(c.stop_hot().await?);
        c.finish().await?;
    }
    let (acquisitions, handoffs) = count(records, t_begin, t_end);
    let secs = (t_end - t_begin) as f64 / 1e9;
    let per_handoff = |n: u64| match handoffs {
        0 => f64::INFINITY,
        h => n as f64 / h as f64,
    };
    // lock-core's scripts run SET inside: commandstats cannot tell those from a client's SET,
    // so ours counts its own calls (both processes); the peers send plain commands.
    let requests = match (calls_before, calls_after) {
        (Some(b), Some(a)) => a - b,
        _ => redis.sum(kind.requests()),
    };
    Ok(HotFigures {
        kind,
        waiters,
        processes,
        acquisitions_per_s: acquisitions as f64 / secs,
        handoffs_per_s: handoffs as f64 / secs,
        commands_per_handoff: per_handoff(redis.total()),
        requests_per_handoff: per_handoff(requests),
        breakdown: redis.breakdown(handoffs, kind.requests()),
    })
}

/// lock-core's calls to Redis so far, in this process and the child; `None` for the peers.
async fn our_calls(design: &Design, child: Option<&mut ChildProc>) -> Result<Option<u64>> {
    let Some(local) = design.backend_calls() else {
        return Ok(None);
    };
    let remote = match child {
        Some(c) => c.backend_calls().await?,
        None => 0,
    };
    Ok(Some(local + remote))
}

/// Acquisitions within `[begin, end]`, and how many of them went to a different task than the
/// acquisition before (which may lie before `begin`).
fn count(mut records: Vec<Record>, begin: u64, end: u64) -> (u64, u64) {
    records.sort_unstable();
    let (mut acquisitions, mut handoffs, mut previous) = (0, 0, None);
    for (t, id) in records.into_iter().take_while(|(t, _)| *t <= end) {
        if t >= begin {
            acquisitions += 1;
            handoffs += u64::from(previous.is_some_and(|p| p != id));
        }
        previous = Some(id);
    }
    (acquisitions, handoffs)
}

#[cfg(test)]
mod tests {
    #[test]
    fn counts_handoffs_in_window() {
        let records = vec![(5, 1), (1, 1), (3, 2), (7, 2), (8, 2), (12, 1)];
        // Sorted: 1:a 3:b 5:a 7:b 8:b 12:a; window [3, 8]: 3 (a->b), 5 (b->a), 7 (a->b), 8 (same).
        assert_eq!(super::count(records, 3, 8), (4, 3));
        assert_eq!(super::count(Vec::new(), 0, 10), (0, 0));
    }
}
