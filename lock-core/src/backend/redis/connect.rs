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
use super::tls::{TlsSettings, is_tls, parse_url, url_error};
use super::watcher::Watcher;
use super::wire::Wire;
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
    /// The certificates of a `rediss://` URL (feature `tls`).
    tls: TlsSettings,
}

impl std::fmt::Debug for RedisBackendBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackendBuilder")
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("tls", &self.tls)
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

    /// Checks the server's certificate against `ca_pem` (PEM: the certificate of the authority
    /// that signed it, or several), instead of the public roots compiled in (feature `tls`;
    /// give a `rediss://` URL). The certificate must also name the URL's host (an IP address
    /// in the URL must be in its subject alternative names). A server whose certificate does
    /// not check out is refused: [`connect`](Self::connect) fails with [`LockError::Backend`]
    /// naming the certificate.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let ca = std::fs::read("/etc/redis/tls/ca.crt").unwrap();
    /// let backend = lock_core::RedisBackend::builder("rediss://redis.internal:6380/")
    ///     .tls(&ca)
    ///     .connect()
    ///     .await?;
    /// # drop(backend); Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls(mut self, ca_pem: &[u8]) -> Self {
        self.tls.set_ca(ca_pem);
        self
    }

    /// Presents this client certificate and its private key (PEM) to the server, for a server
    /// that checks clients' certificates (`tls-auth-clients yes`, mutual TLS; feature `tls`,
    /// with a `rediss://` URL). Without [`tls`](Self::tls), the server's certificate is checked
    /// against the public roots.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let read = |p: &str| std::fs::read(p).unwrap();
    /// let backend = lock_core::RedisBackend::builder("rediss://redis.internal:6380/")
    ///     .tls(&read("/etc/redis/tls/ca.crt"))
    ///     .tls_identity(&read("/etc/redis/tls/client.crt"), &read("/etc/redis/tls/client.key"))
    ///     .connect()
    ///     .await?;
    /// # drop(backend); Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls_identity(mut self, cert_pem: &[u8], key_pem: &[u8]) -> Self {
        self.tls.set_identity(cert_pem, key_pem);
        self
    }

    /// These TLS settings (a Redlock's, for each of its servers).
    #[cfg(feature = "redlock")]
    pub(crate) fn tls_settings(mut self, tls: TlsSettings) -> Self {
        self.tls = tls;
        self
    }

    /// Releases always send the full release (for a Redlock's servers: see release.rs).
    #[cfg(feature = "redlock")]
    pub(crate) fn full_releases(mut self) -> Self {
        self.fast_release = false;
        self
    }

    /// The redis-rs settings the backend's command connection uses over TLS or RESP3 (these
    /// timeouts, one retry, reconnect backoff), for a tool that must talk to Redis with the
    /// lock's timeouts, such as a benchmark's baseline client. (Over plain TCP or a Unix socket
    /// the backend uses a connection of its own with the same timeouts.)
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
    /// [`LockError::InvalidConfig`] for a malformed URL, zero timeouts, or TLS certificates
    /// that do not parse or come with a URL that is not `rediss://`; [`LockError::Backend`]
    /// when the server cannot be reached, or refuses the TLS handshake (its certificate is not
    /// one the client trusts, or the client's is missing or refused), within the connect
    /// timeout.
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
        let info = parse_url(
            &self.url,
            "redis://[user:password@]host[:port][/db], rediss://... or redis+unix:///path",
        )?;
        let info = self.tls.apply(info)?;
        let tls = is_tls(&info);
        let wire = Wire::for_info(&info, self.connect_timeout, self.response_timeout);
        let client =
            Client::open(info).map_err(|e| url_error(&self.url, &e, "a valid Redis URL"))?;
        let mut conn = match wire {
            Some(wire) => {
                wire.connect().await.map_err(|e| connect_error(e, tls))?;
                Conn::Wire(wire)
            }
            None => {
                let config = manager_config(self.connect_timeout, self.response_timeout);
                Conn::Single(
                    ConnectionManager::new_with_config(client.clone(), config)
                        .await
                        .map_err(|e| connect_error(e, tls))?,
                )
            }
        };
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
    let tls = settings.tls();
    let conn = client.get_async_connection().await.map_err(|e| {
        if super::permissions::is_noperm(&e) {
            // The cluster client reads the slot map (`CLUSTER SLOTS`) at connect: a user
            // without it learns so here, before any lock, not as a bare backend error.
            LockError::config(format!(
                "the Redis user is refused a command the cluster client runs at connect ({e}); on a cluster, grant +cluster|slots beside the lock's rule on every node (docs/src/backends/cluster.md): {}",
                super::permissions::ACL_HINT
            ))
        } else {
            connect_error(e, tls)
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

/// A connection that could not be made; over TLS, a refused handshake says which side's
/// certificate was refused and what to give the builder (redis-rs hands rustls's error over as
/// an I/O error, read here by its text).
pub(crate) fn connect_error(e: redis::RedisError, tls: bool) -> LockError {
    match tls.then(|| TlsRefusal::of(&e)).flatten() {
        Some(refusal) => LockError::backend("connect", None, TlsRefused { refusal, source: e }),
        None => LockError::backend("connect", None, e),
    }
}

/// A connection error's text, for errors gathered as text (a sentinel's answer among
/// several): over TLS, a refused handshake is described as [`connect_error`] does.
#[cfg(feature = "sentinel")]
pub(crate) fn describe_connect_error(e: &redis::RedisError, tls: bool) -> String {
    match tls.then(|| TlsRefusal::of(e)).flatten() {
        Some(refusal) => format!("{refusal}: {e}"),
        None => e.to_string(),
    }
}

/// Why a TLS handshake failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TlsRefusal {
    /// This client did not accept the server's certificate.
    ServerCertificate,
    /// The server wants a client certificate and got none.
    ClientCertificateRequired,
    /// The server ended the handshake with another alert (a client certificate it refused).
    Alert,
}

impl TlsRefusal {
    fn of(e: &redis::RedisError) -> Option<Self> {
        let text = e.to_string();
        if text.contains("invalid peer certificate") || text.contains("peer sent no certificates") {
            Some(Self::ServerCertificate)
        } else if text.contains("CertificateRequired") {
            Some(Self::ClientCertificateRequired)
        } else if text.contains("received fatal alert") {
            Some(Self::Alert)
        } else {
            None
        }
    }
}

impl std::fmt::Display for TlsRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::ServerCertificate => {
                "TLS handshake refused: the server's certificate is not accepted (not signed by an \
                 authority this client trusts, expired, or not naming the host); give the \
                 authority that signed it to the builder's `tls`"
            }
            Self::ClientCertificateRequired => {
                "TLS handshake refused: the server requires a client certificate; give one to \
                 the builder's `tls_identity`"
            }
            Self::Alert => {
                "TLS handshake refused by the server (a client certificate it does not accept?)"
            }
        })
    }
}

