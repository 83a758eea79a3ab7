//! [`Locker`]: the entry point, and its builder. What its clones share is [`inner`]'s.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::LockError;
use crate::backend::{Backend, IntoBackend, MemoryBackend};
use crate::key::{DEFAULT_PREFIX, validate_prefix};
use crate::request::LockRequest;

mod inner;

pub(crate) use inner::{Config, LocalHandoff, LockerInner};

/// The lease used when none is configured.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// How long `lock` waits when no wait is configured.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(10);
/// The shortest lease accepted.
pub const MIN_LEASE: Duration = Duration::from_millis(10);
/// The longest lease accepted.
pub const MAX_LEASE: Duration = Duration::from_secs(7 * 24 * 3600);
/// The longest wait accepted.
pub const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);
/// The longest [`LockerBuilder::local_grace`] accepted.
pub const MAX_LOCAL_GRACE: Duration = Duration::from_secs(1);

/// Takes and holds locks on one backend.
///
/// Cheap to clone (an `Arc`); clones share the watchdog, the wait queues and the connections.
/// Keys are namespaced by the locker's prefix (default `"lock:"`).
///
/// ```
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use std::time::Duration;
/// use lock_core::{Locker, MemoryBackend};
///
/// let locker = Locker::memory();                                   // embedded, in-process
/// let custom = Locker::builder(MemoryBackend::new())
///     .prefix("shop:")
///     .lease(Duration::from_secs(30))
///     .wait(Duration::from_secs(2))
///     .build();
///
/// let guard = locker.lock("order:42").await?;                      // waits up to the default wait
/// guard.release().await?;
/// let total = custom.lock("stock:7").run(async { 1 + 1 }).await?;  // released after the body
/// assert_eq!(total, 2);
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct Locker {
    pub(crate) inner: Arc<LockerInner>,
}

/// Counters describing a locker right now.
///
/// ```
/// let stats = lock_core::Locker::memory().stats();
/// assert_eq!(stats.renewed_locks, 0);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockerStats {
    /// Locks the watchdog is renewing now.
    pub renewed_locks: usize,
    /// Renewal calls sent to the backend so far (each may renew many locks).
    pub renewal_calls: u64,
    /// Keys with local waiters now.
    pub waiting_keys: usize,
    /// Of those, the keys whose waiters hear of releases now: their release subscription is
    /// confirmed and the backend's notifications are healthy. The waiters of the others try
    /// again on timers (bounded, with back-off) while the subscription is asked for again;
    /// fewer than `waiting_keys` for long means notifications are failing (a lost
    /// connection, a Redis user without channel permissions, a server refusing connections).
    ///
    /// ```
    /// assert_eq!(lock_core::Locker::memory().stats().notified_keys, 0);
    /// ```
    pub notified_keys: usize,
    /// Local waiters now, over all keys.
    pub waiters: usize,
    /// Calls made to the backend so far (round trips on Redis): acquire attempts, releases,
    /// renewals, queue leaves. Subscriptions are not counted, nor the one retry a Redis call
    /// gets after a dropped connection, nor the full release that follows a one-key release
    /// which found the lock marked by a waiter or failed (one release, two round trips; see
    /// the guide's waiting chapter).
    pub backend_calls: u64,
    /// Locks this locker received from a release that handed them straight to its queued
    /// waiter (no acquire round trip after the release).
    pub handovers: u64,
    /// Locks passed from one task of this locker to the next waiting for the same key without
    /// going through the backend (local hand-off; see [`LockerBuilder::local_handoff`]).
    pub local_handoffs: u64,
    /// Acquires and releases the backend sent grouped with others in one request (group
    /// commit: while two of a kind are in flight, the next ones go out together at the
    /// runtime's next turn). Always 0 on memory and Redis Cluster (a batch's keys would span
    /// slots); on Redlock, the requests sent to each server, summed. Counted per backend, so
    /// lockers built on one backend share it.
    ///
    /// ```
    /// assert_eq!(lock_core::Locker::memory().stats().batched_requests, 0);
    /// ```
    pub batched_requests: u64,
    /// Whether the backend may evict lock keys under memory pressure: `Some(true)` when the
    /// Redis server's `maxmemory-policy` is anything but `noeviction` (a lock evicted while
    /// held can be taken by another owner), `Some(false)` for `noeviction` and the memory
    /// backend, `None` when the policy could not be read (a user without `@dangerous` may read
    /// neither `CONFIG` nor `INFO`). Read when the backend connected; see
    /// [`RedisBackend::maxmemory_policy`](crate::RedisBackend::maxmemory_policy).
    ///
    /// ```
    /// assert_eq!(lock_core::Locker::memory().stats().eviction_risk, Some(false));
    /// ```
    pub eviction_risk: Option<bool>,
}

