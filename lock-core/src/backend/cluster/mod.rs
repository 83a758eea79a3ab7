//! The Redis Cluster backend: the Redis backend's scripts and logic over redis-rs's cluster
//! client. Every key of one lock shares a hash slot (the hash tag of [`LockKey`]), so every
//! script call is routed to the one primary that owns its slot; redis-rs follows MOVED and ASK
//! during resharding and refreshes its slot map after a failover.
//!
//! [`LockKey`]: crate::key::LockKey

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{AsyncConnectionConfig, Client, ConnectionAddr, ProtocolVersion, Value};
use tokio::time::Instant;

use crate::LockError;
use crate::backend::redis::RedisBackend;
use crate::backend::redis::connect::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_RESPONSE_TIMEOUT};
use crate::backend::redis::tls::{TlsSettings, is_tls, parse_url};
use crate::sync::Mutex;

mod conn;

pub(crate) use conn::{ClusterConn, key_slot};

/// How many times redis-rs retries a cluster request (redirections, reconnects, CLUSTERDOWN)
/// before it answers with an error (its default, 16 with waits from 1.28 s, would hold a lock
/// request for tens of seconds when a primary is down).
const RETRIES: u32 = 3;
const MIN_RETRY_WAIT_MS: u64 = 10;
const MAX_RETRY_WAIT_MS: u64 = 200;

/// Locks in a Redis Cluster (Redis 7+: sharded pub/sub).
///
/// The same locks as [`RedisBackend`](crate::RedisBackend) (the same scripts, the same
/// semantics; the conformance suite runs on both), spread over the cluster's shards by key:
/// every key of one lock shares one hash slot, so each call goes to the one primary that owns
/// it. Commands go through one redis-rs cluster connection (slot routing, MOVED/ASK during
/// resharding, slot map refresh after a failover, reconnects); release notifications use
/// sharded pub/sub (`SSUBSCRIBE` on the node that owns each channel's slot) on a connection of
/// their own; one more idle cluster connection hears of a node's dropped connection, and every
/// held lock is checked then. The watchdog renews every lock a primary serves in one script
/// call per tick (Redis 7's `allow-cross-slot-keys` script flag lets one call touch keys of
/// several slots), the primaries concurrently, each on a plain connection to that primary
/// alone: a primary that stops answering loses its own locks (their holders are told when the
/// leases run out) and delays no other primary's renewals, whatever the lease. Each lock gets
/// its own verdict: when a primary no longer serves a lock's slot (resharded, or failed over:
/// it answers READONLY), the slot map is read again from the primaries that answer (at once,
/// never the one that failed) and the lock is renewed on the primary it names, or by itself
/// through the cluster connection (which follows MOVED and ASK) while its slot moves; the map
/// is also read again when a primary's renewal call fails, and the renewal connections of
/// addresses that are no longer primaries are closed then.
///
/// A limit of the cluster client (redis-rs): while one node does not answer (paused or
/// partitioned, not refused), requests on the same cluster connection to other nodes wait too,
/// up to the request bound (twice the response timeout). Acquires and releases share one
/// connection, so they may be slowed then (a `try_lock` on a stalled primary answers after
/// that bound, whatever the lease); renewals are not. redis-rs reads its slot map again after
/// MOVED or a dropped connection, never after a timeout: when a request times out and the slot
/// map (read again from a node that answers) changed since the command connection was made (a
/// stalled primary failed over), a new command connection replaces it.
///
/// What a failover means for a held lock: replication is asynchronous, so a lock written to a
/// primary that dies before its replica got it is gone after the failover; its holder's
/// watchdog finds it missing and reports the lease lost (fencing tokens are the mitigation).
///
/// Clones share the connections.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use std::time::Duration;
/// use lock_core::{Locker, RedisClusterBackend};
///
/// let backend = RedisClusterBackend::builder(&["redis://10.0.0.1:7000/", "redis://10.0.0.2:7000/"])
///     .response_timeout(Duration::from_millis(500))
///     .connect()
///     .await?;
/// let locker = Locker::builder(backend).prefix("shop:").build();
/// # drop(locker); Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisClusterBackend {
    pub(crate) backend: RedisBackend,
}

