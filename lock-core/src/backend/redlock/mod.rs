//! The Redlock backend: one lock over N independent Redis servers, held while a majority
//! (N/2 + 1) of them hold it.
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
//!   (undecided: too few answers, or a quorum answered with too few yes) the call fails and
//!   the watchdog retries while the lease is still locally valid.
//! - release and idempotency records: on every server; success needs a quorum. An
//!   idempotency read hears every server that answers within the bound (at least a quorum)
//!   and a record on any of them wins (see `merge_states`).
//! - a failed or dropped acquire takes back what it may have taken itself (the ballot),
//!   announcing nothing; the core sends no release for it.
//! - waiting: a waiter subscribes on every server (a release message from any wakes it); no
//!   cross-process queue tickets (each server would order its queue differently).
//! - fencing and fair mode are refused (see [`FENCING_REFUSED`]).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock, Weak};
use std::task::Poll;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::{Attempt, AttemptOptions, Inbox, Kept, Renewal};
use crate::LockError;
use crate::backend::redis::RedisBackend;
use crate::backend::redis::connect::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_RESPONSE_TIMEOUT};
use crate::background;
use crate::held::drift;
use crate::idempotency::{IdempotencyRecord, IdempotencyState};
use crate::key::LockKey;
use crate::sync::Mutex;
use crate::token::Token;

#[cfg(test)]
mod tests;

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

/// A refused attempt that split the vote (some servers said yes, too few, and no quorum said
/// busy) answers busy for a random time up to this: contenders that split a vote retry at
/// different moments, soon, instead of splitting it again. A refused attempt with some yes
/// where a quorum said busy waits a random time up to this before answering (the holder's
/// remaining time).
const SPLIT_JITTER: Duration = Duration::from_millis(20);

/// When `Inner::stragglers` or `Inner::taking_back` reaches this many entries, the entries whose
/// tasks have all finished are forgotten (they are otherwise removed when used: at the lock's
/// release, at the waiter's next attempt).
///
/// Not a cap on the entries whose tasks still run: those must be kept (a release, or the same
/// waiter's next attempt, waits for them, see `Inner`), and cannot grow without bound, because
/// every such task ends on its own within a few response timeouts: a take-back task waits at
/// most twice the response timeout for its attempt's task on that server, then makes one
/// Redis call; an acquire task waits for the previous take-back on its server (bounded so),
/// then makes one Redis call; each Redis call is bounded by the connection's response timeout
/// (with one retry after a reconnect). So the entries kept beyond this are at most those of
/// the attempts started within the last few seconds.
const STRAGGLERS_MAX: usize = 4096;

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
/// servers (N/2 + 1) hold it, so it survives the crash or loss of any N/2 of them.
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
///   server stalled), the watchdog retries while the lease is locally valid.
/// - **Waiting** is by notification: a waiter subscribes on every server, and a release
///   message from any of them wakes it. There is no cross-process queue, so
///   [`fair`](crate::LockRequest::fair) is refused; contenders that split a vote retry after a
///   random pause (up to 20 ms: the attempt answers busy for that long).
/// - **Fencing is refused** ([`LockError::InvalidConfig`], before any I/O): tokens drawn from
///   counters on independent servers are not strictly increasing once a server loses its data
///   or clocks differ (see the README, "Redlock").
/// - **A server restarted empty** must stay down for at least the longest lease first (or run
///   with `appendonly yes` and `appendfsync always`): otherwise a lock it forgot can be taken
///   by a second holder on a new majority.
///
/// Every server gets its own connections (commands, notifications, a watcher). The N URLs
/// must name N distinct, independent masters (no replication between them). Only the same URL
/// string twice is refused: one server named twice under different URLs (`localhost` and
/// `127.0.0.1`, a hostname and its address, `/0` and no database, two databases of one
/// server) is not detected, and votes twice, so a "majority" may then be a minority of the
/// real servers and two holders can both get one: the majority guarantee is gone.
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
    /// Take-backs of refused attempts still running, by token and server: a waiter's next
    /// attempt (the same token) waits on each server for the take-back there first, so it can
    /// never find the refused attempt's key and count it, nor be deleted by it afterwards.
    taking_back: Mutex<HashMap<Token, Vec<Option<tokio::task::JoinHandle<bool>>>>>,
}

/// Acquire tasks still running, with the index of their server.
type Running = Vec<(usize, tokio::task::JoinHandle<Vote>)>;

