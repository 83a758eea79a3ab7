//! The Redlock backend: one lock over N independent Redis servers, held while a majority
//! of them (3 of 5, 5 of 8) hold it: it survives the loss of any (N-1)/2, rounded down.
//!
//! Each server is a full [`RedisBackend`] (its scripts, group commit, subscriber and watcher);
//! this module fans every call out to all of them at once, each bounded by a per-server
//! timeout, and counts the answers:
//!
//! - acquire: ours when a quorum answered "acquired" and validity is left (the core measures
//!   it from the instant before the attempt was sent: lease minus elapsed minus the drift
//!   allowance of 1 % + 2 ms, see `held::drift`); otherwise what was taken is released on
//!   every server (owner-checked), and the answer is `Busy` when a quorum answered, else a
//!   [`NoQuorum`] backend error.
//! - renew: an item is renewed only when a quorum extended it (each extension is
//!   owner-checked: the token was on that server continuously); it is lost only when the
//!   servers that said yes and those that did not answer could not make a quorum; otherwise
//!   it is undecided (too few answers, or a quorum answered with too few yes) and the watchdog
//!   retries it while its lease is still locally valid. Each lock of a batch gets its own
//!   verdict (one undecided lock decides nothing for another), judged by its own per-server
//!   bound; every server asked gets the call, also after the answer came at a quorum.
//! - release and idempotency records: on every server; success needs a quorum. An
//!   idempotency read hears every server that answers within the bound (at least a quorum)
//!   and a record on any of them wins (see `merge_states`).
//! - a failed or dropped acquire takes back what it may have taken itself (the ballot),
//!   announcing nothing; the core sends no release for it.
//! - waiting: a waiter subscribes on every server (a release message from any wakes it); no
//!   cross-process queue tickets (each server would order its queue differently).
//! - fencing and fair mode are refused (see [`FENCING_REFUSED`]).
//! - inspect, force_unlock and list (see `inspect`): every server answers its state and a
//!   digest of its token; held when a quorum hold one acquisition, removed only where that
//!   acquisition is, listed from N - quorum + 1 servers each lock once.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::Poll;
use std::time::Duration;

use tokio::sync::watch;

use super::Inbox;
use crate::LockError;
use crate::backend::redis::RedisBackend;
use crate::backend::redis::connect::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_RESPONSE_TIMEOUT};
use crate::key::LockKey;
use crate::sync::Mutex;
use crate::token::Token;

mod acquire;
mod boundary;
mod connect;
mod idempotency;
mod inspect;
mod release;
mod renew;
mod take_back;
#[cfg(test)]
mod tests;

use acquire::Vote;
pub use connect::RedlockBackendBuilder;
use take_back::TakeBacks;

/// Yes and no answers of one call to every server (`None`: no answer in time, or no
/// connection; `Some(None)`: a failed call).
struct Tally {
    yes: usize,
    no: usize,
    answered: usize,
}

impl Tally {
    fn of(answers: &[Option<Option<bool>>]) -> Self {
        let count =
            |want: fn(&Option<Option<bool>>) -> bool| answers.iter().filter(|a| want(a)).count();
        Tally {
            yes: count(|a| matches!(a, Some(Some(true)))),
            no: count(|a| matches!(a, Some(Some(false)))),
            answered: count(|a| matches!(a, Some(Some(_)))),
        }
    }

    /// Whether the outcome is known already: a quorum said yes, or too many said no.
    fn decided(&self, quorum: usize, n: usize) -> bool {
        self.yes >= quorum || self.no > n - quorum
    }
}

/// The default per-server bound on an acquire (and a renewal): a tenth of the lease, at most
/// this. A healthy server on the same network answers in well under a millisecond; one that
/// does not answer within this is counted as down for the attempt.
pub const DEFAULT_SERVER_TIMEOUT: Duration = Duration::from_millis(200);

/// Why `fenced()` is refused on Redlock (the text of the [`LockError::InvalidConfig`]).
pub(crate) const FENCING_REFUSED: &str = "fenced() is not available on Redlock: fencing tokens must be strictly increasing per key, and counters kept on a majority of independent servers are not (a server that restarts empty loses its counter, the servers' clocks floor their counters differently, and two majorities can disagree on the latest value). Use a single Redis server, Sentinel or Cluster for fenced locks, or a consensus store";

