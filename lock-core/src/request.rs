//! [`LockRequest`]: one request for a lock, its options, and how it is acquired.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use std::collections::VecDeque;

use tokio::time::Instant;

use crate::backend::{Attempt, FairTicket, Grant, Inbox};
use crate::guard::{Acquisition, Held, LockGuard};
use crate::key::LockKey;
use crate::locker::{Locker, LockerInner, MAX_LEASE, validate_lease, validate_wait};
use crate::token::Token;
use crate::{LockError, scope};

/// Backoff bounds while release notifications are unavailable.
const DEGRADED_MIN: Duration = Duration::from_millis(5);
const DEGRADED_MAX: Duration = Duration::from_millis(250);
/// Slack added to a holder's remaining lease before trying again (clock granularity).
const EXPIRY_SLACK: Duration = Duration::from_millis(1);
/// How long a queued waiter's ticket stays in the backend's queue without a refresh; waiters
/// refresh it every third of that (more often for short leases). A crashed waiter holds up the
/// queue for at most this long, and a lock handed to it just before its ticket died for at
/// most this long again (the handover lease is at most this too).
pub(crate) const TICKET_TTL: Duration = Duration::from_secs(3);
/// Refreshes of a ticket are never closer than this.
const MIN_REFRESH: Duration = Duration::from_millis(50);
/// How many recent attempts a waiter remembers, to date a handover that names one of them.
const REMEMBERED_ATTEMPTS: usize = 8;
/// How far past its wait a request may return: time for a healthy backend to take a timed-out
/// waiter's ticket out of the queue before the caller hears of the timeout (so the next release
/// does not hand the lock to a waiter that is gone). A backend that has not answered by then is
/// left to finish in the background.
const DEADLINE_SLACK: Duration = Duration::from_millis(20);

/// A request for the lock on one key; from [`Locker::lock`] or [`Locker::try_lock`].
///
/// Set options, then `.await` it for a [`LockGuard`] or call [`run`](Self::run) to run a future
/// under the lock.
///
/// ```
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use std::time::Duration;
/// let locker = lock_core::Locker::memory();
/// let guard = locker
///     .lock("payment:9")
///     .wait(Duration::from_secs(2))
///     .lease(Duration::from_secs(10))
///     .fenced()
///     .await?;
/// assert!(guard.fence().is_some());
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
/// ```
#[derive(Debug)]
#[must_use = "a lock request does nothing until awaited or run"]
pub struct LockRequest {
    locker: Locker,
    key: String,
    wait: Option<Duration>,
    lease: Option<Duration>,
    fenced: bool,
    watchdog: Option<bool>,
    max_hold: Option<Duration>,
    fair: bool,
}

impl LockRequest {
    pub(crate) fn new(locker: Locker, key: String) -> Self {
        LockRequest {
            locker,
            key,
            wait: None,
            lease: None,
            fenced: false,
            watchdog: None,
            max_hold: None,
            fair: false,
        }
    }

    /// Waits up to `wait` for the lock (zero: one attempt). Beyond it: [`LockError::Timeout`].
    ///
    /// ```
    /// # async fn demo() {
    /// use std::time::Duration;
    /// let locker = lock_core::Locker::memory();
    /// let _g = locker.lock("k").await.unwrap();
    /// let r = locker.lock("k").wait(Duration::from_millis(20)).await;
    /// assert!(matches!(r, Err(lock_core::LockError::Timeout { .. })));
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// One attempt, no waiting: [`LockError::Busy`] when held.
    ///
    /// ```
    /// # async fn demo() {
    /// let locker = lock_core::Locker::memory();
    /// let _g = locker.lock("k").await.unwrap();
    /// assert!(matches!(locker.lock("k").no_wait().await, Err(lock_core::LockError::Busy { .. })));
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub fn no_wait(self) -> Self {
        self.wait(Duration::ZERO)
    }