#[derive(Debug, Clone, Copy)]
struct Settings {
    connect_timeout: Duration,
    response_timeout: Duration,
    server_timeout: Option<Duration>,
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

/// The answer of one server to one acquire.
#[derive(Debug, Clone, Copy)]
enum Vote {
    Yes,
    Busy(Option<Duration>),
    /// No answer: an error, the per-server timeout, or not connected.
    None,
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
    /// [`RedlockBackend`]: one server under two URLs votes twice).
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

    pub(crate) async fn acquire(
        &self,
        key: &LockKey,
        token: &Token,
        lease: Duration,
        options: AttemptOptions<'_>,
    ) -> Result<Attempt, LockError> {
        if options.fenced {
            return Err(LockError::config(FENCING_REFUSED));
        }
        if options.ticket.is_some_and(|t| t.strict) {
            return Err(LockError::config(FAIR_REFUSED));
        }
        let start = Instant::now();
        let bound = self.server_timeout(lease);
        let n = self.inner.servers.len();
        let quorum = self.inner.quorum;
        // A waiter (a ticket that may queue) is announced in each server's queue, so releases
        // there publish; it is never handed the lock (see `redlock_waiter.lua`).
        let waiter = options
            .ticket
            .filter(|t| !t.ttl.is_zero())
            .map(|t| (t.id.clone(), t.ttl));
        let mut before = self
            .inner
            .taking_back
            .lock()
            .remove(token)
            .unwrap_or_default();
        before.resize_with(n, || None);
        // Each server's attempt is a task of its own: one that is slow is not cut off half-way
        // when the outcome is decided without it (a lock that succeeds gets every server it
        // can), and whatever it did is known before anything is given back there.
        let mut ballot = Ballot {
            backend: self.clone(),
            key: key.clone(),
            token: token.clone(),
            tasks: self
                .inner
                .servers
                .iter()
                .zip(before)
                .map(|(s, before)| {
                    let b = s.get()?.clone();
                    let (key, token) = (key.clone(), token.clone());
                    let waiter = waiter.clone();
                    background::spawn(async move {
                        // Until a take-back there is confirmed, this server's vote cannot be
                        // trusted: a key of the refused attempt left there (same token, an
                        // older expiry) would be counted as this attempt's.
                        if let Some(take_back) = before
                            && !matches!(take_back.await, Ok(true))
                        {
                            return Vote::None;
                        }
                        let plain = AttemptOptions {
                            fenced: false,
                            ticket: None,
                            remaining: true,
                        };
                        // A waiter is announced before its attempt, on the same connection: a
                        // release after the attempt publishes.
                        let attempt = b.acquire(&key, &token, lease, plain);
                        let answer = match &waiter {
                            Some((ticket, ttl)) => {
                                let announce = b.redlock_waiter(&key, ticket, *ttl, true);
                                let (announced, answer) = tokio::join!(announce, attempt);
                                if let Err(e) = announced {
                                    tracing::debug!(error = %e, "a Redlock server failed to announce a waiter");
                                }
                                answer
                            }
                            None => attempt.await,
                        };
                        match answer {
                            Ok(Attempt::Acquired { .. }) => Vote::Yes,
                            Ok(Attempt::Busy { remaining }) => Vote::Busy(remaining),
                            Err(e) => {
                                tracing::debug!(error = %e, "a Redlock server failed an acquire");
                                Vote::None
                            }
                        }
                    })
                })
                .collect(),
            votes: Vec::new(),
            armed: true,
        };
        let votes = gather(
            ballot.tasks.iter_mut().map(|t| async move {
                let Some(t) = t else {
                    return Vote::None;
                };
                match tokio::time::timeout(bound, t).await {
                    Ok(Ok(vote)) => vote,
                    _ => Vote::None,
                }
            }),
            |votes| {
                let count = Count::of(votes);
                let pending = n - count.answered() - count.silent;
                count.yes >= quorum
                    || (count.yes + pending < quorum
                        && (count.answered() >= quorum || count.answered() + pending < quorum))
            },
        )
        .await;
        ballot.votes.clone_from(&votes);
        let count = Count::of(&votes);
        // The core counts validity from before this call (lease − elapsed − drift) and refuses
        // a lock whose validity is gone by the time it gets it; checked here too, so such a
        // lock is given back at once.
        if count.yes >= quorum && start.elapsed() + drift(lease) < lease {
            ballot.armed = false;
            let running: Vec<_> = std::mem::take(&mut ballot.tasks)
                .into_iter()
                .enumerate()
                .filter_map(|(i, t)| Some((i, t.filter(|t| !t.is_finished())?)))
                .collect();
            if !running.is_empty() {
                let mut stragglers = self.inner.stragglers.lock();
                if stragglers.len() >= STRAGGLERS_MAX {
                    stragglers.retain(|_, tasks| tasks.iter().any(|(_, t)| !t.is_finished()));
                }
                stragglers.insert(token.clone(), running);
            }
            if let Some((ticket, _)) = &waiter {
                self.leave_everywhere(key, ticket);
            }
            return Ok(Attempt::Acquired { fence: None });
        }
        // Not ours: `ballot`, dropped, takes back whatever may have been taken.
        drop(ballot);
        if count.yes >= quorum {
            tracing::debug!(key = %key.display(), "Redlock quorum came after the validity ran out; released");
            return Ok(Attempt::Busy { remaining: None });
        }
        if count.answered() < quorum {
            return Err(self.no_quorum("acquire", Some(key.user()), count.answered()));
        }
        if count.yes > 0 && count.busy < quorum {
            // A split vote (some servers said yes, and no quorum said busy: nobody holds it on
            // a quorum of those that answered): contenders that split it retry soon, each after
            // a pause of its own drawn at random, so that they do not split the next one too.
            // The pause is the answer's `remaining`: a waiter retries after it. (Its take-backs
            // announce nothing, so without it a waiter would sleep until its next ticket
            // refresh.)
            let pause = SPLIT_JITTER.min(bound).mul_f64(rand::random::<f64>());
            return Ok(Attempt::Busy {
                remaining: Some(pause.max(Duration::from_millis(1))),
            });
        }
        if count.yes > 0 {
            // Some servers said yes, but a quorum said busy (a holder on a quorum, or a
            // contender about to have one): pause at random before answering, so that
            // contenders do not meet again at once; the holder's time is the answer.
            let pause = SPLIT_JITTER.min(bound).mul_f64(rand::random::<f64>());
            tokio::time::sleep(pause).await;
        }
        Ok(Attempt::Busy {
            remaining: remaining(&votes, quorum),
        })
    }