/// Why fair mode is refused on Redlock.
pub(crate) const FAIR_REFUSED: &str = "fair() is not available on Redlock: fair mode needs one ordered queue of waiters, and independent servers would order their queues differently (and split the votes); waiters on Redlock are woken by release notifications instead";

/// Fewer than a quorum of the Redlock servers answered: the source of the
/// [`LockError::Backend`] a Redlock call fails with then.
///
/// Nothing was left held: an attempt that got some servers released them again. Retry later
/// (the error is [retryable](LockError::is_retryable)); a waiting request retries on its own
/// until its wait ends.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use lock_core::{LockError, Locker, NoQuorum};
///
/// let locker = Locker::redlock(&["redis://a:6379/", "redis://b:6379/", "redis://c:6379/"]).await?;
/// match locker.try_lock("order:42").await {
///     Err(LockError::Backend { source, .. }) => {
///         if let Some(q) = source.downcast_ref::<NoQuorum>() {
///             eprintln!("only {} of {} servers answered", q.answered, q.servers);
///         }
///     }
///     other => drop(other),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("only {answered} of {servers} Redlock servers answered; a quorum is {quorum}")]
#[non_exhaustive]
pub struct NoQuorum {
    /// How many servers answered.
    pub answered: usize,
    /// How many answers were needed.
    pub quorum: usize,
    /// How many servers the backend has.
    pub servers: usize,
}

/// Locks on N independent Redis servers (Redlock): a lock is held while a majority of the
/// servers (3 of 5, 5 of 8) hold it, so it survives the crash or loss of any (N-1)/2 of them,
/// rounded down (2 of 5, 3 of 8: with 4 of 8 gone, the 4 left are no majority).
///
/// - **Acquire**: `SET NX PX` on every server at once, each bounded by a per-server timeout
///   (a tenth of the lease, at most [`DEFAULT_SERVER_TIMEOUT`]; see
///   [`server_timeout`](RedlockBackendBuilder::server_timeout)). The lock is ours when a
///   quorum said yes and validity is left: lease − time since the first request was sent −
///   drift (1 % of the lease + 2 ms); the local deadline is that. Otherwise whatever was taken
///   is released on every server at once, and the attempt answers busy (a quorum answered)
///   or fails with [`LockError::Backend`] whose source is [`NoQuorum`], within the per-server
///   timeout.
/// - **Watchdog**: one renewal call per server per tick for all the locks on it; a lock is
///   renewed only when a quorum extended it (owner-checked). It is lost, and its holder told
///   ([`LockGuard::lost`](crate::LockGuard::lost), `LeaseLost`), when the servers that extended
///   it and those that did not answer could not make a quorum; when they still could (a
///   server stalled), the watchdog retries it while its lease is locally valid. Each lock of
///   the call is judged on its own. A renewal or an `extend` only lengthens a server's lease,
///   never shortens it (a call resent after `NOSCRIPT` or a reconnect may land after a later
///   one): an `extend` to a shorter lease shortens the local deadline, not the servers' keys.
/// - **Waiting** is by notification: a waiter subscribes on every server, and a release
///   message from any of them wakes it. There is no cross-process queue, so
///   [`fair`](crate::LockRequest::fair) is refused; contenders that split a vote retry after a
///   random pause (up to 20 ms: the attempt answers busy for that long).
/// - **Fencing is refused** ([`LockError::InvalidConfig`], before any I/O): tokens drawn from
///   counters on independent servers are not strictly increasing once a server loses its data
///   or clocks differ (see the guide's Redlock chapter).
/// - **Operations** ([`Locker::inspect`](crate::Locker::inspect), [`list`](crate::Locker::list),
///   [`force_unlock`](crate::Locker::force_unlock)) are judged over the quorum: a lock is held
///   when a quorum of servers hold the same acquisition (compared by a digest of its token,
///   which never leaves the servers), never from a minority; `force_unlock` removes that
///   acquisition only, on every server holding it; a listing scans N − quorum + 1 servers and
///   reports each held lock once. When the servers that did not answer could complete a
///   quorum, the answer is a [`NoQuorum`] error, never a guess. No fence is reported (none is
///   kept), so a holder evicted by `force_unlock` is not fenced off: it learns at its next
///   renewal.
/// - **A server restarted empty** must stay down for at least the longest lease first (or run
///   with `appendonly yes` and `appendfsync always`): otherwise a lock it forgot can be taken
///   by a second holder on a new majority.
///
/// Every server gets its own connections (commands, notifications, a watcher). The N URLs
/// must name N distinct, independent masters (no replication between them): one server named
/// twice would vote twice, so a "majority" could be a minority of the real servers. The same
/// URL twice is refused, and so is one server and database under a second URL (`localhost`
/// and `127.0.0.1`, a hostname and its address, `/0` and no database): as each server joins,
/// a random probe key written through it must not be readable through the servers already
/// joined (a double is [`LockError::InvalidConfig`] at connect, left out when it joins later;
/// a server whose probe key cannot be written yet joins only once it can).
/// Two databases of one server are not detected: they share its fate, so don't.
///
/// Clones share the connections.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use std::time::Duration;
/// use lock_core::{Locker, RedlockBackend};
///
/// let backend = RedlockBackend::builder(&[
///     "redis://10.0.0.1:6379/",
///     "redis://10.0.0.2:6379/",
///     "redis://10.0.0.3:6379/",
///     "redis://10.0.0.4:6379/",
///     "redis://10.0.0.5:6379/",
/// ])
/// .server_timeout(Duration::from_millis(50))
/// .connect()
/// .await?;
/// let locker = Locker::builder(backend).prefix("shop:").build();
/// # drop(locker); Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedlockBackend {
    inner: Arc<Inner>,
}