impl std::fmt::Debug for RedisClusterBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URLs may hold a password: never print them.
        f.debug_struct("RedisClusterBackend")
            .finish_non_exhaustive()
    }
}

/// A cluster is the Redis backend over a cluster connection: the same calls, routed by slot.
impl crate::backend::IntoBackend for RedisClusterBackend {
    fn into_backend(self) -> std::sync::Arc<dyn crate::backend::Backend> {
        std::sync::Arc::new(self.backend)
    }
}

impl RedisClusterBackend {
    /// Connects with default options; see [`RedisClusterBackend::builder`].
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let backend = lock_core::RedisClusterBackend::connect(&["redis://127.0.0.1:7000/"]).await?;
    /// # drop(backend); Ok(()) }
    /// ```
    pub async fn connect(urls: &[&str]) -> Result<Self, LockError> {
        Self::builder(urls).connect().await
    }

    /// Options for connecting. `urls` are some nodes of the cluster (one that answers is
    /// enough; the others are learnt from it), `redis://` or `rediss://` (TLS, with the
    /// feature `tls`; see [`RedisClusterBackendBuilder::tls`]), with an ACL user and password
    /// in the first URL (used for every node).
    ///
    /// ```
    /// let builder = lock_core::RedisClusterBackend::builder(&["redis://127.0.0.1:7000/"]);
    /// # drop(builder);
    /// ```
    pub fn builder(urls: &[&str]) -> RedisClusterBackendBuilder {
        RedisClusterBackendBuilder {
            settings: ClusterSettings {
                urls: urls.iter().map(|u| (*u).to_owned()).collect(),
                connect_timeout: DEFAULT_CONNECT_TIMEOUT,
                response_timeout: DEFAULT_RESPONSE_TIMEOUT,
                tls: TlsSettings::default(),
            },
        }
    }

    /// Checks that the Redis user may run everything the lock runs on the keys and channels of
    /// `prefix`, as [`RedisBackend::check_permissions`](crate::RedisBackend::check_permissions)
    /// does. On a cluster the check runs on the shard that owns the probe's hash slot: ACLs
    /// are set per node, so give every node the same rule.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] naming what is refused, [`LockError::Backend`] when the
    /// cluster cannot be reached.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let backend = lock_core::RedisClusterBackend::connect(&["redis://127.0.0.1:7000/"]).await?;
    /// backend.check_permissions("shop:").await?;
    /// # Ok(()) }
    /// ```
    pub async fn check_permissions(&self, prefix: &str) -> Result<(), LockError> {
        self.backend.check_permissions(prefix).await
    }

    /// The `maxmemory-policy` of one primary of the cluster, read when the backend connected
    /// (`None` when it could not be read); see
    /// [`RedisBackend::maxmemory_policy`](crate::RedisBackend::maxmemory_policy). Set the
    /// same policy (`noeviction`) on every node.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let backend = lock_core::RedisClusterBackend::connect(&["redis://127.0.0.1:7000/"]).await?;
    /// assert_eq!(backend.maxmemory_policy(), Some("noeviction"));
    /// # Ok(()) }
    /// ```
    pub fn maxmemory_policy(&self) -> Option<&str> {
        self.backend.maxmemory_policy()
    }
}

/// Options for connecting a [`RedisClusterBackend`].
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use std::time::Duration;
/// let backend = lock_core::RedisClusterBackend::builder(&["redis://127.0.0.1:7000/"])
///     .connect_timeout(Duration::from_secs(1))
///     .connect()
///     .await?;
/// # drop(backend); Ok(()) }
/// ```
#[must_use]
pub struct RedisClusterBackendBuilder {
    settings: ClusterSettings,
}

impl std::fmt::Debug for RedisClusterBackendBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisClusterBackendBuilder")
            .field("nodes", &self.settings.urls.len())
            .field("connect_timeout", &self.settings.connect_timeout)
            .field("response_timeout", &self.settings.response_timeout)
            .field("tls", &self.settings.tls)
            .finish_non_exhaustive()
    }
}

