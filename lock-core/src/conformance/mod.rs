//! The conformance kit: the checks every backend of this crate passes, offered to a backend of
//! your own (feature `conformance`, off by default).
//!
//! A [`Backend`] that passes every check keeps the guarantees of DESIGN.md's "Semantics every
//! backend must keep": one holder at a time, releases and renewals that only touch their own
//! lock, leases that free a dead holder's lock, bounded waits, release notifications, fences
//! that strictly increase (when offered), idempotency records written only by the holder.
//! The checks use only the public API ([`Locker`](crate::Locker),
//! [`LockGuard`](crate::LockGuard), [`LockRequest`](crate::LockRequest), the [`Backend`]
//! trait): [`Suite::new`] takes a factory of new handles on one shared store, and lockers on
//! separate handles contend as separate processes would.
//!
//! A capability the backend refuses ([`Backend::refuses`]: fencing, fair waiting) is not
//! skipped: its checks then check the refusal (a typed `InvalidConfig` before any I/O). A few
//! checks look beneath the API (a lock deleted behind its holder's back, the length of a
//! key's queue): they need a [`Probe`], a window onto the store, and are reported
//! [`Outcome::Skipped`] without one.
//!
//! ```
//! use lock_core::MemoryBackend;
//! use lock_core::backend::IntoBackend;
//! use lock_core::conformance::Suite;
//!
//! # tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(async {
//! let store = MemoryBackend::new();
//! let handles = store.clone();
//! let report = Suite::new(move || {
//!     let store = handles.clone();
//!     async move { Ok(store.into_backend()) }
//! })
//! .probe(store) // the memory backend can be read directly: no check is skipped
//! .only("acquire_returns_a_held_guard_for_the_key") // the whole suite takes a minute
//! .run()
//! .await; // panics naming every failed check
//! assert_eq!(report.passed().len(), 2); // with local hand-off on, then off
//! # });
//! ```

#![allow(
    clippy::panic,
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::print_stdout,
    reason = "a test kit: its checks fail by panicking (the runner catches each and names it) and print the figures of the stress"
)]

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::LockError;
use crate::backend::{Backend, BoxFuture};

/// Lists the checks of an area (the calling module): `name` or `name: [Need, ..]`.
macro_rules! checks {
    ($($name:ident $(: [$($need:ident),*])?),* $(,)?) => {
        /// The checks of this area, in order.
        pub(super) fn checks() -> Vec<super::Check> {
            vec![$(super::Check {
                area: module_path!(),
                name: stringify!($name),
                needs: &[$($(super::Need::$need),*)?],
                run: |fx| Box::pin($name(fx)),
            }),*]
        }
    };
}

mod acquire;
mod fencing;
mod fixture;
pub mod helpers;
mod idempotency;
mod keys;
mod lease;
mod operations;
mod wait;

use fixture::Fixture;

/// A window onto the store under test, for the checks that look beneath the API: what a test
/// harness can read or do directly (with the store's own client, not through lock-core).
/// Keys are given as the locker sees them, with the locker's prefix.
///
/// [`force_delete`](Self::force_delete) and [`queued`](Self::queued) are required (the checks
/// of a lock deleted behind its holder's back, and of a hand-over to a queued waiter, need
/// them); the rest answer `None` ("cannot tell") by default, and the checks then assert only
/// what the API shows.
///
/// ```
/// use lock_core::MemoryBackend;
/// use lock_core::conformance::Probe;
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let store = MemoryBackend::new();
/// assert_eq!(Probe::queued(&store, "lock:", "order:42").await, Some(0));
/// assert!(!Probe::force_delete(&store, "lock:", "order:42").await);
/// # });
/// ```
pub trait Probe: Send + Sync + 'static {
    /// Deletes the lock of `key` whoever holds it, as an operator would: `true` when there was
    /// one.
    fn force_delete<'a>(&'a self, prefix: &'a str, key: &'a str) -> BoxFuture<'a, bool>;

    /// How many waiters queue for `key` in the store (0 for a backend without a queue);
    /// `None` when it cannot tell.
    fn queued<'a>(&'a self, prefix: &'a str, key: &'a str) -> BoxFuture<'a, Option<usize>>;

    /// The owner token stored for `key`'s lock and its remaining lease; `None` when the store
    /// cannot be read so.
    fn stored<'a>(&'a self, prefix: &'a str, key: &'a str) -> BoxFuture<'a, Option<Stored>> {
        let _ = (prefix, key);
        Box::pin(async { None })
    }

    /// Whether the store holds no lock, queue, record or anything else of its locks under
    /// `prefix` (fence counters aside: they must outlive their locks); `None` when it cannot
    /// tell.
    fn is_empty<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Option<bool>> {
        let _ = prefix;
        Box::pin(async { None })
    }

    /// The last fence the store drew for `key`, as it keeps it; `None` when it keeps none that
    /// can be read.
    fn fence_counter<'a>(&'a self, prefix: &'a str, key: &'a str) -> BoxFuture<'a, Option<u64>> {
        let _ = (prefix, key);
        Box::pin(async { None })
    }

    /// The remaining time to live of `key`'s idempotency record (`Some(None)`: no record);
    /// `None` when it cannot tell.
    fn record_ttl<'a>(
        &'a self,
        prefix: &'a str,
        key: &'a str,
    ) -> BoxFuture<'a, Option<Option<Duration>>> {
        let _ = (prefix, key);
        Box::pin(async { None })
    }
}

