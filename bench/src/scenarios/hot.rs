//! One hot key, W waiters: W + 1 tasks lock, release and lock again, in one process or split
//! over two. Every acquisition is recorded with the shared clock and the task's id; merged and
//! sorted, an acquisition by a different task than the previous one is a handoff (a polling
//! design's releaser often takes the lock straight back: that is an acquisition, not a
//! handoff). Redis work is the `INFO commandstats` delta over the same window.
//!
//! The yielding variant (ours only, local hand-off on and off): each task awaits
//! `tokio::task::yield_now()` between its release and its next lock, as real handlers await
//! between one lock and the next; the releasing task comes back after the other tasks ran, so
//! the local queue often holds nobody at a release (issue 34).

use std::time::Duration;

use redis::aio::ConnectionManager;

use super::Plan;
use crate::Result;
use crate::child::{ChildProc, HotTasks, LEASE, Record};
use crate::clock::shared_now_ns;
use crate::designs::{Design, Kind, ours};
use crate::server::Target;
use crate::stats::{CommandStats, Latencies};

/// Task ids of the second process start here.
const REMOTE_ID_BASE: u32 = 1_000_000;

/// One design at one (waiters, processes) point.
#[derive(Debug, Clone)]
pub(crate) struct HotFigures {
    pub(crate) kind: Kind,
    pub(crate) waiters: usize,
    pub(crate) processes: usize,
    /// Ours only: whether local hand-off was on (the peers: always `true`, meaningless).
    pub(crate) local_handoff: bool,
    /// Whether each task awaited `yield_now()` between its release and its next lock.
    pub(crate) yielding: bool,
    pub(crate) acquisitions_per_s: f64,
    pub(crate) handoffs_per_s: f64,
    /// Every command Redis ran (script-internal ones included) per handoff.
    pub(crate) commands_per_handoff: f64,
    /// Requests (round trips) per handoff.
    pub(crate) requests_per_handoff: f64,
    /// Ours: `LockerStats::local_handoffs` over the window, both processes.
    pub(crate) local_handoffs: u64,
    /// 2 processes: how long each acquisition in the window by a task of the child had waited.
    pub(crate) remote_wait: Latencies,
    /// 2 processes: the most acquisitions in a row by tasks of one process in the window.
    pub(crate) longest_run: u64,
}

pub(crate) async fn hot_keys(
    plan: &Plan,
    target: &Target,
    stats: &mut ConnectionManager,
) -> Result<Vec<HotFigures>> {
    let mut out = Vec::new();
    for processes in [1, 2] {
        for &waiters in &plan.waiters {
            // Ours without local hand-off: the same scenario, for the ratio (one process).
            let off = (processes == 1 && waiters > 1).then_some((Kind::Ours, false));
            let runs = Kind::ALL.map(|k| (k, true)).into_iter().chain(off);
            for (kind, local) in runs {
                let name = kind.name();
                let off = if local { "" } else { ", local hand-off off" };
                crate::progress(&format!(
                    "  {waiters} waiters, {processes} process(es), {name}{off}"
                ));
                let point = (kind, local, waiters, processes);
                out.push(hot_key(plan, target, stats, point, false).await?);
            }
        }
    }
    // Ours with an await between release and lock: on and off in one process, on in two (the
    // other process's waiter's wait).
    for (local, processes) in [(true, 1), (false, 1), (true, 2)] {
        let off = if local { "" } else { ", local hand-off off" };
        crate::progress(&format!(
            "  {YIELDING_WAITERS} waiters yielding, {processes} process(es), ours{off}"
        ));
        let point = (Kind::Ours, local, YIELDING_WAITERS, processes);
        out.push(hot_key(plan, target, stats, point, true).await?);
    }
    Ok(out)
}

/// The yielding variant's waiters (11 tasks, as in issue 34).
pub(crate) const YIELDING_WAITERS: usize = 10;