impl RedisClusterBackendBuilder {
    /// Bound on establishing (and re-establishing) a connection to a node. Default 2 s.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let b = lock_core::RedisClusterBackend::builder(&["redis://127.0.0.1:7000/"])
    ///     .connect_timeout(Duration::from_secs(1));
    /// # drop(b);
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.settings.connect_timeout = timeout;
        self
    }

    /// Bound on waiting for one answer from a node. Default 2 s. A whole request, with the
    /// cluster client's few retries and redirections, is bounded by twice this: a lock whose
    /// primary is down fails with [`LockError::Backend`] within it.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let b = lock_core::RedisClusterBackend::builder(&["redis://127.0.0.1:7000/"])
    ///     .response_timeout(Duration::from_millis(300));
    /// # drop(b);
    /// ```
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.settings.response_timeout = timeout;
        self
    }

    /// Checks every node's certificate against `ca_pem` (PEM: the authority that signed them),
    /// instead of the public roots compiled in (feature `tls`; give `rediss://` URLs, and run
    /// the cluster with `tls-cluster yes` so that it names its nodes' TLS ports). Each
    /// certificate must name the address the cluster gives for its node (`CLUSTER SLOTS`:
    /// usually an IP address, or the `cluster-announce-hostname`). A node whose certificate
    /// does not check out is refused, as
    /// [`RedisBackendBuilder::tls`](crate::RedisBackendBuilder::tls) says.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let ca = std::fs::read("/etc/redis/tls/ca.crt").unwrap();
    /// let backend = lock_core::RedisClusterBackend::builder(&["rediss://10.0.0.1:7000/"])
    ///     .tls(&ca)
    ///     .connect()
    ///     .await?;
    /// # drop(backend); Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls(mut self, ca_pem: &[u8]) -> Self {
        self.settings.tls.set_ca(ca_pem);
        self
    }

    /// Presents this client certificate and its private key (PEM) to every node, for nodes
    /// that check clients' certificates (`tls-auth-clients yes`; feature `tls`, `rediss://`
    /// URLs).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let read = |p: &str| std::fs::read(p).unwrap();
    /// let backend = lock_core::RedisClusterBackend::builder(&["rediss://10.0.0.1:7000/"])
    ///     .tls(&read("/etc/redis/tls/ca.crt"))
    ///     .tls_identity(&read("/etc/redis/tls/client.crt"), &read("/etc/redis/tls/client.key"))
    ///     .connect()
    ///     .await?;
    /// # drop(backend); Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls_identity(mut self, cert_pem: &[u8], key_pem: &[u8]) -> Self {
        self.settings.tls.set_identity(cert_pem, key_pem);
        self
    }

    /// Connects to the cluster and learns its slot map.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for no or malformed URLs, zero timeouts, or TLS
    /// certificates that do not parse or come with URLs that are not `rediss://`;
    /// [`LockError::Backend`] when no node can be reached (or every one refuses the TLS
    /// handshake).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let backend = lock_core::RedisClusterBackend::builder(&["redis://127.0.0.1:7000/"])
    ///     .connect()
    ///     .await?;
    /// # drop(backend); Ok(()) }
    /// ```
    pub async fn connect(self) -> Result<RedisClusterBackend, LockError> {
        crate::backend::validate_timeouts(
            "Redis connect and response timeouts",
            &[
                self.settings.connect_timeout,
                self.settings.response_timeout,
            ],
        )?;
        if self.settings.urls.is_empty() {
            return Err(LockError::config(
                "a Redis Cluster backend needs the URL of at least one node",
            ));
        }
        // Every URL parses, and certificates come with rediss:// URLs only.
        for url in &self.settings.urls {
            self.settings.tls.apply(parse_url(url, CLUSTER_URLS)?)?;
        }
        let backend = crate::backend::redis::connect::connect_cluster(self.settings).await?;
        Ok(RedisClusterBackend { backend })
    }
}

/// How to reach the cluster; every connection of the backend is made from it.
#[derive(Clone)]
pub(crate) struct ClusterSettings {
    urls: Vec<String>,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    /// The certificates of `rediss://` URLs (feature `tls`), for every node.
    tls: TlsSettings,
}

/// The URLs a cluster backend takes, for its errors.
const CLUSTER_URLS: &str =
    "redis://[user:password@]host:port/ or rediss://..., all with the same credentials";