    /// The lease for this lock (default: the locker's).
    ///
    /// When a release hands the lock to this request while it waits, the handover sets a lease
    /// of at most 3 s (so a waiter that died unseen holds the key only briefly); the watchdog
    /// extends it to this lease within its first second, or, with the watchdog off, the waiter
    /// sets this lease with one more round trip before it returns.
    ///
    /// ```
    /// # async fn demo() {
    /// use std::time::Duration;
    /// let g = lock_core::Locker::memory().lock("k").lease(Duration::from_secs(3)).await.unwrap();
    /// assert_eq!(g.lease(), Duration::from_secs(3));
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Draws a fencing token with the lock: [`LockGuard::fence`] is then `Some(n)`, with `n`
    /// strictly greater than every token drawn before for this key (across releases, expiries,
    /// processes and client restarts).
    ///
    /// On Redis a token is the larger of the last one drawn plus one and the server's clock in
    /// microseconds, so tokens keep rising when the server loses its data (a restart without
    /// persistence, `FLUSHALL`, a failover), as long as the server's clock does not go backwards
    /// (after a failover: as long as the new primary's clock is not behind the old one's). The
    /// counter key expires with the lock's lease: a fenced key costs nothing once unused. In
    /// memory the tokens count from 1 per key name, for as long as the backend lives.
    ///
    /// ```
    /// # async fn demo() {
    /// let g = lock_core::Locker::memory().lock("k").fenced().await.unwrap();
    /// assert_eq!(g.fence(), Some(1));
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub fn fenced(mut self) -> Self {
        self.fenced = true;
        self
    }

    /// Whether the watchdog renews this lock while it is held (default: the locker's, `true`).
    /// Without it the lock lasts one lease unless you call [`LockGuard::extend`].
    ///
    /// ```
    /// # async fn demo() {
    /// let g = lock_core::Locker::memory().lock("k").watchdog(false).await.unwrap();
    /// # drop(g);
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub fn watchdog(mut self, on: bool) -> Self {
        self.watchdog = Some(on);
        self
    }

    /// Caps how long the lock is held (above zero, at most [`MAX_LEASE`](crate::MAX_LEASE)):
    /// renewal stops after `max_hold`, and [`run`](Self::run) cancels its body then with
    /// [`LockError::MaxHoldExceeded`].
    ///
    /// ```
    /// # async fn demo() {
    /// use std::time::Duration;
    /// let r = lock_core::Locker::memory()
    ///     .lock("k")
    ///     .max_hold(Duration::from_millis(20))
    ///     .run(tokio::time::sleep(Duration::from_secs(60)))
    ///     .await;
    /// assert!(matches!(r, Err(lock_core::LockError::MaxHoldExceeded { .. })));
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// Waits in first-come, first-served order across processes: every waiter has its own
    /// ticket in the backend's queue of the key, only the oldest live ticket takes a free lock,
    /// and a release hands the lock straight to it. Waiters refresh their ticket every second;
    /// a crashed waiter is skipped after at most 3 s (a lock handed to it just before that is
    /// held at most 3 s more: a handover sets a lease of at most 3 s).
    ///
    /// In the default mode the queue holds one ticket per waiting locker (the head of its
    /// local queue) and a waiter takes a lock it finds free whatever its place; releases hand
    /// over the same way. Fair mode costs more: every waiter keeps its own place, and
    /// subscription, in the backend. Fair and default requests on one key can be mixed.
    ///
    /// ```
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let locker = lock_core::Locker::memory();
    /// let guard = locker.lock("payout:batch").fair().await?;
    /// # drop(guard); Ok(()) }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
    /// ```
    pub fn fair(mut self) -> Self {
        self.fair = true;
        self
    }

