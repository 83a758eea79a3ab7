//! Where locks live: the [`Backend`] trait, its vocabulary, and the backends of this crate
//! (the embedded memory backend, Redis and its scale-out engines).
//!
//! A [`Backend`] is what [`Locker::builder`](crate::Locker::builder) takes. Every backend keeps
//! the same semantics (one conformance suite runs against each): atomic acquire with a random
//! token, owner-checked release and renewal, a lease on every lock, a release notification for
//! waiters, and an optional fencing counter. None of the backends knows the engine above it:
//! they talk to it only through this trait.
//!
//! ```
//! use lock_core::backend::{Backend, IntoBackend};
//! let backend = lock_core::MemoryBackend::new().into_backend();
//! assert!(backend.refuses(true, true).is_none());
//! ```

use std::sync::Arc;
use std::time::Duration;

use crate::LockError;
use crate::idempotency::IdempotencyState;
pub use crate::idempotency::Marked;
use crate::inspect::LockState;
pub use crate::key::LockKey;
pub use crate::token::Token;

#[cfg(feature = "cluster")]
pub(crate) mod cluster;
#[cfg(test)]
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
mod consensus_tests;
#[cfg(feature = "etcd")]
pub(crate) mod etcd;
pub(crate) mod memory;
mod notify;
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
mod record_codec;
#[cfg(feature = "redis")]
pub(crate) mod redis;
#[cfg(feature = "redlock")]
pub(crate) mod redlock;
#[cfg(feature = "sentinel")]
pub(crate) mod sentinel;
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
mod stamp;
mod types;
#[cfg(feature = "zookeeper")]
pub(crate) mod zookeeper;

pub use crate::inspect::{KeyPattern, ListPage};
#[cfg(feature = "cluster")]
pub use cluster::{RedisClusterBackend, RedisClusterBackendBuilder};
#[cfg(feature = "etcd")]
pub use etcd::{ETCD_MIN_LEASE, EtcdBackend, EtcdBackendBuilder};
pub use memory::MemoryBackend;
pub(crate) use notify::Grant;
pub use notify::{Inbox, Listeners};
#[cfg(feature = "redis")]
pub use redis::{RedisBackend, RedisBackendBuilder};
#[cfg(feature = "redlock")]
pub use redlock::{DEFAULT_SERVER_TIMEOUT, NoQuorum, RedlockBackend, RedlockBackendBuilder};
#[cfg(feature = "sentinel")]
pub use sentinel::{RedisSentinelBackend, RedisSentinelBackendBuilder};
pub use types::{Attempt, AttemptOptions, Kept, QueueTicket, Renewal, Renewed};
#[cfg(feature = "zookeeper")]
pub use zookeeper::{ZooKeeperBackend, ZooKeeperBackendBuilder};

