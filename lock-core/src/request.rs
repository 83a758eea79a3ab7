//! [`LockRequest`]: one request for a lock, its options, and how it is acquired.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::{Attempt, FairTicket};
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
/// How long a fair waiter's ticket stays in the queue without a refresh; waiters refresh it
/// every third of that, so a crashed waiter holds up the queue for at most this long.
pub(crate) const FAIR_TICKET_TTL: Duration = Duration::from_secs(3);

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
    /// Cost: one small counter per fenced key name, kept without expiry (tokens must never go
    /// backwards). On Redis the counter survives a server restart only with persistence (RDB or
    /// AOF); without it a restarted Redis starts counting again from 1.
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

    /// Waits in first-come, first-served order across processes: a queue of waiter tickets in
    /// the backend, and the release names the next ticket so only that waiter wakes. Waiters
    /// refresh their ticket every second; a crashed waiter is skipped after at most 3 s.
    ///
    /// Costs more than the default (unfair) mode: every waiter keeps its own place, and
    /// subscription, in the backend. Fair and unfair requests on one key can be mixed, but
    /// unfair ones do not queue: they take the lock whenever they find it free.
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
            // Reentrant: the outer scope holds and releases the lock. Its loss still cancels
            // this body, whatever the outer scope is (a `run`, or a guard's `scope`).
            let held = held?;
            let out = tokio::select! {
                biased;
                () = held.lost() => return Err(held.lease_lost()),
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
            Ok(out) if held.is_held() => {
                if let Err(e) = guard.release().await {
                    // The body ran while the lease was valid; the lease expires on its own.
                    tracing::warn!(key = %crate::key::display_key(held.key.user()), error = %e, "release after run failed");
                }
                Ok(out)
            }
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
        if self.fair {
            acquire_fair(inner, &key, &spec).await
        } else {
            acquire(inner, &key, &spec).await
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
/// as its head, attempts woken by release notifications or by the holder's lease running out.
async fn acquire(
    inner: &Arc<LockerInner>,
    key: &LockKey,
    spec: &Spec,
) -> Result<LockGuard, LockError> {
    let start = Instant::now();
    let deadline = start + spec.wait;
    let busy = |retry_after| LockError::Busy {
        key: key.user().to_owned(),
        retry_after,
    };
    let timeout = || LockError::Timeout {
        key: key.user().to_owned(),
        waited: start.elapsed(),
    };
    // Nobody queues here: contend at once (the uncontended path is this one round trip).
    let mut remaining = None;
    if spec.wait.is_zero() || !inner.queues.has_waiters(key) {
        match attempt(inner, key, spec, None, false).await? {
            Ok(guard) => return Ok(guard),
            Err(r) if spec.wait.is_zero() => return Err(busy(r)),
            Err(r) => remaining = r,
        }
    }
    let mut ticket = inner.queues.join(inner, key);
    let held_by_predecessor = tokio::time::timeout_at(deadline, ticket.my_turn())
        .await
        .map_err(|_| timeout())?;
    // Subscribed before the next attempt, so a release after it cannot go unnoticed.
    let subscribed = tokio::time::timeout_at(deadline, ticket.subscribe())
        .await
        .map_err(|_| timeout())?;
    let mut skip_attempt = held_by_predecessor && subscribed;
    let mut backoff = DEGRADED_MIN;
    let mut trouble = None;
    loop {
        if !skip_attempt {
            match patient(attempt(inner, key, spec, None, true).await, &mut trouble)? {
                Ok(guard) => {
                    ticket.acquired = true;
                    return Ok(guard);
                }
                Err(r) => remaining = r,
            }
        }
        if Instant::now() >= deadline {
            return Err(trouble.unwrap_or_else(timeout));
        }
        // The holder's lease bounds every wait: a key that expires publishes nothing. When
        // the predecessor just took the lock we know no TTL: its lease is at most ours.
        let expiry = if skip_attempt {
            spec.lease.max(inner.config.lease)
        } else {
            remaining.map_or(spec.lease, |r| r + EXPIRY_SLACK)
        };
        skip_attempt = false;
        let nap = if inner.backend.notifications_healthy() && trouble.is_none() {
            backoff = DEGRADED_MIN;
            expiry
        } else {
            let nap = jittered(backoff).min(expiry);
            backoff = (backoff * 2).min(DEGRADED_MAX);
            nap
        };
        tokio::select! {
            biased;
            () = ticket.released() => {}
            () = tokio::time::sleep(nap) => {}
            () = tokio::time::sleep_until(deadline) => {
                return Err(trouble.unwrap_or_else(timeout));
            }
        }
    }
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

/// One acquire round trip. `Ok(Err(remaining))` when busy.
async fn attempt(
    inner: &Arc<LockerInner>,
    key: &LockKey,
    spec: &Spec,
    fair: Option<&FairTicket>,
    waited: bool,
) -> Result<Result<LockGuard, Option<Duration>>, LockError> {
    let token = Token::random();
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
        .backend
        .acquire(key, &token, spec.lease, spec.fenced, fair)
        .await?;
    in_flight.token = None;
    drop(in_flight);
    match answer {
        Attempt::Acquired { fence } => {
            let held = Held::new(
                inner.clone(),
                Acquisition {
                    key: key.clone(),
                    token,
                    fence,
                    lease: spec.lease,
                    sent_at,
                    max_hold: spec.max_hold,
                    waited,
                },
            );
            if !held.is_held() {
                // The answer came back after the lease had run out (a slow network, a pause):
                // the lock may be someone else's already. Not a success; the guard's drop
                // releases it if it is still ours.
                tracing::debug!(key = %crate::key::display_key(key.user()), "acquired too late: the lease ran out before the answer came");
                drop(LockGuard::owned(held));
                return Ok(Err(None));
            }
            if spec.watchdog {
                inner.watchdog.add(inner, &held);
            }
            tracing::trace!(key = %crate::key::display_key(key.user()), fence, "lock acquired");
            Ok(Ok(LockGuard::owned(held)))
        }
        Attempt::Busy { remaining } => Ok(Err(remaining)),
    }
}

/// Acquires `key` in fair mode: this waiter's ticket joins the backend's FIFO on its first
/// attempt; it tries again when a release names its ticket, when the holder's lease runs out,
/// or every third of the ticket's lifetime to keep the ticket alive.
async fn acquire_fair(
    inner: &Arc<LockerInner>,
    key: &LockKey,
    spec: &Spec,
) -> Result<LockGuard, LockError> {
    let start = Instant::now();
    let deadline = start + spec.wait;
    let timeout = || LockError::Timeout {
        key: key.user().to_owned(),
        waited: start.elapsed(),
    };
    let mut ticket = FairTicket {
        id: format!("t{:016x}", rand::random::<u64>()),
        ttl: FAIR_TICKET_TTL,
    };
    if spec.wait.is_zero() {
        ticket.ttl = Duration::ZERO;
        return match attempt(inner, key, spec, Some(&ticket), false).await? {
            Ok(guard) => Ok(guard),
            Err(retry_after) => Err(LockError::Busy {
                key: key.user().to_owned(),
                retry_after,
            }),
        };
    }
    let mut stay = FairStay {
        inner: inner.clone(),
        key: key.clone(),
        ticket: ticket.id.clone(),
        wake: Arc::new(Notify::new()),
        acquired: false,
    };
    // Subscribed before the first attempt: a release after it names us or wakes us.
    tokio::time::timeout_at(
        deadline,
        inner.backend.subscribe(key, &stay.wake, Some(&ticket.id)),
    )
    .await
    .map_err(|_| timeout())?;
    let refresh = ticket.ttl / 3;
    let mut backoff = DEGRADED_MIN;
    let mut waited = false;
    let mut trouble = None;
    loop {
        let answer = attempt(inner, key, spec, Some(&ticket), waited).await;
        // As in the unfair mode, a backend down at the first attempt fails at once.
        let answer = if waited {
            patient(answer, &mut trouble)
        } else {
            answer
        };
        let remaining = match answer? {
            Ok(guard) => {
                stay.acquired = true;
                return Ok(guard);
            }
            Err(r) => r,
        };
        waited = true;
        if Instant::now() >= deadline {
            return Err(trouble.unwrap_or_else(timeout));
        }
        let mut nap = remaining.map_or(refresh, |r| (r + EXPIRY_SLACK).min(refresh));
        if !inner.backend.notifications_healthy() || trouble.is_some() {
            nap = nap.min(jittered(backoff));
            backoff = (backoff * 2).min(DEGRADED_MAX);
        } else {
            backoff = DEGRADED_MIN;
        }
        tokio::select! {
            biased;
            () = stay.wake.notified() => {}
            () = tokio::time::sleep(nap) => {}
            () = tokio::time::sleep_until(deadline) => {
                return Err(trouble.unwrap_or_else(timeout));
            }
        }
    }
}

/// A fair waiter's registrations; dropping it unsubscribes and, unless the lock was acquired,
/// takes the ticket out of the queue in the background.
struct FairStay {
    inner: Arc<LockerInner>,
    key: LockKey,
    ticket: String,
    wake: Arc<Notify>,
    acquired: bool,
}

impl Drop for FairStay {
    fn drop(&mut self) {
        self.inner.backend.unsubscribe(&self.key, &self.wake);
        if self.acquired {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let inner = self.inner.clone();
        let key = self.key.clone();
        let ticket = std::mem::take(&mut self.ticket);
        handle.spawn(async move {
            if let Err(e) = inner.backend.leave_queue(&key, &ticket).await {
                tracing::debug!(error = %e, "leaving the fair queue failed; the ticket expires on its own");
            }
        });
    }
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
