//! The Redis Sentinel backend: the Redis backend on the primary that a set of sentinels names,
//! following it across failovers (see [`master`]).

use std::time::Duration;

use redis::{ConnectionAddr, ConnectionInfo, RedisConnectionInfo};

use crate::LockError;
use crate::backend::redis::RedisBackend;
use crate::backend::redis::connect::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_RESPONSE_TIMEOUT};
use crate::backend::redis::tls::{TlsSettings, parse_url};

pub(crate) mod master;

pub(crate) use master::{Master, SentinelConn, SentinelSettings};

/// Locks on the primary of a Redis group watched by Sentinel, followed across failovers.
///
/// The same locks as [`RedisBackend`](crate::RedisBackend) (the same scripts and semantics;
/// the conformance suite runs on both) on the primary that the sentinels name. The backend
/// asks the sentinels for the primary at connect (and checks with `HELLO` that it is one), then
/// follows it: when a sentinel announces a failover (`+switch-master`), and when the primary
/// refuses a command in a way that says it may be one no more (`READONLY`, a refused or
/// dropped connection), the sentinels are asked again; when they name a new primary, commands,
/// release notifications and the connection watcher move to it, and the command that failed
/// is sent once more there.
///
/// Every answer a caller gets is the current primary's: a command answered while the primary
/// moved is sent again on the new one. The sentinels are all asked at once and only an
/// address that a majority of the configured sentinels name (more than half of the URLs
/// given, whether they answered or not) is taken, once it answers as a primary: a stale or
/// cut-off sentinel never moves the backend to a server the others do not name, and a
/// sentinel's `+switch-master` is followed once the majority names the new primary too
/// (seconds later). While no address has a majority, or the one it names does not answer as
/// a primary, lock requests fail with [`LockError::Backend`] and the sentinels are asked again
/// later. The listened sentinel is pinged every second, the next one listened to when it does
/// not answer; a primary that does not answer in time has the sentinels asked too.
///
/// What a failover means for a held lock: replication is asynchronous, so a lock written to a
/// primary that fails before its replica got it is gone after the failover. Every held lock
/// is checked at once when the primary moved; a lock found missing is reported lost to its
/// holder ([`LockGuard::lost`](crate::LockGuard::lost), and `run` cancels its body). A
/// lock that is not missing is kept. Until then, two holders are possible: another process
/// can take the missing lock on the new primary, and the old primary takes writes until the
/// sentinels demote it (a split brain of seconds, longer under a partition;
/// `min-replicas-to-write` on the primary bounds it). Fencing tokens never go backwards across
/// a failover as long as the new primary's clock is not behind the old one's (each is at
/// least the last one plus 1, and never below the server clock in µs), so a store that checks
/// them turns away the writes of a holder that lost its lock this way. While no primary
/// answers (between the crash and the promotion, a few seconds with Sentinel's defaults),
/// lock requests fail with [`LockError::Backend`]; the backend serves locks again as soon as
/// the new primary is named, without a restart.
///
/// Clones share the connections.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use std::time::Duration;
/// use lock_core::{Locker, RedisSentinelBackend};
///
/// let backend = RedisSentinelBackend::builder(
///     &["redis://10.0.0.1:26379/", "redis://10.0.0.2:26379/", "redis://10.0.0.3:26379/"],
///     "mymaster",
/// )
/// .master_auth(Some("app"), Some("secret"))
/// .connect()
/// .await?;
/// let locker = Locker::builder(backend).prefix("shop:").build();
/// # drop(locker); Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisSentinelBackend {
    pub(crate) backend: RedisBackend,
}

impl std::fmt::Debug for RedisSentinelBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URLs may hold a password: never print them.
        f.debug_struct("RedisSentinelBackend")
            .field("primary", &self.primary())
            .finish_non_exhaustive()
    }
}

/// A Sentinel group is the Redis backend on its current primary.
impl crate::backend::IntoBackend for RedisSentinelBackend {
    fn into_backend(self) -> std::sync::Arc<dyn crate::backend::Backend> {
        std::sync::Arc::new(self.backend)
    }
}

impl RedisSentinelBackend {
    /// Connects with default options; see [`RedisSentinelBackend::builder`].
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let backend =
    ///     lock_core::RedisSentinelBackend::connect(&["redis://127.0.0.1:26379/"], "mymaster").await?;
    /// # drop(backend); Ok(()) }
    /// ```
    pub async fn connect(sentinels: &[&str], master_name: &str) -> Result<Self, LockError> {
        Self::builder(sentinels, master_name).connect().await
    }