    /// The key asked for.
    ///
    /// ```
    /// assert_eq!(lock_core::Locker::memory().lock("k").key(), "k");
    /// ```
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Runs `body` under the lock and releases it afterwards.
    ///
    /// If the lease is lost while the body runs, the body is dropped at once (at its next
    /// `.await`) and `run` returns [`LockError::LeaseLost`]; the same if the body finished but
    /// the lease had already been lost. Inside the body, locking the same key again through
    /// the same locker is reentrant, and [`current_lock`](crate::current_lock) describes the lock.
    ///
    /// After the body, `run` releases the lock and returns its output only when the release
    /// went through: when the backend answers that the lock was no longer ours (the key
    /// expired, was deleted, or another owner holds it, e.g. after a server restart without
    /// persistence), `run` returns [`LockError::LeaseLost`], since the body may have overlapped
    /// with another owner. When the backend does not answer that release ([`LockError::Backend`]:
    /// unreachable, timed out), the outcome is unknown but the body ran while the lease was
    /// valid by the local clock: `run` logs a warning and returns the output, and the lease
    /// expires on its own.
    ///
    /// Reentrant use (the current scope already holds the key, e.g. inside another `run` of
    /// it or a [`LockGuard::scope`]) neither acquires nor releases: the body runs under the
    /// outer lock and is dropped at once, with `LeaseLost`, when the outer lock stops being
    /// held for any reason (released, dropped, lost, past its validity deadline).
    ///
    /// # Errors
    /// Acquisition errors (`Busy`, `Timeout`, `InvalidKey`, `Backend`...), `LeaseLost`,
    /// `MaxHoldExceeded`. The body never runs without the lock.
    ///
    /// ```
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let locker = lock_core::Locker::memory();
    /// let stock = std::sync::atomic::AtomicI64::new(10);
    /// let left = locker.lock("inventory:sku-1").run(async {
    ///     stock.fetch_sub(1, std::sync::atomic::Ordering::SeqCst) - 1
    /// }).await?;
    /// assert_eq!(left, 9);
    /// # Ok(()) }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
    /// ```
    pub async fn run<F: Future>(self, body: F) -> Result<F::Output, LockError> {
        if let Some(held) = self.reentrant() {
            // Reentrant: the outer scope holds and releases the lock. The body ends when the
            // outer lock ends, whatever ends it (release, drop, loss, deadline) and whatever
            // the outer scope is (a `run`, or a guard's `scope` that may run in another task
            // than the guard's owner): it must never run under a lock someone else may hold.
            let held = held?;
            let out = tokio::select! {
                biased;
                () = held.ended() => return Err(held.lease_lost()),
                out = body => out,
            };
            return if held.is_held() {
                Ok(out)
            } else {
                Err(held.lease_lost())
            };
        }
        let max_hold = self.max_hold;
        let guard = self.acquire_owned().await?;
        let held = guard.held().clone();
        let outcome = scope::enter(held.clone(), async {
            let cap = async {
                match max_hold {
                    Some(d) => tokio::time::sleep_until(held.acquired_at + d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                () = held.lost() => Err(held.lease_lost()),
                () = cap => Err(LockError::MaxHoldExceeded {
                    key: held.key.user().to_owned(),
                    max_hold: max_hold.unwrap_or_default(),
                }),
                out = body => Ok(out),
            }
        })
        .await;
        match outcome {
            Ok(out) if held.is_held() => match guard.release().await {
                Ok(()) => Ok(out),
                // "Not ours": the key expired, was deleted or taken behind our back (a server
                // that lost its data, say), so the body may have overlapped another owner.
                Err(e @ LockError::LeaseLost { .. }) => Err(e),
                Err(e) => {
                    // No answer: the body ran while the lease was valid by the local clock;
                    // the lease expires on its own.
                    tracing::warn!(key = %crate::key::display_key(held.key.user()), error = %e, "release after run failed; the lease will expire");
                    Ok(out)
                }
            },
            // After a loss the guard drops here and releases in the background: the caller
            // learns of the loss now, not after a round trip to a server that may not answer.
            Ok(_) => Err(held.lease_lost()),
            Err(e @ LockError::LeaseLost { .. }) => Err(e),
            Err(e) => {
                // Still ours (max_hold): free it before returning, as on success.
                let _ = guard.release().await;
                Err(e)
            }
        }
    }

    /// The lock of the current `run` scope for this key, if it holds one: reentrant use.
    /// Its own options do not apply (the outer lock's lease, watchdog and `max_hold` rule), but
    /// asking for a fence the outer lock does not have is refused rather than ignored.
    fn reentrant(&self) -> Option<Result<Arc<Held>, LockError>> {
        let held = scope::find(self.locker.inner.id, &self.key)?;
        if !held.is_held() {
            return Some(Err(held.lease_lost()));
        }
        if self.fenced && held.fence.is_none() {
            return Some(Err(LockError::config(format!(
                "lock {:?} is already held without a fence by this run scope; ask for .fenced() on the outermost lock",
                crate::key::display_key(&self.key)
            ))));
        }
        Some(Ok(held))
    }

    async fn acquire(self) -> Result<LockGuard, LockError> {
        if let Some(held) = self.reentrant() {
            return held.map(LockGuard::reentrant);
        }
        self.acquire_owned().await
    }

    /// Acquires the lock for real (the caller checked it is not held by the current scope).
    async fn acquire_owned(self) -> Result<LockGuard, LockError> {
        let inner = &self.locker.inner;
        if let Some(e) = &inner.config.error {
            return Err(e.clone());
        }
        let key = LockKey::new(&inner.config.prefix, &self.key)?;
        let spec = Spec {
            wait: self.wait.unwrap_or(inner.config.wait),
            lease: self.lease.unwrap_or(inner.config.lease),
            fenced: self.fenced,
            watchdog: self.watchdog.unwrap_or(inner.config.watchdog),
            max_hold: self.max_hold,
        };
        validate_lease(spec.lease)?;
        validate_wait(spec.wait)?;
        if let Some(m) = spec.max_hold.filter(|m| m.is_zero() || *m > MAX_LEASE) {
            return Err(LockError::config(format!(
                "max_hold {m:?} is out of range: use above zero and at most {MAX_LEASE:?}"
            )));
        }
        let start = Instant::now();
        let engine = async {
            if self.fair {
                acquire_fair(inner, &key, &spec, start).await
            } else {
                acquire(inner, &key, &spec, start).await
            }
        };
        if spec.wait.is_zero() {
            // One attempt: bounded by the backend's own response timeout.
            return engine.await;
        }
        // The wait is a bound, whatever the backend does: an attempt or a clean-up still in
        // flight at the deadline is dropped here and finished in the background (an attempt
        // that turns out to have taken the lock releases it; a queued ticket leaves), and a
        // lock granted after the bound is released, never returned.
        let bound = start + spec.wait + DEADLINE_SLACK;
        match tokio::time::timeout_at(bound, engine).await {
            Ok(Ok(guard)) if Instant::now() > bound => {
                drop(guard);
                Err(timed_out(&key, start))
            }
            Ok(outcome) => outcome,
            Err(_) => Err(timed_out(&key, start)),
        }
    }
}

impl IntoFuture for LockRequest {
    type Output = Result<LockGuard, LockError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'static>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.acquire())
    }
}

#[derive(Debug, Clone, Copy)]
struct Spec {
    wait: Duration,
    lease: Duration,
    fenced: bool,
    watchdog: bool,
    max_hold: Option<Duration>,
}

/// Acquires `key`: one attempt; then, when waiting is allowed, a place in the local queue and,
/// as its head, a place in the backend's queue, where a release hands the lock over directly;
/// the head also tries again when the holder's lease runs out or a plain release is announced.
async fn acquire(
    inner: &Arc<LockerInner>,
    key: &LockKey,
    spec: &Spec,
    start: Instant,
) -> Result<LockGuard, LockError> {
    let deadline = start + spec.wait;
    // Nobody queues here: contend at once (the uncontended path is this one round trip).
    if spec.wait.is_zero() || !inner.queues.has_waiters(key) {
        match attempt(inner, key, spec, false).await? {
            Ok(guard) => return Ok(guard),
            Err(r) if spec.wait.is_zero() => {
                return Err(LockError::Busy {
                    key: key.user().to_owned(),
                    retry_after: r,
                });
            }
            Err(_) => {}
        }
    }
    let ticket = inner.queues.join(inner, key);
    tokio::time::timeout_at(deadline, ticket.my_turn())
        .await
        .map_err(|_| timed_out(key, start))?;
    // Subscribed before the next attempt, so a release after it cannot go unnoticed.
    tokio::time::timeout_at(deadline, ticket.subscribe())
        .await
        .map_err(|_| timed_out(key, start))?;
    let mut queued = Queued::new(inner, key, spec, ticket.inbox(), false);
    queued.wait(deadline, start, false).await
}

/// Acquires `key` in fair mode: this waiter's own ticket joins the backend's FIFO on its first
/// attempt, and only the queue's head takes a free lock; a release hands the lock to the next
/// live ticket.
async fn acquire_fair(
    inner: &Arc<LockerInner>,
    key: &LockKey,
    spec: &Spec,
    start: Instant,
) -> Result<LockGuard, LockError> {
    let deadline = start + spec.wait;
    let inbox = Arc::new(Inbox::default());
    let mut queued = Queued::new(inner, key, spec, inbox.clone(), true);
    if spec.wait.is_zero() {
        queued.ticket.ttl = Duration::ZERO;
        return match queued.attempt(false).await? {
            Ok(guard) => Ok(guard),
            Err(retry_after) => Err(LockError::Busy {
                key: key.user().to_owned(),
                retry_after,
            }),
        };
    }
    queued.own_subscription = true;
    // Subscribed before the first attempt: a release after it hands over to us or wakes us.
    tokio::time::timeout_at(deadline, inner.backend.subscribe(key, &inbox))
        .await
        .map_err(|_| timed_out(key, start))?;
    queued.wait(deadline, start, true).await
}

/// A waiter with a ticket in the backend's queue of its key. Each attempt refreshes the ticket
/// and registers the attempt's token, lease and fencing choice; a release that finds the ticket
/// at the head sets the lock to that token and names the ticket and attempt in its message, so
/// the waiter owns the lock without another round trip. Its lease is counted from the moment
/// that attempt was sent (the handover came after the server saw it), which is why the waiter
/// remembers when it sent each recent attempt.
///
/// Dropping it before the lock was acquired takes the ticket out of the queue in the
/// background, passing the lock on if a release handed it over meanwhile.
struct Queued {
    inner: Arc<LockerInner>,
    key: LockKey,
    spec: Spec,
    inbox: Arc<Inbox>,
    ticket: FairTicket,
    token: Token,
    /// Recent attempts of this identity: generation and when it was sent. They all registered
    /// `token` (a new identity starts with an empty list).
    sent: VecDeque<(u64, Instant)>,
    /// Whether the backend may hold the ticket (an attempt that could queue was sent).
    registered: bool,
    acquired: bool,
    /// A fair waiter's inbox is its own subscription, dropped with it.
    own_subscription: bool,
}

impl Queued {
    fn new(
        inner: &Arc<LockerInner>,
        key: &LockKey,
        spec: &Spec,
        inbox: Arc<Inbox>,
        strict: bool,
    ) -> Self {
        // A handed-over lock starts with a short lease (the watchdog, or the waiter's next
        // attempt, takes it to the full lease), so a waiter that died without leaving its
        // ticket holds the key only briefly.
        let handover_lease = spec.lease.min(TICKET_TTL);
        let ticket = FairTicket {
            id: new_ticket_id(inner),
            ttl: TICKET_TTL,
            strict,
            generation: 0,
            handover_lease,
        };
        inbox.expect(Some(&ticket.id));
        inbox.clear_wakeup();
        Queued {
            inner: inner.clone(),
            key: key.clone(),
            spec: *spec,
            inbox,
            ticket,
            token: inner.new_token(),
            sent: VecDeque::with_capacity(REMEMBERED_ATTEMPTS),
            registered: false,
            acquired: false,
            own_subscription: false,
        }
    }