/// What a [`Probe`] read for a lock.
///
/// ```
/// let s = lock_core::conformance::Stored { token: None, remaining: None };
/// assert!(s.token.is_none());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// The owner token as stored; `None` when the lock is not there.
    pub token: Option<String>,
    /// What remains of its lease; `None` when it has no expiry (or is not there).
    pub remaining: Option<Duration>,
}

impl Probe for crate::MemoryBackend {
    fn force_delete<'a>(&'a self, prefix: &'a str, key: &'a str) -> BoxFuture<'a, bool> {
        Box::pin(async move { self.force_delete_prefixed(prefix, key) })
    }

    fn queued<'a>(&'a self, prefix: &'a str, key: &'a str) -> BoxFuture<'a, Option<usize>> {
        Box::pin(async move { Some(self.queued_prefixed(prefix, key)) })
    }

    fn is_empty<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Option<bool>> {
        Box::pin(async move { Some(self.held_under(prefix) == 0) })
    }
}

/// What a check needs of the backend beyond the required trait methods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Need {
    /// `fenced()`: without it the check asserts the refusal.
    Fencing,
    /// `fair()`: without it the check asserts the refusal.
    Fair,
    /// A release hands the lock to the queued waiter (no newcomer slips in).
    Handover,
    /// Simultaneous acquires of a fresh key: exactly one wins (a quorum store may refuse all).
    OneWinner,
    /// A [`Probe`].
    Probe,
    /// A short lease the check watches run out or be renewed: raised to the backend's floor
    /// ([`Suite::min_lease`]) with the check's waits in proportion, so the check mostly waits;
    /// where the floor is a second or more, [`Suite::run`] runs these checks together.
    ShortLease,
    /// A busy answer tells how long the holder's lease still runs (optional: see
    /// [`AttemptOptions::remaining`](crate::backend::AttemptOptions::remaining)).
    BusyHint,
    /// [`Backend::inspect`], [`Backend::force_unlock`] and [`Backend::list_page`]: without
    /// them the check asserts the refusal.
    Operations,
}

type CheckFn = fn(Fixture) -> Pin<Box<dyn Future<Output = ()>>>;

/// One check: its area, its name, what it needs, the property.
#[derive(Clone, Copy)]
struct Check {
    area: &'static str,
    name: &'static str,
    needs: &'static [Need],
    run: CheckFn,
}

fn all_checks() -> Vec<Check> {
    let mut all = Vec::new();
    for area in [
        acquire::checks(),
        lease::checks(),
        wait::checks(),
        fencing::checks(),
        keys::checks(),
        idempotency::checks(),
        operations::checks(),
    ] {
        all.extend(area);
    }
    for check in &mut all {
        check.area = check.area.rsplit("::").next().unwrap_or(check.area);
    }
    all
}

/// A factory of new handles on the store under test.
type Connect =
    Arc<dyn Fn() -> BoxFuture<'static, Result<Arc<dyn Backend>, LockError>> + Send + Sync>;