/// A boxed future, as the [`Backend`] trait's methods return (the engine holds its backend as
/// `Arc<dyn Backend>`). Write a method's body as `Box::pin(async move { .. })`.
///
/// ```
/// use lock_core::backend::BoxFuture;
/// fn answer(n: u32) -> BoxFuture<'static, u32> {
///     Box::pin(async move { n + 1 })
/// }
/// # drop(answer(1));
/// ```
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// Where locks live: the one boundary between the engine (waiting, local hand-off, watchdog,
/// reentrancy, idempotency) and a store. Every backend of this crate implements it (memory,
/// one Redis server, Cluster and Sentinel, Redlock), and so can a store of your own: pass it
/// to [`Locker::builder`](crate::Locker::builder) and the same locker, guard, macro and layers
/// run on it.
///
/// # What an implementation must keep
///
/// The semantics of DESIGN.md's "Semantics every backend must keep", checked by the
/// conformance kit (`lock_core::conformance`, feature `conformance`): run it against your
/// backend in your own tests, and a backend that passes it keeps every guarantee.
/// - [`acquire`](Self::acquire) is one atomic step: the lock is taken with the token and the
///   lease only if nobody holds it; never set-then-expire.
/// - [`release`](Self::release) and [`renew`](Self::renew) check the token atomically: a lock
///   another owner took after ours expired is never released or renewed by us. A renewal
///   answers each lock on its own ([`Renewed`]); `Unknown` when it cannot tell, never `Yes`.
/// - A release wakes the key's listeners ([`subscribe`](Self::subscribe)) in every process;
///   the lease ends a lock whose holder died.
/// - Fences (when offered) strictly increase per key, whatever the store went through.
///
/// # Required and optional
///
/// Required: acquire, release, renew, the release notification (subscribe / unsubscribe),
/// and the idempotency record (store, mark, clear, read). Everything else has a default for a
/// backend without the capability: no queue with hand-over (tickets are ignored, waiters are
/// woken and try again), no group commit, no per-shard renewal groups, no connection-loss
/// signal, and no fencing nor fair queue: [`refuses`](Self::refuses) turns those requests
/// down, so a caller is never promised what the store cannot keep.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use lock_core::backend::{
///     Attempt, AttemptOptions, Backend, BoxFuture, Inbox, LockKey, Marked, Renewal, Renewed, Token,
/// };
/// use lock_core::{IdempotencyState, LockError, Locker, MemoryBackend};
///
/// /// A backend that counts acquires and leaves the rest to the memory backend.
/// #[derive(Debug, Default)]
/// struct Counting {
///     inner: MemoryBackend,
///     acquires: std::sync::atomic::AtomicU64,
/// }
///
/// impl Backend for Counting {
///     fn acquire<'a>(&'a self, key: &'a LockKey, token: &'a Token, lease: Duration,
///         options: AttemptOptions<'a>) -> BoxFuture<'a, Result<Attempt, LockError>> {
///         self.acquires.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
///         self.inner.acquire(key, token, lease, options)
///     }
///     fn release<'a>(&'a self, key: &'a LockKey, token: &'a Token)
///         -> BoxFuture<'a, Result<bool, LockError>> {
///         self.inner.release(key, token)
///     }
///     fn renew<'a>(&'a self, items: &'a [Renewal]) -> BoxFuture<'a, Result<Vec<Renewed>, LockError>> {
///         self.inner.renew(items)
///     }
///     fn subscribe<'a>(&'a self, key: &'a LockKey, inbox: &'a Arc<Inbox>) -> BoxFuture<'a, bool> {
///         self.inner.subscribe(key, inbox)
///     }
///     fn unsubscribe(&self, key: &LockKey, inbox: &Arc<Inbox>) {
///         self.inner.unsubscribe(key, inbox)
///     }
///     fn store_result<'a>(&'a self, key: &'a LockKey, token: &'a Token, fingerprint: &'a str,
///         result: &'a [u8], ttl: Duration) -> BoxFuture<'a, Result<bool, LockError>> {
///         self.inner.store_result(key, token, fingerprint, result, ttl)
///     }
///     fn mark_started<'a>(&'a self, key: &'a LockKey, token: &'a Token, mark: &'a Token,
///         fingerprint: &'a str, ttl: Duration) -> BoxFuture<'a, Result<Marked, LockError>> {
///         self.inner.mark_started(key, token, mark, fingerprint, ttl)
///     }
///     fn clear_started<'a>(&'a self, key: &'a LockKey, token: &'a Token, mark: &'a Token)
///         -> BoxFuture<'a, Result<bool, LockError>> {
///         self.inner.clear_started(key, token, mark)
///     }
///     fn idempotency_state<'a>(&'a self, key: &'a LockKey)
///         -> BoxFuture<'a, Result<IdempotencyState, LockError>> {
///         self.inner.idempotency_state(key)
///     }
/// }
///
/// # async fn demo() -> Result<(), LockError> {
/// let backend = Arc::new(Counting::default());
/// let locker = Locker::builder(backend.clone()).build();
/// locker.lock("order:42").await?.release().await?;
/// assert_eq!(backend.acquires.load(std::sync::atomic::Ordering::Relaxed), 1);
/// // Without `refuses`, fencing is turned down rather than promised.
/// assert!(matches!(locker.lock("order:42").fenced().await, Err(LockError::InvalidConfig { .. })));
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
/// ```
pub trait Backend: Send + Sync + std::fmt::Debug + 'static {
    /// One atomic attempt to take `key` with `token` for `lease`: [`Attempt::Acquired`] (with a
    /// fence when [`AttemptOptions::fenced`] asks) or [`Attempt::Busy`]. With a
    /// [`QueueTicket`], a busy attempt keeps (or refreshes) the ticket's place in the key's
    /// queue, when the backend has one.
    fn acquire<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        lease: Duration,
        options: AttemptOptions<'a>,
    ) -> BoxFuture<'a, Result<Attempt, LockError>>;

    /// `Ok(true)` when the lock was ours and is now deleted or handed to a queued waiter (and
    /// the key's listeners, in this process too, were told); `Ok(false)`, nothing touched,
    /// when it was not ours.
    fn release<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<bool, LockError>>;

    /// Renews each lock of the batch that still holds its token, with its lease from now: one
    /// verdict per item, in order. `Err` when the whole call failed (every item
    /// [`Renewed::Unknown`]).
    fn renew<'a>(&'a self, items: &'a [Renewal]) -> BoxFuture<'a, Result<Vec<Renewed>, LockError>>;

    /// Registers `inbox` for the release notifications of `key` (wake it with
    /// [`Inbox::wake`], or deliver messages through [`Listeners`]). Returns `false` when the
    /// backend could not confirm the subscription: the caller then falls back to bounded
    /// retries.
    fn subscribe<'a>(&'a self, key: &'a LockKey, inbox: &'a Arc<Inbox>) -> BoxFuture<'a, bool>;

    /// Removes a registration [`subscribe`](Self::subscribe) made.
    fn unsubscribe(&self, key: &LockKey, inbox: &Arc<Inbox>);

    /// Stores an idempotency record for `key` in one atomic step that checks the lock still
    /// holds `token`: `Ok(false)`, nothing written, when it does not.
    fn store_result<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        fingerprint: &'a str,
        result: &'a [u8],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, LockError>>;

    /// Writes the "started" mark of `key`, with the id `mark`, in one atomic step that checks
    /// the lock still holds `token` and that neither a mark nor a result is there (then nothing
    /// is written; a mark with the id `mark` is this one, written before).
    fn mark_started<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        mark: &'a Token,
        fingerprint: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Marked, LockError>>;

    /// Removes the "started" mark of `key` whose id is `mark` (never a result, never another
    /// mark) if the lock still holds `token`: `Ok(false)`, nothing removed, when it does not.
    fn clear_started<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        mark: &'a Token,
    ) -> BoxFuture<'a, Result<bool, LockError>>;

    /// The idempotency record of `key`, else whether its lock is held, in one atomic read.
    fn idempotency_state<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<IdempotencyState, LockError>>;

    /// Why this backend refuses a request with these options, if it does: checked at the
    /// start of the request, before any I/O and before the request joins the local queue. The
    /// default refuses fencing and fair waiting (a backend offers them by overriding this):
    /// a store that cannot keep a promise must say so rather than make it.
    fn refuses(&self, fenced: bool, fair: bool) -> Option<&'static str> {
        if fenced {
            Some(NO_FENCING)
        } else if fair {
            Some(NO_FAIR_QUEUE)
        } else {
            None
        }
    }

    /// Whether an acquire that fails, or is dropped mid-flight, takes back on its own whatever
    /// it may have taken (announcing nothing): the engine's in-flight release is then not sent,
    /// as it would announce the release of a lock nobody held to the key's waiters. Such a
    /// backend gets a new token for every attempt of a waiter.
    fn takes_back_failed_attempts(&self) -> bool {
        false
    }

    /// Whether an attempt sent again with the same token finds what an earlier attempt with it
    /// did (its key in the queue, or the lock), the answer to which was lost. A queued waiter
    /// whose attempt fails then keeps its token (and its place in the queue) for its next
    /// attempt, instead of having the engine release the token and start over with a new one;
    /// what the failed attempt may have taken is given back by
    /// [`leave_queue`](Self::leave_queue) when the waiter gives up (a timeout, a cancel, an
    /// error returned to its caller), which must then delete the token's entry whether it
    /// waits or holds the lock. The default (`false`) releases a failed attempt's token at once.
    fn keeps_token_after_failed_attempt(&self) -> bool {
        false
    }

    /// Whether the store lives in this process only (the memory backend): every call completes
    /// without I/O, and tokens come from a fast in-process generator (no other process can see
    /// them).
    fn in_process(&self) -> bool {
        false
    }

    /// A short name for the kind of store, the `backend` label of the metrics (feature
    /// `metrics`): `memory`, `redis`, `cluster`, `sentinel`, `redlock`, `etcd`, `zookeeper`;
    /// `custom` unless a backend of your own names itself.
    ///
    /// ```
    /// use lock_core::Backend;
    /// assert_eq!(lock_core::MemoryBackend::new().kind(), "memory");
    /// ```
    fn kind(&self) -> &'static str {
        "custom"
    }

    /// Takes a waiter's ticket out of the key's queue (it gave up). If a release handed the
    /// lock to the ticket meanwhile (`token`), the lock is passed on as a release would.
    fn leave_queue<'a>(
        &'a self,
        key: &'a LockKey,
        ticket: &'a str,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        let _ = (key, ticket, token);
        Box::pin(async { Ok(()) })
    }

    /// Leaves the queue at once when that needs no I/O; `false` when the engine must call
    /// [`leave_queue`](Self::leave_queue). The default (no queue) has nothing to leave.
    fn leave_queue_at_once(&self, key: &LockKey, ticket: &str, token: &Token) -> bool {
        let _ = (key, ticket, token);
        true
    }

    /// At the bound of a local hand-off's turns: keeps the lock held by `token` when no waiter
    /// queues for it in the backend (the hand-off goes on), else releases it to them. The
    /// default cannot see other processes' waiters and releases.
    fn keep_if_alone<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<Kept, LockError>> {
        Box::pin(async move {
            Ok(if self.release(key, token).await? {
                Kept::Released
            } else {
                Kept::NotOurs
            })
        })
    }

    /// The renewal items grouped (by the shard that serves them, say): one
    /// [`renew`](Self::renew) call per group, each on a task of its own. `None` (the default):
    /// one call for all.
    fn renewal_groups(&self, items: &[Renewal]) -> Option<Vec<Vec<usize>>> {
        let _ = items;
        None
    }

    /// When a subscription that failed (or whose connection has gone) may succeed if asked for
    /// again: at once while notifications flow or no connection is trying to restore them,
    /// after the back-off of a failed connect; `None` while a connection recovers (it
    /// subscribes every registered key itself) or never can.
    fn resubscribe_after(&self) -> Option<Duration> {
        Some(Duration::ZERO)
    }

    /// Whether release notifications are flowing right now.
    fn notifications_healthy(&self) -> bool {
        true
    }

    /// Acquires and releases sent in a batch with others (group commit); 0 without it.
    fn batched_requests(&self) -> u64 {
        0
    }

    /// Whether the store may evict lock keys under memory pressure (`None`: unknown).
    fn eviction_risk(&self) -> Option<bool> {
        None
    }

    /// A receiver whose value changes each time the connection to the store was lost or came
    /// back (held locks may have gone with it: the watchdog checks them all at once); `None`
    /// when the backend cannot tell.
    fn reconnects(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }

    /// The state of `key`'s lock, read in one atomic step without taking it: held, the lease
    /// left, the last fence, the holder recorded at acquire ([`AttemptOptions::holder`]) and
    /// for how long, the waiters queued. Never the token. The default cannot inspect.
    fn inspect<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<LockState, LockError>> {
        let _ = key;
        Box::pin(async { Err(cannot("inspect locks")) })
    }

    /// Removes `key`'s lock whoever holds it, in one atomic step, as a release by its holder
    /// would (the oldest live waiter is handed the lock, or the listeners are told it is
    /// free), and returns its state just before; `None`, nothing touched, when nobody held
    /// it. The fence counter is kept: the next fence is larger than every one before. The
    /// default cannot.
    fn force_unlock<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<LockState>, LockError>> {
        let _ = key;
        Box::pin(async { Err(cannot("force an unlock")) })
    }

    /// Removes `key`'s lock as [`force_unlock`](Self::force_unlock) does, in the same atomic
    /// step, only if it is still the holding `seen` showed (the same
    /// [`LockState::since`] and last fence); else touches nothing and answers the holding now.
    /// The default cannot.
    fn force_unlock_seen<'a>(
        &'a self,
        key: &'a LockKey,
        seen: &'a LockState,
    ) -> BoxFuture<'a, Result<crate::Unlocked, LockError>> {
        let _ = (key, seen);
        Box::pin(async { Err(cannot("force an unlock of a holding seen")) })
    }

    /// One page of the held locks under `prefix` whose keys match `pattern`, from `cursor`
    /// (`None`: the first page; else a [`ListPage::next`] this backend returned). A page is
    /// bounded (a `SCAN` step on Redis): a listing holds one page in memory at a time. The
    /// default cannot list.
    fn list_page<'a>(
        &'a self,
        prefix: &'a str,
        pattern: &'a KeyPattern,
        cursor: Option<&'a str>,
    ) -> BoxFuture<'a, Result<ListPage, LockError>> {
        let _ = (prefix, pattern, cursor);
        Box::pin(async { Err(cannot("list locks")) })
    }
}

