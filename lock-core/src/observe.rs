//! What the engine tells operators: tracing spans (one per acquisition, `lock.acquire`, and one
//! per held lock, `lock.held`), and, with the `metrics` feature, metrics through the `metrics`
//! facade (the application installs the exporter). The guide's "Metrics and traces" chapter
//! lists every name, label and meaning; this module is the only place that names them.
//!
//! Labels are bounded: `class` (the name a request, the macro or a layer gives its locks, see
//! [`class`]), `backend` ([`Backend::kind`](crate::Backend::kind)), and a fixed `outcome` or
//! `reason`. Never the raw key, never a token: keys appear only in span fields, as the logs show
//! them (`LockKey::display`), and tokens nowhere. Without the feature every metric call below
//! compiles to nothing.

use std::borrow::Cow;
use std::collections::HashSet;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Span;
use tracing::field::Empty;

use crate::LockError;
use crate::key::LockKey;
use crate::locker::LockerInner;
use crate::sync::Mutex;

/// Whether metrics are compiled in (feature `metrics`).
const METRICS: bool = cfg!(feature = "metrics");

/// The class of a request that names none.
pub(crate) const DEFAULT_CLASS: &str = "default";

/// The class that stands for every class past [`MAX_CLASSES`] distinct owned names.
const OVERFLOW_CLASS: &str = "other";

/// The most distinct owned (non-`'static`) class names kept; later ones are counted as
/// [`OVERFLOW_CLASS`], so a class built from raw keys by mistake cannot grow the series (nor
/// this set) without bound.
const MAX_CLASSES: usize = 256;

/// A class name as a `'static` label: a `'static` name as it is, an owned one interned once
/// (at most [`MAX_CLASSES`] of them).
pub(crate) fn class(name: Cow<'static, str>) -> &'static str {
    match name {
        Cow::Borrowed(name) => name,
        Cow::Owned(name) => intern(name),
    }
}

fn intern(name: String) -> &'static str {
    static CLASSES: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
    let mut classes = CLASSES.lock();
    let classes = classes.get_or_insert_with(HashSet::new);
    if let Some(known) = classes.get(name.as_str()) {
        return known;
    }
    if classes.len() >= MAX_CLASSES {
        return OVERFLOW_CLASS;
    }
    // Kept for the life of the process, once per distinct name (bounded above): a label is
    // then a `&'static str`, and no metric call allocates.
    let name: &'static str = Box::leak(name.into_boxed_str());
    classes.insert(name);
    name
}

/// Why a held lock was lost: the `reason` label of `lock_leases_lost_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LossReason {
    /// The local validity deadline passed without a successful renewal.
    Expired,
    /// A renewal (or `extend`) found the lock no longer ours.
    Renewal,
    /// Writing or removing an idempotency record found the lock no longer ours.
    Idempotency,
    /// The release found the lock no longer ours.
    Release,
    /// Anything else (tests).
    Other,
}

impl LossReason {
    /// The reason behind a `Held::mark_lost` message.
    pub(crate) fn of(why: &str) -> Self {
        if why.starts_with("the local validity deadline") {
            LossReason::Expired
        } else if why.starts_with("renewal") || why.starts_with("extend") {
            LossReason::Renewal
        } else if why.contains("idempotency") {
            LossReason::Idempotency
        } else {
            LossReason::Other
        }
    }

    pub(crate) fn label(self) -> &'static str {
        match self {
            LossReason::Expired => "expired",
            LossReason::Renewal => "renewal",
            LossReason::Idempotency => "idempotency",
            LossReason::Release => "release",
            LossReason::Other => "other",
        }
    }
}

/// One acquisition being observed: its span (`lock.acquire`), its class, and the caller's span,
/// under which the held lock's span goes.
#[derive(Debug)]
pub(crate) struct Acquiring {
    pub(crate) span: Span,
    caller: Span,
    class: &'static str,
    backend: &'static str,
    /// When it started, if anyone is told how long it took.
    start: Option<Instant>,
}

impl Acquiring {
    /// Starts observing an acquisition of `key`, in the caller's context (its current span is
    /// the parent of both spans).
    pub(crate) fn new(inner: &LockerInner, key: &LockKey, class: &'static str) -> Self {
        let span = tracing::info_span!(
            "lock.acquire",
            class,
            key = %key.display(),
            outcome = Empty,
            waited = Empty,
            wait_us = Empty,
            fence = Empty,
        );
        // No clock read, no caller's span, for nobody (no metrics, no span): the uncontended
        // lock costs next to nothing more without them.
        let observed = METRICS || !span.is_disabled();
        Acquiring {
            start: observed.then(Instant::now),
            caller: if observed {
                Span::current()
            } else {
                Span::none()
            },
            span,
            class,
            backend: inner.backend.kind(),
        }
    }