    /// Releases on the servers `which` selects, each in a task of its own that runs to its end
    /// whatever the caller does (bounded by the server's response timeout).
    fn release_on(
        &self,
        key: &LockKey,
        token: &Token,
        which: impl Fn(usize) -> bool,
    ) -> Vec<Option<tokio::task::JoinHandle<Result<bool, LockError>>>> {
        let mut stragglers = self
            .inner
            .stragglers
            .lock()
            .remove(token)
            .unwrap_or_default();
        let bound = self.inner.settings.response_timeout * 2;
        self.inner
            .servers
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let b = s.get().filter(|_| which(i))?.clone();
                let (key, token) = (key.clone(), token.clone());
                let straggler = stragglers
                    .iter()
                    .position(|(j, _)| *j == i)
                    .map(|p| stragglers.swap_remove(p).1);
                background::spawn(async move {
                    if let Some(acquire) = straggler {
                        let _ = tokio::time::timeout(bound, acquire).await;
                    }
                    b.release(&key, &token).await
                })
            })
            .collect()
    }

    /// Waits for the tasks of [`release_on`](Self::release_on) until a quorum said yes (or
    /// can no longer), at most the response timeout; `Ok(true)` when a quorum released it.
    async fn released(
        &self,
        key: &LockKey,
        tasks: Vec<Option<tokio::task::JoinHandle<Result<bool, LockError>>>>,
    ) -> Result<bool, LockError> {
        let quorum = self.inner.quorum;
        let n = tasks.len();
        let bound = self.inner.settings.response_timeout;
        let answers = gather(
            tasks.into_iter().map(|t| async move {
                let t = t?;
                match tokio::time::timeout(bound, t).await {
                    Ok(Ok(Ok(yes))) => Some(yes),
                    _ => None,
                }
            }),
            |answers| Tally::of(answers).decided(quorum, n),
        )
        .await;
        self.verdict(&answers, "release", key)
    }

    /// How many of the tasks of [`release_on`](Self::release_on) released (waiting for all,
    /// each at most the response timeout).
    async fn released_count(
        &self,
        tasks: Vec<Option<tokio::task::JoinHandle<Result<bool, LockError>>>>,
    ) -> usize {
        let bound = self.inner.settings.response_timeout;
        gather(
            tasks.into_iter().map(|t| async move {
                matches!(tokio::time::timeout(bound, t?).await, Ok(Ok(Ok(true)))).then_some(())
            }),
            |_| false,
        )
        .await
        .into_iter()
        .flatten()
        .flatten()
        .count()
    }

    pub(crate) async fn release(&self, key: &LockKey, token: &Token) -> Result<bool, LockError> {
        let tasks = self.release_on(key, token, |_| true);
        self.released(key, tasks).await
    }

    /// Takes a waiter's announcement out of every server's queue, in the background.
    fn leave_everywhere(&self, key: &LockKey, ticket: &str) {
        for b in self.inner.servers.iter().filter_map(Server::get) {
            let (b, key, ticket) = (b.clone(), key.clone(), ticket.to_owned());
            background::spawn(async move {
                if let Err(e) = b.redlock_waiter(&key, &ticket, Duration::ZERO, false).await {
                    tracing::debug!(error = %e, "leaving a Redlock server's queue failed; the entry expires on its own");
                }
            });
        }
    }

    /// A waiter gives up: its announcements go (in the background; they expire on their own
    /// otherwise). Nothing was ever handed to it.
    pub(crate) fn leave_queue(&self, key: &LockKey, ticket: &str) {
        self.leave_everywhere(key, ticket);
    }

    /// Local hand-off between the tasks of one locker, at a bound of its turns: `keep.lua` on
    /// every server keeps the lock where it is ours and nobody of another process waits
    /// (waiters announce themselves in each server's queue), and releases it there to the
    /// waiters otherwise. Kept when a quorum kept it and none released it; when any server
    /// released it, it is released everywhere (part of a lock is no lock) and the answer is
    /// `Released`.
    pub(crate) async fn keep_if_alone(
        &self,
        key: &LockKey,
        token: &Token,
    ) -> Result<Kept, LockError> {
        let quorum = self.inner.quorum;
        let n = self.inner.servers.len();
        let bound = self.inner.settings.response_timeout;
        let answers = gather(
            self.inner.servers.iter().map(|s| async move {
                let b = s.get()?;
                tokio::time::timeout(bound, b.keep_if_alone(key, token))
                    .await
                    .ok()?
                    .ok()
            }),
            // Kept by a majority with nobody waiting: decided, a stalled server is not waited
            // for (a waiter announces itself on every server, so the majority would show it).
            // When a server released it, every answer is awaited: the release that follows
            // must not overtake those still on their way.
            |answers| {
                let alone = answers
                    .iter()
                    .filter(|a| matches!(a, Some(Some(Kept::Alone))))
                    .count();
                let released = answers
                    .iter()
                    .filter(|a| matches!(a, Some(Some(Kept::Released))))
                    .count();
                released == 0 && alone >= quorum
            },
        )
        .await;
        let count = |kept: Kept| {
            answers
                .iter()
                .filter(|a| matches!(a, Some(Some(k)) if *k == kept))
                .count()
        };
        let (alone, released) = (count(Kept::Alone), count(Kept::Released));
        let answered = alone + released + count(Kept::NotOurs);
        if released == 0 && alone >= quorum {
            return Ok(Kept::Alone);
        }
        if released > 0 {
            let tasks = self.release_on(key, token, |_| true);
            let rest = self.released_count(tasks).await;
            return Ok(if released + rest >= quorum {
                Kept::Released
            } else {
                Kept::NotOurs
            });
        }
        if alone + (n - answered) >= quorum {
            return Err(self.no_quorum("release", Some(key.user()), answered));
        }
        Ok(Kept::NotOurs)
    }

    pub(crate) async fn renew(&self, items: &[Renewal]) -> Result<Vec<bool>, LockError> {
        let Some(shortest) = items.iter().map(|r| r.lease).min() else {
            return Ok(Vec::new());
        };
        let bound = self.server_timeout(shortest);
        let quorum = self.inner.quorum;
        let n = self.inner.servers.len();
        let answers = gather(
            self.inner.servers.iter().map(|s| async move {
                let b = s.get()?;
                match tokio::time::timeout(bound, b.renew(items)).await {
                    Ok(Ok(answers)) if answers.len() == items.len() => Some(answers),
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "a Redlock server failed a renewal");
                        None
                    }
                    _ => None,
                }
            }),
            |answers| {
                // Done early when every item is decided either way.
                let got: Vec<&Vec<bool>> = answers.iter().flatten().flatten().collect();
                (0..items.len()).all(|i| {
                    let yes = got.iter().filter(|a| a[i]).count();
                    yes >= quorum || got.len() - yes > n - quorum
                })
            },
        )
        .await;
        let got: Vec<&Vec<bool>> = answers.iter().flatten().flatten().collect();
        let silent = n - got.len();
        let mut renewed = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let yes = got.iter().filter(|a| a[i]).count();
            if yes >= quorum {
                renewed.push(true);
            } else if yes + silent < quorum {
                // Even the servers that did not answer could not make a quorum: lost.
                renewed.push(false);
            } else {
                // Undecided: the servers that did not answer may hold it still (too few
                // answers, or a quorum answered without a quorum of yes). Like a transport
                // failure on one server, the call fails and the watchdog retries while the
                // leases are still locally valid; nothing is extended locally without a quorum
                // of yes.
                return Err(self.no_quorum("renew", Some(item.key.user()), got.len()));
            }
        }
        Ok(renewed)
    }

    pub(crate) async fn store_result(
        &self,
        key: &LockKey,
        token: &Token,
        fingerprint: &str,
        result: &[u8],
        ttl: Duration,
    ) -> Result<bool, LockError> {
        let quorum = self.inner.quorum;
        let n = self.inner.servers.len();
        let bound = self.inner.settings.response_timeout;
        // Each store in a task of its own: a server that is slow still gets the record.
        let tasks: Vec<_> = self
            .inner
            .servers
            .iter()
            .map(|s| {
                let b = s.get()?.clone();
                let (key, token) = (key.clone(), token.clone());
                let (fingerprint, result) = (fingerprint.to_owned(), result.to_vec());
                background::spawn(async move {
                    b.store_result(&key, &token, &fingerprint, &result, ttl)
                        .await
                })
            })
            .collect();
        let answers = gather(
            tasks.into_iter().map(|t| async move {
                match tokio::time::timeout(bound, t?).await {
                    Ok(Ok(Ok(stored))) => Some(stored),
                    Ok(Ok(Err(e))) => {
                        tracing::debug!(error = %e, "a Redlock server failed to store a result");
                        None
                    }
                    _ => None,
                }
            }),
            |answers| Tally::of(answers).decided(quorum, n),
        )
        .await;
        self.verdict(&answers, "store result", key)
    }

    pub(crate) async fn idempotency_state(
        &self,
        key: &LockKey,
    ) -> Result<IdempotencyState, LockError> {
        let bound = self.inner.settings.response_timeout;
        let answers = gather(
            self.inner.servers.iter().map(|s| async move {
                let b = s.get()?;
                match tokio::time::timeout(bound, b.idempotency_state(key)).await {
                    Ok(Ok(state)) => Some(state),
                    Ok(Err(e @ LockError::InvalidConfig { .. })) => {
                        tracing::warn!(error = %e, "a Redlock server refuses the idempotency read");
                        None
                    }
                    _ => None,
                }
            }),
            // Every server that answers within the bound is heard (see `merge_states`), not
            // only the first quorum: readers that reach the same servers decide alike.
            |_| false,
        )
        .await;
        let states: Vec<IdempotencyState> = answers.into_iter().flatten().flatten().collect();
        self.quorum_or("idempotency state", Some(key.user()), states.len())?;
        Ok(merge_states(states))
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

    pub(crate) fn notifications_healthy(&self) -> bool {
        self.inner
            .servers
            .iter()
            .filter_map(Server::get)
            .filter(|b| b.notifications_healthy())
            .count()
            >= self.inner.quorum
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

/// One acquire attempt's tasks, one per server. Unless disarmed (the lock is ours), dropping
/// it takes back what the attempt may have taken, on every server that did not answer "held
/// by someone else": each server's take-back waits for that server's attempt to end (so it can
/// never run before a `SET` still on its way), then deletes the key if it still holds our
/// token, announcing nothing: a lock that was never ours on a quorum was never announced, and
/// a release message would wake every waiter of the key in every process for nothing (whose
/// attempts could split the next vote, and so on). The next attempt with the same token (a
/// waiter's) waits for these take-backs first (see `Inner::taking_back`).
struct Ballot {
    backend: RedlockBackend,
    key: LockKey,
    token: Token,
    tasks: Vec<Option<tokio::task::JoinHandle<Vote>>>,
    /// The votes known when the attempt was decided (empty if it never was).
    votes: Vec<Option<Vote>>,
    armed: bool,
}

impl Drop for Ballot {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let bound = self.backend.inner.settings.response_timeout * 2;
        let mut handles = Vec::with_capacity(self.tasks.len());
        for (i, task) in self.tasks.iter_mut().enumerate() {
            let known = self.votes.get(i).copied().flatten();
            let server = self.backend.inner.servers[i].get().cloned();
            let (Some(server), false) = (server, matches!(known, Some(Vote::Busy(_)))) else {
                handles.push(None);
                continue;
            };
            // A task still running (not answered, or past the per-server timeout) is awaited
            // first, whatever the attempt decided without it.
            let running = task.take().filter(|t| !t.is_finished());
            let (key, token) = (self.key.clone(), self.token.clone());
            handles.push(background::spawn(async move {
                if let Some(task) = running
                    && let Ok(Ok(Vote::Busy(_))) = tokio::time::timeout(bound, task).await
                {
                    return true;
                }
                match server.redlock_take_back(&key, &token).await {
                    Ok(_) => true,
                    Err(e) => {
                        tracing::debug!(error = %e, "taking back a failed Redlock attempt failed on one server; its lease ends it");
                        false
                    }
                }
            }));
        }
        if handles.iter().any(Option::is_some) {
            let mut taking_back = self.backend.inner.taking_back.lock();
            if taking_back.len() >= STRAGGLERS_MAX {
                taking_back.retain(|_, h| h.iter().flatten().any(|h| !h.is_finished()));
            }
            taking_back.insert(self.token.clone(), handles);
        }
    }
}

/// Answers counted.
#[derive(Debug, Default)]
struct Count {
    yes: usize,
    busy: usize,
    silent: usize,
}

impl Count {
    fn of(votes: &[Option<Vote>]) -> Self {
        let mut count = Count::default();
        for v in votes.iter().flatten() {
            match v {
                Vote::Yes => count.yes += 1,
                Vote::Busy(_) => count.busy += 1,
                Vote::None => count.silent += 1,
            }
        }
        count
    }

    fn answered(&self) -> usize {
        self.yes + self.busy
    }
}

/// How long until a quorum of servers may be free: the servers that did not answer busy may
/// be free now; of the busy ones, enough to make a quorum must see their holder's lease end.
fn remaining(votes: &[Option<Vote>], quorum: usize) -> Option<Duration> {
    let mut busy: Vec<Option<Duration>> = votes
        .iter()
        .filter_map(|v| match v {
            Some(Vote::Busy(r)) => Some(*r),
            _ => None,
        })
        .collect();
    let free = votes.len() - busy.len();
    let needed = quorum.checked_sub(free).filter(|n| *n > 0)?;
    // Unknown remainders sort last: a holder whose lease is unknown is waited for by message.
    busy.sort_by_key(|r| r.unwrap_or(Duration::MAX));
    busy.get(needed - 1).copied().flatten()
}

/// One idempotency state from the answers of every server that answered within the bound (at
/// least a quorum): a record on any of them wins (the most common one, should two differ),
/// then a lock in flight, else absent.
///
/// A record whose store succeeded is on a quorum of servers, so any quorum of answers includes
/// a copy of it: every reader sees it. A record whose store failed (its holder was told so)
/// may be on a minority only: a reader that hears from one of those servers sees it, one that
/// does not sees the state without it. Waiting for every server that answers, not only the
/// first quorum, makes readers that reach the same servers decide alike; readers separated by
/// a fault can still differ about such a record, never about one that was stored.
fn merge_states(states: Vec<IdempotencyState>) -> IdempotencyState {
    let records: Vec<&IdempotencyRecord> = states
        .iter()
        .filter_map(|s| match s {
            IdempotencyState::Completed(r) => Some(r),
            _ => None,
        })
        .collect();
    // Copies on different servers differ only in how long each keeps it: the shortest counts.
    let same = |a: &IdempotencyRecord, b: &IdempotencyRecord| {
        a.fingerprint == b.fingerprint && a.result == b.result
    };
    let mut best: Option<(usize, IdempotencyRecord)> = None;
    for r in &records {
        let copies: Vec<&&IdempotencyRecord> = records.iter().filter(|o| same(o, r)).collect();
        if best.as_ref().is_none_or(|(n, _)| copies.len() > *n) {
            let mut record = (*r).clone();
            record.expires_in = copies
                .iter()
                .map(|c| c.expires_in)
                .min()
                .unwrap_or_default();
            best = Some((copies.len(), record));
        }
    }
    if let Some((_, record)) = best {
        return IdempotencyState::Completed(record);
    }
    if states.contains(&IdempotencyState::InFlight) {
        return IdempotencyState::InFlight;
    }
    IdempotencyState::Absent
}

/// Runs `futures` concurrently until all are done or `done` says the outcome is decided; the
/// outputs so far, in order (`None` for those still running, which are dropped).
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

/// Options for connecting a [`RedlockBackend`].
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use std::time::Duration;
/// let backend = lock_core::RedlockBackend::builder(&["redis://a/", "redis://b/", "redis://c/"])
///     .connect_timeout(Duration::from_secs(1))
///     .server_timeout(Duration::from_millis(50))
///     .connect()
///     .await?;
/// # drop(backend); Ok(()) }
/// ```
#[must_use]
pub struct RedlockBackendBuilder {
    urls: Vec<String>,
    settings: Settings,
}

impl std::fmt::Debug for RedlockBackendBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedlockBackendBuilder")
            .field("servers", &self.urls.len())
            .field("connect_timeout", &self.settings.connect_timeout)
            .field("response_timeout", &self.settings.response_timeout)
            .field("server_timeout", &self.settings.server_timeout)
            .finish_non_exhaustive()
    }
}