async fn hot_key(
    plan: &Plan,
    target: &Target,
    stats: &mut ConnectionManager,
    (kind, local_handoff, waiters, processes): (Kind, bool, usize, usize),
    yielding: bool,
) -> Result<HotFigures> {
    let off = if local_handoff { "" } else { ":off" };
    let y = if yielding { ":yield" } else { "" };
    let key = format!("hot:{}{off}{y}:{waiters}w:{processes}p", kind.name());
    let tasks = waiters + 1;
    let local = if processes == 1 {
        tasks
    } else {
        tasks.div_ceil(2)
    };
    let design = match kind {
        Kind::Ours => Design::Ours(ours(target, LEASE, local_handoff).await?),
        _ => Design::connect(kind, target, LEASE).await?,
    };
    design
        .release(design.lock(&key, Duration::from_secs(10)).await?)
        .await?;
    let mut child = match tasks - local {
        0 => None,
        remote => {
            let (remote, base) = (remote.to_string(), REMOTE_ID_BASE.to_string());
            let y = if yielding { "yield" } else { "-" };
            let args = ["hot", kind.name(), &key, &remote, &base, y];
            Some(ChildProc::spawn(&args, &target.url).await?)
        }
    };
    let hot = HotTasks::spawn(&design, &key, local, 0, yielding).go();
    if let Some(c) = child.as_mut() {
        c.send("go").await;
    }
    tokio::time::sleep(plan.hot_warm).await;
    let counts_before = our_counts(&design, child.as_mut()).await?;
    let before = CommandStats::fetch(stats).await?;
    let t_begin = shared_now_ns();
    tokio::time::sleep(plan.hot_run).await;
    let t_end = shared_now_ns();
    let redis = CommandStats::fetch(stats).await?.since(&before);
    let counts_after = our_counts(&design, child.as_mut()).await?;
    let mut records = hot.stop().await?;
    if let Some(mut c) = child {
        records.extend(c.stop_hot().await?);
        c.finish().await?;
    }
    let window = count(records, t_begin, t_end);
    let secs = (t_end - t_begin) as f64 / 1e9;
    let per_handoff = |n: u64| match window.handoffs {
        0 => f64::INFINITY,
        h => n as f64 / h as f64,
    };
    // lock-core's scripts run SET inside: commandstats cannot tell those from a client's SET,
    // so ours counts its own calls (both processes); the peers send plain commands.
    let [requests, local_handoffs] = match (counts_before, counts_after) {
        (Some([b, lb]), Some([a, la])) => [a - b, la - lb],
        _ => [redis.sum(kind.requests()), 0],
    };
    Ok(HotFigures {
        kind,
        waiters,
        processes,
        local_handoff,
        yielding,
        acquisitions_per_s: window.acquisitions as f64 / secs,
        handoffs_per_s: window.handoffs as f64 / secs,
        commands_per_handoff: per_handoff(redis.total()),
        requests_per_handoff: per_handoff(requests),
        local_handoffs,
        remote_wait: window.remote_wait,
        longest_run: window.longest_run,
    })
}

/// lock-core's counts (backend calls, local hand-offs) so far, in this process and the child;
/// `None` for the peers.
async fn our_counts(design: &Design, child: Option<&mut ChildProc>) -> Result<Option<[u64; 2]>> {
    let Some([calls, local]) = design.our_counts() else {
        return Ok(None);
    };
    let [rc, rl] = match child {
        Some(c) => c.our_counts().await?,
        None => [0, 0],
    };
    Ok(Some([calls + rc, local + rl]))
}

/// What the acquisitions of one window add up to.
#[derive(Debug, Default)]
struct Window {
    acquisitions: u64,
    /// Acquisitions by a different task than the acquisition before (which may lie before
    /// the window).
    handoffs: u64,
    remote_wait: Latencies,
    longest_run: u64,
}

/// The acquisitions within `[begin, end]`.
fn count(mut records: Vec<Record>, begin: u64, end: u64) -> Window {
    records.sort_unstable();
    let (mut w, mut previous, mut run) = (Window::default(), None, 0);
    for (t, id, waited) in records.into_iter().take_while(|r| r.0 <= end) {
        let remote = id >= REMOTE_ID_BASE;
        if t >= begin {
            w.acquisitions += 1;
            w.handoffs += u64::from(previous.is_some_and(|p| p != id));
            if remote {
                w.remote_wait.record(waited);
            }
            let same = previous.is_some_and(|p| (p >= REMOTE_ID_BASE) == remote);
            run = if same { run + 1 } else { 1 };
            w.longest_run = w.longest_run.max(run);
        }
        previous = Some(id);
    }
    w
}

#[cfg(test)]
mod tests {
    #[test]
    fn counts_handoffs_in_window() {
        let r = 1_000_000;
        let records = vec![
            (5, 1, 0),
            (1, 1, 0),
            (3, r, 7),
            (7, r, 9),
            (8, r, 2),
            (12, 1, 0),
        ];
        // Sorted: 1:a 3:r 5:a 7:r 8:r 12:a; window [3, 8]: 3 (a->r), 5 (r->a), 7 (a->r), 8 (same).
        let w = super::count(records, 3, 8);
        assert_eq!((w.acquisitions, w.handoffs, w.longest_run), (4, 3, 2));
        assert_eq!((w.remote_wait.n(), w.remote_wait.max()), (3, 9));
        assert_eq!(super::count(Vec::new(), 0, 10).acquisitions, 0);
    }
}