    /// The acquisition ended with `result`: its sample, its span's fields, and for a lock
    /// acquired the start of its `lock.held` span and `lock_held` count.
    pub(crate) fn finish(mut self, result: &Result<crate::LockGuard, LockError>) {
        let outcome = outcome(result);
        if !self.ended(outcome) {
            return;
        }
        if let Ok(guard) = result {
            let held = guard.held();
            if !self.span.is_disabled() {
                self.span.record("waited", held.waited);
                if let Some(fence) = held.fence {
                    self.span.record("fence", fence);
                }
            }
            let span = tracing::info_span!(
                parent: &self.caller,
                "lock.held",
                class = self.class,
                key = %held.key.display(),
                fence = Empty,
            );
            if let Some(fence) = held.fence {
                span.record("fence", fence);
            }
            // Nothing to keep without metrics and with the span disabled.
            if METRICS || !span.is_disabled() {
                held.observe(Holding::new(span, self.class, self.backend));
            }
        }
    }
}

impl Acquiring {
    /// Records how the acquisition ended (`outcome`): its sample and its span's fields, once.
    /// `false` when it is not observed (or was recorded already).
    fn ended(&mut self, outcome: &'static str) -> bool {
        let Some(start) = self.start.take() else {
            return false;
        };
        let took = start.elapsed();
        acquired_sample(self.class, self.backend, outcome, took);
        if !self.span.is_disabled() {
            self.span.record("outcome", outcome);
            self.span.record(
                "wait_us",
                u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
            );
        }
        true
    }
}

impl Drop for Acquiring {
    /// Dropped before its answer: the caller gave up (a `tokio::time::timeout` around the
    /// request, an HTTP client gone while its request waited in a layer). Counted as
    /// `cancelled`, with the time it waited: otherwise the longest waits, those callers gave up
    /// on, would be missing from the histogram. Its `lock_waiters` count ends with it (see
    /// [`Waiting`]).
    fn drop(&mut self) {
        self.ended("cancelled");
    }
}

/// An acquisition refused before any I/O (a bad key, an option out of range): an `error`
/// sample of no duration, so that samples count every acquisition asked for.
pub(crate) fn refused(inner: &LockerInner, class: &'static str) {
    acquired_sample(class, inner.backend.kind(), "error", Duration::ZERO);
}

fn outcome(result: &Result<crate::LockGuard, LockError>) -> &'static str {
    match result {
        Ok(_) => "acquired",
        Err(LockError::Busy { .. }) => "busy",
        Err(LockError::Timeout { .. }) => "timeout",
        Err(_) => "error",
    }
}

/// A held lock being observed (kept by its `Held` from its acquisition's end to its own).
#[derive(Debug)]
pub(crate) struct Holding {
    span: Span,
    pub(crate) class: &'static str,
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    backend: &'static str,
    /// Its series of `lock_held` and `lock_held_duration_seconds`, looked up once: the
    /// release then records without a lookup.
    #[cfg(feature = "metrics")]
    series: (::metrics::Gauge, ::metrics::Histogram),
}

/// How a held lock stopped being held.
#[derive(Debug, Clone, Copy)]
pub(crate) enum End {
    Released,
    /// Passed to another task of the locker (local hand-off).
    Passed,
    Lost(LossReason),
}

impl Holding {
    fn new(span: Span, class: &'static str, backend: &'static str) -> Self {
        Holding {
            span,
            class,
            backend,
            #[cfg(feature = "metrics")]
            series: (
                ::metrics::gauge!(names::HELD, "class" => class, "backend" => backend),
                ::metrics::histogram!(names::HELD_DURATION, "class" => class, "backend" => backend),
            ),
        }
    }

    /// The `lock.held` span.
    pub(crate) fn span(&self) -> Span {
        self.span.clone()
    }

    /// Now held: counted in `lock_held`.
    pub(crate) fn started(&self) {
        #[cfg(feature = "metrics")]
        self.series.0.increment(1.0);
    }

    /// The lock held since `since` ended as `end`: its hold sample, and an event in its span
    /// (which closes when this is dropped).
    pub(crate) fn ended(self, since: Instant, end: End) {
        let held = since.elapsed();
        #[cfg(feature = "metrics")]
        {
            let (class, backend) = (self.class, self.backend);
            self.series.0.decrement(1.0);
            self.series.1.record(held.as_secs_f64());
            match end {
                End::Passed => {
                    ::metrics::counter!(names::LOCAL_HANDOFFS, "class" => class, "backend" => backend)
                        .increment(1);
                }
                End::Lost(reason) => lost_count(class, backend, reason),
                End::Released => {}
            }
        }
        let held_us = u64::try_from(held.as_micros()).unwrap_or(u64::MAX);
        // A loss was logged (`warn`) by whoever found it, in this span.
        self.span.in_scope(|| match end {
            End::Released => tracing::trace!(held_us, "lock released"),
            End::Passed => tracing::debug!(held_us, "lock passed on within the locker"),
            End::Lost(reason) => {
                tracing::debug!(held_us, reason = reason.label(), "lock ended: lost")
            }
        });
    }
}