struct Inner {
    servers: Vec<Server>,
    quorum: usize,
    settings: Settings,
    /// Bumped when any server's connection dropped or came back, and when a server that was
    /// down at connect joins.
    reconnects: watch::Sender<u64>,
    /// Acquire tasks of held locks that had not ended when the lock was decided ours, by
    /// token: the release on their server waits for them (a `SET` still on its way, say in the
    /// server's group commit, must not land after the release).
    stragglers: Mutex<HashMap<Token, Running>>,
    /// Take-backs of refused attempts, by token (see `take_back`): a quorum of busy votes that
    /// may include keys of this process's own refused attempts, being deleted, is answered
    /// like a split vote. Every attempt has a token of its own, so no attempt waits for
    /// another's take-backs.
    taking_back: Mutex<TakeBacks>,
    /// Held while a server is checked against those already joined and joins, so that two
    /// servers joining at once are checked against each other too.
    joining: tokio::sync::Mutex<()>,
}

/// Acquire tasks still running, with the index of their server.
type Running = Vec<(usize, tokio::task::JoinHandle<Vote>)>;

#[derive(Debug, Clone)]
struct Settings {
    connect_timeout: Duration,
    response_timeout: Duration,
    server_timeout: Option<Duration>,
    /// The certificates of `rediss://` URLs (feature `tls`), for every server.
    tls: Arc<crate::backend::redis::tls::TlsSettings>,
}

/// One of the servers: connected at `connect`, or later in the background when it was down.
struct Server {
    backend: OnceLock<RedisBackend>,
}

impl Server {
    fn get(&self) -> Option<&RedisBackend> {
        self.backend.get()
    }
}

impl std::fmt::Debug for RedlockBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URLs may hold a password: never print them.
        f.debug_struct("RedlockBackend")
            .field("servers", &self.inner.servers.len())
            .field("quorum", &self.inner.quorum)
            .finish_non_exhaustive()
    }
}