/// The conformance suite, set up for one store: run all of it ([`run`](Self::run)) or one
/// check by name ([`run_check`](Self::run_check), for a harness that lists each as a test of
/// its own).
///
/// ```
/// use lock_core::MemoryBackend;
/// use lock_core::backend::IntoBackend;
/// use lock_core::conformance::{Outcome, Suite};
///
/// # tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(async {
/// let store = MemoryBackend::new();
/// let suite = Suite::new({
///     let store = store.clone();
///     move || {
///         let store = store.clone();
///         async move { Ok(store.into_backend()) }
///     }
/// })
/// .probe(store);
/// assert!(Suite::checks().contains(&"fences_rise_across_release"));
/// assert_eq!(suite.run_check("fences_rise_across_release").await, Outcome::Passed);
/// # });
/// ```
#[derive(Clone)]
pub struct Suite {
    connect: Connect,
    probe: Option<Arc<dyn Probe>>,
    prefix: String,
    local_handoff: Option<bool>,
    fencing: Option<bool>,
    fair: Option<bool>,
    handover: Option<bool>,
    one_winner: bool,
    consecutive_fences: bool,
    min_lease: Option<Duration>,
    busy_hint: bool,
    last_fence_kept: bool,
    stress_iterations: u64,
    only: Option<String>,
}

impl std::fmt::Debug for Suite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Suite")
            .field("probe", &self.probe.is_some())
            .field("prefix", &self.prefix)
            .field("local_handoff", &self.local_handoff)
            .field("fencing", &self.fencing)
            .field("fair", &self.fair)
            .field("handover", &self.handover)
            .field("one_winner", &self.one_winner)
            .field("consecutive_fences", &self.consecutive_fences)
            .field("min_lease", &self.min_lease)
            .field("busy_hint", &self.busy_hint)
            .field("last_fence_kept", &self.last_fence_kept)
            .field("stress_iterations", &self.stress_iterations)
            .finish_non_exhaustive()
    }
}

/// How one check ended (a failed check panics, naming itself).
///
/// ```
/// use lock_core::conformance::Outcome;
/// assert_ne!(Outcome::Passed, Outcome::Skipped("needs a Probe"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The property held.
    Passed,
    /// The backend refuses what the check needs, and the refusal was checked instead.
    Refused,
    /// Not applicable to this backend, and why.
    Skipped(&'static str),
}

/// What [`Suite::run`] saw: every check by name (`area::name`, with ` (local hand-off off)`
/// for the second pass), with its outcome.
///
/// ```
/// # use lock_core::conformance::Report;
/// fn summary(report: &Report) -> String {
///     format!("{} passed, {} skipped", report.passed().len(), report.skipped().len())
/// }
/// ```
#[derive(Debug, Clone, Default)]
pub struct Report {
    outcomes: Vec<(String, Outcome)>,
}

impl Report {
    /// The checks that passed (or whose refusal was checked).
    ///
    /// ```
    /// # let report = lock_core::conformance::Report::default();
    /// assert!(report.passed().is_empty());
    /// ```
    pub fn passed(&self) -> Vec<&str> {
        self.outcomes
            .iter()
            .filter(|(_, o)| !matches!(o, Outcome::Skipped(_)))
            .map(|(n, _)| n.as_str())
            .collect()
    }

    /// The checks left out, and why.
    ///
    /// ```
    /// # let report = lock_core::conformance::Report::default();
    /// assert!(report.skipped().is_empty());
    /// ```
    pub fn skipped(&self) -> Vec<(&str, &'static str)> {
        self.outcomes
            .iter()
            .filter_map(|(n, o)| match o {
                Outcome::Skipped(why) => Some((n.as_str(), *why)),
                Outcome::Passed | Outcome::Refused => None,
            })
            .collect()
    }

    /// Every check run, with its outcome, in order.
    ///
    /// ```
    /// # let report = lock_core::conformance::Report::default();
    /// assert_eq!(report.outcomes().count(), 0);
    /// ```
    pub fn outcomes(&self) -> impl Iterator<Item = (&str, Outcome)> {
        self.outcomes.iter().map(|(n, o)| (n.as_str(), *o))
    }
}