impl Locker {
    /// A locker on a new, private, embedded memory backend: no server, same semantics.
    ///
    /// ```
    /// # async fn demo() {
    /// let locker = lock_core::Locker::memory();
    /// let _g = locker.lock("k").await.unwrap();
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub fn memory() -> Self {
        Self::builder(MemoryBackend::new()).build()
    }

    /// A locker on one Redis server, with default options. Accepts `redis://`, `rediss://`,
    /// `redis+unix://` URLs, with an ACL user and password in the URL.
    ///
    /// Checks at once that the Redis user may run everything the lock needs on the default
    /// prefix's keys and channels (see
    /// [`RedisBackend::check_permissions`](crate::RedisBackend::check_permissions)).
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for a bad URL or a missing Redis permission (the message
    /// names it), [`LockError::Backend`] when Redis cannot be reached.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let locker = lock_core::Locker::redis("redis://127.0.0.1:6379/").await?;
    /// # drop(locker); Ok(()) }
    /// ```
    #[cfg(feature = "redis")]
    pub async fn redis(url: &str) -> Result<Self, LockError> {
        let backend = crate::RedisBackend::connect(url).await?;
        backend.check_permissions(DEFAULT_PREFIX).await?;
        Ok(Self::builder(backend).build())
    }

    /// A locker on a Redis Cluster (Redis 7+), with default options: `urls` are some of its
    /// nodes (one that answers is enough). Locks are spread over the shards by key; see
    /// [`RedisClusterBackend`](crate::RedisClusterBackend).
    ///
    /// Checks at once that the Redis user may run everything the lock needs on the default
    /// prefix's keys and channels (on the shard of the check's hash slot: give every node the
    /// same ACL rule).
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for bad URLs or a missing Redis permission,
    /// [`LockError::Backend`] when no node can be reached.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let locker = lock_core::Locker::redis_cluster(&[
    ///     "redis://10.0.0.1:7000/",
    ///     "redis://10.0.0.2:7000/",
    /// ])
    /// .await?;
    /// # drop(locker); Ok(()) }
    /// ```
    #[cfg(feature = "cluster")]
    pub async fn redis_cluster(urls: &[&str]) -> Result<Self, LockError> {
        let backend = crate::RedisClusterBackend::connect(urls).await?;
        backend.check_permissions(DEFAULT_PREFIX).await?;
        Ok(Self::builder(backend).build())
    }

    /// A locker on an etcd v3 cluster, with default options: `endpoints` are some of its
    /// members' client URLs. Every lock may be fenced (its key's create revision) and fair;
    /// leases are at least [`ETCD_MIN_LEASE`](crate::ETCD_MIN_LEASE). See
    /// [`EtcdBackend`](crate::EtcdBackend), and its builder for timeouts, a namespace and auth.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for no endpoint, [`LockError::Backend`] when the cluster
    /// does not answer a linearizable read within the connect timeout.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let locker = lock_core::Locker::etcd(&["http://127.0.0.1:2379"]).await?;
    /// let guard = locker.lock("order:42").fenced().await?;
    /// # drop(guard); Ok(()) }
    /// ```
    #[cfg(feature = "etcd")]
    pub async fn etcd(endpoints: &[&str]) -> Result<Self, LockError> {
        let backend = crate::EtcdBackend::connect(endpoints).await?;
        Ok(Self::builder(backend).build())
    }

    /// A locker on a ZooKeeper ensemble, with default options (feature `zookeeper`): `hosts`
    /// is its connect string (`host:port` pairs separated by commas). See
    /// [`ZooKeeperBackend`](crate::ZooKeeperBackend) for the recipe, and its builder for the
    /// session timeout, the root node and credentials.
    ///
    /// # Errors
    /// As [`ZooKeeperBackendBuilder::connect`](crate::ZooKeeperBackendBuilder::connect).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let locker = lock_core::Locker::zookeeper("10.0.0.1:2181,10.0.0.2:2181,10.0.0.3:2181").await?;
    /// let guard = locker.lock("order:42").fenced().await?;
    /// # drop(guard); Ok(()) }
    /// ```
    #[cfg(feature = "zookeeper")]
    pub async fn zookeeper(hosts: &str) -> Result<Self, LockError> {
        let backend = crate::ZooKeeperBackend::connect(hosts).await?;
        Ok(Self::builder(backend).build())
    }

    /// A locker on the primary of a Redis group watched by Sentinel, with default options:
    /// `sentinels` are its sentinels (a majority of them must name the same primary),
    /// `master_name` the name they monitor the primary under. The locker follows the primary across failovers;
    /// see [`RedisSentinelBackend`](crate::RedisSentinelBackend) for what a failover means for
    /// a held lock, and its builder for the primary's credentials.
    ///
    /// Checks at once that the Redis user may run everything the lock needs on the default
    /// prefix's keys and channels.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for bad URLs or a missing Redis permission,
    /// [`LockError::Backend`] when no address is named by a majority of the sentinels, or
    /// the one named does not answer as a primary.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let locker = lock_core::Locker::redis_sentinel(
    ///     &["redis://10.0.0.1:26379/", "redis://10.0.0.2:26379/", "redis://10.0.0.3:26379/"],
    ///     "mymaster",
    /// )
    /// .await?;
    /// # drop(locker); Ok(()) }
    /// ```
    #[cfg(feature = "sentinel")]
    pub async fn redis_sentinel(sentinels: &[&str], master_name: &str) -> Result<Self, LockError> {
        let backend = crate::RedisSentinelBackend::connect(sentinels, master_name).await?;
        backend.check_permissions(DEFAULT_PREFIX).await?;
        Ok(Self::builder(backend).build())
    }

    /// A locker on N independent Redis servers (Redlock), with default options: a lock is
    /// held while a majority of them (3 of 5, 5 of 8) hold it, so it survives the loss of any
    /// (N-1)/2, rounded down (2 of 5, 3 of 8).
    /// See [`RedlockBackend`](crate::RedlockBackend) for what it guarantees, what the servers
    /// must be configured with (restart delay or `appendfsync always`), and why `fenced()` is
    /// refused on it. The URLs must name distinct servers: the same URL twice, and one server
    /// and database under two URLs (`localhost` and `127.0.0.1`, `/0` and none), are refused
    /// (a probe key written through each server must not be readable through another); two
    /// databases of one server are not detected, and would vote twice.
    ///
    /// Checks at once, on every server that answers, that the Redis user may run everything
    /// the lock needs on the default prefix's keys and channels.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for bad or repeated URLs or a missing Redis permission,
    /// [`LockError::Backend`] (source [`NoQuorum`](crate::NoQuorum)) when fewer than a majority
    /// of the servers can be reached.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let locker = lock_core::Locker::redlock(&[
    ///     "redis://10.0.0.1:6379/",
    ///     "redis://10.0.0.2:6379/",
    ///     "redis://10.0.0.3:6379/",
    /// ])
    /// .await?;
    /// # drop(locker); Ok(()) }
    /// ```
    #[cfg(feature = "redlock")]
    pub async fn redlock(urls: &[&str]) -> Result<Self, LockError> {
        let backend = crate::RedlockBackend::connect(urls).await?;
        backend.check_permissions(DEFAULT_PREFIX).await?;
        Ok(Self::builder(backend).build())
    }

    /// A builder for a locker on `backend`.
    ///
    /// ```
    /// use std::time::Duration;
    /// let locker = lock_core::Locker::builder(lock_core::MemoryBackend::new())
    ///     .prefix("shop:")
    ///     .lease(Duration::from_secs(10))
    ///     .build();
    /// # drop(locker);
    /// ```
    pub fn builder(backend: impl IntoBackend) -> LockerBuilder {
        LockerBuilder {
            backend: backend.into_backend(),
            prefix: DEFAULT_PREFIX.to_owned(),
            lease: DEFAULT_LEASE,
            wait: DEFAULT_WAIT,
            watchdog: true,
            local: LocalHandoff::default(),
            holder: None,
        }
    }

    /// Asks for the lock on `key`. Await the request for a [`LockGuard`](crate::LockGuard), or
    /// call [`run`](LockRequest::run) on it; set options on it first. Waits up to the locker's
    /// default wait unless told otherwise.
    ///
    /// ```
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// use std::time::Duration;
    /// let locker = lock_core::Locker::memory();
    /// let guard = locker.lock("order:42").wait(Duration::from_secs(2)).await?;
    /// # drop(guard); Ok(()) }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
    /// ```
    pub fn lock(&self, key: impl AsRef<str>) -> LockRequest {
        LockRequest::new(self.clone(), key.as_ref().to_owned())
    }

    /// Asks for the lock on `key` with one attempt only: [`LockError::Busy`] when it is held.
    ///
    /// ```
    /// # async fn demo() {
    /// use lock_core::LockError;
    /// let locker = lock_core::Locker::memory();
    /// let _held = locker.try_lock("order:42").await.unwrap();
    /// assert!(matches!(locker.try_lock("order:42").await, Err(LockError::Busy { .. })));
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub fn try_lock(&self, key: impl AsRef<str>) -> LockRequest {
        self.lock(key).no_wait()
    }

    /// The key prefix.
    ///
    /// ```
    /// assert_eq!(lock_core::Locker::memory().prefix(), "lock:");
    /// ```
    pub fn prefix(&self) -> &str {
        &self.inner.config.prefix
    }

    /// The default lease.
    ///
    /// ```
    /// assert_eq!(lock_core::Locker::memory().lease(), lock_core::DEFAULT_LEASE);
    /// ```
    pub fn lease(&self) -> Duration {
        self.inner.config.lease
    }

    /// The default wait.
    ///
    /// ```
    /// assert_eq!(lock_core::Locker::memory().wait(), lock_core::DEFAULT_WAIT);
    /// ```
    pub fn wait(&self) -> Duration {
        self.inner.config.wait
    }

    /// The backend this locker uses.
    ///
    /// ```
    /// let backend = lock_core::Locker::memory().backend();
    /// assert!(backend.in_process());
    /// ```
    pub fn backend(&self) -> Arc<dyn Backend> {
        self.inner.backend.clone()
    }

    /// Counters: locks being renewed, renewal calls sent, local waiters.
    ///
    /// ```
    /// assert_eq!(lock_core::Locker::memory().stats().waiters, 0);
    /// ```
    pub fn stats(&self) -> LockerStats {
        LockerStats {
            renewed_locks: self.inner.watchdog.len(),
            renewal_calls: self.inner.watchdog.calls.load(Ordering::Relaxed),
            waiting_keys: self.inner.queues.waiting_keys(),
            notified_keys: self
                .inner
                .queues
                .notified_keys(self.inner.backend.notifications_healthy()),
            waiters: self.inner.queues.waiters(),
            backend_calls: self.inner.calls.load(Ordering::Relaxed),
            handovers: self.inner.handovers.load(Ordering::Relaxed),
            local_handoffs: self.inner.local_handoffs.load(Ordering::Relaxed),
            batched_requests: self.inner.backend.batched_requests(),
            eviction_risk: self.inner.backend.eviction_risk(),
        }
    }
}

/// Options for a [`Locker`]; from [`Locker::builder`].
///
/// `build` never fails: a value out of range is reported by every lock attempt as
/// [`LockError::InvalidConfig`]. Use [`try_build`](LockerBuilder::try_build) to find out at
/// start-up.
///
/// ```
/// use std::time::Duration;
/// use lock_core::{Locker, MemoryBackend};
///
/// let err = Locker::builder(MemoryBackend::new()).lease(Duration::ZERO).try_build().unwrap_err();
/// assert!(matches!(err, lock_core::LockError::InvalidConfig { .. }));
/// ```
#[derive(Debug)]
#[must_use]
pub struct LockerBuilder {
    backend: Arc<dyn Backend>,
    prefix: String,
    lease: Duration,
    wait: Duration,
    watchdog: bool,
    local: LocalHandoff,
    holder: Option<String>,
}

impl LockerBuilder {
    /// The namespace put before every key (default `"lock:"`; no braces: the crate chooses
    /// the cluster hash slot itself).
    ///
    /// ```
    /// let l = lock_core::Locker::builder(lock_core::MemoryBackend::new()).prefix("shop:").build();
    /// assert_eq!(l.prefix(), "shop:");
    /// ```
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The default lease (how long a lock outlives a holder that stops renewing it), from
    /// [`MIN_LEASE`] to [`MAX_LEASE`]. Default 30 s.
    ///
    /// ```
    /// use std::time::Duration;
    /// let l = lock_core::Locker::builder(lock_core::MemoryBackend::new()).lease(Duration::from_secs(5)).build();
    /// assert_eq!(l.lease(), Duration::from_secs(5));
    /// ```
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The default wait of `lock` (at most [`MAX_WAIT`]; zero means one attempt). Default 10 s.
    ///
    /// ```
    /// use std::time::Duration;
    /// let l = lock_core::Locker::builder(lock_core::MemoryBackend::new()).wait(Duration::from_secs(1)).build();
    /// assert_eq!(l.wait(), Duration::from_secs(1));
    /// ```
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Whether held locks are renewed by the watchdog by default (default `true`).
    ///
    /// ```
    /// let l = lock_core::Locker::builder(lock_core::MemoryBackend::new()).watchdog(false).build();
    /// # drop(l);
    /// ```
    pub fn watchdog(mut self, on: bool) -> Self {
        self.watchdog = on;
        self
    }