impl RedlockBackend {
    /// Connects with default options; see [`RedlockBackend::builder`].
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let backend = lock_core::RedlockBackend::connect(&[
    ///     "redis://10.0.0.1:6379/",
    ///     "redis://10.0.0.2:6379/",
    ///     "redis://10.0.0.3:6379/",
    /// ])
    /// .await?;
    /// # drop(backend); Ok(()) }
    /// ```
    pub async fn connect(urls: &[&str]) -> Result<Self, LockError> {
        Self::builder(urls).connect().await
    }

    /// Options for connecting. `urls` are the independent servers (any number from 1; odd
    /// is best: 5 survive 2 down, as 6 do), each `redis://`, `rediss://` or `redis+unix://`,
    /// with its own ACL user and password in its URL. N URLs must be N distinct servers (see
    /// [`RedlockBackend`]: one server under two URLs is refused).
    ///
    /// ```
    /// let builder = lock_core::RedlockBackend::builder(&["redis://a:6379/", "redis://b:6379/", "redis://c:6379/"]);
    /// # drop(builder);
    /// ```
    pub fn builder(urls: &[&str]) -> RedlockBackendBuilder {
        RedlockBackendBuilder {
            urls: urls.iter().map(|u| (*u).to_owned()).collect(),
            settings: Settings {
                connect_timeout: DEFAULT_CONNECT_TIMEOUT,
                response_timeout: DEFAULT_RESPONSE_TIMEOUT,
                server_timeout: None,
                tls: Arc::default(),
            },
        }
    }

    /// How many servers the backend has.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let backend = lock_core::RedlockBackend::connect(&["redis://a/", "redis://b/", "redis://c/"]).await?;
    /// assert_eq!(backend.servers(), 3);
    /// # Ok(()) }
    /// ```
    pub fn servers(&self) -> usize {
        self.inner.servers.len()
    }

    /// How many servers must agree: `servers() / 2 + 1`.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let backend = lock_core::RedlockBackend::connect(&["redis://a/", "redis://b/", "redis://c/"]).await?;
    /// assert_eq!(backend.quorum(), 2);
    /// # Ok(()) }
    /// ```
    pub fn quorum(&self) -> usize {
        self.inner.quorum
    }

    /// Checks that the Redis user may run everything the lock runs on the keys and channels
    /// of `prefix`, on every server that can be reached (see
    /// [`RedisBackend::check_permissions`](crate::RedisBackend::check_permissions)); give every
    /// server the same ACL rule.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] naming what a server refuses; [`LockError::Backend`] with a
    /// [`NoQuorum`] source when fewer than a quorum of servers could be checked.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let backend = lock_core::RedlockBackend::connect(&["redis://a/", "redis://b/", "redis://c/"]).await?;
    /// backend.check_permissions("shop:").await?;
    /// # Ok(()) }
    /// ```
    pub async fn check_permissions(&self, prefix: &str) -> Result<(), LockError> {
        let bound = self.inner.settings.response_timeout * 2;
        let answers = gather(
            self.inner.servers.iter().map(|s| async move {
                let b = s.get()?;
                tokio::time::timeout(bound, b.check_permissions(prefix))
                    .await
                    .ok()
            }),
            |_| false,
        )
        .await;
        let mut ok = 0;
        for answer in answers.into_iter().flatten().flatten() {
            match answer {
                Ok(()) => ok += 1,
                Err(e @ LockError::InvalidConfig { .. }) => return Err(e),
                Err(e) => tracing::debug!(error = %e, "a Redlock server could not be checked"),
            }
        }
        self.quorum_or("check permissions", None, ok)
    }

    fn quorum_or(
        &self,
        operation: &'static str,
        key: Option<&str>,
        answered: usize,
    ) -> Result<(), LockError> {
        if answered >= self.inner.quorum {
            Ok(())
        } else {
            Err(self.no_quorum(operation, key, answered))
        }
    }

    /// The outcome of a call every server answered yes or no to (release, result store):
    /// `Ok(true)` on a quorum of yes; `Ok(false)` when the yes and the silent servers together
    /// cannot make a quorum; else unknown (the silent servers may be the ones that held it),
    /// a [`NoQuorum`] error rather than "not ours".
    fn verdict(
        &self,
        answers: &[Option<Option<bool>>],
        operation: &'static str,
        key: &LockKey,
    ) -> Result<bool, LockError> {
        let (quorum, n) = (self.inner.quorum, answers.len());
        let tally = Tally::of(answers);
        if tally.yes >= quorum {
            return Ok(true);
        }
        if tally.yes + (n - tally.answered) >= quorum {
            return Err(self.no_quorum(operation, Some(key.user()), tally.answered));
        }
        Ok(false)
    }

    fn no_quorum(&self, operation: &'static str, key: Option<&str>, answered: usize) -> LockError {
        LockError::backend(
            operation,
            key,
            NoQuorum {
                answered,
                quorum: self.inner.quorum,
                servers: self.inner.servers.len(),
            },
        )
    }

    /// The per-server bound for calls about locks of `lease`.
    fn server_timeout(&self, lease: Duration) -> Duration {
        let default = (lease / 10).min(DEFAULT_SERVER_TIMEOUT);
        self.inner
            .settings
            .server_timeout
            .unwrap_or(default)
            .min(lease / 2)
            .max(Duration::from_millis(1))
    }

    pub(crate) async fn subscribe(&self, key: &LockKey, inbox: &Arc<Inbox>) -> bool {
        let quorum = self.inner.quorum;
        let bound = self.inner.settings.response_timeout;
        let answers = gather(
            self.inner.servers.iter().map(|s| async move {
                let b = s.get()?;
                tokio::time::timeout(bound, b.subscribe(key, inbox))
                    .await
                    .ok()
            }),
            |answers| {
                answers
                    .iter()
                    .filter(|a| matches!(a, Some(Some(true))))
                    .count()
                    >= quorum
            },
        )
        .await;
        // Every release of a lock held on a quorum is announced on a quorum: subscribed on a
        // quorum, a waiter hears of it from at least one server.
        answers
            .iter()
            .filter(|a| matches!(a, Some(Some(true))))
            .count()
            >= quorum
    }

    pub(crate) fn unsubscribe(&self, key: &LockKey, inbox: &Arc<Inbox>) {
        for b in self.inner.servers.iter().filter_map(Server::get) {
            b.unsubscribe(key, inbox);
        }
    }

    /// When a subscription that failed on a quorum may succeed on one if asked again: when
    /// it may on a quorum of servers (the quorum's latest).
    pub(crate) fn resubscribe_after(&self) -> Option<Duration> {
        let mut after: Vec<Duration> = self
            .inner
            .servers
            .iter()
            .filter_map(Server::get)
            .filter_map(RedisBackend::resubscribe_after)
            .collect();
        after.sort_unstable();
        after.get(self.inner.quorum.checked_sub(1)?).copied()
    }

    pub(crate) fn notifications_healthy(&self) -> bool {
        let servers = self.inner.servers.iter().filter_map(Server::get);
        servers.filter(|b| b.notifications_healthy()).count() >= self.inner.quorum
    }

    /// Requests the servers' backends sent in a batch with others, summed over the servers.
    pub(crate) fn batched_requests(&self) -> u64 {
        let servers = self.inner.servers.iter().filter_map(|s| s.get());
        servers.map(RedisBackend::batched_requests).sum()
    }

    pub(crate) fn eviction_risk(&self) -> Option<bool> {
        let mut unknown = false;
        for s in &self.inner.servers {
            match s.get().and_then(RedisBackend::eviction_risk) {
                Some(true) => return Some(true),
                Some(false) => {}
                None => unknown = true,
            }
        }
        (!unknown).then_some(false)
    }

    pub(crate) fn reconnects(&self) -> Option<watch::Receiver<u64>> {
        Some(self.inner.reconnects.subscribe())
    }
}

/// Runs `futures` concurrently until all are done or `done` says the outcome is decided; the
/// outputs so far, in order (`None` for those still running, which are dropped: a call that
/// must reach its server whatever is decided goes through [`start`] or a task of its own).
async fn gather<F: Future>(
    futures: impl IntoIterator<Item = F>,
    mut done: impl FnMut(&[Option<F::Output>]) -> bool,
) -> Vec<Option<F::Output>> {
    let mut futures: Vec<Option<Pin<Box<F>>>> =
        futures.into_iter().map(|f| Some(Box::pin(f))).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        for (slot, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if let Some(fut) = slot
                && let Poll::Ready(v) = fut.as_mut().poll(cx)
            {
                *output = Some(v);
                *slot = None;
            }
        }
        if futures.iter().all(Option::is_none) || done(&outputs) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    outputs
}

/// A call started on one server by [`start`]: answered at its first poll, or running in a task
/// of its own.
enum Started<T> {
    Done(T),
    Running(tokio::task::JoinHandle<T>),
}

impl<T> Started<T> {
    /// Its output (`None`: its task panicked or was cancelled by a runtime shutting down).
    async fn finish(self) -> Option<T> {
        match self {
            Started::Done(v) => Some(v),
            Started::Running(task) => task.await.ok(),
        }
    }
}

/// Polls `call` once (its request is then on its server's connection, in the order the calls
/// were started), then lets it run to its end in a task of its own, whatever the caller does:
/// every server asked gets the call, even when the outcome is decided without its answer.
/// `None` outside a runtime (the call is dropped).
async fn start<F>(call: F) -> Option<Started<F::Output>>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let mut call = Box::pin(call);
    match std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await {
        Poll::Ready(v) => Some(Started::Done(v)),
        Poll::Pending => crate::background::spawn(call).map(Started::Running),
    }
}