impl ClusterSettings {
    /// Whether the nodes are reached over TLS (as the first URL is).
    pub(crate) fn tls(&self) -> bool {
        self.urls
            .first()
            .and_then(|url| parse_url(url, CLUSTER_URLS).ok())
            .is_some_and(|info| is_tls(&info))
    }

    /// A client with bounded timeouts and retries; with `push` (RESP3), one that reports
    /// pub/sub messages and dropped node connections to it.
    pub(crate) fn client(
        &self,
        push: Option<impl redis::aio::AsyncPushSender>,
    ) -> Result<ClusterClient, LockError> {
        let mut builder = ClusterClientBuilder::new(self.urls.iter().map(String::as_str))
            .connection_timeout(self.connect_timeout)
            .response_timeout(self.response_timeout)
            .overall_response_timeout(Some(self.response_timeout * 2))
            .retries(RETRIES)
            .min_retry_wait(MIN_RETRY_WAIT_MS)
            .max_retry_wait(MAX_RETRY_WAIT_MS);
        if let Some(push) = push {
            builder = builder
                .use_protocol(ProtocolVersion::RESP3)
                .push_sender(push);
        }
        #[cfg(feature = "tls")]
        if let Some(certificates) = self.tls.certificates() {
            builder = builder.certs(certificates);
        }
        if let Some(first) = self.urls.first() {
            // Readies rustls for rediss:// nodes.
            self.tls.apply(parse_url(first, CLUSTER_URLS)?)?;
        }
        builder.build().map_err(|e| {
            LockError::config(format!(
                "cannot use these Redis Cluster URLs ({e}); expected {CLUSTER_URLS}"
            ))
        })
    }

    /// A client of the one node at `addr` ("host:port", as `CLUSTER SLOTS` names it), with the
    /// first URL's user, password and transport.
    fn node_client(&self, addr: &str) -> Result<Client, String> {
        let (host, port) = addr
            .rsplit_once(':')
            .and_then(|(host, port)| Some((host.to_owned(), port.parse::<u16>().ok()?)))
            .ok_or_else(|| format!("a node address without a port: {addr:?}"))?;
        let url = self.urls.first().ok_or("no URL")?;
        let info = parse_url(url, CLUSTER_URLS)
            .and_then(|info| self.tls.apply(info))
            .map_err(|e| e.to_string())?;
        let addr = match info.addr().clone() {
            ConnectionAddr::Tcp(..) => ConnectionAddr::Tcp(host, port),
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host,
                port,
                insecure,
                tls_params,
            },
            other => return Err(format!("a cluster node over {other:?}")),
        };
        Client::open(info.set_addr(addr)).map_err(|e| e.to_string())
    }
}

/// How long a slot that a node said it does not serve (moved or moving) is renewed one slot
/// per call through the cluster connection before its primary is asked again (a refreshed map
/// that names another primary ends it sooner).
const UNSETTLED: Duration = Duration::from_secs(5);

/// The shortest time between two reads of the slot map after renewal failures (a stalled
/// node's locks are retried often; one read serves them all).
const REFRESH_GAP: Duration = Duration::from_millis(100);

/// The client name of the renewal connections (`CLIENT LIST` shows it on each primary).
const RENEWAL_CONNECTION_NAME: &str = "lock-core:renewal";

/// One primary's read of the slot map in [`Topology::refresh`].
type Read<'a> = std::pin::Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// Where a renewal goes: the primary that serves a slot (one script call for all its locks),
/// or one slot through the cluster connection (a slot moving or of unknown owner).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Target {
    Node(Arc<str>),
    Slot(u16),
}

