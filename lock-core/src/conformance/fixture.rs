//! What every check runs on: lockers on new handles of the store under test (as separate
//! processes would contend), the [`Probe`](super::Probe) when there is one, the set-ups checks
//! of several areas start from, and the small assertions they share.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{Connect, Probe, Stored, Suite};
use crate::backend::Backend;
use crate::{LockError, LockGuard, Locker, LockerBuilder};

/// A hang guard for things expected to happen "soon": generous, never a speed claim.
pub(super) const SOON: Duration = Duration::from_secs(10);

/// The store under test, and whether the lockers built on it pass a lock between their own
/// tasks (local hand-off).
pub(super) struct Fixture {
    connect: Connect,
    probe: Option<Arc<dyn Probe>>,
    prefix: String,
    local_handoff: bool,
    consecutive_fences: bool,
    stress_iterations: u64,
    min_lease: Option<Duration>,
    last_fence_kept: bool,
}

impl Fixture {
    pub(super) fn new(suite: &Suite, local_handoff: bool) -> Self {
        Fixture {
            connect: suite.connect.clone(),
            probe: suite.probe.clone(),
            prefix: suite.prefix.clone(),
            local_handoff,
            consecutive_fences: false,
            stress_iterations: suite.stress_iterations,
            min_lease: suite.min_lease,
            last_fence_kept: suite.last_fence_kept,
        }
    }

    /// Whether a released lock's last fence is still shown ([`Suite::last_fence_kept`]).
    pub(super) fn last_fence_kept(&self) -> bool {
        self.last_fence_kept
    }

    pub(super) fn with_fences(self, consecutive: bool) -> Self {
        Fixture {
            consecutive_fences: consecutive,
            ..self
        }
    }

    /// How many locked increments each task of the counter stress makes.
    pub(super) fn stress_iterations(&self) -> u64 {
        self.stress_iterations
    }

    /// Whether each key's fences count 1, 2, 3, ...
    pub(super) fn consecutive_fences(&self) -> bool {
        self.consecutive_fences
    }

    /// A short lease the check watches run out or be renewed: `base` as the check means it,
    /// raised to the backend's floor ([`Suite::min_lease`]).
    pub(super) fn short_lease(&self, base: Duration) -> ShortLease {
        ShortLease {
            lease: self.min_lease.map_or(base, |floor| base.max(floor)),
        }
    }