impl RedlockBackendBuilder {
    /// Bound on establishing (and re-establishing) a connection to one server. Default 2 s.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let b = lock_core::RedlockBackend::builder(&["redis://a/"]).connect_timeout(Duration::from_secs(1));
    /// # drop(b);
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.settings.connect_timeout = timeout;
        self
    }

    /// Bound on one server's answer to a release, a result store or read, a subscription.
    /// Default 2 s. Calls wait for a quorum, not for every server: a stalled minority does
    /// not slow them.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let b = lock_core::RedlockBackend::builder(&["redis://a/"]).response_timeout(Duration::from_millis(500));
    /// # drop(b);
    /// ```
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.settings.response_timeout = timeout;
        self
    }

    /// Bound on one server's answer to an acquire or a renewal: a server that has not
    /// answered by then counts as down for that call. Default: a tenth of the lease, at most
    /// [`DEFAULT_SERVER_TIMEOUT`]; never more than half the lease. Keep it well under the
    /// lease: it is time taken from the lock's validity when servers are slow.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let b = lock_core::RedlockBackend::builder(&["redis://a/"]).server_timeout(Duration::from_millis(50));
    /// # drop(b);
    /// ```
    pub fn server_timeout(mut self, timeout: Duration) -> Self {
        self.settings.server_timeout = Some(timeout);
        self
    }

    /// Connects to every server at once. Needs a quorum of them to answer; the others are
    /// connected in the background and join when they answer.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for no URLs, the same URL twice, a malformed URL or zero
    /// timeouts; [`LockError::Backend`] with a [`NoQuorum`] source when fewer than a quorum
    /// of servers could be reached.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let backend = lock_core::RedlockBackend::builder(&["redis://a/", "redis://b/", "redis://c/"])
    ///     .connect()
    ///     .await?;
    /// # drop(backend); Ok(()) }
    /// ```
    pub async fn connect(self) -> Result<RedlockBackend, LockError> {
        let Settings {
            connect_timeout,
            response_timeout,
            server_timeout,
        } = self.settings;
        if connect_timeout.is_zero()
            || response_timeout.is_zero()
            || server_timeout.is_some_and(|t| t.is_zero())
        {
            return Err(LockError::config(
                "Redlock connect, response and server timeouts must be above zero",
            ));
        }
        if self.urls.is_empty() {
            return Err(LockError::config(
                "a Redlock backend needs the URL of at least one server",
            ));
        }
        let distinct: HashSet<&str> = self.urls.iter().map(|u| u.trim_end_matches('/')).collect();
        if distinct.len() != self.urls.len() {
            return Err(LockError::config(
                "the same Redlock server URL is given twice: the servers must be independent",
            ));
        }
        let n = self.urls.len();
        let (reconnects, _) = watch::channel(0);
        let inner = Arc::new(Inner {
            servers: (0..n)
                .map(|_| Server {
                    backend: OnceLock::new(),
                })
                .collect(),
            quorum: n / 2 + 1,
            settings: self.settings,
            reconnects,
            stragglers: Mutex::default(),
            taking_back: Mutex::default(),
        });
        let backend = RedlockBackend { inner };
        // Every server is connected by a task of its own, which reports its first outcome and,
        // when the server did not answer, goes on trying in the background. The backend is
        // ready once a majority is connected: a stalled minority does not hold it up.
        let (outcomes, mut first) = tokio::sync::mpsc::unbounded_channel();
        for (i, url) in self.urls.iter().enumerate() {
            let (inner, url, settings) =
                (Arc::downgrade(&backend.inner), url.clone(), self.settings);
            let outcomes = outcomes.clone();
            background::spawn(async move {
                match connect_one(url.clone(), settings).await {
                    Ok(b) => {
                        if let Some(inner) = inner.upgrade() {
                            join(&inner, i, b);
                        }
                        let _ = outcomes.send(Ok(true));
                    }
                    Err(e @ LockError::InvalidConfig { .. }) => {
                        let _ = outcomes.send(Err(e));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "a Redlock server cannot be reached; connecting it in the background");
                        let _ = outcomes.send(Ok(false));
                        connect_later(inner, i, url).await;
                    }
                }
            });
        }
        drop(outcomes);
        let quorum = backend.inner.quorum;
        let started = Instant::now();
        let (mut up, mut down) = (0, 0);
        while up < quorum && down <= n - quorum {
            match first.recv().await {
                Some(Ok(true)) => up += 1,
                Some(Ok(false)) => down += 1,
                Some(Err(e)) => return Err(e),
                // No runtime to connect on (spawn refused): nothing more will come.
                None => break,
            }
        }
        if up < quorum {
            return Err(backend.no_quorum("connect", None, up));
        }
        // The others usually answer a moment later: a short grace (twice what the majority
        // took, plus 100 ms) lets them join before the first locks, so that these are on every
        // server that answers; a stalled one is not waited for longer.
        let grace = (started.elapsed() * 2 + Duration::from_millis(100)).min(connect_timeout);
        let grace = tokio::time::sleep(grace);
        tokio::pin!(grace);
        while up + down < n {
            tokio::select! {
                outcome = first.recv() => match outcome {
                    Some(Ok(true)) => up += 1,
                    Some(Ok(false)) => down += 1,
                    Some(Err(e)) => return Err(e),
                    None => break,
                },
                () = &mut grace => break,
            }
        }
        Ok(backend)
    }
}

