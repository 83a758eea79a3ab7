//! Connecting a Redis backend: the builder, `connect` (which puts together what the other
//! modules learn of the server), and the connection settings.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, ProtocolVersion};

use super::batch::Batches;
use super::conn::Conn;
use super::eviction::{maxmemory_policy, warn_if_evicting};
use super::permissions::Permissions;
use super::server::{ServerInfo, server_info};
use super::subscriber::Subscriber;
use super::watcher::Watcher;
use super::{Inner, RedisBackend};
use crate::LockError;

/// Default bound on establishing a connection.
pub(crate) const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Default bound on waiting for one answer from Redis.
pub(crate) const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

/// Options for connecting a [`RedisBackend`].
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use std::time::Duration;
/// let backend = lock_core::RedisBackend::builder("redis+unix:///run/redis.sock")
///     .connect_timeout(Duration::from_secs(1))
///     .connect()
///     .await?;
/// # drop(backend); Ok(()) }
/// ```
#[must_use]
pub struct RedisBackendBuilder {
    url: String,
    connect_timeout: Duration,
    response_timeout: Duration,
    /// Whether releases try the one-key release first (see release.rs); a Redlock's servers
    /// do not.
    fast_release: bool,
}

impl std::fmt::Debug for RedisBackendBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackendBuilder")
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .finish_non_exhaustive()
    }
}

impl RedisBackendBuilder {
    /// Bound on establishing (and re-establishing) a connection. Default 2 s.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let b = lock_core::RedisBackend::builder("redis://127.0.0.1/").connect_timeout(Duration::from_secs(1));
    /// # drop(b);
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Bound on waiting for one answer. Default 2 s. A renewal that gets no answer in time is
    /// retried while the lease is still locally valid.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let b = lock_core::RedisBackend::builder("redis://127.0.0.1/").response_timeout(Duration::from_millis(300));
    /// # drop(b);
    /// ```
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Releases always send the full release (for a Redlock's servers: see release.rs).
    #[cfg(feature = "redlock")]
    pub(crate) fn full_releases(mut self) -> Self {
        self.fast_release = false;
        self
    }

    /// The redis-rs settings the backend's command connection uses (these timeouts, one retry,
    /// reconnect backoff), for a tool that must talk to Redis exactly as the lock does, such as
    /// a benchmark's baseline client.
    ///
    /// ```
    /// let config = lock_core::RedisBackend::builder("redis://127.0.0.1/").connection_manager_config();
    /// # drop(config);
    /// ```
    pub fn connection_manager_config(&self) -> ConnectionManagerConfig {
        manager_config(self.connect_timeout, self.response_timeout)
    }

    /// Connects, checks the server answers, and learns whether it has sharded pub/sub.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for a malformed URL or zero timeouts,
    /// [`LockError::Backend`] when the server cannot be reached.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let backend = lock_core::RedisBackend::builder("redis://127.0.0.1/").connect().await?;
    /// # drop(backend); Ok(()) }
    /// ```
    pub async fn connect(self) -> Result<RedisBackend, LockError> {
        crate::backend::validate_timeouts(
            "Redis connect and response timeouts",
            &[self.connect_timeout, self.response_timeout],
        )?;
        let client = Client::open(self.url.as_str()).map_err(|e| {
            LockError::config(format!(
                "cannot parse the Redis URL ({e}); expected redis://[user:password@]host[:port][/db], rediss://... or redis+unix:///path"
            ))
        })?;
        let config = manager_config(self.connect_timeout, self.response_timeout);
        let mut conn = Conn::Single(
            ConnectionManager::new_with_config(client.clone(), config)
                .await
                .map_err(|e| LockError::backend("connect", None, e))?,
        );
        let probed = probe(&mut conn).await?;
        let server = &probed.server;
        let subscriber = Subscriber::new(
            &client,
            server.major >= 7,
            server.major >= 6,
            self.connect_timeout,
            self.response_timeout,
        )?;
        let watcher = Watcher::new(&client, server.major >= 6, self.connect_timeout)?;
        let timeouts = (self.connect_timeout, self.response_timeout);
        let fast_release = self.fast_release;
        Ok(assemble(
            conn,
            probed,
            subscriber,
            watcher,
            timeouts,
            |inner| inner.fast_release = fast_release,
        ))
    }
}

/// What the backend learns from its server at connect.
struct Probed {
    /// Version and mode.
    server: ServerInfo,
    /// The eviction policy (a warning is logged when it may evict lock keys).
    maxmemory_policy: Option<String>,
}

async fn probe(conn: &mut Conn) -> Result<Probed, LockError> {
    let server = server_info(conn).await?;
    let maxmemory_policy = maxmemory_policy(conn).await;
    warn_if_evicting(maxmemory_policy.as_deref());
    Ok(Probed {
        server,
        maxmemory_policy,
    })
}

/// The backend over `conn`, for one server; `own` then sets what a cluster or Sentinel backend
/// has of its own (the slot map, the primary it follows). `timeouts` are the connection's
/// connect and response timeouts, from which a queued request's bound is set (batch.rs).
fn assemble(
    conn: Conn,
    Probed {
        server,
        maxmemory_policy,
    }: Probed,
    subscriber: Subscriber,
    watcher: Watcher,
    (connect_timeout, response_timeout): (Duration, Duration),
    own: impl FnOnce(&mut Inner),
) -> RedisBackend {
    let mut inner = Inner {
        conn,
        sharded: server.major >= 7,
        cluster: server.cluster,
        set_nx_get: server.major >= 7,
        subscriber,
        maxmemory_policy,
        permissions: Permissions::default(),
        watcher,
        batches: Batches::new(connect_timeout, response_timeout),
        fast_release: true,
        contention: super::release::Contention::new(),
        #[cfg(feature = "cluster")]
        topology: None,
        #[cfg(feature = "sentinel")]
        master: None,
    };
    own(&mut inner);
    RedisBackend {
        inner: Arc::new(inner),
    }
}

/// Connects a cluster backend: the Redis backend over a cluster connection, its slot map read,
/// sharded pub/sub required (Redis 7+), no group commit (a batch's keys span slots).
#[cfg(feature = "cluster")]
pub(crate) async fn connect_cluster(
    settings: crate::backend::cluster::ClusterSettings,
) -> Result<RedisBackend, LockError> {
    use crate::backend::cluster::{ClusterConn, Topology};
    let client = settings.client(None::<tokio::sync::mpsc::UnboundedSender<redis::PushInfo>>)?;
    let conn = client.get_async_connection().await.map_err(|e| {
        if super::permissions::is_noperm(&e) {
            // The cluster client reads the slot map (`CLUSTER SLOTS`) at connect: a user
            // without it learns so here, before any lock, not as a bare backend error.
            LockError::config(format!(
                "the Redis user is refused a command the cluster client runs at connect ({e}); on a cluster, grant +cluster|slots beside the lock's rule on every node (docs/src/backends/cluster.md): {}",
                super::permissions::ACL_HINT
            ))
        } else {
            LockError::backend("connect", None, e)
        }
    })?;
    let mut conn = ClusterConn::new(conn);
    let topology = std::sync::Arc::new(Topology::new(Some(settings.clone())));
    topology.load(&mut conn).await;
    topology.connect_renewers().await;
    let mut conn = Conn::Cluster(conn.following(topology.clone()));
    // HELLO and CONFIG GET go to one node (redis-rs picks it): the cluster runs one version,
    // and the policy should be the same on every node (the docs say so).
    let probed = probe(&mut conn).await?;
    if probed.server.major < 7 {
        return Err(LockError::config(
            "the Redis Cluster backend needs Redis 7 or later (sharded pub/sub)",
        ));
    }
    let watcher = Watcher::cluster(settings.clone());
    watcher.ready(settings.connect_timeout * 2).await;
    // A cluster node never batches (a batch's keys would span slots): its lanes stay empty.
    let timeouts = (settings.connect_timeout, settings.response_timeout);
    let subscriber = Subscriber::cluster(settings);
    Ok(assemble(
        conn,
        probed,
        subscriber,
        watcher,
        timeouts,
        |inner| {
            // Whatever the node said of its mode: every request goes through the cluster
            // connection.
            inner.cluster = true;
            inner.topology = Some(topology);
        },
    ))
}

/// Connects a Sentinel backend: the Redis backend on the primary the sentinels name, its
/// command connection, subscriber and watcher following that primary across failovers.
#[cfg(feature = "sentinel")]
pub(crate) async fn connect_sentinel(
    settings: crate::backend::sentinel::SentinelSettings,
) -> Result<RedisBackend, LockError> {
    use crate::backend::sentinel::{Master, SentinelConn};
    let master = Master::connect(settings).await?;
    let mut conn = Conn::Sentinel(SentinelConn::new(master.clone()));
    let probed = probe(&mut conn).await?;
    let server = &probed.server;
    let sharded = server.major >= 7;
    let settings = master.settings();
    let subscriber = Subscriber::sentinel(
        master.clone(),
        sharded,
        server.major >= 6,
        settings.connect_timeout,
        settings.response_timeout,
    );
    let watcher = Watcher::sentinel(master.clone(), server.major >= 6, settings.connect_timeout);
    let timeouts = (settings.connect_timeout, settings.response_timeout);
    Ok(assemble(
        conn,
        probed,
        subscriber,
        watcher,
        timeouts,
        |inner| {
            inner.master = Some(master);
        },
    ))
}

pub(crate) fn manager_config(connect: Duration, response: Duration) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(connect))
        .set_response_timeout(Some(response))
        .set_number_of_retries(1)
        .set_min_delay(Duration::from_millis(10))
        .set_max_delay(Duration::from_millis(500))
}