/// Which primary serves each slot, from `CLUSTER SLOTS`, to send the watchdog's renewals to
/// the primaries (routing of every other request is redis-rs's, by slot), and one renewal
/// connection per primary. Read at connect, and again from a node that answers (never the one
/// that failed) when a primary's renewal call fails or a primary answers that it does not
/// serve a lock's slot; each read drops the connections of addresses no longer primaries.
pub(crate) struct Topology {
    /// `(first slot, last slot, primary "host:port")`, sorted.
    ranges: Mutex<Vec<(u16, u16, Arc<str>)>>,
    /// Slots a primary said it does not serve, with that primary and when: renewed per slot
    /// through the cluster connection (which follows MOVED and ASK) meanwhile.
    unsettled: Mutex<HashMap<u16, (Arc<str>, Instant)>>,
    /// One plain connection per primary for its renewals: a node that does not answer holds
    /// only its own calls (a cluster connection would hold every node's while it waits).
    renewers: Mutex<HashMap<Arc<str>, MultiplexedConnection>>,
    /// When the map was last read after a failure.
    refreshed: Mutex<Option<Instant>>,
    /// Counts the reads that changed the map (see `ClusterConn::following`).
    generation: AtomicU64,
    /// `None` in unit tests: no connections.
    settings: Option<ClusterSettings>,
}

impl Topology {
    pub(crate) fn new(settings: Option<ClusterSettings>) -> Self {
        Topology {
            ranges: Mutex::default(),
            unsettled: Mutex::default(),
            renewers: Mutex::default(),
            refreshed: Mutex::default(),
            generation: AtomicU64::new(0),
            settings,
        }
    }

