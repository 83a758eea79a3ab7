//! Where locks live: the embedded memory backend and Redis.
//!
//! A [`Backend`] is what [`Locker::builder`](crate::Locker::builder) takes. Every backend keeps
//! the same semantics (one conformance suite runs against each): atomic acquire with a random
//! token, owner-checked release and renewal, a lease on every lock, a release notification for
//! waiters, and an optional fencing counter.

use std::sync::Arc;
use std::time::Duration;

use crate::LockError;
use crate::idempotency::{IdempotencyState, Marked};
use crate::key::LockKey;
use crate::token::Token;

#[cfg(feature = "cluster")]
pub(crate) mod cluster;
pub(crate) mod memory;
mod notify;
#[cfg(feature = "redis")]
pub(crate) mod redis;
#[cfg(feature = "redlock")]
pub(crate) mod redlock;
#[cfg(feature = "sentinel")]
pub(crate) mod sentinel;

#[cfg(feature = "cluster")]
pub use cluster::{RedisClusterBackend, RedisClusterBackendBuilder};
pub use memory::MemoryBackend;
pub(crate) use notify::{Grant, Inbox, Listeners};
#[cfg(feature = "redis")]
pub use redis::{RedisBackend, RedisBackendBuilder};
#[cfg(feature = "redlock")]
pub use redlock::{DEFAULT_SERVER_TIMEOUT, NoQuorum, RedlockBackend, RedlockBackendBuilder};
#[cfg(feature = "sentinel")]
pub use sentinel::{RedisSentinelBackend, RedisSentinelBackendBuilder};

/// A lock backend, as taken by [`Locker::builder`](crate::Locker::builder).
///
/// Made from a [`MemoryBackend`], a [`RedisBackend`] or a `RedisClusterBackend` with `.into()`
/// (the builder does it).
///
/// ```
/// use lock_core::{Backend, Locker, MemoryBackend};
///
/// let shared = MemoryBackend::new();
/// // Two lockers on one backend contend like two processes on one Redis.
/// let a = Locker::builder(shared.clone()).build();
/// let b = Locker::builder(Backend::from(shared)).build();
/// # drop((a, b));
/// ```
#[derive(Debug, Clone)]
pub struct Backend(pub(crate) BackendKind);

#[derive(Debug, Clone)]
pub(crate) enum BackendKind {
    Memory(MemoryBackend),
    #[cfg(feature = "redis")]
    Redis(RedisBackend),
    #[cfg(feature = "redlock")]
    Redlock(RedlockBackend),
}

impl From<MemoryBackend> for Backend {
    fn from(b: MemoryBackend) -> Self {
        Backend(BackendKind::Memory(b))
    }
}

#[cfg(feature = "redis")]
impl From<RedisBackend> for Backend {
    fn from(b: RedisBackend) -> Self {
        Backend(BackendKind::Redis(b))
    }
}

/// A cluster is the Redis backend over a cluster connection: the same calls, routed by slot.
#[cfg(feature = "cluster")]
impl From<RedisClusterBackend> for Backend {
    fn from(b: RedisClusterBackend) -> Self {
        Backend(BackendKind::Redis(b.backend))
    }
}

/// Redlock: one lock over a majority of independent servers.
#[cfg(feature = "redlock")]
impl From<RedlockBackend> for Backend {
    fn from(b: RedlockBackend) -> Self {
        Backend(BackendKind::Redlock(b))
    }
}

/// What an acquire attempt asks of the backend besides the lock itself.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct AttemptOptions<'a> {
    /// Draw a fencing token with the lock.
    pub(crate) fenced: bool,
    /// A place in the key's cross-process queue, taken when the lock is held.
    pub(crate) ticket: Option<&'a QueueTicket>,
    /// Report how long a holder's lease still runs when the lock is busy (a request that does
    /// not wait tells its caller; one that waits learns it from its queued attempts, so the
    /// Redis backend saves a command).
    #[cfg_attr(
        not(feature = "redis"),
        allow(dead_code, reason = "read by the Redis backend")
    )]
    pub(crate) remaining: bool,
}