impl RedisBackend {
    /// Connects with default options; see [`RedisBackend::builder`].
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let backend = lock_core::RedisBackend::connect("redis://127.0.0.1:6379/").await?;
    /// # drop(backend); Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::builder(url).connect().await
    }

    /// Options for connecting. Accepts `redis://`, `rediss://` (when redis-rs is built with TLS),
    /// `redis+unix://` and `unix://` URLs, with an ACL user and password in the URL.
    ///
    /// ```
    /// let builder = lock_core::RedisBackend::builder("redis://127.0.0.1:6379/");
    /// # drop(builder);
    /// ```
    pub fn builder(url: &str) -> RedisBackendBuilder {
        RedisBackendBuilder {
            url: url.to_owned(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            fast_release: true,
        }
    }
}

/// A client like `client` speaking RESP3 (pushes: messages and disconnections), or `None` when
/// the server is too old for it (`resp3` false).
pub(super) fn resp3_client(
    client: &Client,
    resp3: bool,
    operation: &'static str,
) -> Result<Option<Client>, LockError> {
    if !resp3 {
        return Ok(None);
    }
    with_resp3(client)
        .map(Some)
        .map_err(|e| LockError::backend(operation, None, e))
}

/// `client`'s server and settings, speaking RESP3.
pub(crate) fn with_resp3(client: &Client) -> redis::RedisResult<Client> {
    let info = client.get_connection_info().clone();
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    Client::open(info.set_redis_settings(settings))
}