    /// Options for connecting. `sentinels` are the URLs of the sentinels of the group (all
    /// asked at once; a majority of them must name the same primary, so each is given once:
    /// one sentinel under two URLs is refused), `redis://` or `rediss://` (TLS, with the
    /// feature `tls`; see [`RedisSentinelBackendBuilder::tls`]: the primary is then reached
    /// over TLS too), with the sentinels' own ACL user and password in them;
    /// `master_name` is the name they monitor the primary under. The primary's user,
    /// password and database are set with
    /// [`master_auth`](RedisSentinelBackendBuilder::master_auth) and
    /// [`db`](RedisSentinelBackendBuilder::db).
    ///
    /// ```
    /// let builder = lock_core::RedisSentinelBackend::builder(&["redis://127.0.0.1:26379/"], "mymaster");
    /// # drop(builder);
    /// ```
    pub fn builder(sentinels: &[&str], master_name: &str) -> RedisSentinelBackendBuilder {
        RedisSentinelBackendBuilder {
            sentinels: sentinels.iter().map(|u| (*u).to_owned()).collect(),
            master_name: master_name.to_owned(),
            master: RedisConnectionInfo::default(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            tls: TlsSettings::default(),
        }
    }

    /// The `host:port` of the primary the backend talks to now (it changes after a failover).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let backend =
    ///     lock_core::RedisSentinelBackend::connect(&["redis://127.0.0.1:26379/"], "mymaster").await?;
    /// println!("primary: {}", backend.primary());
    /// # Ok(()) }
    /// ```
    pub fn primary(&self) -> String {
        self.backend
            .sentinel_master()
            .map(|m| m.addr())
            .unwrap_or_default()
    }

    /// Checks that the Redis user may run everything the lock runs on the keys and channels of
    /// `prefix`, as [`RedisBackend::check_permissions`](crate::RedisBackend::check_permissions)
    /// does, on the current primary (give the replicas the same ACL rule: one of them is the
    /// next primary).
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] naming what is refused, [`LockError::Backend`] when the
    /// primary cannot be reached.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let backend =
    ///     lock_core::RedisSentinelBackend::connect(&["redis://127.0.0.1:26379/"], "mymaster").await?;
    /// backend.check_permissions("shop:").await?;
    /// # Ok(()) }
    /// ```
    pub async fn check_permissions(&self, prefix: &str) -> Result<(), LockError> {
        self.backend.check_permissions(prefix).await
    }

    /// The primary's `maxmemory-policy`, read when the backend connected (`None` when it
    /// could not be read); see
    /// [`RedisBackend::maxmemory_policy`](crate::RedisBackend::maxmemory_policy). Set the
    /// same policy (`noeviction`) on the replicas.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let backend =
    ///     lock_core::RedisSentinelBackend::connect(&["redis://127.0.0.1:26379/"], "mymaster").await?;
    /// assert_eq!(backend.maxmemory_policy(), Some("noeviction"));
    /// # Ok(()) }
    /// ```
    pub fn maxmemory_policy(&self) -> Option<&str> {
        self.backend.maxmemory_policy()
    }
}

/// Options for connecting a [`RedisSentinelBackend`].
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use std::time::Duration;
/// let backend = lock_core::RedisSentinelBackend::builder(&["redis://127.0.0.1:26379/"], "mymaster")
///     .connect_timeout(Duration::from_secs(1))
///     .connect()
///     .await?;
/// # drop(backend); Ok(()) }
/// ```
#[must_use]
pub struct RedisSentinelBackendBuilder {
    sentinels: Vec<String>,
    master_name: String,
    master: RedisConnectionInfo,
    connect_timeout: Duration,
    response_timeout: Duration,
    /// The certificates of `rediss://` URLs (feature `tls`), for the sentinels and the primary.
    tls: TlsSettings,
}

impl std::fmt::Debug for RedisSentinelBackendBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSentinelBackendBuilder")
            .field("sentinels", &self.sentinels.len())
            .field("master_name", &self.master_name)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

impl RedisSentinelBackendBuilder {
    /// The ACL user and password of the primary (and of the replica that will replace it);
    /// default: none (the `default` user). The sentinels' own credentials go in their URLs.
    ///
    /// ```
    /// let b = lock_core::RedisSentinelBackend::builder(&["redis://127.0.0.1:26379/"], "mymaster")
    ///     .master_auth(Some("app"), Some("secret"));
    /// # drop(b);
    /// ```
    pub fn master_auth(mut self, username: Option<&str>, password: Option<&str>) -> Self {
        let mut info = RedisConnectionInfo::default().set_db(self.master.db());
        if let Some(username) = username {
            info = info.set_username(username);
        }
        if let Some(password) = password {
            info = info.set_password(password);
        }
        self.master = info;
        self
    }

    /// The database number on the primary. Default 0.
    ///
    /// ```
    /// let b = lock_core::RedisSentinelBackend::builder(&["redis://127.0.0.1:26379/"], "mymaster").db(2);
    /// # drop(b);
    /// ```
    pub fn db(mut self, db: i64) -> Self {
        self.master = self.master.set_db(db);
        self
    }

