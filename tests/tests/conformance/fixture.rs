//! What every property is checked on: the backend under test ([`Fixture`]: the memory backend
//! or a real redis-server), read directly where a test needs to (the harness's own client,
//! never lock-core), the set-ups checks of several modules start from, and the small
//! assertions the properties share.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lock_core::backend::{Backend, BoxFuture, IntoBackend};
use lock_core::conformance::{Probe, Suite};
use lock_core::{
    LockGuard, Locker, LockerBuilder, MemoryBackend, RedisBackend, RedisClusterBackend,
    RedisSentinelBackend, RedlockBackend,
};
use lock_testkit::RedisServer;
use lock_testkit::cluster::RedisCluster;
use lock_testkit::sentinel::RedisSentinelSet;
use redis::AsyncCommands;
use sha2::{Digest, Sha256};

/// One check of the suite, by name, for the runs on a shared deployment (`on_cluster` and `on_sentinel` in main.rs).
pub(crate) type Check = (
    &'static str,
    fn(Fixture) -> std::pin::Pin<Box<dyn Future<Output = ()>>>,
);

/// A hang guard for things expected to happen "soon": generous, never a speed claim.
pub(crate) const SOON: Duration = Duration::from_secs(10);

/// The backend under test, and whether the lockers built on it pass a lock between their own
/// tasks (local hand-off, on by default; every check also runs with it off).
#[derive(Clone)]
pub(crate) struct Fixture {
    store: Arc<Store>,
    local_handoff: bool,
    /// The key prefix of every locker built on it: `lock:` (the default) but on the shared
    /// cluster, where each check has its own.
    prefix: String,
}

/// Where the locks live.
pub(crate) enum Store {
    Memory(MemoryBackend),
    /// One server: a redis-server of the check's own, or the primary of a Sentinel set
    /// (reached through the sentinels).
    Redis(Server),
    /// A Redis Cluster shared by every cluster check of the binary (one at a time, each with
    /// its own key prefix).
    Cluster(Arc<RedisCluster>),
}

/// The one server of [`Store::Redis`]; derefs to it, so a check reads it alike either way.
pub(crate) enum Server {
    Own(RedisServer),
    /// The primary of a Sentinel set shared by every Sentinel check of the binary (one at a
    /// time, the data flushed before each).
    SentinelPrimary(Arc<RedisSentinelSet>),
    /// Redlock over the servers shared by every Redlock check of the binary (one at a time,
    /// the data flushed before each); it derefs to the first, which holds every lock once the
    /// acquires' last `SET`s landed (all servers are up); `Fixture::stored` reads them all.
    Redlock(Arc<Vec<RedisServer>>),
}

impl std::ops::Deref for Server {
    type Target = RedisServer;

    fn deref(&self) -> &RedisServer {
        match self {
            Server::Own(server) => server,
            Server::SentinelPrimary(set) => set.primary(),
            Server::Redlock(servers) => &servers[0],
        }
    }
}

impl Fixture {
    pub(crate) fn memory() -> Self {
        Fixture {
            store: Arc::new(Store::Memory(MemoryBackend::new())),
            local_handoff: true,
            prefix: "lock:".to_owned(),
        }
    }

    pub(crate) fn redis() -> Self {
        Fixture {
            store: Arc::new(Store::Redis(Server::Own(RedisServer::start()))),
            local_handoff: true,
            prefix: "lock:".to_owned(),
        }
    }

    /// A check on the shared cluster, its keys under `prefix`.
    pub(crate) fn cluster(cluster: Arc<RedisCluster>, prefix: String) -> Self {
        Fixture {
            store: Arc::new(Store::Cluster(cluster)),
            local_handoff: true,
            prefix,
        }
    }

    /// A check on the primary of the shared Sentinel set (its data flushed by the caller).
    pub(crate) fn sentinel(set: Arc<RedisSentinelSet>) -> Self {
        Fixture {
            store: Arc::new(Store::Redis(Server::SentinelPrimary(set))),
            local_handoff: true,
            prefix: "lock:".to_owned(),
        }
    }

    /// A check on Redlock over the shared `servers` (their data flushed by the caller).
    pub(crate) fn redlock(servers: Arc<Vec<RedisServer>>) -> Self {
        Fixture {
            store: Arc::new(Store::Redis(Server::Redlock(servers))),
            local_handoff: true,
            prefix: "lock:".to_owned(),
        }
    }