    /// Whether a lock released while another task of this locker waits for the same key is
    /// passed to that task directly, without a round trip to the backend (default `true`).
    ///
    /// This is lock cohorting (Dice, Marathe and Shavit, PPoPP 2012): on a hot key, the locker
    /// that holds the lock in the backend lets its own waiters take their turns in memory, at
    /// memory speed, and gives the lock back to the backend, where waiters of other processes
    /// queue, as soon as one of them asks for it, after [`local_turns`](Self::local_turns)
    /// local turns, or after [`local_hold`](Self::local_hold), whichever comes first. The
    /// lock passed on keeps its lease in the backend (the watchdog renews it as before) and
    /// its loss detection.
    ///
    /// A turn passed without asking the backend rests on the backend's last answer for the
    /// lock, at most `local_hold` old: if the server loses the key in between (`FLUSHALL`, an
    /// operator's `DEL`, eviction) and another process takes it, the task the lock is passed to
    /// holds it beside that process until its renewal, due within a tenth of the lease,
    /// tells it (`lost()` resolves, `run` is cancelled), and the release that passed it on says
    /// `Ok`. Fencing, or `local_handoff(false)`, is the answer to data loss (FAULTS.md).
    ///
    /// With [`local_grace`](Self::local_grace) (opt-in), a hot lock released while no task of
    /// this locker waits may stay *parked* in the locker, for the next task that asks for it.
    ///
    /// Requests that take no part: `.fenced()` ones (each holder gets a new fencing token
    /// from the backend), `.fair()` ones (strict FIFO across processes), and those without the
    /// watchdog (the lease they would inherit is not theirs to keep).
    ///
    /// ```
    /// // Every turn through the backend, as between processes.
    /// let l = lock_core::Locker::builder(lock_core::MemoryBackend::new()).local_handoff(false).build();
    /// # drop(l);
    /// ```
    pub fn local_handoff(mut self, on: bool) -> Self {
        self.local.on = on;
        self
    }