async fn connect_one(url: String, settings: Settings) -> Result<RedisBackend, LockError> {
    let connect = RedisBackend::builder(&url)
        .connect_timeout(settings.connect_timeout)
        .response_timeout(settings.response_timeout)
        .connect();
    match tokio::time::timeout(
        settings.connect_timeout * 2 + settings.response_timeout * 2,
        connect,
    )
    .await
    {
        Ok(answer) => answer,
        Err(_) => Err(LockError::backend(
            "connect",
            None,
            std::io::Error::from(std::io::ErrorKind::TimedOut),
        )),
    }
}

/// Server `i` is connected: it takes part from now on, and its dropped connections reach
/// the watchdog.
fn join(inner: &Arc<Inner>, i: usize, backend: RedisBackend) {
    let watcher = backend.reconnects();
    if inner.servers[i].backend.set(backend).is_err() {
        return;
    }
    inner.reconnects.send_modify(|v| *v += 1);
    if let Some(mut rx) = watcher {
        let weak = Arc::downgrade(inner);
        background::spawn(async move {
            while rx.changed().await.is_ok() {
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                inner.reconnects.send_modify(|v| *v += 1);
            }
        });
    }
}

/// Connects server `i`, down at connect, once it answers (every second, while the backend
/// lives).
async fn connect_later(inner: Weak<Inner>, i: usize, url: String) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let Some(settings) = inner.upgrade().map(|i| i.settings) else {
            return;
        };
        if let Ok(b) = connect_one(url.clone(), settings).await {
            if let Some(inner) = inner.upgrade() {
                join(&inner, i, b);
                tracing::info!(server = i, "a Redlock server down at connect has joined");
            }
            return;
        }
    }
}