    /// The prefix of the lockers built on this fixture.
    pub(super) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// How failures name the run.
    pub(super) fn name(&self) -> &'static str {
        if self.local_handoff {
            "local hand-off on"
        } else {
            "local hand-off off"
        }
    }

    /// A new handle on the same store: lockers built on it contend like separate processes.
    pub(super) async fn backend(&self) -> Arc<dyn Backend> {
        (self.connect)()
            .await
            .unwrap_or_else(|e| panic!("connect to the store under test: {e}"))
    }

    pub(super) async fn builder(&self) -> LockerBuilder {
        Locker::builder(self.backend().await)
            .local_handoff(self.local_handoff)
            .prefix(self.prefix.as_str())
    }

    pub(super) async fn locker(&self) -> Locker {
        self.builder().await.build()
    }

    /// What the store holds for `key`, when the probe can read it.
    pub(super) async fn stored(&self, key: &str) -> Option<Stored> {
        match &self.probe {
            Some(p) => p.stored(&self.prefix, key).await,
            None => None,
        }
    }

    /// How many waiters queue for `key` in the store.
    ///
    /// # Panics
    /// Without a probe that can tell (such a check is listed as needing a probe).
    pub(super) async fn queued(&self, key: &str) -> usize {
        let n = match &self.probe {
            Some(p) => p.queued(&self.prefix, key).await,
            None => None,
        };
        n.unwrap_or_else(|| panic!("the probe cannot tell how many waiters queue for {key:?}"))
    }

    /// Waits until `n` waiters queue for `key` in the store (polled: nothing signals it).
    pub(super) async fn until_queued(&self, key: &str, n: usize) {
        let deadline = Instant::now() + SOON;
        while self.queued(key).await != n {
            assert!(
                Instant::now() < deadline,
                "{}: {n} waiter(s) never queued for {key:?}",
                self.name()
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Deletes the lock whoever holds it, as an operator would.
    pub(super) async fn force_delete(&self, key: &str) {
        let Some(p) = &self.probe else {
            panic!("a check deleting {key:?} behind its holder's back needs a probe")
        };
        assert!(
            p.force_delete(&self.prefix, key).await,
            "{}: no lock to delete for {key:?}",
            self.name()
        );
    }

    /// Whether the store holds nothing of this fixture's locks (fence counters aside), when
    /// the probe can tell.
    pub(super) async fn is_empty(&self) -> Option<bool> {
        match &self.probe {
            Some(p) => p.is_empty(&self.prefix).await,
            None => None,
        }
    }

    /// Asserts the store holds nothing (when the probe can tell).
    pub(super) async fn assert_empty(&self, what: &str) {
        if let Some(empty) = self.is_empty().await {
            assert!(empty, "{}: {what}", self.name());
        }
    }

    /// The last fence the store keeps for `key`, when the probe can read it.
    pub(super) async fn fence_counter(&self, key: &str) -> Option<u64> {
        match &self.probe {
            Some(p) => p.fence_counter(&self.prefix, key).await,
            None => None,
        }
    }

    /// The remaining TTL of `key`'s record (`Some(None)`: none), when the probe can read it.
    pub(super) async fn record_ttl(&self, key: &str) -> Option<Option<Duration>> {
        match &self.probe {
            Some(p) => p.record_ttl(&self.prefix, key).await,
            None => None,
        }
    }

    /// A shared counter for the read-modify-write stress.
    pub(super) fn counter(&self) -> Counter {
        Counter(Arc::new(AtomicU64::new(0)))
    }

    /// Asserts that the backend refuses `fenced()` (`fenced`) or `fair()`, with a typed
    /// `InvalidConfig`, on `lock`, `try_lock` and `run` alike, and holds nothing after.
    /// A backend without the operations refuses each with `InvalidConfig`, and its locks work.
    pub(super) async fn assert_operations_refused(&self) {
        let locker = self.locker().await;
        assert_invalid_config(locker.inspect("refused").await, "inspect");
        assert_invalid_config(locker.force_unlock("refused").await, "force_unlock");
        assert_invalid_config(locker.list("*").next().await.expect("the refusal"), "list");
        locker
            .lock("refused")
            .await
            .expect("a lock still works")
            .release()
            .await
            .expect("release");
    }

    pub(super) async fn assert_refused(&self, fenced: bool) {
        let locker = self.locker().await;
        let what = if fenced { "fenced()" } else { "fair()" };
        let request = || {
            let r = locker.lock("refused");
            if fenced { r.fenced() } else { r.fair() }
        };
        assert_invalid_config(request().await, what);
        assert_invalid_config(request().no_wait().await, what);
        let ran = std::sync::atomic::AtomicBool::new(false);
        assert_invalid_config(
            request()
                .run(async { ran.store(true, Ordering::SeqCst) })
                .await,
            what,
        );
        assert!(!ran.load(Ordering::SeqCst), "a refused run ran its body");
        locker
            .try_lock("refused")
            .await
            .expect("the key is free: the refused requests took nothing")
            .release()
            .await
            .expect("release");
    }
}

/// A short lease of a check: on a backend without a floor (or with a floor below it) exactly
/// what the check means, else the floor; the check measures its waits in it.
#[derive(Debug, Clone, Copy)]
pub(super) struct ShortLease {
    lease: Duration,
}

impl ShortLease {
    /// The lease to ask for.
    pub(super) fn lease(self) -> Duration {
        self.lease
    }

    /// A hang guard for what is due once the lease ran out (an expiry seen, a renewal made):
    /// the lease, then [`SOON`].
    pub(super) fn soon_after(self) -> Duration {
        self.lease + SOON
    }

    /// Awaits `fut`, due once the lease ran out, up to [`soon_after`](Self::soon_after).
    pub(super) async fn soon<F: Future>(self, what: &str, fut: F) -> F::Output {
        let within = self.soon_after();
        tokio::time::timeout(within, fut)
            .await
            .unwrap_or_else(|_| panic!("{what}: not done within {within:?}"))
    }
}

/// A lock whose lease ran out unrenewed, and the lock another locker took in its place.
pub(super) struct Expired {
    /// The first holder's guard (a lease of [`EXPIRING_LEASE`] or the backend's floor, no
    /// watchdog): lost.
    pub(super) stale: LockGuard,
    /// The lease [`stale`](Self::stale) was taken with.
    pub(super) lease: ShortLease,
    /// The second locker's guard (a 30 s lease), got by waiting on the key.
    pub(super) fresh: LockGuard,
    /// How long after the first acquire was called the key was free for the second locker.
    pub(super) freed_after: Duration,
    /// A third locker, for newcomers.
    pub(super) third: Locker,
    _lockers: [Locker; 2],
}

/// The lease of [`Expired::stale`], on a backend without a floor above it.
pub(super) const EXPIRING_LEASE: Duration = Duration::from_millis(200);

impl Fixture {
    /// Locks `key` with a short lease ([`EXPIRING_LEASE`], or the backend's floor) and no
    /// watchdog, and has a second locker wait for it (up to [`SOON`] past the lease) with a 30 s
    /// lease: the first lease runs out and the key is retaken.
    pub(super) async fn expire_and_retake(&self, key: &str) -> Expired {
        let lease = self.short_lease(EXPIRING_LEASE);
        let (a, b, third) = (
            self.locker().await,
            self.locker().await,
            self.locker().await,
        );
        let started = Instant::now();
        let stale = a
            .lock(key)
            .lease(lease.lease())
            .watchdog(false)
            .await
            .expect("acquire");
        let fresh = b
            .lock(key)
            .lease(Duration::from_secs(30))
            .wait(lease.soon_after())
            .await
            .expect("an expired lease frees the key");
        Expired {
            stale,
            lease,
            fresh,
            freed_after: started.elapsed(),
            third,
            _lockers: [a, b],
        }
    }
}

/// A counter incremented by a deliberately non-atomic read, yield, write.
#[derive(Clone)]
pub(super) struct Counter(Arc<AtomicU64>);

impl Counter {
    pub(super) fn read(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }

    /// The non-atomic increment: a lost update whenever two of these overlap.
    pub(super) async fn increment(&self) {
        let v = self.read();
        tokio::task::yield_now().await;
        self.0.store(v + 1, Ordering::SeqCst);
    }
}

/// Whether `s` holds a run of at least `n` lowercase hex digits (what a token looks like).
pub(super) fn has_hex_run(s: &str, n: usize) -> bool {
    let mut run = 0;
    for c in s.chars() {
        if c.is_ascii_digit() || ('a'..='f').contains(&c) {
            run += 1;
            if run >= n {
                return true;
            }
        } else {
            run = 0;
        }
    }
    false
}

pub(super) async fn soon<F: Future>(what: &str, fut: F) -> F::Output {
    tokio::time::timeout(SOON, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: not done within {SOON:?}"))
}

/// Polls `cond` until it holds, up to `within` (for what nothing signals).
pub(super) async fn eventually(what: &str, within: Duration, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond().await {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[track_caller]
pub(super) fn assert_busy<T: std::fmt::Debug>(r: Result<T, LockError>, key: &str) {
    match r {
        Err(LockError::Busy { key: k, .. }) => assert_eq!(k, key),
        other => panic!("expected Busy for {key:?}, got {other:?}"),
    }
}

#[track_caller]
pub(super) fn assert_invalid_key<T: std::fmt::Debug>(r: Result<T, LockError>) {
    match r {
        Err(LockError::InvalidKey { reason, .. }) => assert!(!reason.is_empty()),
        other => panic!("expected InvalidKey, got {other:?}"),
    }
}

#[track_caller]
pub(super) fn assert_invalid_config<T: std::fmt::Debug>(r: Result<T, LockError>, what: &str) {
    match r {
        Err(LockError::InvalidConfig { what: w, .. }) => assert!(!w.is_empty()),
        other => panic!("{what}: expected InvalidConfig, got {other:?}"),
    }
}