    /// How many times in a row a lock may be passed between tasks of this locker before it
    /// goes back to the backend, where waiters of other processes get their turn (default
    /// 64; from 1 to 100 000). See [`local_handoff`](Self::local_handoff).
    ///
    /// ```
    /// let l = lock_core::Locker::builder(lock_core::MemoryBackend::new()).local_turns(8).build();
    /// # drop(l);
    /// ```
    pub fn local_turns(mut self, turns: u32) -> Self {
        self.local.turns = turns;
        self
    }

    /// How long this locker may keep a lock by passing it between its own tasks before it
    /// goes back to the backend (default 50 ms, counted from when the lock was taken in the
    /// backend; at most [`MAX_LEASE`]). See [`local_handoff`](Self::local_handoff).
    ///
    /// ```
    /// use std::time::Duration;
    /// let l = lock_core::Locker::builder(lock_core::MemoryBackend::new())
    ///     .local_hold(Duration::from_millis(10))
    ///     .build();
    /// # drop(l);
    /// ```
    pub fn local_hold(mut self, hold: Duration) -> Self {
        self.local.hold = hold;
        self
    }

    /// How long a hot lock released while no task of this locker waits for it stays *parked*
    /// in the locker, for the next task of this locker that asks for the key (default zero:
    /// nothing is parked; 1 ms is the length measured below; at most [`MAX_LOCAL_GRACE`]).
    /// See [`local_handoff`](Self::local_handoff).
    ///
    /// Real handlers await something between one lock and the next: the local queue drains,
    /// and without a grace the last holder gives the lock back to the backend, where this
    /// locker's tasks then take it again one round trip at a time. A lock is parked only when
    /// it is hot here (passed between this locker's tasks since the backend last vouched for
    /// it), while no other process is known to wait (the key's release subscription is
    /// confirmed and no fair waiter announced itself), and once the backend vouched for it (see
    /// below): a task that takes a parked lock takes a local turn, and the grace ends by
    /// [`local_hold`](Self::local_hold) at the latest, so a waiter of another process is
    /// served within `local_hold`, as without a grace. The parked lock stays held in the
    /// backend, renewed by the watchdog; one lost meanwhile is given to nobody. When the grace
    /// ends unclaimed, when a request that may not take it arrives (`fenced`, `fair`, without
    /// the watchdog), or when its runtime shuts down, the lock is released in the backend. A
    /// `try_lock` may take a parked lock.
    ///
    /// Only a release on a multi-thread tokio runtime parks: the task that gives the lock back
    /// at the grace's end must run whatever the caller does next. A release on a current-thread
    /// runtime (which runs its tasks only while a `block_on` drives it: a sync facade's
    /// `block_on` per request would leave the lock parked until its lease ends), or polled
    /// outside any runtime, goes to the backend as without a grace.
    ///
    /// Measured on one Redis (bench/NOTES.md, 2026-12-02): 11 tasks looping `lock`, `release`,
    /// `yield_now().await` made 174-285k handoffs/s with a grace (any from 100 µs to 5 ms)
    /// against 30k without, and 0.0 Redis requests per handoff against 1.1. 1 ms (about one
    /// round trip on a LAN) also covers the short awaits of real handlers, while a key this
    /// locker stopped using stays busy for another process at most 1 ms longer. The grace is
    /// opt-in in this release: it becomes the default once it has had its own review.
    ///
    /// Since its review, a release parks its lock only on the backend's word, asked as it
    /// releases (one round trip, as a release without the grace): the lock is still ours and no
    /// other process queues for it (one that does is given the lock). A release of a lock lost
    /// behind its back thus says [`LockError::LeaseLost`] and parks nothing, and a task that
    /// takes a parked lock takes one the backend vouched for at most the grace ago. The
    /// request of the next task is what the grace saves: in the test of the loop above, 175-207
    /// backend calls for 1,100 acquisitions against 1,240-2,210 without a grace (29 before the
    /// review, when a park took the backend's last answer, up to `local_hold` old, on trust).
    ///
    /// ```
    /// use std::time::Duration;
    /// let l = lock_core::Locker::builder(lock_core::MemoryBackend::new())
    ///     .local_grace(Duration::from_micros(300))
    ///     .build();
    /// # drop(l);
    /// let err = lock_core::Locker::builder(lock_core::MemoryBackend::new())
    ///     .local_grace(Duration::from_secs(5))
    ///     .try_build()
    ///     .unwrap_err();
    /// assert!(matches!(err, lock_core::LockError::InvalidConfig { .. }));
    /// ```
    pub fn local_grace(mut self, grace: Duration) -> Self {
        self.local.grace = grace;
        self
    }