/// What a backend without the operation answers.
fn cannot(what: &str) -> LockError {
    LockError::config(format!("this backend cannot {what}"))
}

/// The trait methods of a Redis-family backend that forward to its inherent methods of the
/// same name (the one server and Redlock backends share this vocabulary).
#[cfg(feature = "redis")]
macro_rules! forward_to_inherent {
    ($ty:ident) => {
        fn acquire<'a>(
            &'a self,
            key: &'a LockKey,
            token: &'a Token,
            lease: Duration,
            options: AttemptOptions<'a>,
        ) -> BoxFuture<'a, Result<Attempt, LockError>> {
            Box::pin($ty::acquire(self, key, token, lease, options))
        }

        fn release<'a>(
            &'a self,
            key: &'a LockKey,
            token: &'a Token,
        ) -> BoxFuture<'a, Result<bool, LockError>> {
            Box::pin($ty::release(self, key, token))
        }

        fn subscribe<'a>(&'a self, key: &'a LockKey, inbox: &'a Arc<Inbox>) -> BoxFuture<'a, bool> {
            Box::pin($ty::subscribe(self, key, inbox))
        }

        fn unsubscribe(&self, key: &LockKey, inbox: &Arc<Inbox>) {
            $ty::unsubscribe(self, key, inbox);
        }

        fn store_result<'a>(
            &'a self,
            key: &'a LockKey,
            token: &'a Token,
            fingerprint: &'a str,
            result: &'a [u8],
            ttl: Duration,
        ) -> BoxFuture<'a, Result<bool, LockError>> {
            Box::pin($ty::store_result(
                self,
                key,
                token,
                fingerprint,
                result,
                ttl,
            ))
        }

        fn mark_started<'a>(
            &'a self,
            key: &'a LockKey,
            token: &'a Token,
            mark: &'a Token,
            fingerprint: &'a str,
            ttl: Duration,
        ) -> BoxFuture<'a, Result<Marked, LockError>> {
            Box::pin($ty::mark_started(self, key, token, mark, fingerprint, ttl))
        }

        fn clear_started<'a>(
            &'a self,
            key: &'a LockKey,
            token: &'a Token,
            mark: &'a Token,
        ) -> BoxFuture<'a, Result<bool, LockError>> {
            Box::pin($ty::clear_started(self, key, token, mark))
        }

        fn idempotency_state<'a>(
            &'a self,
            key: &'a LockKey,
        ) -> BoxFuture<'a, Result<IdempotencyState, LockError>> {
            Box::pin($ty::idempotency_state(self, key))
        }

        fn keep_if_alone<'a>(
            &'a self,
            key: &'a LockKey,
            token: &'a Token,
        ) -> BoxFuture<'a, Result<Kept, LockError>> {
            Box::pin($ty::keep_if_alone(self, key, token))
        }

        fn renewal_groups(&self, items: &[Renewal]) -> Option<Vec<Vec<usize>>> {
            $ty::renewal_groups(self, items)
        }

        fn resubscribe_after(&self) -> Option<Duration> {
            $ty::resubscribe_after(self)
        }

        fn notifications_healthy(&self) -> bool {
            $ty::notifications_healthy(self)
        }

        fn batched_requests(&self) -> u64 {
            $ty::batched_requests(self)
        }

        fn eviction_risk(&self) -> Option<bool> {
            $ty::eviction_risk(self)
        }

        fn reconnects(&self) -> Option<watch::Receiver<u64>> {
            $ty::reconnects(self)
        }
    };
}
#[cfg(feature = "redis")]
pub(crate) use forward_to_inherent;