    /// Bound on establishing (and re-establishing) a connection, to a sentinel or the primary.
    /// Default 2 s.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let b = lock_core::RedisSentinelBackend::builder(&["redis://127.0.0.1:26379/"], "mymaster")
    ///     .connect_timeout(Duration::from_secs(1));
    /// # drop(b);
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Bound on waiting for one answer. Default 2 s.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let b = lock_core::RedisSentinelBackend::builder(&["redis://127.0.0.1:26379/"], "mymaster")
    ///     .response_timeout(Duration::from_millis(300));
    /// # drop(b);
    /// ```
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Checks the certificates of the sentinels and of the primary (and of the replica that
    /// replaces it) against `ca_pem` (PEM: the authority that signed them), instead of the
    /// public roots compiled in (feature `tls`; give `rediss://` sentinel URLs: the primary is
    /// reached over TLS as the sentinels are). The primary's certificate must name the address
    /// the sentinels give for it (usually an IP address, or the replicas'
    /// `replica-announce-ip`). A server whose certificate does not check out is refused, as
    /// [`RedisBackendBuilder::tls`](crate::RedisBackendBuilder::tls) says.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let ca = std::fs::read("/etc/redis/tls/ca.crt").unwrap();
    /// let backend = lock_core::RedisSentinelBackend::builder(&["rediss://10.0.0.1:26379/"], "mymaster")
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

    /// Presents this client certificate and its private key (PEM) to the sentinels and the
    /// primary, for servers that check clients' certificates (`tls-auth-clients yes`; feature
    /// `tls`, `rediss://` URLs).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let read = |p: &str| std::fs::read(p).unwrap();
    /// let backend = lock_core::RedisSentinelBackend::builder(&["rediss://10.0.0.1:26379/"], "mymaster")
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

    /// Asks the sentinels for the primary and connects to it.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for no or malformed sentinel URLs, one sentinel given twice
    /// (the same host and port, or names of the same address), an empty name, zero timeouts,
    /// or TLS certificates that do not parse or come with URLs that are not `rediss://`;
    /// [`LockError::Backend`] when no address is named by a majority of the sentinels (a
    /// sentinel that refuses the TLS handshake does not answer), or the one named does not
    /// answer as a primary.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let backend = lock_core::RedisSentinelBackend::builder(&["redis://127.0.0.1:26379/"], "mymaster")
    ///     .connect()
    ///     .await?;
    /// # drop(backend); Ok(()) }
    /// ```
    pub async fn connect(self) -> Result<RedisSentinelBackend, LockError> {
        crate::backend::validate_timeouts(
            "Redis connect and response timeouts",
            &[self.connect_timeout, self.response_timeout],
        )?;
        if self.master_name.is_empty() {
            return Err(LockError::config(
                "a Redis Sentinel backend needs the name the sentinels monitor the primary under",
            ));
        }
        let sentinels = self
            .sentinels
            .iter()
            .map(|url| {
                let info = parse_url(
                    url,
                    "redis://[user:password@]host:port/ or rediss://... for each sentinel",
                )?;
                self.tls.apply(info)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let Some(first) = sentinels.first() else {
            return Err(LockError::config(
                "a Redis Sentinel backend needs the URL of at least one sentinel",
            ));
        };
        refuse_doubles(&sentinels, self.connect_timeout).await?;
        let settings = SentinelSettings {
            transport: first.addr().clone(),
            sentinels,
            master_name: self.master_name,
            master: self.master,
            connect_timeout: self.connect_timeout,
            response_timeout: self.response_timeout,
        };
        let backend = crate::backend::redis::connect::connect_sentinel(settings).await?;
        Ok(RedisSentinelBackend { backend })
    }
}

/// Refuses one sentinel given twice: it would vote twice, and a "majority" of the configured
/// sentinels could be one stale sentinel. Two URLs are the same sentinel when they name the
/// same host and port, or when their host names resolve to a common address (`localhost` and
/// `127.0.0.1`); a name that does not resolve within `bound` is compared as written (it is
/// asked again at each resolution, like any other). Two sentinels behind one address (a proxy)
/// are one to the backend too: it cannot tell which one answers.
async fn refuse_doubles(sentinels: &[ConnectionInfo], bound: Duration) -> Result<(), LockError> {
    let mut seen: Vec<(usize, Vec<String>)> = Vec::with_capacity(sentinels.len());
    for (i, sentinel) in sentinels.iter().enumerate() {
        let names = endpoints(sentinel.addr(), bound).await;
        if let Some((j, _)) = seen
            .iter()
            .find(|(_, other)| other.iter().any(|n| names.contains(n)))
        {
            return Err(LockError::config(format!(
                "sentinels {} and {} of the list are the same sentinel (the same address): its \
                 vote would count twice toward the majority; give each sentinel once",
                j + 1,
                i + 1
            )));
        }
        seen.push((i, names));
    }
    Ok(())
}

/// The names of a sentinel's endpoint: its host and port as written, and each address they
/// resolve to.
async fn endpoints(addr: &ConnectionAddr, bound: Duration) -> Vec<String> {
    let (host, port) = match addr {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            (host.as_str(), *port)
        }
        other => return vec![format!("{other:?}")],
    };
    let mut names = vec![format!("{}:{port}", host.to_ascii_lowercase())];
    if let Ok(Ok(found)) = tokio::time::timeout(bound, tokio::net::lookup_host((host, port))).await
    {
        names.extend(found.map(|a| a.to_string()));
    }
    names
}