/// A refused TLS handshake: what to do about it, then rustls's own words.
#[derive(Debug, thiserror::Error)]
#[error("{refusal}: {source}")]
struct TlsRefused {
    refusal: TlsRefusal,
    #[source]
    source: redis::RedisError,
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

    /// Options for connecting. Accepts `redis://`, `rediss://` (TLS, with the feature `tls`;
    /// see [`RedisBackendBuilder::tls`]), `redis+unix://` and `unix://` URLs, with an ACL user
    /// and password in the URL.
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
            tls: TlsSettings::default(),
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

#[cfg(all(test, feature = "tls"))]
mod tests {
    use super::*;

    /// rustls's error as redis-rs hands it over (an I/O error around it).
    fn handed_over(e: rustls::Error) -> redis::RedisError {
        redis::RedisError::from(std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }

    #[test]
    fn a_refused_handshake_says_whose_certificate_and_what_to_give() {
        let cases = [
            (
                rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
                Some(TlsRefusal::ServerCertificate),
            ),
            (
                rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName),
                Some(TlsRefusal::ServerCertificate),
            ),
            (
                rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired),
                Some(TlsRefusal::ClientCertificateRequired),
            ),
            (
                rustls::Error::AlertReceived(rustls::AlertDescription::UnknownCA),
                Some(TlsRefusal::Alert),
            ),
        ];
        for (rustls_error, want) in cases {
            let shown = rustls_error.to_string();
            let e = handed_over(rustls_error);
            assert_eq!(TlsRefusal::of(&e), want, "{shown}");
            let text = connect_error(e, true).to_string();
            assert!(text.contains("TLS") && text.contains(&shown), "{text}");
            assert!(text.contains("certificate"), "{text}");
        }
        let refused =
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(TlsRefusal::of(&refused), None);
        assert!(!connect_error(refused, true).to_string().contains("TLS"));
    }
}