/// The trait of a consensus backend (etcd, ZooKeeper): both keep one contender entry per
/// token under the lock (the token in its name), so their vocabulary is the same and each
/// method forwards to the inherent method that does it. `$reconnects` is the backend's signal
/// of a lost or renewed session.
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
macro_rules! consensus_backend {
    ($ty:ty, $kind:literal, |$this:ident| $reconnects:expr) => {
        impl Backend for $ty {
            fn kind(&self) -> &'static str {
                $kind
            }

            fn acquire<'a>(
                &'a self,
                key: &'a LockKey,
                token: &'a Token,
                lease: Duration,
                options: AttemptOptions<'a>,
            ) -> BoxFuture<'a, Result<Attempt, LockError>> {
                Box::pin(self.acquire_lock(key, token, lease, options))
            }

            fn release<'a>(
                &'a self,
                key: &'a LockKey,
                token: &'a Token,
            ) -> BoxFuture<'a, Result<bool, LockError>> {
                Box::pin(self.release_lock(key, token))
            }

            fn renew<'a>(
                &'a self,
                items: &'a [Renewal],
            ) -> BoxFuture<'a, Result<Vec<Renewed>, LockError>> {
                Box::pin(self.renew_locks(items))
            }

            /// Releases of this process reach its listeners directly, and releases of others
            /// through each waiter's watch of the entry ahead; fair waiters of other processes
            /// are heard by a watch of the lock's contenders while it has listeners here.
            fn subscribe<'a>(
                &'a self,
                key: &'a LockKey,
                inbox: &'a Arc<Inbox>,
            ) -> BoxFuture<'a, bool> {
                self.hear_fair_waiters(key, inbox);
                Box::pin(std::future::ready(true))
            }

            fn unsubscribe(&self, key: &LockKey, inbox: &Arc<Inbox>) {
                self.stop_hearing(key, inbox);
            }

            fn store_result<'a>(
                &'a self,
                key: &'a LockKey,
                token: &'a Token,
                fingerprint: &'a str,
                result: &'a [u8],
                ttl: Duration,
            ) -> BoxFuture<'a, Result<bool, LockError>> {
                Box::pin(self.store_record(key, token, fingerprint, result, ttl))
            }

            fn mark_started<'a>(
                &'a self,
                key: &'a LockKey,
                token: &'a Token,
                mark: &'a Token,
                fingerprint: &'a str,
                ttl: Duration,
            ) -> BoxFuture<'a, Result<Marked, LockError>> {
                Box::pin(self.write_mark(key, token, mark, fingerprint, ttl))
            }

            fn clear_started<'a>(
                &'a self,
                key: &'a LockKey,
                token: &'a Token,
                mark: &'a Token,
            ) -> BoxFuture<'a, Result<bool, LockError>> {
                Box::pin(self.clear_mark(key, token, mark))
            }

            fn idempotency_state<'a>(
                &'a self,
                key: &'a LockKey,
            ) -> BoxFuture<'a, Result<IdempotencyState, LockError>> {
                Box::pin(self.read_state(key))
            }

            /// Every lock has a fence (its entry's creation in the store's history), and
            /// waiting is FIFO.
            fn refuses(&self, _fenced: bool, _fair: bool) -> Option<&'static str> {
                None
            }

            fn leave_queue<'a>(
                &'a self,
                key: &'a LockKey,
                _ticket: &'a str,
                token: &'a Token,
            ) -> BoxFuture<'a, Result<(), LockError>> {
                Box::pin(self.leave(key, token))
            }

            /// Leaving deletes an entry in the store.
            fn leave_queue_at_once(&self, _key: &LockKey, _ticket: &str, _token: &Token) -> bool {
                false
            }

            /// An attempt sent again finds its own entry (the token is in its name); leaving
            /// deletes the entry, held or waiting.
            fn keeps_token_after_failed_attempt(&self) -> bool {
                true
            }

            fn keep_if_alone<'a>(
                &'a self,
                key: &'a LockKey,
                token: &'a Token,
            ) -> BoxFuture<'a, Result<Kept, LockError>> {
                Box::pin(self.keep_alone(key, token))
            }

            fn eviction_risk(&self) -> Option<bool> {
                Some(false)
            }

            fn reconnects(&self) -> Option<watch::Receiver<u64>> {
                let $this = self;
                Some($reconnects)
            }

            /// The holder is the first contender entry; its stamp names the holder and its
            /// age, and the entries behind it are the waiters (see the backend's docs for
            /// what `remaining` and `fence` mean on it).
            fn inspect<'a>(
                &'a self,
                key: &'a LockKey,
            ) -> BoxFuture<'a, Result<crate::LockState, LockError>> {
                Box::pin(self.inspect_lock(key))
            }

            /// Deletes the holder's entry, conditioned on that very entry: the waiter watching
            /// it is handed the lock at once.
            fn force_unlock<'a>(
                &'a self,
                key: &'a LockKey,
            ) -> BoxFuture<'a, Result<Option<crate::LockState>, LockError>> {
                Box::pin(self.force_unlock_lock(key))
            }

            fn list_page<'a>(
                &'a self,
                prefix: &'a str,
                pattern: &'a KeyPattern,
                cursor: Option<&'a str>,
            ) -> BoxFuture<'a, Result<ListPage, LockError>> {
                Box::pin(self.list_locks(prefix, pattern, cursor))
            }
        }
    };
}
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
pub(crate) use consensus_backend;