/// The answer to [`BackendKind::keep_if_alone`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kept {
    /// Still ours, and nobody of another process queues for it.
    Alone,
    /// Someone queued: the lock was released to them (handed over or announced).
    Released,
    /// It was no longer ours.
    NotOurs,
}

/// The answer to one acquire attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// Ours now; the fencing token when one was asked for.
    Acquired { fence: Option<u64> },
    /// Held by someone else; how long their lease still runs, when known.
    Busy { remaining: Option<Duration> },
}

/// A waiter's place in the backend's cross-process queue of a key. While it is there, a release
/// hands the lock straight to it (the lock is set to the ticket's registered token and the
/// release message says so), which saves the waiter its own acquire round trip.
#[derive(Debug, Clone)]
pub(crate) struct QueueTicket {
    /// Random, not secret: it is published to name the waiter a lock was handed to.
    pub(crate) id: String,
    /// How long the ticket stays alive without a refresh (each attempt refreshes it); zero for
    /// a single attempt that must not join the queue.
    pub(crate) ttl: Duration,
    /// Fair mode: the lock is taken only in queue order. Otherwise (the head of a local queue
    /// in the default mode) the ticket takes a free lock whatever its place.
    pub(crate) strict: bool,
    /// Counts this ticket's attempts; a handover names the attempt it was decided on, so the
    /// waiter knows from when to count the lease.
    pub(crate) generation: u64,
    /// The lease a handover sets: the requested lease capped at the ticket lifetime (3 s), so a
    /// waiter that died unseen holds the key only briefly; the new owner's watchdog, or its
    /// next attempt, sets the full lease.
    pub(crate) handover_lease: Duration,
}

/// The longest connect, response or server timeout a backend accepts: an hour. Longer bounds
/// serve no lock (the watchdog must hear a renewal within a lease), and the backends add and
/// multiply them, which must never overflow.
///
/// ```
/// # async fn demo() {
/// use std::time::Duration;
/// let refused = lock_core::RedisBackend::builder("redis://127.0.0.1/")
///     .connect_timeout(Duration::MAX)
///     .connect()
///     .await;
/// assert!(matches!(refused, Err(lock_core::LockError::InvalidConfig { .. })));
/// assert_eq!(lock_core::MAX_TIMEOUT, Duration::from_secs(3600));
/// # }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
/// ```
#[cfg(feature = "redis")]
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

/// Checks a backend's timeouts (`what` names them in the error): each above zero and at most
/// [`MAX_TIMEOUT`].
#[cfg(feature = "redis")]
pub(crate) fn validate_timeouts(what: &str, timeouts: &[Duration]) -> Result<(), LockError> {
    if timeouts.iter().any(|t| t.is_zero() || *t > MAX_TIMEOUT) {
        return Err(LockError::config(format!(
            "{what} must be above zero and at most {MAX_TIMEOUT:?}"
        )));
    }
    Ok(())
}

/// One lock's answer to a batched renewal (or an extend): each lock of a batch gets its own,
/// so one lock's state never decides another's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewed {
    /// Still ours: the lease was reset.
    Yes,
    /// Known not ours (expired, deleted, taken by another owner): the lock is lost.
    Lost,
    /// Not known either way (a server or a slot did not answer, or too few answered for a
    /// quorum): the caller retries while the lease is locally valid, and nothing is extended
    /// locally.
    Unknown,
}

impl Renewed {
    /// The verdicts of a backend that answers every lock of a batch yes or no.
    pub(crate) fn from_bools(answers: Vec<bool>) -> Vec<Renewed> {
        answers
            .into_iter()
            .map(|ok| if ok { Renewed::Yes } else { Renewed::Lost })
            .collect()
    }
}