    /// How often the ticket is refreshed: often enough that a handover leaves most of its
    /// lease to the new owner.
    fn refresh_every(&self) -> Duration {
        (self.ticket.ttl / 3)
            .min(self.ticket.handover_lease / 4)
            .max(MIN_REFRESH)
    }

    /// The token is spent (an acquisition with it was given up and is being released): the
    /// next attempts register a new token under a new ticket, and older handovers are ignored.
    fn renew_identity(&mut self) {
        let token = std::mem::replace(&mut self.token, self.inner.new_token());
        let ticket = std::mem::replace(&mut self.ticket.id, new_ticket_id(&self.inner));
        self.sent.clear();
        self.inbox.expect(Some(&self.ticket.id));
        if std::mem::take(&mut self.registered) {
            // A later attempt may have queued the old ticket again: take it out, so no release
            // hands the lock to a token nobody waits with.
            leave_in_background(&self.inner, &self.key, ticket, token);
        }
    }

    /// One attempt: acquires, or (re)registers the ticket with this attempt's generation.
    async fn attempt(
        &mut self,
        waited: bool,
    ) -> Result<Result<LockGuard, Option<Duration>>, LockError> {
        self.ticket.generation += 1;
        let sent_at = Instant::now();
        if self.sent.len() == REMEMBERED_ATTEMPTS {
            self.sent.pop_front();
        }
        self.sent.push_back((self.ticket.generation, sent_at));
        self.registered |= !self.ticket.ttl.is_zero();
        let mut in_flight = InFlight {
            inner: &self.inner,
            key: &self.key,
            token: Some(&self.token),
        };
        let answer = self
            .inner
            .call()
            .acquire(
                &self.key,
                &self.token,
                self.spec.lease,
                self.spec.fenced,
                Some(&self.ticket),
            )
            .await;
        let answer = match answer {
            Ok(answer) => answer,
            Err(e) => {
                // The attempt may have run: `in_flight` releases its token in the background,
                // so that token must never be used again (nor a handover to it).
                drop(in_flight);
                self.renew_identity();
                return Err(e);
            }
        };
        in_flight.token = None;
        drop(in_flight);
        match answer {
            Attempt::Acquired { fence } => {
                let acquisition = self.acquisition(self.token.clone(), fence, sent_at, waited);
                match guard_for(&self.inner, acquisition, self.spec.watchdog) {
                    Some(guard) => {
                        self.acquired = true;
                        Ok(Ok(guard))
                    }
                    None => {
                        self.renew_identity();
                        Ok(Err(None))
                    }
                }
            }
            Attempt::Busy { remaining } => Ok(Err(remaining)),
        }
    }