    /// The same backend, with local hand-off turned off in every locker built on it.
    pub(crate) fn without_local_handoff(self) -> Self {
        Fixture {
            local_handoff: false,
            ..self
        }
    }

    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    pub(crate) fn name(&self) -> &'static str {
        match (&*self.store, self.local_handoff) {
            (Store::Memory(_), true) => "memory",
            (Store::Memory(_), false) => "memory (local hand-off off)",
            (Store::Redis(Server::Own(_)), true) => "redis",
            (Store::Redis(Server::Own(_)), false) => "redis (local hand-off off)",
            (Store::Redis(Server::SentinelPrimary(_)), true) => "sentinel",
            (Store::Redis(Server::SentinelPrimary(_)), false) => "sentinel (local hand-off off)",
            (Store::Redis(Server::Redlock(_)), true) => "redlock",
            (Store::Redis(Server::Redlock(_)), false) => "redlock (local hand-off off)",
            (Store::Cluster(_), true) => "cluster",
            (Store::Cluster(_), false) => "cluster (local hand-off off)",
        }
    }

    /// The redis-server under test, for a `redis_only:` check.
    ///
    /// # Panics
    /// On the memory backend: the check was listed for both backends by mistake.
    pub(crate) fn server(&self) -> &RedisServer {
        match &*self.store {
            Store::Redis(server) => server,
            Store::Memory(_) | Store::Cluster(_) => {
                panic!("a Redis-only check ran on {}", self.name())
            }
        }
    }

    /// A new handle on the same store: lockers built on it contend like separate processes.
    pub(crate) async fn backend(&self) -> Arc<dyn Backend> {
        connect(&self.store).await
    }

    /// The conformance kit on this store: new handles from [`connect`], this fixture as its
    /// probe, what the backend offers.
    pub(crate) fn suite(&self) -> Suite {
        let store = self.store.clone();
        let suite = Suite::new(move || {
            let store = store.clone();
            async move { Ok(connect(&store).await) }
        })
        .prefix(self.prefix.as_str())
        .local_handoff(self.local_handoff)
        .probe(self.clone());
        match &*self.store {
            Store::Memory(_) => suite.consecutive_fences(true),
            // Several independent servers: simultaneous racers can split the vote.
            Store::Redis(Server::Redlock(_)) => suite.split_votes(true),
            Store::Redis(_) | Store::Cluster(_) => suite.handover(true),
        }
    }

    pub(crate) async fn builder(&self) -> LockerBuilder {
        Locker::builder(self.backend().await)
            .local_handoff(self.local_handoff)
            .prefix(self.prefix.as_str())
    }

    /// The cluster's value at `name` (a GET with the harness's own client); `None` but on the
    /// cluster.
    pub(crate) async fn cluster_get(&self, name: &str) -> Option<String> {
        let Store::Cluster(c) = &*self.store else {
            return None;
        };
        c.client().await.get(name).await.expect("GET")
    }

    /// The names of every key of this fixture's prefix on the cluster's primaries, sorted.
    pub(crate) async fn cluster_keys(&self) -> Vec<String> {
        let Store::Cluster(c) = &*self.store else {
            return Vec::new();
        };
        let mut keys = Vec::new();
        for primary in c.primaries().await {
            keys.extend(
                c.node(primary)
                    .server()
                    .keys(&format!("{}*", self.prefix))
                    .await,
            );
        }
        keys.sort();
        keys
    }

    pub(crate) async fn locker(&self) -> Locker {
        self.builder().await.build()
    }

    /// What the backend stores for `key` (the fixture's prefix), read without lock-core: the token and
    /// the PTTL. `None` for the memory backend, whose tokens cannot be read from outside.
    pub(crate) async fn stored(&self, key: &str) -> Option<Stored> {
        if let Store::Cluster(c) = &*self.store {
            let name = lock_name(&self.prefix, key);
            let mut conn = c.client().await;
            let token: Option<String> = conn.get(&name).await.expect("GET");
            let pttl: i64 = conn.pttl(&name).await.expect("PTTL");
            return Some(Stored { token, pttl });
        }
        let Store::Redis(server) = &*self.store else {
            return None;
        };
        let name = lock_name("lock:", key);
        if let Server::Redlock(servers) = server {
            // The lock is what a majority holds: an acquire returns once a majority said yes,
            // and a minority may miss the key for a moment (a straggling SET lands later).
            // Each server's value is the token and a stamp of when that server's write was
            // made (`|<since ms>|<holder>|`): the servers' stamps may differ by a few ms, so a
            // majority is counted by token, the value's head.
            let head = |v: &str| v.split(['|', '+']).next().unwrap_or_default().to_owned();
            let mut seen = Vec::with_capacity(servers.len());
            for s in servers.iter() {
                let value: Option<String> = s.get(&name).await;
                seen.push((value.as_deref().map(head), s.pttl(&name).await));
            }
            let on = |t: &String| seen.iter().filter(|(u, _)| u.as_ref() == Some(t)).count();
            let token = seen
                .iter()
                .filter_map(|(t, _)| t.clone())
                .find(|t| on(t) > servers.len() / 2);
            let pttl = seen
                .iter()
                .filter(|(t, _)| t.is_some() && *t == token)
                .map(|(_, p)| *p)
                .min()
                .unwrap_or(-2);
            return Some(Stored { token, pttl });
        }
        let token = server.get(&name).await;
        let pttl = server.pttl(&name).await;
        Some(Stored { token, pttl })
    }

    /// How many waiters queue for `key` (the fixture's prefix) in the backend.
    pub(crate) async fn queued(&self, key: &str) -> usize {
        match &*self.store {
            Store::Memory(m) => m.queued(key),
            Store::Redis(s) => {
                let len: i64 = s
                    .query(
                        redis::cmd("HLEN")
                            .arg(format!("{}:waiters", lock_name("lock:", key)))
                            .clone(),
                    )
                    .await;
                usize::try_from(len).unwrap_or(0)
            }
            Store::Cluster(c) => {
                let len: i64 = c
                    .client()
                    .await
                    .hlen(format!("{}:waiters", lock_name(&self.prefix, key)))
                    .await
                    .expect("HLEN");
                usize::try_from(len).unwrap_or(0)
            }
        }
    }

    /// Deletes the lock whoever holds it, as an operator's DEL would.
    pub(crate) async fn force_delete(&self, key: &str) {
        let deleted = match &*self.store {
            Store::Memory(m) => m.force_delete(key),
            Store::Redis(Server::Redlock(servers)) => {
                let mut deleted = false;
                for s in servers.iter() {
                    deleted |= s.del(&lock_name("lock:", key)).await == 1;
                }
                deleted
            }
            Store::Redis(s) => s.del(&lock_name("lock:", key)).await == 1,
            Store::Cluster(c) => {
                let n: i64 = c
                    .client()
                    .await
                    .del(lock_name(&self.prefix, key))
                    .await
                    .expect("DEL");
                n == 1
            }
        };
        assert!(deleted, "{}: no lock to delete for {key:?}", self.name());
    }

    /// Whether the backend holds nothing but fence counters (which outlive their locks).
    pub(crate) async fn is_empty(&self) -> bool {
        match &*self.store {
            Store::Memory(m) => m.is_empty(),
            Store::Redis(Server::Redlock(servers)) => {
                for s in servers.iter() {
                    if s.dbsize().await != 0 {
                        return false;
                    }
                }
                true
            }
            Store::Redis(s) => s.keys("*").await.iter().all(|k| k.ends_with(":fence")),
            Store::Cluster(_) => self
                .cluster_keys()
                .await
                .iter()
                .all(|k| k.ends_with(":fence")),
        }
    }
}