/// One lock to renew (or extend) in a batch.
#[derive(Debug, Clone)]
pub(crate) struct Renewal {
    pub(crate) key: LockKey,
    pub(crate) token: Token,
    pub(crate) lease: Duration,
}

impl BackendKind {
    /// Why this backend refuses a request with these options, if it does: checked at the
    /// start of the request, before any I/O and before the request joins the local queue (a
    /// refusal must not wait behind a local holder, nor subscribe anywhere first).
    pub(crate) fn refuses(&self, fenced: bool, fair: bool) -> Option<&'static str> {
        match self {
            #[cfg(feature = "redlock")]
            BackendKind::Redlock(_) if fenced => Some(redlock::FENCING_REFUSED),
            #[cfg(feature = "redlock")]
            BackendKind::Redlock(_) if fair => Some(redlock::FAIR_REFUSED),
            _ => {
                let _ = (fenced, fair);
                None
            }
        }
    }

    /// Whether an acquire that fails, or is dropped mid-flight, takes back on its own whatever
    /// it may have taken (announcing nothing): the core's in-flight release is then not sent,
    /// as it would announce the release of a lock nobody held to the key's waiters. Redlock's
    /// ballot does it (see `backend::redlock`). A waiter on such a backend uses a new token for
    /// every attempt: a take-back deletes by token, and a copy of a refused attempt's key left
    /// on a server must never count as (nor be deleted as) a later attempt's.
    pub(crate) fn takes_back_failed_attempts(&self) -> bool {
        match self {
            #[cfg(feature = "redlock")]
            BackendKind::Redlock(_) => true,
            _ => false,
        }
    }

    pub(crate) async fn acquire(
        &self,
        key: &LockKey,
        token: &Token,
        lease: Duration,
        options: AttemptOptions<'_>,
    ) -> Result<Attempt, LockError> {
        match self {
            BackendKind::Memory(m) => {
                Ok(m.acquire(key, token, lease, options.fenced, options.ticket))
            }
            #[cfg(feature = "redis")]
            BackendKind::Redis(r) => r.acquire(key, token, lease, options).await,
            #[cfg(feature = "redlock")]
            BackendKind::Redlock(r) => r.acquire(key, token, lease, options).await,
        }
    }

    /// Takes a waiter's ticket out of the key's queue (it gave up). If a release handed the
    /// lock to the ticket meanwhile (`token`), the lock is passed on as a release would.
    pub(crate) async fn leave_queue(
        &self,
        key: &LockKey,
        ticket: &str,
        token: &Token,
    ) -> Result<(), LockError> {
        match self {
            BackendKind::Memory(m) => {
                m.leave_queue(key, ticket, token);
                Ok(())
            }
            #[cfg(feature = "redis")]
            BackendKind::Redis(r) => r.leave_queue(key, ticket, token).await,
            #[cfg(feature = "redlock")]
            BackendKind::Redlock(r) => {
                r.leave_queue(key, ticket);
                Ok(())
            }
        }
    }

    /// Whether every call completes without I/O (memory): its futures finish in their first
    /// poll unless they wait for another task of this process.
    pub(crate) fn answers_at_once(&self) -> bool {
        matches!(self, BackendKind::Memory(_))
    }

    /// Leaves the queue at once when that needs no I/O (memory); `false` when it must go
    /// through [`leave_queue`](Self::leave_queue).
    pub(crate) fn leave_queue_at_once(&self, key: &LockKey, ticket: &str, token: &Token) -> bool {
        match self {
            BackendKind::Memory(m) => {
                m.leave_queue(key, ticket, token);
                true
            }
            #[cfg(feature = "redis")]
            BackendKind::Redis(_) => false,
            #[cfg(feature = "redlock")]
            BackendKind::Redlock(r) => {
                r.leave_queue(key, ticket);
                true
            }
        }
    }

    /// `Ok(true)` when the lock was ours and is now deleted or handed to a queued waiter (and
    /// waiters, in this process too, were told).
    pub(crate) async fn release(&self, key: &LockKey, token: &Token) -> Result<bool, LockError> {
        match self {
            BackendKind::Memory(m) => Ok(m.release(key, token)),
            #[cfg(feature = "redis")]
            BackendKind::Redis(r) => r.release(key, token).await,
            #[cfg(feature = "redlock")]
            BackendKind::Redlock(r) => r.release(key, token).await,
        }
    }

    /// At the bound of a local hand-off's turns: keeps the lock held by `token` when no waiter
    /// queues for it in the backend (the hand-off goes on), else releases it to the oldest
    /// live waiter.
    pub(crate) async fn keep_if_alone(
        &self,
        key: &LockKey,
        token: &Token,
    ) -> Result<Kept, LockError> {
        match self {
            BackendKind::Memory(m) => Ok(m.keep_if_alone(key, token)),
            #[cfg(feature = "redis")]
            BackendKind::Redis(r) => r.keep_if_alone(key, token).await,
            #[cfg(feature = "redlock")]
            BackendKind::Redlock(r) => r.keep_if_alone(key, token).await,
        }
    }

    /// On a cluster, the renewal items grouped by the shard that serves them; on Redlock, by
    /// their per-server bound (lease class; one group too): one [`renew`](Self::renew) call per
    /// group, each on a task of its own. `None` elsewhere: one call for all, awaited by the
    /// scheduler.
    pub(crate) fn renewal_groups(&self, items: &[Renewal]) -> Option<Vec<Vec<usize>>> {
        let _ = items;
        match self {
            BackendKind::Memory(_) => None,
            #[cfg(feature = "redis")]
            BackendKind::Redis(r) => r.renewal_groups(items),
            #[cfg(feature = "redlock")]
            BackendKind::Redlock(r) => r.renewal_groups(items),
        }
    }

    /// One verdict per item, in order. `Err` when the whole call failed (every item
    /// [`Renewed::Unknown`]).
    pub(crate) async fn renew(&self, items: &[Renewal]) -> Result<Vec<Renewed>, LockError> {
        match self {
            BackendKind::Memory(m) => Ok(Renewed::from_bools(m.renew(items))),
            #[cfg(feature = "redis")]
            BackendKind::Redis(r) => r.renew_verdicts(items).await,
            #[cfg(feature = "redlock")]
            BackendKind::Redlock(r) => r.renew(items).await,
        }
    }

    /// Stores an idempotency record for `key` in one atomic step that checks the lock still
    /// holds `token`: `Ok(false)`, nothing written, when it does not.
    pub(crate) async fn store_result(
        &self,
        key: &LockKey,
        token: &Token,
        fingerprint: &str,
        result: &[u8],
        ttl: Duration,
    ) -> Result<bool, LockError> {
        match self {
            BackendKind::Memory(m) => Ok(m.store_result(key, token, fingerprint, result, ttl)),
            #[cfg(feature = "redis")]
            BackendKind::Redis(r) => r.store_result(key, token, fingerprint, result, ttl).await,
            #[cfg(feature = "redlock")]
            BackendKind::Redlock(r) => r.store_result(key, token, fingerprint, result, ttl).await,
        }
    }

    /// Writes the "started" mark of `key`, with the id `mark`, in one atomic step that checks
    /// the lock still holds `token` and that neither a mark nor a result is there (then nothing
    /// is written; a mark with the id `mark` is this one, written before).
    pub(crate) async fn mark_started(
        &self,
        key: &LockKey,
        token: &Token,
        mark: &Token,
        fingerprint: &str,
        ttl: Duration,
    ) -> Result<Marked, LockError> {
        match self {
            BackendKind::Memory(m) => Ok(m.mark_started(key, token, mark, fingerprint, ttl)),
            #[cfg(feature = "redis")]
            BackendKind::Redis(r) => r.mark_started(key, token, mark, fingerprint, ttl).await,
            #[cfg(feature = "redlock")]
            BackendKind::Redlock(r) => r.mark_started(key, token, mark, fingerprint, ttl).await,
        }
    }

    /// Removes the "started" mark of `key` whose id is `mark` (never a result, never another
    /// mark) if the lock still holds `token`: `Ok(false)`, nothing removed, when it does not.
    pub(crate) async fn clear_started(
        &self,
        key: &LockKey,
        token: &Token,
        mark: &Token,
    ) -> Result<bool, LockError> {
        match self {
            BackendKind::Memory(m) => Ok(m.clear_started(key, token, mark)),
            #[cfg(feature = "redis")]
            BackendKind::Redis(r) => r.clear_started(key, token, mark).await,
            #[cfg(feature = "redlock")]
            BackendKind::Redlock(r) => r.clear_started(key, token, mark).await,
        }
    }

    /// The idempotency record of `key`, else whether its lock is held, in one atomic read.
    pub(crate) async fn idempotency_state(
        &self,
        key: &LockKey,
    ) -> Result<IdempotencyState, LockError> {
        match self {
            BackendKind::Memory(m) => Ok(m.idempotency_state(key)),
            #[cfg(feature = "redis")]
            BackendKind::Redis(r) => r.idempotency_state(key).await,
            #[cfg(feature = "redlock")]
            BackendKind::Redlock(r) => r.idempotency_state(key).await,
        }
    }

    /// Registers `inbox` for the release messages of `key`. Returns `false` when the backend
    /// could not confirm the subscription: the caller must then fall back to bounded retries.
    pub(crate) async fn subscribe(&self, key: &LockKey, inbox: &Arc<Inbox>) -> bool {
        match self {
            BackendKind::Memory(m) => {
                m.subscribe(key, inbox);
                true
            }
            #[cfg(feature = "redis")]
            BackendKind::Redis(r) => r.subscribe(key, inbox).await,
            #[cfg(feature = "redlock")]
            BackendKind::Redlock(r) => r.subscribe(key, inbox).await,
        }
    }

    pub(crate) fn unsubscribe(&self, key: &LockKey, inbox: &Arc<Inbox>) {
        match self {
            BackendKind::Memory(m) => m.unsubscribe(key, inbox),
            #[cfg(feature = "redis")]
            BackendKind::Redis(r) => r.unsubscribe(key, inbox),
            #[cfg(feature = "redlock")]
            BackendKind::Redlock(r) => r.unsubscribe(key, inbox),
        }
    }

    /// When a subscription that failed (or whose connection has gone) may succeed if asked for
    /// again: at once while notifications flow (the backend recovered, and with it every
    /// registered channel) or no connection is trying to restore them (the next subscription
    /// connects), after the back-off of a failed connect; `None` while a connection recovers
    /// (it subscribes every registered channel itself) or never can.
    pub(crate) fn resubscribe_after(&self) -> Option<std::time::Duration> {
        match self {
            BackendKind::Memory(_) => Some(std::time::Duration::ZERO),
            #[cfg(feature = "redis")]
            BackendKind::Redis(r) => r.resubscribe_after(),
            #[cfg(feature = "redlock")]
            BackendKind::Redlock(r) => r.resubscribe_after(),
        }
    }

    /// Whether release notifications are flowing right now.
    pub(crate) fn notifications_healthy(&self) -> bool {
        match self {
            BackendKind::Memory(_) => true,
            #[cfg(feature = "redis")]
            BackendKind::Redis(r) => r.notifications_healthy(),
            #[cfg(feature = "redlock")]
            BackendKind::Redlock(r) => r.notifications_healthy(),
        }
    }

    /// Acquires and releases sent in a batch with others (group commit; none on memory).
    pub(crate) fn batched_requests(&self) -> u64 {
        match self {
            BackendKind::Memory(_) => 0,
            #[cfg(feature = "redis")]
            BackendKind::Redis(r) => r.batched_requests(),
            #[cfg(feature = "redlock")]
            BackendKind::Redlock(r) => r.batched_requests(),
        }
    }

    /// Whether the backend may evict lock keys under memory pressure (`None`: unknown).
    pub(crate) fn eviction_risk(&self) -> Option<bool> {
        match self {
            BackendKind::Memory(_) => Some(false),
            #[cfg(feature = "redis")]
            BackendKind::Redis(r) => r.eviction_risk(),
            #[cfg(feature = "redlock")]
            BackendKind::Redlock(r) => r.eviction_risk(),
        }
    }

    /// A receiver whose value changes each time the connection to the server was lost or came
    /// back (held locks may have gone with the server's data: the watchdog checks them all at
    /// once); `None` when the backend cannot tell (memory: nothing to lose).
    pub(crate) fn reconnects(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        match self {
            BackendKind::Memory(_) => None,
            #[cfg(feature = "redis")]
            BackendKind::Redis(r) => r.reconnects(),
            #[cfg(feature = "redlock")]
            BackendKind::Redlock(r) => r.reconnects(),
        }
    }
}

