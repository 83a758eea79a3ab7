//! [`LockRequest`]: one request for a lock and its options, the builder the caller sees; the
//! acquisition itself is [`crate::engine::acquire`]'s.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::LockError;
use crate::engine::acquire::{Options, acquire_owned};
use crate::engine::held::Held;
use crate::engine::scope;
use crate::guard::LockGuard;
use crate::locker::Locker;

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
///
/// It is itself a [`Future`]: besides `.await`, `tokio::spawn(locker.lock(k))`,
/// `block_on(locker.lock(k))` and `tokio::time::timeout(d, locker.lock(k))` take it as it is.
/// The acquisition starts at its first poll; an option set after that starts it again.
///
/// ```
/// let locker = lock_core::Locker::memory();
/// let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
/// let guard = runtime.block_on(locker.lock("order:7")).unwrap();
/// assert_eq!(guard.key(), "order:7");
/// ```
#[must_use = "a lock request does nothing until awaited or run"]
pub struct LockRequest {
    locker: Locker,
    key: String,
    options: Options,
    /// The acquisition, from the first poll on. In a `Mutex` only to keep the request `Sync`
    /// (the future is not); it is reached through `&mut self`, never locked.
    started: Option<Mutex<Acquiring>>,
}

type Acquiring = Pin<Box<dyn Future<Output = Result<LockGuard, LockError>> + Send + 'static>>;

impl std::fmt::Debug for LockRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockRequest")
            .field("locker", &self.locker)
            .field("key", &self.key)
            .field("options", &self.options)
            .field("started", &self.started.is_some())
            .finish()
    }
}

impl LockRequest {
    pub(crate) fn new(locker: Locker, key: String) -> Self {
        LockRequest {
            locker,
            key,
            options: Options::default(),
            started: None,
        }
    }

    /// The options, to change: an acquisition already started (polled) is dropped, so the
    /// next poll starts one with every option set so far (a dropped acquisition leaves no lock
    /// behind: what it took is released in the background).
    fn options_mut(&mut self) -> &mut Options {
        self.started = None;
        &mut self.options
    }

    /// Waits up to `wait` for the lock (zero: one attempt). Beyond it: [`LockError::Timeout`]
    /// when the key was held, [`LockError::Backend`] when the backend never answered within
    /// the wait (a stalled server: nothing said the key was held).
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
        self.options_mut().wait = Some(wait);
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
        self.options_mut().lease = Some(lease);
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
    /// counter key has no TTL, so while the server keeps its data a token is the last one plus
    /// one at least, whatever its clock does; it costs one small key per fenced key name. In
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
        self.options_mut().fenced = true;
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
        self.options_mut().watchdog = Some(on);
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
        self.options_mut().max_hold = Some(max_hold);
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
        self.options_mut().fair = true;
        self
    }

    /// Names the class of this lock in its metrics and spans (the `class` label): a name
    /// for a family of keys, such as `"checkout"` or a key template (`"inventory:{sku}"`),
    /// never the key itself (labels must stay few). Default `"default"`. `#[distributed_lock]`
    /// gives its key template, lock-tower's layers their name. Owned names are kept once each,
    /// up to 256 distinct ones; later ones are counted as `"other"`. It changes no lock: two
    /// classes of one key are one lock.
    ///
    /// ```
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let locker = lock_core::Locker::memory();
    /// let guard = locker.lock("order:42").class("checkout").await?;
    /// # drop(guard); Ok(()) }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
    /// ```
    pub fn class(mut self, class: impl Into<std::borrow::Cow<'static, str>>) -> Self {
        self.options_mut().class = Some(crate::observe::class(class.into()));
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

    /// The locker asked (for `#[distributed_lock(idempotent)]`'s state read before locking).
    #[cfg(feature = "idempotent")]
    pub(crate) fn locker(&self) -> &Locker {
        &self.locker
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
    pub fn run<F: Future>(mut self, body: F) -> impl Future<Output = Result<F::Output, LockError>> {
        // An acquisition started by polling this request goes first: never polled again, it
        // would stand in the key's queue ahead of this one.
        self.started = None;
        // On the heap, once: an async fn keeps its arguments beside the futures it moves them
        // into, so a body held by value would be stored twice, and nested runs (reentrant
        // calls of `#[distributed_lock]` functions) would double in size at each level.
        let body = Box::pin(body);
        self.run_boxed(body)
    }

    async fn run_boxed<F: Future>(self, body: Pin<Box<F>>) -> Result<F::Output, LockError> {
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
        let max_hold = self.options.max_hold;
        let guard = acquire_owned(&self.locker.inner, &self.key, self.options)?.await?;
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
                    tracing::warn!(key = %held.key.display(), error = %e, "release after run failed; the lease will expire");
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
        if self.options.fenced && held.fence.is_none() {
            return Some(Err(LockError::config(format!(
                "lock {:?} is already held without a fence by this run scope; ask for .fenced() on the outermost lock",
                crate::key::display_key(&self.key)
            ))));
        }
        Some(Ok(held))
    }

    /// The acquisition, as the first poll starts it: the outer lock of the current scope when
    /// it holds the key (read here, in the polling task), else the lock acquired for real.
    fn start(&self) -> Acquiring {
        if let Some(held) = self.reentrant() {
            return Box::pin(std::future::ready(held.map(LockGuard::reentrant)));
        }
        match acquire_owned(&self.locker.inner, &self.key, self.options) {
            Ok(acquiring) => Box::pin(acquiring),
            Err(e) => Box::pin(std::future::ready(Err(e))),
        }
    }
}

impl Future for LockRequest {
    type Output = Result<LockGuard, LockError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let acquiring = match this.started.take() {
            Some(acquiring) => acquiring,
            None => Mutex::new(this.start()),
        };
        this.started
            .insert(acquiring)
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .as_mut()
            .poll(cx)
    }
}