/// A new handle on `store`: lockers built on it contend like separate processes.
async fn connect(store: &Store) -> Arc<dyn Backend> {
    match store {
        Store::Memory(m) => m.clone().into_backend(),
        Store::Redis(Server::Own(s)) => RedisBackend::connect(&s.url())
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", s.url()))
            .into_backend(),
        Store::Redis(Server::SentinelPrimary(set)) => {
            let urls = set.sentinel_urls();
            let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
            RedisSentinelBackend::connect(&urls, set.master_name())
                .await
                .unwrap_or_else(|e| panic!("connect through the sentinels: {e}"))
                .into_backend()
        }
        Store::Redis(Server::Redlock(servers)) => {
            let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
            let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
            RedlockBackend::connect(&urls)
                .await
                .unwrap_or_else(|e| panic!("connect to the Redlock servers: {e}"))
                .into_backend()
        }
        Store::Cluster(c) => {
            let urls = c.urls();
            let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
            RedisClusterBackend::connect(&urls)
                .await
                .unwrap_or_else(|e| panic!("connect to the cluster: {e}"))
                .into_backend()
        }
    }
}

/// A lock whose lease ran out unrenewed, and the lock another locker took in its place.
pub(crate) struct Expired {
    /// The first holder's guard (a lease of [`EXPIRING_LEASE`], no watchdog): lost.
    _stale: LockGuard,
    /// The second locker's guard (a 30 s lease), got by waiting on the key.
    _fresh: LockGuard,
    /// The first holder's token as stored (Redis only).
    pub(crate) stale_token: Option<String>,
    _lockers: [Locker; 2],
}