impl Suite {
    /// The suite on the store `connect` opens a new handle on, each time it is called (every
    /// locker of a check gets a handle of its own). By default each capability is what the
    /// backend says ([`Backend::refuses`]), local hand-off runs on then off, and the lockers
    /// use the default prefix.
    ///
    /// ```
    /// use lock_core::MemoryBackend;
    /// use lock_core::backend::IntoBackend;
    /// let store = MemoryBackend::new();
    /// let suite = lock_core::conformance::Suite::new(move || {
    ///     let store = store.clone();
    ///     async move { Ok(store.into_backend()) }
    /// });
    /// # drop(suite);
    /// ```
    pub fn new<F, Fut>(connect: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Arc<dyn Backend>, LockError>> + Send + 'static,
    {
        Suite {
            connect: Arc::new(move || Box::pin(connect())),
            probe: None,
            prefix: crate::DEFAULT_PREFIX.to_owned(),
            local_handoff: None,
            fencing: None,
            fair: None,
            handover: None,
            one_winner: true,
            consecutive_fences: false,
            min_lease: None,
            busy_hint: true,
            last_fence_kept: true,
            stress_iterations: 500,
            only: None,
        }
    }

    /// A window onto the store, for the checks that need one (skipped without it).
    ///
    /// ```
    /// # let store = lock_core::MemoryBackend::new();
    /// # let suite = lock_core::conformance::Suite::new(|| async { Ok(lock_core::backend::IntoBackend::into_backend(lock_core::MemoryBackend::new())) });
    /// let suite = suite.probe(store);
    /// # drop(suite);
    /// ```
    #[must_use]
    pub fn probe(self, probe: impl Probe) -> Self {
        Suite {
            probe: Some(Arc::new(probe)),
            ..self
        }
    }

    /// The key prefix of every locker of the suite (a store shared with other runs).
    ///
    /// ```
    /// # let suite = lock_core::conformance::Suite::new(|| async { Ok(lock_core::backend::IntoBackend::into_backend(lock_core::MemoryBackend::new())) });
    /// let suite = suite.prefix("check7:");
    /// # drop(suite);
    /// ```
    #[must_use]
    pub fn prefix(self, prefix: impl Into<String>) -> Self {
        Suite {
            prefix: prefix.into(),
            ..self
        }
    }

    /// Runs the checks with local hand-off on only (`true`) or off only (`false`); by default
    /// [`run`](Self::run) runs them with it on, then off, and [`run_check`](Self::run_check)
    /// with it on.
    ///
    /// ```
    /// # let suite = lock_core::conformance::Suite::new(|| async { Ok(lock_core::backend::IntoBackend::into_backend(lock_core::MemoryBackend::new())) });
    /// let suite = suite.local_handoff(false);
    /// # drop(suite);
    /// ```
    #[must_use]
    pub fn local_handoff(self, on: bool) -> Self {
        Suite {
            local_handoff: Some(on),
            ..self
        }
    }

    /// Whether the backend offers fencing: its checks run, else they check that `fenced()` is
    /// refused. By default, what [`Backend::refuses`] says.
    ///
    /// ```
    /// # let suite = lock_core::conformance::Suite::new(|| async { Ok(lock_core::backend::IntoBackend::into_backend(lock_core::MemoryBackend::new())) });
    /// let suite = suite.fencing(true);
    /// # drop(suite);
    /// ```
    #[must_use]
    pub fn fencing(self, offered: bool) -> Self {
        Suite {
            fencing: Some(offered),
            ..self
        }
    }

    /// Whether the backend offers fair (FIFO) waiting: its checks run, else they check that
    /// `fair()` is refused. By default, what [`Backend::refuses`] says.
    ///
    /// ```
    /// # let suite = lock_core::conformance::Suite::new(|| async { Ok(lock_core::backend::IntoBackend::into_backend(lock_core::MemoryBackend::new())) });
    /// let suite = suite.fair(true);
    /// # drop(suite);
    /// ```
    #[must_use]
    pub fn fair(self, offered: bool) -> Self {
        Suite {
            fair: Some(offered),
            ..self
        }
    }

    /// Whether a release hands the lock to a waiter queued in the store (so no newcomer slips
    /// in). By default, whether the backend offers fair waiting.
    ///
    /// ```
    /// # let suite = lock_core::conformance::Suite::new(|| async { Ok(lock_core::backend::IntoBackend::into_backend(lock_core::MemoryBackend::new())) });
    /// let suite = suite.handover(true);
    /// # drop(suite);
    /// ```
    #[must_use]
    pub fn handover(self, offered: bool) -> Self {
        Suite {
            handover: Some(offered),
            ..self
        }
    }

    /// Whether simultaneous acquires of a fresh key may all be refused (a quorum of
    /// independent servers whose votes split, as Redlock's): then "at most one wins" is checked
    /// instead of "exactly one". Off by default.
    ///
    /// ```
    /// # let suite = lock_core::conformance::Suite::new(|| async { Ok(lock_core::backend::IntoBackend::into_backend(lock_core::MemoryBackend::new())) });
    /// let suite = suite.split_votes(true);
    /// # drop(suite);
    /// ```
    #[must_use]
    pub fn split_votes(self, possible: bool) -> Self {
        Suite {
            one_winner: !possible,
            ..self
        }
    }

    /// Whether each key's fences count 1, 2, 3, ... (the memory backend's do): the checks then
    /// assert the very next number, not just a larger one. Off by default (a consensus store's
    /// fences, its revisions, jump).
    ///
    /// ```
    /// # let suite = lock_core::conformance::Suite::new(|| async { Ok(lock_core::backend::IntoBackend::into_backend(lock_core::MemoryBackend::new())) });
    /// let suite = suite.consecutive_fences(true);
    /// # drop(suite);
    /// ```
    #[must_use]
    pub fn consecutive_fences(self, yes: bool) -> Self {
        Suite {
            consecutive_fences: yes,
            ..self
        }
    }

    /// The shortest lease the backend accepts (etcd's leases are whole seconds, at least 2 s).
    /// The checks that watch a short lease (50 to 600 ms) run out or be renewed then take the
    /// floor instead, never a lease the backend would refuse, and scale their waits with it (a
    /// check that waits 2.5 leases for a renewed lock waits 2.5 floors); on a backend without a
    /// floor they run as written. The other checks keep their leases, which are all long
    /// enough. With a floor of a second or more, [`run`](Self::run) runs those checks together
    /// (they mostly wait), after the others.
    ///
    /// ```
    /// # let suite = lock_core::conformance::Suite::new(|| async { Ok(lock_core::backend::IntoBackend::into_backend(lock_core::MemoryBackend::new())) });
    /// let suite = suite.min_lease(std::time::Duration::from_secs(2));
    /// # drop(suite);
    /// ```
    #[must_use]
    pub fn min_lease(self, floor: Duration) -> Self {
        Suite {
            min_lease: Some(floor),
            ..self
        }
    }

    /// Whether a busy answer tells how long the holder's lease still runs (default `true`): a
    /// backend that never reports it (`Attempt::Busy { remaining: None }`) has the check of
    /// the hint skipped.
    ///
    /// ```
    /// # let suite = lock_core::conformance::Suite::new(|| async { Ok(lock_core::backend::IntoBackend::into_backend(lock_core::MemoryBackend::new())) });
    /// let suite = suite.busy_hint(false);
    /// # drop(suite);
    /// ```
    #[must_use]
    pub fn busy_hint(self, reported: bool) -> Self {
        Suite {
            busy_hint: reported,
            ..self
        }
    }

    /// Whether [`Backend::inspect`] still shows a lock's last fence once it is released
    /// (default `true`: a fence counter that outlives its lock, as Redis's). A consensus store
    /// (etcd, ZooKeeper) draws each fence from the holder entry's place in its log, and keeps
    /// nothing of it once the entry is deleted: with `false`, the check asserts that a free lock
    /// shows no fence rather than a made-up one (the next fence is larger all the same, which
    /// the fencing checks assert).
    ///
    /// ```
    /// # let suite = lock_core::conformance::Suite::new(|| async { Ok(lock_core::backend::IntoBackend::into_backend(lock_core::MemoryBackend::new())) });
    /// let suite = suite.last_fence_kept(false);
    /// # drop(suite);
    /// ```
    #[must_use]
    pub fn last_fence_kept(self, kept: bool) -> Self {
        Suite {
            last_fence_kept: kept,
            ..self
        }
    }

    /// How many locked increments each of the stress's 8 tasks makes (default 500): fewer on a
    /// store whose every lock is a consensus round (etcd), so the run stays short. At least 1.
    ///
    /// ```
    /// # let suite = lock_core::conformance::Suite::new(|| async { Ok(lock_core::backend::IntoBackend::into_backend(lock_core::MemoryBackend::new())) });
    /// let suite = suite.stress_iterations(100);
    /// # drop(suite);
    /// ```
    #[must_use]
    pub fn stress_iterations(self, n: u64) -> Self {
        Suite {
            stress_iterations: n.max(1),
            ..self
        }
    }

    /// Has [`run`](Self::run) keep only the checks whose name contains `part` (to debug one).
    ///
    /// ```
    /// # let suite = lock_core::conformance::Suite::new(|| async { Ok(lock_core::backend::IntoBackend::into_backend(lock_core::MemoryBackend::new())) });
    /// let suite = suite.only("fence");
    /// # drop(suite);
    /// ```
    #[must_use]
    pub fn only(self, part: impl Into<String>) -> Self {
        Suite {
            only: Some(part.into()),
            ..self
        }
    }

    /// The name of every check, in the order [`run`](Self::run) runs them.
    ///
    /// ```
    /// let names = lock_core::conformance::Suite::checks();
    /// assert!(names.contains(&"stress_counter_ends_exact"));
    /// ```
    pub fn checks() -> Vec<&'static str> {
        all_checks().iter().map(|c| c.name).collect()
    }