    /// Who this locker's locks say holds them, for the people on call
    /// ([`Locker::inspect`], [`LockState::holder`](crate::LockState::holder)): a service
    /// name, an instance, a process. 1 to [`MAX_HOLDER_LEN`](crate::MAX_HOLDER_LEN) bytes,
    /// no control characters. Default `host/pid N/locker M` (the host name, the process id,
    /// and this locker's number in the process). Never a secret: anyone who can read the
    /// locks can read it.
    ///
    /// ```
    /// let l = lock_core::Locker::builder(lock_core::MemoryBackend::new())
    ///     .holder("checkout-7f9c/pid 4211")
    ///     .build();
    /// assert_eq!(l.holder(), "checkout-7f9c/pid 4211");
    /// ```
    pub fn holder(mut self, holder: impl Into<String>) -> Self {
        self.holder = Some(holder.into());
        self
    }

    /// Builds the locker; an out-of-range value is reported by each lock attempt.
    ///
    /// ```
    /// let l = lock_core::Locker::builder(lock_core::MemoryBackend::new()).build();
    /// # drop(l);
    /// ```
    pub fn build(self) -> Locker {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let holder = self
            .holder
            .unwrap_or_else(|| crate::inspect::default_holder(id));
        let error = validate_prefix(&self.prefix)
            .and_then(|()| validate_lease(self.lease))
            .and_then(|()| validate_wait(self.wait))
            .and_then(|()| self.local.validate())
            .and_then(|()| crate::inspect::validate_holder(&holder))
            .err();
        Locker {
            inner: Arc::new(LockerInner::new(
                id,
                self.backend,
                Config {
                    prefix: self.prefix,
                    lease: self.lease,
                    wait: self.wait,
                    watchdog: self.watchdog,
                    local: self.local,
                    holder,
                    error,
                },
            )),
        }
    }

    /// Builds the locker, or says which value is out of range.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`].
    ///
    /// ```
    /// let l = lock_core::Locker::builder(lock_core::MemoryBackend::new()).prefix("a{b").try_build();
    /// assert!(l.is_err());
    /// ```
    pub fn try_build(self) -> Result<Locker, LockError> {
        let locker = self.build();
        match &locker.inner.config.error {
            Some(e) => Err(e.clone()),
            None => Ok(locker),
        }
    }
}

pub(crate) fn validate_lease(lease: Duration) -> Result<(), LockError> {
    if lease < MIN_LEASE || lease > MAX_LEASE {
        return Err(LockError::config(format!(
            "lease {lease:?} is out of range: use {MIN_LEASE:?} to {MAX_LEASE:?} (the watchdog renews it every lease/3 while the lock is held)"
        )));
    }
    Ok(())
}

pub(crate) fn validate_wait(wait: Duration) -> Result<(), LockError> {
    if wait > MAX_WAIT {
        return Err(LockError::config(format!(
            "wait {wait:?} is above the {MAX_WAIT:?} allowed; waits are bounded so a stuck holder cannot stall callers forever"
        )));
    }
    Ok(())
}