    fn acquisition(
        &self,
        token: Token,
        fence: Option<u64>,
        sent_at: Instant,
        waited: bool,
    ) -> Acquisition {
        Acquisition {
            key: self.key.clone(),
            token,
            fence,
            lease: self.spec.lease,
            first_lease: self.spec.lease,
            sent_at,
            received_at: sent_at,
            max_hold: self.spec.max_hold,
            waited,
        }
    }

    /// A release handed the lock to this ticket. Its lease runs from when the attempt the
    /// handover names was sent (the server could only hand over after it saw that attempt).
    /// `None` when the handover cannot be used as it is: an unknown attempt (a stale or
    /// repeated message), too little of the handover lease left to trust (a late message), or
    /// no watchdog to take the short handover lease to the full one. The caller's next attempt
    /// then settles it: the lock still holding this waiter's token is taken with the full lease
    /// and a new fence, measured from that attempt.
    fn take_over(&mut self, grant: Grant) -> Option<LockGuard> {
        let (_, sent_at) = *self.sent.iter().find(|(g, _)| *g == grant.generation)?;
        let lease = self.ticket.handover_lease;
        let valid_until = sent_at + lease.saturating_sub(crate::guard::drift(lease));
        if !self.spec.watchdog || valid_until.saturating_duration_since(Instant::now()) < lease / 2
        {
            return None;
        }
        let fence = if self.spec.fenced { grant.fence } else { None };
        let mut acquisition = self.acquisition(self.token.clone(), fence, sent_at, true);
        acquisition.first_lease = lease;
        acquisition.received_at = Instant::now();
        self.settle(acquisition)
    }