    /// The area (`acquire`, `lease`, `wait`, `fencing`, `keys`, `idempotency`) of the check
    /// `name`.
    ///
    /// ```
    /// use lock_core::conformance::Suite;
    /// assert_eq!(Suite::area("stress_counter_ends_exact"), Some("acquire"));
    /// ```
    pub fn area(name: &str) -> Option<&'static str> {
        all_checks()
            .into_iter()
            .find(|c| c.name == name)
            .map(|c| c.area)
    }

    /// Runs the check `name` (one of [`checks`](Self::checks)) with local hand-off on (or as
    /// [`local_handoff`](Self::local_handoff) says), under the suite's prefix: give each call a
    /// store (or a [`prefix`](Self::prefix)) of its own, as a harness listing the checks as
    /// separate tests does.
    ///
    /// # Panics
    /// When the check fails (the message names it and says why), or no check has that name.
    ///
    /// ```
    /// # use lock_core::conformance::{Outcome, Suite};
    /// # tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(async {
    /// # let suite = Suite::new(|| async { Ok(lock_core::backend::IntoBackend::into_backend(lock_core::MemoryBackend::new())) });
    /// assert_eq!(suite.run_check("empty_key_is_invalid_key").await, Outcome::Passed);
    /// # });
    /// ```
    pub async fn run_check(&self, name: &str) -> Outcome {
        let check = all_checks()
            .into_iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no conformance check is named {name:?}"));
        let on = self.local_handoff.unwrap_or(true);
        match CatchUnwind(Box::pin(self.run_one(&check, on))).await {
            Ok(outcome) => outcome,
            Err(why) => panic!("conformance check {name} failed: {why}"),
        }
    }

    /// Runs every check (but those [`only`](Self::only) leaves out), with local hand-off on
    /// then off (or as [`local_handoff`](Self::local_handoff) says), one after the other (those
    /// that wait on a lease stretched to a [`min_lease`](Self::min_lease) of a second or more
    /// run together, last), each under a key prefix of its own (the suite's prefix followed by
    /// the run's number).
    ///
    /// # Panics
    /// When a check failed, after all ran: the message names each failed check and says why.
    ///
    /// ```no_run
    /// # async fn demo(suite: lock_core::conformance::Suite) {
    /// let report = suite.run().await;
    /// println!("{} checks passed, skipped: {:?}", report.passed().len(), report.skipped());
    /// # }
    /// ```
    pub async fn run(&self) -> Report {
        let passes: &[bool] = match self.local_handoff {
            Some(true) => &[true],
            Some(false) => &[false],
            None => &[true, false],
        };
        let mut runs = Vec::new();
        for &on in passes {
            for check in all_checks() {
                if self
                    .only
                    .as_deref()
                    .is_none_or(|part| check.name.contains(part))
                {
                    runs.push((check, on));
                }
            }
        }
        // A floor of seconds makes each short-lease check wait seconds for a lease: they run
        // together once the others are done, so the run waits about one floor for all of them.
        let together = self.min_lease.is_some_and(|f| f >= Duration::from_secs(1));
        let mut ended: Vec<Option<Result<Outcome, String>>> = vec![None; runs.len()];
        let mut waiting = Vec::new();
        for (i, &(check, on)) in runs.iter().enumerate() {
            if together && check.needs.contains(&Need::ShortLease) {
                waiting.push(i);
                continue;
            }
            let own = self.numbered(i);
            ended[i] = Some(CatchUnwind(Box::pin(own.run_one(&check, on))).await);
        }
        if !waiting.is_empty() {
            // The checks' futures are not `Send`: they share this thread.
            let local = tokio::task::LocalSet::new();
            let tasks: Vec<_> = waiting
                .iter()
                .map(|&i| {
                    let (check, on) = runs[i];
                    let own = self.numbered(i);
                    local.spawn_local(async move { own.run_one(&check, on).await })
                })
                .collect();
            local
                .run_until(async {
                    for (&i, task) in waiting.iter().zip(tasks) {
                        ended[i] = Some(task.await.map_err(|e| match e.try_into_panic() {
                            Ok(payload) => panic_message(payload.as_ref()),
                            Err(e) => e.to_string(),
                        }));
                    }
                })
                .await;
        }
        let mut report = Report::default();
        let mut failed = Vec::new();
        for ((check, on), end) in runs.iter().zip(ended) {
            let name = if *on {
                format!("{}::{}", check.area, check.name)
            } else {
                format!("{}::{} (local hand-off off)", check.area, check.name)
            };
            match end {
                Some(Ok(outcome)) => report.outcomes.push((name, outcome)),
                Some(Err(why)) => failed.push(format!("{name}: {why}")),
                None => failed.push(format!("{name}: never ran")),
            }
        }
        assert!(
            failed.is_empty(),
            "{} conformance check(s) failed:\n{}",
            failed.len(),
            failed.join("\n")
        );
        report
    }

    /// The suite for run `i` of [`run`](Self::run): each check under a prefix of its own, so
    /// that what one left behind (a record, a fence counter, a lock still expiring) never meets
    /// the next.
    fn numbered(&self, i: usize) -> Suite {
        Suite {
            prefix: format!("{}{}:", self.prefix, i + 1),
            ..self.clone()
        }
    }

    /// Runs `check` with local hand-off `on`, or the refusal of what it needs.
    async fn run_one(&self, check: &Check, on: bool) -> Outcome {
        let fx = Fixture::new(self, on);
        let probe = fx.backend().await;
        let fencing = self
            .fencing
            .unwrap_or_else(|| probe.refuses(true, false).is_none());
        let fair = self
            .fair
            .unwrap_or_else(|| probe.refuses(false, true).is_none());
        let handover = self.handover.unwrap_or(fair);
        let operations = match crate::backend::LockKey::new(&self.prefix, "operations") {
            Ok(key) => !matches!(
                probe.inspect(&key).await,
                Err(LockError::InvalidConfig { .. })
            ),
            Err(_) => false,
        };
        drop(probe);
        let mut refused = None;
        let mut skipped = None;
        for need in check.needs {
            match need {
                Need::Fencing if !fencing => refused = Some(Need::Fencing),
                Need::Fair if !fair => refused = Some(Need::Fair),
                Need::Operations if !operations => refused = Some(Need::Operations),
                Need::Handover if !handover => {
                    skipped = Some("no hand-over to a queued waiter");
                }
                Need::OneWinner if !self.one_winner => {
                    skipped = Some("simultaneous racers may split the vote");
                }
                Need::Probe if self.probe.is_none() => skipped = Some("needs a Probe"),
                Need::BusyHint if !self.busy_hint => {
                    skipped = Some("the backend does not report the holder's remaining lease");
                }
                _ => {}
            }
        }
        // A refusal is checked even where the check itself would not apply.
        if let (None, Some(why)) = (refused, skipped) {
            return Outcome::Skipped(why);
        }
        match refused {
            Some(Need::Operations) => {
                fx.assert_operations_refused().await;
                Outcome::Refused
            }
            Some(need) => {
                fx.assert_refused(need == Need::Fencing).await;
                Outcome::Refused
            }
            None => {
                (check.run)(fx.with_fences(self.consecutive_fences)).await;
                Outcome::Passed
            }
        }
    }
}

/// A future that turns a panic while polling `F` into `Err` with the panic's message.
struct CatchUnwind<F>(F);

impl<F: Future + Unpin> Future for CatchUnwind<F> {
    type Output = Result<F::Output, String>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = &mut self.0;
        match std::panic::catch_unwind(AssertUnwindSafe(|| Pin::new(inner).poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Err(payload) => Poll::Ready(Err(panic_message(payload.as_ref()))),
        }
    }
}

/// What a panic said.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "panicked".to_owned())
}