    /// The renewal connection of the primary at `addr` (made now if there is none); `None`
    /// when it cannot be made within twice the connect timeout.
    pub(crate) async fn renewer(&self, addr: &Arc<str>) -> Option<MultiplexedConnection> {
        if let Some(conn) = self.renewers.lock().get(addr) {
            return Some(conn.clone());
        }
        let settings = self.settings.as_ref()?;
        let client = match settings.node_client(addr) {
            Ok(client) => client,
            Err(e) => {
                tracing::debug!(error = %e, "cannot address a primary's renewal connection");
                return None;
            }
        };
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(settings.connect_timeout))
            .set_response_timeout(Some(settings.response_timeout));
        let connect = client.get_multiplexed_async_connection_with_config(&config);
        let conn = match tokio::time::timeout(settings.connect_timeout * 2, connect).await {
            Ok(Ok(mut conn)) => {
                // Named, so that an operator (and a test) tells it in `CLIENT LIST`.
                let name = redis::cmd("CLIENT")
                    .arg("SETNAME")
                    .arg(RENEWAL_CONNECTION_NAME)
                    .clone();
                if let Err(e) = name.query_async::<Value>(&mut conn).await {
                    tracing::debug!(error = %e, "cannot name a renewal connection");
                }
                conn
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "cannot connect a primary's renewal connection");
                return None;
            }
            Err(_) => return None,
        };
        let mut renewers = self.renewers.lock();
        // Not kept for an address that stopped being a primary meanwhile.
        if !self.ranges.lock().iter().any(|(_, _, a)| a == addr) {
            return Some(conn);
        }
        Some(renewers.entry(addr.clone()).or_insert(conn).clone())
    }

    /// Drops the renewal connection of `addr` (its call failed: the next one reconnects).
    pub(crate) fn forget(&self, addr: &str) {
        self.renewers.lock().remove(addr);
    }

    /// Makes the renewal connection of every known primary.
    pub(crate) async fn connect_renewers(&self) {
        for addr in self.primaries() {
            self.renewer(&addr).await;
        }
    }

    /// The primaries of the map, each once.
    pub(crate) fn primaries(&self) -> Vec<Arc<str>> {
        let mut primaries: Vec<Arc<str>> = self
            .ranges
            .lock()
            .iter()
            .map(|(_, _, addr)| addr.clone())
            .collect();
        primaries.sort();
        primaries.dedup();
        primaries
    }

    /// The primary that serves `slot`, when known.
    pub(crate) fn shard_of(&self, slot: u16) -> Option<Arc<str>> {
        let ranges = self.ranges.lock();
        ranges
            .iter()
            .find(|(first, last, _)| (*first..=*last).contains(&slot))
            .map(|(_, _, addr)| addr.clone())
    }

    /// Where the renewal of a lock in `slot` goes.
    pub(crate) fn target(&self, slot: u16) -> Target {
        {
            let mut unsettled = self.unsettled.lock();
            match unsettled.get(&slot) {
                Some((_, since)) if since.elapsed() < UNSETTLED => return Target::Slot(slot),
                Some(_) => {
                    unsettled.remove(&slot);
                }
                None => {}
            }
        }
        self.shard_of(slot).map_or(Target::Slot(slot), Target::Node)
    }

    /// `addr` answered that it does not serve `slot`.
    pub(crate) fn unsettled(&self, slot: u16, addr: &Arc<str>) {
        self.unsettled
            .lock()
            .insert(slot, (addr.clone(), Instant::now()));
    }

    /// Reads `CLUSTER SLOTS` through the cluster connection (at connect); keeps the old map
    /// when that fails.
    pub(crate) async fn load(&self, conn: &mut ClusterConn) {
        let reply = conn
            .inner()
            .route_command(
                redis::cmd("CLUSTER").arg("SLOTS").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary),
            )
            .await;
        match reply {
            Ok(reply) => self.apply(parse_slots(&reply)),
            Err(e) => tracing::debug!(error = %e, "cannot read the cluster's slot map"),
        }
    }

    /// Reads `CLUSTER SLOTS` again: from `prefer` first (a node that just answered), then from
    /// every other primary at once, never `avoid` (a node whose call just failed: it may be
    /// stalled), taking the first answer; at most once per [`REFRESH_GAP`]. Keeps the old map
    /// when no primary answers. Asked at once, not in turn: another stalled primary would
    /// otherwise hold the read (and the renewals waiting for it) for its timeout.
    pub(crate) async fn refresh(&self, prefer: Option<&Arc<str>>, avoid: Option<&str>) {
        {
            let mut refreshed = self.refreshed.lock();
            if refreshed.is_some_and(|at| at.elapsed() < REFRESH_GAP) {
                return;
            }
            *refreshed = Some(Instant::now());
        }
        if self.settings.is_none() {
            return;
        }
        if let Some(prefer) = prefer.filter(|p| Some(&***p) != avoid)
            && let Some(ranges) = self.read_slots(prefer).await
        {
            self.apply(ranges);
            return;
        }
        let (found, mut first) = tokio::sync::mpsc::unbounded_channel();
        let reads: Vec<Read<'_>> = self
            .primaries()
            .into_iter()
            .filter(|a| Some(a) != prefer && Some(&**a) != avoid)
            .map(|addr| {
                let found = found.clone();
                Box::pin(async move {
                    if let Some(ranges) = self.read_slots(&addr).await {
                        let _ = found.send(ranges);
                    }
                }) as Read<'_>
            })
            .collect();
        drop(found);
        // The first map read ends the others (their requests are dropped).
        let ranges = tokio::select! {
            Some(ranges) = first.recv() => Some(ranges),
            () = async { crate::backend::join_all(reads).await; } => first.try_recv().ok(),
        };
        if let Some(ranges) = ranges {
            self.apply(ranges);
        }
    }

    /// The slot map as the primary at `addr` sees it, on its renewal connection; `None` when it
    /// does not answer in time (its connection is dropped then) or answers no map.
    async fn read_slots(&self, addr: &Arc<str>) -> Option<Vec<(u16, u16, Arc<str>)>> {
        let settings = self.settings.as_ref()?;
        let mut conn = self.renewer(addr).await?;
        let slots = redis::cmd("CLUSTER").arg("SLOTS").clone();
        let reply = tokio::time::timeout(
            settings.response_timeout,
            slots.query_async::<Value>(&mut conn),
        )
        .await;
        match reply {
            Ok(Ok(reply)) => Some(parse_slots(&reply)).filter(|ranges| !ranges.is_empty()),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "cannot read the cluster's slot map");
                if !crate::backend::redis::answered(&e) {
                    self.forget(addr);
                }
                None
            }
            Err(_) => {
                self.forget(addr);
                None
            }
        }
    }

    /// Takes a new map: the connections of addresses no longer primaries are dropped, and a
    /// slot now served by another primary than the one that refused it is settled.
    fn apply(&self, ranges: Vec<(u16, u16, Arc<str>)>) {
        if ranges.is_empty() {
            return;
        }
        {
            let mut current = self.ranges.lock();
            if *current != ranges {
                self.generation.fetch_add(1, Ordering::AcqRel);
            }
            *current = ranges;
        }
        let primaries = self.primaries();
        self.renewers
            .lock()
            .retain(|addr, _| primaries.contains(addr));
        let mut unsettled = self.unsettled.lock();
        unsettled.retain(|&slot, (refused_by, _)| self.shard_of(slot).as_ref() == Some(refused_by));
    }

    /// How many reads changed the map so far.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// A new command connection (it reads the slot map afresh); `None` when it cannot be made
    /// within twice the connect timeout.
    pub(crate) async fn connect_command(&self) -> Option<ClusterConnection> {
        let settings = self.settings.as_ref()?;
        let client = settings
            .client(None::<tokio::sync::mpsc::UnboundedSender<redis::PushInfo>>)
            .ok()?;
        match tokio::time::timeout(settings.connect_timeout * 2, client.get_async_connection())
            .await
        {
            Ok(Ok(conn)) => Some(conn),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "cannot make a new command connection");
                None
            }
            Err(_) => None,
        }
    }

    /// Groups `slots` (one per item) by where their renewals go (see [`Topology::target`]).
    pub(crate) fn group(&self, slots: impl Iterator<Item = u16>) -> Vec<Vec<usize>> {
        let mut groups: HashMap<Target, Vec<usize>> = HashMap::new();
        for (i, slot) in slots.enumerate() {
            groups.entry(self.target(slot)).or_default().push(i);
        }
        groups.into_values().collect()
    }
}

