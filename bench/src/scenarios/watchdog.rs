//! Watchdog cost: Redis calls per second while 1,000 locks are held and renewed.
//!
//! Ours: one `Locker`, 1,000 guards, the watchdog renewing them (one batched `EVALSHA` per
//! tick). rslock: 1,000 `LockManager::using` calls, its own renewal (one `EVALSHA` per lock when
//! its validity is 500 ms from running out). The seed design has no renewal at all.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lock_core::{LockGuard, Locker};
use lock_testkit::eventually;
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
    /// rslock `using` calls that ended in an error: its renewal came too late and the lock was
    /// gone (seen in debug builds on a loaded machine with a 1 s ttl). A peer's failure is a
    /// figure of the run, not a reason to abort it.
    pub(crate) rslock_lost: usize,
}

/// Redis's commands over one window of `plan.watchdog_window`: EVALSHA (and EVAL) and all.
async fn window(plan: &Plan, stats: &mut ConnectionManager) -> Result<Renewals> {
    let (before, t0) = (CommandStats::fetch(stats).await?, Instant::now());
    tokio::time::sleep(plan.watchdog_window).await;
    let redis = CommandStats::fetch(stats).await?.since(&before);
    let secs = t0.elapsed().as_secs_f64();
    Ok(Renewals {
        evalsha_per_s: redis.sum("evalsha eval") as f64 / secs,
        commands_per_s: redis.total() as f64 / secs,
    })
}

/// Takes `n` locks (`wd:<i>`) on `locker` and waits for the steady state: the first renewal
/// has been sent (on Redis it loaded the renew script) with every lock in step, and half a
/// period has passed since (the renewal may still be in flight), so that a window of whole
/// periods that starts now holds exactly window / period renewals.
pub(crate) async fn hold(locker: &Locker, n: usize) -> Result<Vec<LockGuard>> {
    let mut set = JoinSet::new();
    for i in 0..n {
        set.spawn(locker.lock(format!("wd:{i}")).wait(Duration::from_secs(10)));
    }
    let guards = set
        .join_all()
        .await
        .into_iter()
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let lease = locker.lease();
    let renewed = async || locker.stats().renewal_calls > 0;
    eventually("the watchdog's first renewal", lease, renewed).await;
    tokio::time::sleep(lease / 6).await;
    Ok(guards)
}

/// Checks that every lock of `guards` is still held (an error naming `what` otherwise), then
/// releases them all.
pub(crate) async fn release_all(guards: Vec<LockGuard>, what: &str) -> Result<()> {
    let (n, still_held) = (guards.len(), guards.iter().filter(|g| g.is_held()).count());
    if still_held != n {
        return Err(format!("{what}: only {still_held} of {n} locks still held").into());
    }
    for released in JoinSet::from_iter(guards.into_iter().map(LockGuard::release))
        .join_all()
        .await
    {
        released?;
    }
    Ok(())
}

pub(crate) async fn watchdog(
    plan: &Plan,
    target: &Target,
    stats: &mut ConnectionManager,
) -> Result<Watchdog> {
    let (n, lease) = (plan.watchdog_locks, plan.watchdog_lease);
    crate::progress(&format!("  ours: {n} locks, lease {lease:?}"));
    let locker = crate::designs::ours(target, lease, true).await?;
    let guards = hold(&locker, n).await?;
    let (calls0, t0) = (locker.stats().renewal_calls, Instant::now());
    let ours = window(plan, stats).await?;
    let calls = (locker.stats().renewal_calls - calls0) as f64 / t0.elapsed().as_secs_f64();
    release_all(guards, "watchdog").await?;

    crate::progress(&format!("  rslock: {n} locks, ttl {lease:?}"));
    let manager = rslock::LockManager::from_clients(vec![target.client()?]);
    let started = Arc::new(AtomicUsize::new(0));
    let (finish, finished) = watch::channel(false);
    let mut set = JoinSet::new();
    for i in 0..n {
        let (manager, started, mut finished) = (manager.clone(), started.clone(), finished.clone());
        set.spawn(async move {
            let resource = format!("rslock:wd:{i}");
            let hold = async move || {
                started.fetch_add(1, Ordering::SeqCst);
                let _ = finished.wait_for(|f| *f).await;
            };
            manager.using(resource.as_bytes(), lease, hold).await
        });
    }
    let all_taken = async || started.load(Ordering::SeqCst) == n;
    eventually(
        "rslock: all locks taken",
        Duration::from_secs(60),
        all_taken,
    )
    .await;
    let rslock = window(plan, stats).await?;
    finish.send_replace(true);
    let rslock_lost = set.join_all().await.iter().filter(|u| u.is_err()).count();
    Ok(Watchdog {
        locks: n,
        lease,
        window: plan.watchdog_window,
        ours,
        ours_renewal_calls_per_s: calls,
        rslock,
        rslock_lost,
    })
}