/// Why a backend without fencing refuses `fenced()` (the default of [`Backend::refuses`]).
pub const NO_FENCING: &str = "this backend offers no fencing tokens";

/// Why a backend without a queue refuses `fair()` (the default of [`Backend::refuses`]).
pub const NO_FAIR_QUEUE: &str =
    "this backend keeps no queue of waiters, so it cannot serve them in order";

/// What [`Locker::builder`](crate::Locker::builder) takes: any [`Backend`], shared or not, and
/// the Redis Cluster and Sentinel backends (the Redis backend over their connections).
///
/// ```
/// use std::sync::Arc;
/// use lock_core::backend::Backend;
/// use lock_core::{Locker, MemoryBackend};
///
/// let shared: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
/// // Two lockers on one backend contend like two processes on one Redis.
/// let a = Locker::builder(shared.clone()).build();
/// let b = Locker::builder(shared).build();
/// # drop((a, b));
/// ```
pub trait IntoBackend {
    /// The backend, ready for a locker.
    fn into_backend(self) -> Arc<dyn Backend>;
}

impl<B: Backend> IntoBackend for B {
    fn into_backend(self) -> Arc<dyn Backend> {
        Arc::new(self)
    }
}

impl<B: Backend> IntoBackend for Arc<B> {
    fn into_backend(self) -> Arc<dyn Backend> {
        self
    }
}