/// Runs `futures` concurrently; their outputs in order.
#[cfg(any(feature = "cluster", feature = "sentinel", feature = "redlock"))]
pub(crate) async fn join_all<'a, T>(
    futures: Vec<std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>>,
) -> Vec<T> {
    let mut futures: Vec<_> = futures.into_iter().map(Some).collect();
    let mut outputs: Vec<Option<T>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (slot, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if let Some(fut) = slot {
                match fut.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => {
                        *output = Some(v);
                        *slot = None;
                    }
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

#[cfg(all(test, feature = "cluster"))]
mod tests {
    use std::future::Future;
    use std::pin::Pin;

    use super::*;

    #[tokio::test]
    async fn join_all_keeps_order() {
        let futures: Vec<Pin<Box<dyn Future<Output = u32> + Send>>> = vec![
            Box::pin(async {
                tokio::task::yield_now().await;
                1
            }),
            Box::pin(async { 2 }),
        ];
        assert_eq!(join_all(futures).await, vec![1, 2]);
    }
}

#[cfg(all(test, feature = "cluster", feature = "sentinel", feature = "redlock"))]
mod timeout_tests {
    use std::time::Duration;

    use crate::{
        LockError, RedisBackend, RedisClusterBackend, RedisSentinelBackend, RedlockBackend,
    };

    fn refused<T>(r: Result<T, LockError>) -> bool {
        matches!(r, Err(LockError::InvalidConfig { .. }))
    }

    /// A timeout the backends cannot add or multiply without overflow is refused by every
    /// builder before anything is sent (port 1: nothing listens, so a builder that went on
    /// would answer `Backend`, or panic in a sum).
    #[tokio::test]
    async fn every_builder_refuses_a_timeout_above_the_maximum() {
        let (url, max) = ("redis://127.0.0.1:1/", Duration::MAX);
        let over = super::MAX_TIMEOUT + Duration::from_millis(1);
        for t in [max, over] {
            let redis = RedisBackend::builder(url)
                .connect_timeout(t)
                .connect()
                .await;
            assert!(refused(redis), "redis connect_timeout {t:?}");
            let redis = RedisBackend::builder(url)
                .response_timeout(t)
                .connect()
                .await;
            assert!(refused(redis), "redis response_timeout {t:?}");
            let cluster = RedisClusterBackend::builder(&[url])
                .response_timeout(t)
                .connect()
                .await;
            assert!(refused(cluster), "cluster response_timeout {t:?}");
            let sentinel = RedisSentinelBackend::builder(&[url], "m")
                .connect_timeout(t)
                .connect()
                .await;
            assert!(refused(sentinel), "sentinel connect_timeout {t:?}");
            let redlock = RedlockBackend::builder(&[url])
                .server_timeout(t)
                .connect()
                .await;
            assert!(refused(redlock), "redlock server_timeout {t:?}");
        }
    }
}