fn parse_slots(reply: &Value) -> Vec<(u16, u16, Arc<str>)> {
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let Value::Array(entries) = reply else {
        return Vec::new();
    };
    let mut ranges: Vec<(u16, u16, Arc<str>)> = entries
        .iter()
        .filter_map(|entry| {
            let Value::Array(fields) = entry else {
                return None;
            };
            match fields.as_slice() {
                [
                    Value::Int(first),
                    Value::Int(last),
                    Value::Array(primary),
                    ..,
                ] => {
                    let (host, port) = match primary.as_slice() {
                        [host, Value::Int(port), ..] => (text(host)?, *port),
                        _ => return None,
                    };
                    Some((
                        u16::try_from(*first).ok()?,
                        u16::try_from(*last).ok()?,
                        Arc::from(format!("{host}:{port}")),
                    ))
                }
                _ => None,
            }
        })
        .collect();
    ranges.sort();
    ranges
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_map_parse_and_group() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let node = |port| Value::Array(vec![bulk("127.0.0.1"), Value::Int(port), bulk("id")]);
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(8192),
                Value::Int(16383),
                node(7001),
                node(7004),
            ]),
            Value::Array(vec![Value::Int(0), Value::Int(8191), node(7000)]),
            Value::Int(3),
        ]);
        let topology = Topology::new(None);
        topology.apply(parse_slots(&reply));
        assert_eq!(topology.shard_of(0).as_deref(), Some("127.0.0.1:7000"));
        assert_eq!(topology.shard_of(16383).as_deref(), Some("127.0.0.1:7001"));
        let mut groups = topology.group([1, 9000, 2, 8191].into_iter());
        groups.sort();
        assert_eq!(groups, vec![vec![0, 2, 3], vec![1]]);
        // A slot that its primary refused is renewed per slot until the map names another.
        let a: Arc<str> = Arc::from("127.0.0.1:7000");
        topology.unsettled(2, &a);
        assert_eq!(topology.target(2), Target::Slot(2));
        assert_eq!(topology.target(1), Target::Node(a.clone()));
        topology.apply(parse_slots(&reply));
        assert_eq!(topology.target(2), Target::Slot(2), "still served there");
        let moved = Value::Array(vec![
            Value::Array(vec![Value::Int(0), Value::Int(8191), node(7002)]),
            Value::Array(vec![Value::Int(8192), Value::Int(16383), node(7001)]),
        ]);
        topology.apply(parse_slots(&moved));
        assert_eq!(
            topology.target(2),
            Target::Node(Arc::from("127.0.0.1:7002")),
            "settled: another primary serves it"
        );
        assert_eq!(topology.primaries().len(), 2);
        let empty = Topology::new(None);
        let mut by_slot = empty.group([5, 6, 5].into_iter());
        by_slot.sort();
        assert_eq!(by_slot, vec![vec![0, 2], vec![1]]);
    }
}