impl IntoBackend for Arc<dyn Backend> {
    fn into_backend(self) -> Arc<dyn Backend> {
        self
    }
}

/// The clock-drift allowance subtracted from every lease when its local validity is counted:
/// 1 % plus 2 ms (the engine's deadline, and Redlock's validity check, both use it).
pub(crate) fn drift(lease: Duration) -> Duration {
    lease / 100 + Duration::from_millis(2)
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
#[cfg(any(feature = "redis", feature = "etcd", feature = "zookeeper"))]
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

/// Checks a backend's timeouts (`what` names them in the error): each above zero and at most
/// [`MAX_TIMEOUT`].
#[cfg(any(feature = "redis", feature = "etcd", feature = "zookeeper"))]
pub(crate) fn validate_timeouts(what: &str, timeouts: &[Duration]) -> Result<(), LockError> {
    if timeouts.iter().any(|t| t.is_zero() || *t > MAX_TIMEOUT) {
        return Err(LockError::config(format!(
            "{what} must be above zero and at most {MAX_TIMEOUT:?}"
        )));
    }
    Ok(())
}

/// Runs `futures` concurrently; their outputs in order.
#[cfg(any(
    feature = "cluster",
    feature = "sentinel",
    feature = "redlock",
    feature = "etcd"
))]
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
