//! [`LockLayerMetrics`]: counters a service can export.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Counters of one [`LockLayer`](crate::LockLayer), shared by every service it made and every
/// clone. Cheap to clone (an `Arc`); read them with [`snapshot`](Self::snapshot) and export
/// them to the metrics system of your choice.
///
/// ```
/// # async fn demo() {
/// use lock_tower::{LockLayer, extract::MethodAndPath};
/// use tower::{Service, ServiceExt};
///
/// let layer = LockLayer::new(lock_core::Locker::memory(), MethodAndPath);
/// let metrics = layer.metrics();
/// let svc = tower::ServiceBuilder::new().layer(layer).service_fn(|_req: http::Request<String>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
/// });
/// svc.oneshot(http::Request::new(String::new())).await.unwrap();
///
/// let now = metrics.snapshot();
/// assert_eq!(now.requests_locked, 1);
/// assert_eq!(now.in_flight, 0);
/// # }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
/// ```
#[derive(Debug, Clone)]
pub struct LockLayerMetrics {
    inner: Arc<Counters>,
    /// The layer's class: the `class` label of its answers and of its locks.
    pub(crate) class: &'static str,
    /// Its locker's backend (`Backend::kind`): the `backend` label of its answers.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) backend: &'static str,
}

impl Default for LockLayerMetrics {
    fn default() -> Self {
        LockLayerMetrics {
            inner: Arc::default(),
            class: "default",
            backend: "custom",
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    requests_locked: AtomicU64,
    waits: AtomicU64,
    passed_through: AtomicU64,
    failed_open: AtomicU64,
    rejected_busy: AtomicU64,
    rejected_timeout: AtomicU64,
    rejected_unavailable: AtomicU64,
    rejected_lease_lost: AtomicU64,
    rejected_bad_key: AtomicU64,
    rejected_misconfigured: AtomicU64,
    leases_lost: AtomicU64,
    acquire_micros_total: AtomicU64,
    held_micros_total: AtomicU64,
    in_flight: AtomicU64,
}

/// The counters of a [`LockLayerMetrics`] at one moment. Totals only grow; `in_flight` is a
/// gauge.
///
/// ```
/// let snapshot = lock_tower::LockLayerMetrics::default().snapshot();
/// assert_eq!(snapshot, lock_tower::MetricsSnapshot::default());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MetricsSnapshot {
    /// Requests that ran under the lock (the lock was acquired).
    pub requests_locked: u64,
    /// Of those, requests that found the key locked and waited for it.
    pub waits: u64,
    /// Requests without a key that ran unlocked (the extractor found none).
    pub passed_through: u64,
    /// Requests that ran unlocked because the backend failed and the layer fails open.
    pub failed_open: u64,
    /// 409: busy with `reject_when_busy`.
    pub rejected_busy: u64,
    /// 409: still busy at the end of the wait.
    pub rejected_timeout: u64,
    /// 503: the backend failed (fail closed).
    pub rejected_unavailable: u64,
    /// 503: the lease was lost while the request ran; the request was cancelled.
    pub rejected_lease_lost: u64,
    /// 400: missing (with `require_key`) or invalid key.
    pub rejected_bad_key: u64,
    /// 500: the layer or the locker is misconfigured.
    pub rejected_misconfigured: u64,
    /// Leases lost while held, however noticed (during the request, its body, or at release).
    pub leases_lost: u64,
    /// Time spent acquiring locks that were acquired, waiting included, in microseconds.
    pub acquire_micros_total: u64,
    /// Time locks were held by requests, in microseconds.
    pub held_micros_total: u64,
    /// Locks held by requests right now.
    pub in_flight: u64,
}

impl MetricsSnapshot {
    /// Every rejection, whatever its status.
    ///
    /// ```
    /// assert_eq!(lock_tower::MetricsSnapshot::default().rejections(), 0);
    /// ```
    pub fn rejections(&self) -> u64 {
        self.rejected_busy
            + self.rejected_timeout
            + self.rejected_unavailable
            + self.rejected_lease_lost
            + self.rejected_bad_key
            + self.rejected_misconfigured
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counter {
    PassedThrough,
    FailedOpen,
    RejectedBusy,
    RejectedTimeout,
    RejectedUnavailable,
    RejectedLeaseLost,
    RejectedBadKey,
    RejectedMisconfigured,
    LeasesLost,
}

impl LockLayerMetrics {
    /// Reads every counter.
    ///
    /// ```
    /// let metrics = lock_tower::LockLayerMetrics::default();
    /// assert_eq!(metrics.snapshot().requests_locked, 0);
    /// ```
    pub fn snapshot(&self) -> MetricsSnapshot {
        let c = &*self.inner;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        MetricsSnapshot {
            requests_locked: get(&c.requests_locked),
            waits: get(&c.waits),
            passed_through: get(&c.passed_through),
            failed_open: get(&c.failed_open),
            rejected_busy: get(&c.rejected_busy),
            rejected_timeout: get(&c.rejected_timeout),
            rejected_unavailable: get(&c.rejected_unavailable),
            rejected_lease_lost: get(&c.rejected_lease_lost),
            rejected_bad_key: get(&c.rejected_bad_key),
            rejected_misconfigured: get(&c.rejected_misconfigured),
            leases_lost: get(&c.leases_lost),
            acquire_micros_total: get(&c.acquire_micros_total),
            held_micros_total: get(&c.held_micros_total),
            in_flight: get(&c.in_flight),
        }
    }

    pub(crate) fn incr(&self, counter: Counter) {
        let c = &*self.inner;
        let atomic = match counter {
            Counter::PassedThrough => &c.passed_through,
            Counter::FailedOpen => &c.failed_open,
            Counter::RejectedBusy => &c.rejected_busy,
            Counter::RejectedTimeout => &c.rejected_timeout,
            Counter::RejectedUnavailable => &c.rejected_unavailable,
            Counter::RejectedLeaseLost => &c.rejected_lease_lost,
            Counter::RejectedBadKey => &c.rejected_bad_key,
            Counter::RejectedMisconfigured => &c.rejected_misconfigured,
            Counter::LeasesLost => &c.leases_lost,
        };
        atomic.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        {
            let outcome = match counter {
                Counter::PassedThrough => "passed_through",
                Counter::FailedOpen => "failed_open",
                Counter::RejectedBusy => "busy",
                Counter::RejectedTimeout => "timeout",
                Counter::RejectedUnavailable => "unavailable",
                Counter::RejectedLeaseLost => "lease_lost",
                Counter::RejectedBadKey => "bad_key",
                Counter::RejectedMisconfigured => "misconfigured",
                // Not an answer: lock-core counts the loss (`lock_leases_lost_total`), and
                // the answer it leads to is counted as `lease_lost`.
                Counter::LeasesLost => return,
            };
            self.answer(outcome);
        }
    }

    /// Counts one answer of the layer (`lock_layer_requests_total`).
    #[cfg(feature = "metrics")]
    fn answer(&self, outcome: &'static str) {
        ::metrics::counter!(
            "lock_layer_requests_total",
            "class" => self.class,
            "backend" => self.backend,
            "outcome" => outcome
        )
        .increment(1);
    }

    /// A request that ran under the lock was answered with its service's output (counted
    /// then, not at its acquisition: a request whose lease is lost is answered `lease_lost`
    /// instead, and counted once).
    pub(crate) fn answered_locked(&self) {
        #[cfg(feature = "metrics")]
        self.answer("locked");
    }

    /// A lock was acquired after `took` (`waited`: the key was locked when the request came);
    /// it is now in flight.
    pub(crate) fn acquired(&self, took: Duration, waited: bool) {
        let c = &*self.inner;
        c.requests_locked.fetch_add(1, Ordering::Relaxed);
        if waited {
            c.waits.fetch_add(1, Ordering::Relaxed);
        }
        c.acquire_micros_total
            .fetch_add(micros(took), Ordering::Relaxed);
        c.in_flight.fetch_add(1, Ordering::Relaxed);
    }

    /// A lock acquired by a request is no longer held by it, after `held`.
    pub(crate) fn released(&self, held: Duration) {
        let c = &*self.inner;
        c.held_micros_total
            .fetch_add(micros(held), Ordering::Relaxed);
        c.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