    /// Gives up: takes the ticket out of the backend's queue before the caller hears of the
    /// timeout, so no release hands the lock to a waiter that is gone (a handover that came
    /// meanwhile is passed on). Without an answer, the ticket dies unrefreshed.
    /// While the backend is failing (`trouble`) the leave goes out in the background instead;
    /// a leave still unanswered when the request's bound (wait + [`DEADLINE_SLACK`]) passes is
    /// dropped with the request, whose drop finishes it in the background.
    async fn leave(&mut self, trouble: bool) {
        if !self.registered || self.acquired {
            return;
        }
        if trouble {
            self.registered = false;
            let ticket = self.ticket.id.clone();
            leave_in_background(&self.inner, &self.key, ticket, self.token.clone());
            return;
        }
        // `registered` stays set until the answer: if this future is dropped meanwhile, the
        // drop leaves in the background (a second leave is harmless).
        if let Err(e) = self
            .inner
            .call()
            .leave_queue(&self.key, &self.ticket.id, &self.token)
            .await
        {
            tracing::debug!(error = %e, "leaving the wait queue failed; the ticket expires on its own");
        }
        self.registered = false;
    }

    fn settle(&mut self, acquisition: Acquisition) -> Option<LockGuard> {
        let guard = guard_for(&self.inner, acquisition, self.spec.watchdog);
        if guard.is_some() {
            self.acquired = true;
            self.inner.handovers.fetch_add(1, Ordering::Relaxed);
        } else {
            self.renew_identity();
        }
        guard
    }

