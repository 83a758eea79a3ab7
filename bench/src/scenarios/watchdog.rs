//! Watchdog cost: Redis calls per second while 1,000 locks are held and renewed.
//!
//! Ours: one `Locker`, 1,000 guards, the watchdog renewing them (one batched `EVALSHA` per
//! tick). rslock: 1,000 `LockManager::using` calls, its own renewal (one `EVALSHA` per lock when
//! its validity is 500 ms from running out). The seed design has no renewal at all.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::Plan;
use crate::Result;
use crate::server::Target;
use crate::stats::CommandStats;

/// Renewal traffic of one design.
#[derive(Debug, Clone, Default)]
pub(crate) struct Renewals {
    pub(crate) evalsha_per_s: f64,
    pub(crate) commands_per_s: f64,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Watchdog {
    pub(crate) locks: usize,
    pub(crate) lease: Duration,
    pub(crate) window: Duration,
    pub(crate) ours: Renewals,
    /// `locker.stats().renewal_calls` delta per second over the same window.
    pub(crate) ours_renewal_calls_per_s: f64,
    pub(crate) rslock: Renewals,
}

fn renewals(redis: &CommandStats, secs: f64) -> Renewals {
    Renewals {
        evalsha_per_s: redis.sum("evalsha eval") as f64 / secs,
        commands_per_s: redis.total() as f64 / secs,
    }
}

pub(crate) async fn watchdog(
    plan: &Plan,
    target: &Target,
    stats: &mut ConnectionManager,
) -> Result<Watchdog> {
    let n = plan.watchdog_locks;
    crate::progress(&format!(
        "  ours: {n} locks, lease {:?}",
        plan.watchdog_lease
    ));
    let locker = crate::designs::ours(target, plan.watchdog_lease, true).await?;
    let mut set = JoinSet::new();
    for i in 0..n {
        let l = locker.clone();
        set.spawn(async move {
            l.lock(format!("wd:{i}"))
                .wait(Duration::from_secs(10))
                .await
        });
    }
    let mut guards = Vec::with_capacity(n);
    while let Some(joined) = set.join_next().await {
        guards.push(joined??);
    }
    // Steady state: the first renewal has loaded the renew script and put every lock in step.
    let deadline = Instant::now() + plan.watchdog_lease;
    while locker.stats().renewal_calls == 0 {
        if Instant::now() > deadline {
            return Err("watchdog: no renewal within one lease".into());
        }
        // Polls a counter the locker exposes without a change signal.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Start half a period after that renewal was sent (it may still be in flight): a window of
    // whole periods then holds exactly window / period renewals.
    tokio::time::sleep(plan.watchdog_lease / 6).await;
    let before = CommandStats::fetch(stats).await?;
    let calls0 = locker.stats().renewal_calls;
    let t0 = Instant::now();
    tokio::time::sleep(plan.watchdog_window).await;
    let redis = CommandStats::fetch(stats).await?.since(&before);
    let calls1 = locker.stats().renewal_calls;
    let secs = t0.elapsed().as_secs_f64();
    let still_held = guards.iter().filter(|g| g.is_held()).count();
    if still_held != n {
        return Err(format!("watchdog: only {still_held} of {n} locks still held").into());
    }
    let ours = renewals(&redis, secs);
    let ours_renewal_calls_per_s = (calls1 - calls0) as f64 / secs;
    let mut set = JoinSet::new();
    for g in guards {
        set.spawn(g.release());
    }
    while let Some(joined) = set.join_next().await {
        joined??;
    }

    crate::progress(&format!(
        "  rslock: {n} locks, ttl {:?}",
        plan.watchdog_lease
    ));
    let manager = rslock::LockManager::from_clients(vec![target.client()?]);
    let started = Arc::new(AtomicUsize::new(0));
    let (finish, finished) = watch::channel(false);
    let mut set = JoinSet::new();
    for i in 0..n {
        let manager = manager.clone();
        let started = started.clone();
        let mut finished = finished.clone();
        let lease = plan.watchdog_lease;
        set.spawn(async move {
            let resource = format!("rslock:wd:{i}");
            manager
                .using(resource.as_bytes(), lease, async move || {
                    started.fetch_add(1, Ordering::SeqCst);
                    let _ = finished.wait_for(|f| *f).await;
                })
                .await
        });
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while started.load(Ordering::SeqCst) < n {
        if Instant::now() > deadline {
            return Err("rslock: the 1,000 locks were not all taken within 60 s".into());
        }
        // Progress poll of a third-party API with no completion signal.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let before = CommandStats::fetch(stats).await?;
    let t0 = Instant::now();
    tokio::time::sleep(plan.watchdog_window).await;
    let redis = CommandStats::fetch(stats).await?.since(&before);
    let secs = t0.elapsed().as_secs_f64();
    finish.send_replace(true);
    while let Some(joined) = set.join_next().await {
        joined?.map_err(|e| format!("rslock using: {e}"))?;
    }
    Ok(Watchdog {
        locks: n,
        lease: plan.watchdog_lease,
        window: plan.watchdog_window,
        ours,
        ours_renewal_calls_per_s,
        rslock: renewals(&redis, secs),
    })
}