/// The lease of [`Expired::stale`].
pub(crate) const EXPIRING_LEASE: Duration = Duration::from_millis(200);

impl Fixture {
    /// Locks `key` with a short lease and no watchdog, and has a second locker wait for it
    /// (up to [`SOON`]) with a 30 s lease: the first lease runs out and the key is retaken.
    pub(crate) async fn expire_and_retake(&self, key: &str) -> Expired {
        let (a, b) = (self.locker().await, self.locker().await);
        let stale = a
            .lock(key)
            .lease(EXPIRING_LEASE)
            .watchdog(false)
            .await
            .expect("acquire");
        let stale_token = self.stored(key).await.and_then(|s| s.token);
        let fresh = b
            .lock(key)
            .lease(Duration::from_secs(30))
            .wait(SOON)
            .await
            .expect("an expired lease frees the key");
        Expired {
            _stale: stale,
            _fresh: fresh,
            stale_token,
            _lockers: [a, b],
        }
    }
}

#[derive(Debug)]
pub(crate) struct Stored {
    pub(crate) token: Option<String>,
    pub(crate) pttl: i64,
}

/// The Redis name of a lock, computed here from the documented layout (not by lock-core):
/// `{prefix}{<key>}` for a key without braces, else `{prefix}{#<16 hex of sha256>}<key>`.
pub(crate) fn lock_name(prefix: &str, key: &str) -> String {
    if key.contains(['{', '}']) {
        let digest = Sha256::digest(key.as_bytes());
        let tag: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        format!("{prefix}{{#{tag}}}{key}")
    } else {
        format!("{prefix}{{{key}}}")
    }
}

pub(crate) async fn soon<F: Future>(what: &str, fut: F) -> F::Output {
    tokio::time::timeout(SOON, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: not done within {SOON:?}"))
}

/// The kit's window onto the store: this fixture's own reads (the harness's client, never
/// lock-core). The prefix is the fixture's, the only one the kit's probe reads use.
impl Probe for Fixture {
    fn force_delete<'a>(&'a self, _prefix: &'a str, key: &'a str) -> BoxFuture<'a, bool> {
        Box::pin(async move {
            Fixture::force_delete(self, key).await;
            true
        })
    }

    fn queued<'a>(&'a self, _prefix: &'a str, key: &'a str) -> BoxFuture<'a, Option<usize>> {
        Box::pin(async move { Some(Fixture::queued(self, key).await) })
    }

    fn stored<'a>(
        &'a self,
        _prefix: &'a str,
        key: &'a str,
    ) -> BoxFuture<'a, Option<lock_core::conformance::Stored>> {
        Box::pin(async move {
            let s = Fixture::stored(self, key).await?;
            Some(lock_core::conformance::Stored {
                token: s.token,
                remaining: u64::try_from(s.pttl).ok().map(Duration::from_millis),
            })
        })
    }

    fn is_empty<'a>(&'a self, _prefix: &'a str) -> BoxFuture<'a, Option<bool>> {
        Box::pin(async move { Some(Fixture::is_empty(self).await) })
    }

    fn fence_counter<'a>(&'a self, _prefix: &'a str, key: &'a str) -> BoxFuture<'a, Option<u64>> {
        Box::pin(async move {
            let name = format!("{}:fence", lock_name(&self.prefix, key));
            let value = match &*self.store {
                Store::Memory(_) | Store::Redis(Server::Redlock(_)) => None,
                Store::Redis(server) => server.get(&name).await,
                Store::Cluster(_) => self.cluster_get(&name).await,
            };
            value.and_then(|v| v.parse().ok())
        })
    }

    fn record_ttl<'a>(
        &'a self,
        _prefix: &'a str,
        key: &'a str,
    ) -> BoxFuture<'a, Option<Option<Duration>>> {
        Box::pin(async move {
            let name = format!("{}:result", lock_name(&self.prefix, key));
            let pttl: i64 = match &*self.store {
                Store::Memory(_) => return None,
                Store::Redis(server) => server.pttl(&name).await,
                Store::Cluster(c) => c.client().await.pttl(&name).await.expect("PTTL"),
            };
            Some(match pttl {
                -2 => None,
                -1 => Some(Duration::MAX),
                ms => Some(Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
            })
        })
    }
}