/// A loss learnt only once the lock was no longer observed as held (its release found it
/// gone): counted, with an event in the caller's span.
pub(crate) fn lost_at_release(inner: &LockerInner, class: &'static str, key: &LockKey) {
    #[cfg(feature = "metrics")]
    lost_count(class, inner.backend.kind(), LossReason::Release);
    let _ = inner;
    tracing::debug!(class, key = %key.display(), "the release found the lock no longer ours");
}

#[cfg(feature = "metrics")]
fn lost_count(class: &'static str, backend: &'static str, reason: LossReason) {
    ::metrics::counter!(
        names::LEASES_LOST,
        "class" => class,
        "backend" => backend,
        "reason" => reason.label()
    )
    .increment(1);
}

fn acquired_sample(
    class: &'static str,
    backend: &'static str,
    outcome: &'static str,
    took: Duration,
) {
    #[cfg(feature = "metrics")]
    ::metrics::histogram!(
        names::ACQUIRE_DURATION,
        "class" => class,
        "backend" => backend,
        "outcome" => outcome
    )
    .record(took.as_secs_f64());
    let _ = (class, backend, outcome, took);
}

/// A lock received from a release that handed it over (no acquire round trip after it).
pub(crate) fn handed_over(inner: &LockerInner, class: &'static str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(names::HANDOVERS, "class" => class, "backend" => inner.backend.kind())
        .increment(1);
    let _ = (inner, class);
    tracing::debug!("lock handed over by its release");
}

/// A lock parked in its locker's grace was taken by a task of the locker: a local hand-off,
/// counted under the class of the holder that parked it.
pub(crate) fn local_handoff(inner: &LockerInner, class: &'static str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(names::LOCAL_HANDOFFS, "class" => class, "backend" => inner.backend.kind())
        .increment(1);
    let _ = (inner, class);
}

/// One renewal call of the watchdog, for `locks` locks, took `took` and ended `ok` (an answer
/// for each) or not.
pub(crate) fn renewal_call(inner: &LockerInner, took: Duration, ok: bool) {
    #[cfg(feature = "metrics")]
    ::metrics::histogram!(
        names::RENEWAL_DURATION,
        "backend" => inner.backend.kind(),
        "outcome" => if ok { "ok" } else { "error" }
    )
    .record(took.as_secs_f64());
    let _ = (inner, took, ok);
}

/// The verdict of one lock's renewal: `renewed`, `lost`, `undecided`, or `released` (released
/// while the renewal was on its way: "not ours" then is no loss).
pub(crate) fn renewal(inner: &LockerInner, class: Option<&'static str>, outcome: &'static str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(
        names::RENEWALS,
        "class" => class.unwrap_or(DEFAULT_CLASS),
        "backend" => inner.backend.kind(),
        "outcome" => outcome
    )
    .increment(1);
    let _ = (inner, class, outcome);
}

/// Counts the acquisition in `lock_waiters` while it waits (until dropped).
#[derive(Debug)]
pub(crate) struct Waiting {
    #[cfg(feature = "metrics")]
    gauge: ::metrics::Gauge,
}

impl Waiting {
    pub(crate) fn new(inner: &LockerInner, class: &'static str) -> Self {
        #[cfg(feature = "metrics")]
        {
            let backend = inner.backend.kind();
            let gauge = ::metrics::gauge!(names::WAITERS, "class" => class, "backend" => backend);
            gauge.increment(1.0);
            Waiting { gauge }
        }
        #[cfg(not(feature = "metrics"))]
        {
            let _ = (inner, class);
            Waiting {}
        }
    }
}

#[cfg(feature = "metrics")]
impl Drop for Waiting {
    fn drop(&mut self) {
        self.gauge.decrement(1.0);
    }
}

/// The metric names (the public contract: DESIGN.md, the guide's "Metrics and traces").
#[cfg(feature = "metrics")]
mod names {
    pub(super) const ACQUIRE_DURATION: &str = "lock_acquire_duration_seconds";
    pub(super) const HELD_DURATION: &str = "lock_held_duration_seconds";
    pub(super) const RENEWAL_DURATION: &str = "lock_renewal_duration_seconds";
    pub(super) const LEASES_LOST: &str = "lock_leases_lost_total";
    pub(super) const RENEWALS: &str = "lock_renewals_total";
    pub(super) const HANDOVERS: &str = "lock_handovers_total";
    pub(super) const LOCAL_HANDOFFS: &str = "lock_local_handoffs_total";
    pub(super) const HELD: &str = "lock_held";
    pub(super) const WAITERS: &str = "lock_waiters";
}