    /// Waits for the lock until `deadline`: attempts (which refresh the ticket), handovers,
    /// release messages, the holder's lease running out. `first` when no attempt was made yet:
    /// a backend that fails the very first attempt fails the request at once.
    async fn wait(
        &mut self,
        deadline: Instant,
        start: Instant,
        first: bool,
    ) -> Result<LockGuard, LockError> {
        let key = self.key.clone();
        let timeout =
            |trouble: Option<LockError>| trouble.unwrap_or_else(|| timed_out(&key, start));
        let refresh = self.refresh_every();
        let mut backoff = DEGRADED_MIN;
        let mut trouble = None;
        let mut waited = !first;
        let mut remaining;
        loop {
            if let Some(guard) = self.inbox.take_grant().and_then(|g| self.take_over(g)) {
                return Ok(guard);
            }
            let answer = self.attempt(waited).await;
            let answer = if waited {
                patient(answer, &mut trouble)
            } else {
                answer
            };
            match answer? {
                Ok(guard) => return Ok(guard),
                Err(r) => remaining = r,
            }
            waited = true;
            if Instant::now() >= deadline {
                // A handover that came during the last attempt still counts.
                if let Some(guard) = self.inbox.take_grant().and_then(|g| self.take_over(g)) {
                    return Ok(guard);
                }
                self.leave(trouble.is_some()).await;
                return Err(timeout(trouble));
            }
            // The holder's lease bounds every wait: a key that expires publishes nothing.
            let mut nap = remaining.map_or(refresh, |r| (r + EXPIRY_SLACK).min(refresh));
            if !self.inner.backend.notifications_healthy() || trouble.is_some() {
                nap = nap.min(jittered(backoff));
                backoff = (backoff * 2).min(DEGRADED_MAX);
            } else {
                backoff = DEGRADED_MIN;
            }
            let inbox = self.inbox.clone();
            let woken = inbox.notified();
            tokio::select! {
                biased;
                () = woken => {}
                () = tokio::time::sleep(nap) => {}
                () = tokio::time::sleep_until(deadline) => {
                    // A handover that came at the very end still counts.
                    if let Some(guard) = self.inbox.take_grant().and_then(|g| self.take_over(g)) {
                        return Ok(guard);
                    }
                    self.leave(trouble.is_some()).await;
                    return Err(timeout(trouble));
                }
            }
        }
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        if self.own_subscription {
            self.inner.backend.unsubscribe(&self.key, &self.inbox);
        } else {
            self.inbox.forget(&self.ticket.id);
        }
        if self.acquired || !self.registered {
            return;
        }
        let ticket = std::mem::take(&mut self.ticket.id);
        leave_in_background(&self.inner, &self.key, ticket, self.token.clone());
    }
}

/// Takes a ticket out of the key's queue (passing the lock on if a release handed it to
/// `token` meanwhile): at once in memory, in the background on Redis. Best effort: an
/// unrefreshed ticket dies on its own.
fn leave_in_background(inner: &Arc<LockerInner>, key: &LockKey, ticket: String, token: Token) {
    if inner.backend.leave_queue_at_once(key, &ticket, &token) {
        inner.calls.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let (inner, key) = (inner.clone(), key.clone());
    handle.spawn(async move {
        if let Err(e) = inner.call().leave_queue(&key, &ticket, &token).await {
            tracing::debug!(error = %e, "leaving the wait queue failed; the ticket expires on its own");
        }
    });
}

/// The wait for `key`, begun at `start`, is over.
fn timed_out(key: &LockKey, start: Instant) -> LockError {
    LockError::Timeout {
        key: key.user().to_owned(),
        waited: start.elapsed(),
    }
}

/// A ticket names the waiter a release hands the lock to, so on a shared backend it is drawn
/// like an owner token, from the OS: a forked child must never draw its parent's tickets (both
/// would take one hand-over message as theirs: two holders).
fn new_ticket_id(inner: &LockerInner) -> String {
    format!("t{}", &inner.new_token().as_str()[..16])
}

/// Inside a wait, a transport failure is not the end: the backend may be back before the
/// deadline (a restart, a dropped connection). It counts as "busy, for an unknown time" and is
/// remembered, to be returned if the wait ends without the lock. Other errors end the wait.
fn patient<T>(
    answer: Result<Result<T, Option<Duration>>, LockError>,
    trouble: &mut Option<LockError>,
) -> Result<Result<T, Option<Duration>>, LockError> {
    match answer {
        Err(e @ LockError::Backend { .. }) => {
            tracing::debug!(error = %e, "lock attempt failed while waiting; retrying until the deadline");
            *trouble = Some(e);
            Ok(Err(None))
        }
        Ok(answer) => {
            *trouble = None;
            Ok(answer)
        }
        Err(e) => Err(e),
    }
}

/// One plain acquire round trip (no queue). `Ok(Err(remaining))` when busy.
async fn attempt(
    inner: &Arc<LockerInner>,
    key: &LockKey,
    spec: &Spec,
    waited: bool,
) -> Result<Result<LockGuard, Option<Duration>>, LockError> {
    let token = inner.new_token();
    let sent_at = Instant::now();
    // If this future is dropped mid-flight, or the answer is lost, the lock may be ours in the
    // backend without our knowing: release it in the background rather than block the key
    // for a whole lease (the release script only deletes a key holding this token).
    let mut in_flight = InFlight {
        inner,
        key,
        token: Some(&token),
    };
    let answer = inner
        .call()
        .acquire(key, &token, spec.lease, spec.fenced, None)
        .await?;
    in_flight.token = None;
    drop(in_flight);
    match answer {
        Attempt::Acquired { fence } => {
            let acquisition = Acquisition {
                key: key.clone(),
                token,
                fence,
                lease: spec.lease,
                first_lease: spec.lease,
                sent_at,
                received_at: sent_at,
                max_hold: spec.max_hold,
                waited,
            };
            Ok(guard_for(inner, acquisition, spec.watchdog).ok_or(None))
        }
        Attempt::Busy { remaining } => Ok(Err(remaining)),
    }
}

/// The guard for an acquisition, or `None` when its lease had already run out by the time the
/// answer came (a slow network, a pause): the lock may be someone else's already, so it is not
/// a success, and it is released in the background in case it is still ours.
fn guard_for(
    inner: &Arc<LockerInner>,
    acquisition: Acquisition,
    watchdog: bool,
) -> Option<LockGuard> {
    let held = Held::new(inner.clone(), acquisition);
    if !held.is_held() {
        tracing::debug!(key = %crate::key::display_key(held.key.user()), "acquired too late: the lease ran out before the answer came");
        drop(LockGuard::owned(held));
        return None;
    }
    if watchdog {
        inner.watchdog.add(inner, &held);
    }
    tracing::trace!(key = %crate::key::display_key(held.key.user()), fence = held.fence, "lock acquired");
    Some(LockGuard::owned(held))
}

struct InFlight<'a> {
    inner: &'a Arc<LockerInner>,
    key: &'a LockKey,
    token: Option<&'a Token>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Some(token) = self.token {
            self.inner.release_later(self.key.clone(), token.clone());
        }
    }
}

fn jittered(d: Duration) -> Duration {
    let r: u32 = rand::random();
    // Between d/2 and d.
    d / 2 + d.mul_f64(f64::from(r) / f64::from(u32::MAX) / 2.0)
}
