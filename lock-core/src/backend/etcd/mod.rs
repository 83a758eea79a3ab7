//! The etcd backend: locks on an etcd v3 cluster, after etcd's own mutex recipe
//! (`client/v3/concurrency/mutex.go`).
//!
//! Under the backend's namespace `N` and a lock's name `K` ([`LockKey::name`]):
//! - `N K/q/<token>`: one key per contender (holder or waiter), created in one transaction and
//!   bound to the backend's etcd lease for the lock's lease length. The holder is the contender
//!   with the lowest create revision; its create revision is the fence (strictly increasing per
//!   key, whatever the cluster goes through: revisions come from the Raft log). The token is in
//!   the name, so an attempt sent again finds its own key. Its value is the taker's stamp
//!   (identity, lease, since when it holds or queues: `backend::stamp`), for `inspect`.
//! - `N K/result`: the idempotency record (a result or a "started" mark), bound to a lease of
//!   the record's TTL, written only while our contender key still exists.
//! - `N K/forced/<token>`: the mark `force_unlock` leaves on a removed holder key's lease, read
//!   and deleted by that holder's release (`lock::forced_key`).
//!
//! Reads are linearizable (etcd's default) and writes go through Raft: a client that reaches
//! only a minority of the members gets an error, never a lock.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, Txn, TxnResponse};
use tokio::sync::watch;

use super::{
    Attempt, AttemptOptions, Backend, BoxFuture, Inbox, Kept, KeyPattern, ListPage, Listeners,
    Renewal, Renewed, validate_timeouts,
};
use crate::LockError;
use crate::idempotency::{IdempotencyState, Marked};
use crate::key::LockKey;
use crate::sync::Mutex;
use crate::token::Token;

mod announce;
mod inspect;
mod lease;
mod lock;
mod record;
mod sweep;
mod unrenewed;

use lease::Leases;

/// The shortest lease the etcd backend accepts: 2 s. etcd grants no lease shorter than its own
/// floor (one and a half election timeouts, 1.5 s with its defaults, raised silently), and
/// counts leases in whole seconds; a shorter request is refused with
/// [`LockError::InvalidConfig`] rather than kept longer than asked.
///
/// ```
/// assert_eq!(lock_core::ETCD_MIN_LEASE, std::time::Duration::from_secs(2));
/// ```
pub const ETCD_MIN_LEASE: Duration = Duration::from_secs(2);

const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Between HTTP/2 pings on the connection (etcd's `--grpc-keepalive-min-time` is 5 s).
const PING_INTERVAL: Duration = Duration::from_secs(10);

/// Locks on an etcd v3 cluster: a key per contender bound to a lease, the holder being the one
/// created first; fences from the key's create revision; FIFO waiting, each waiter watching the
/// deletion of the contender just ahead of it; leases kept alive by the watchdog, one keepalive
/// per lease length for all the locks on it.
///
/// Every lock request may be fenced and fair. Leases are counted in whole seconds, at least
/// [`ETCD_MIN_LEASE`]; the etcd lease behind a lock runs one second past the lock's lease (so
/// that an acquire rarely needs a keepalive of its own), which is how long etcd may keep the
/// lock of a holder that died.
///
/// Operators may [`inspect`](crate::Locker::inspect), [`list`](crate::Locker::list) and
/// [`force_unlock`](crate::Locker::force_unlock) its locks: the fence shown is the holder key's
/// create revision (none once the lock is free: nothing keeps it), `remaining` is its etcd
/// lease's time to live less the second added (whole seconds), and `held_for` is counted from
/// the taker's clock (see the guide's "Operating it" chapter).
///
/// Clones share the client, the leases and the remembered acquisitions.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use lock_core::{EtcdBackend, Locker};
///
/// let backend = EtcdBackend::connect(&["http://127.0.0.1:2379"]).await?;
/// let locker = Locker::builder(backend).build();
/// let guard = locker.lock("order:42").fenced().await?;
/// assert!(guard.fence().is_some());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct EtcdBackend {
    inner: Arc<Shared>,
}

/// Counts only: names hold lock keys and tokens, which have no place in logs.
impl std::fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("contenders", &self.inner.contenders.lock().len())
            .field("request_timeout", &self.inner.request_timeout)
            .finish_non_exhaustive()
    }
}

struct Shared {
    client: Client,
    namespace: String,
    request_timeout: Duration,
    listeners: Arc<Mutex<Listeners>>,
    /// Our contender keys (by full etcd key), with what we know of each.
    contenders: Mutex<HashMap<String, Contender>>,
    /// Its `reconnects` is bumped each time a keepalive stream broke (held locks may have gone
    /// with it).
    leases: Leases,
    /// Our keys with an attempt pending, and when each lease was last swept of orphans.
    orphans: sweep::Orphans,
    /// The watch announcing fair waiters, per lock with listeners here (see `announce`).
    announcers: Mutex<HashMap<String, tokio::task::JoinHandle<()>>>,
    /// The highest revision etcd answered this backend with: a watch started after it misses
    /// nothing that came since.
    seen_revision: std::sync::atomic::AtomicI64,
    /// Fair waiters announced to this process's listeners (by `announce`).
    fair_heard: std::sync::atomic::AtomicU64,
}

/// The last clone of the backend is gone, and with it every guard and waiter of its lockers
/// (each holds the backend): its leases are revoked, so that keys left behind (a delete still
/// retried, an acquire whose answer was lost) go now rather than at the lease's end.
impl Drop for Shared {
    fn drop(&mut self) {
        for (_, watch) in self.announcers.lock().drain() {
            watch.abort();
        }
        let leases = self.leases.granted();
        if leases.is_empty() {
            return;
        }
        let mut client = self.client.lease_client();
        let timeout = self.request_timeout;
        crate::background::spawn(async move {
            for lease in leases {
                let _ = tokio::time::timeout(timeout, client.revoke(lease)).await;
            }
        });
    }
}

/// One of our contender keys: its create revision (the fence, and the proof that the key is
/// still the one we created), the lease length it is bound to, and the watch of the contender
/// ahead of it while it waits.
#[derive(Debug)]
struct Contender {
    create_revision: i64,
    ttl: u64,
    lease_id: i64,
    /// While it waits, the watch of the contender ahead of it; held without the watchdog, the
    /// task that ends it at its lease (see `unrenewed`).
    watch: Option<tokio::task::JoinHandle<()>>,
    /// When a lock held without the watchdog ends (moved on by each `extend`).
    ends: Option<tokio::time::Instant>,
    /// The generation of this waiter's latest attempt whose keepalive was confirmed (0: none):
    /// the lease runs at least a lock's lease from that attempt, so a handover may name it.
    turn: Arc<std::sync::atomic::AtomicU64>,
    /// The key's value while its stamp says "queued" (see `backend::stamp`): rewritten "held"
    /// once the key holds the lock.
    queued: Option<Vec<u8>>,
}

impl Drop for Contender {
    fn drop(&mut self) {
        if let Some(watch) = self.watch.take() {
            watch.abort();
        }
    }
}

/// Connects an [`EtcdBackend`] with options: timeouts, a key namespace, user auth.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use std::time::Duration;
/// let backend = lock_core::EtcdBackend::builder(&["http://127.0.0.1:2379"])
///     .request_timeout(Duration::from_millis(500))
///     .namespace("billing/")
///     .connect()
///     .await?;
/// # drop(backend); Ok(()) }
/// ```
#[derive(Clone)]
pub struct EtcdBackendBuilder {
    endpoints: Vec<String>,
    connect_timeout: Duration,
    request_timeout: Duration,
    namespace: String,
    auth: Option<(String, String)>,
    #[cfg(feature = "etcd-tls")]
    tls: Option<Tls>,
}

/// The TLS settings of a builder: the authority the members' certificates are checked
/// against, and this client's own certificate and key, when the members ask for one.
#[cfg(feature = "etcd-tls")]
#[derive(Clone)]
struct Tls {
    ca_pem: Vec<u8>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
}

/// Never the password.
impl std::fmt::Debug for EtcdBackendBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBackendBuilder")
            .field("endpoints", &self.endpoints.len())
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("auth", &self.auth.is_some())
            .finish_non_exhaustive()
    }
}

impl EtcdBackendBuilder {
    /// Bound on connecting (and checking that a member answers). Default 2 s.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let b = lock_core::EtcdBackend::builder(&["http://127.0.0.1:2379"])
    ///     .connect_timeout(Duration::from_secs(1));
    /// # drop(b);
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Bound on every request (a transaction, a keepalive, a grant). Default 2 s. A renewal
    /// without an answer in time is retried while the lease is still locally valid.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let b = lock_core::EtcdBackend::builder(&["http://127.0.0.1:2379"])
    ///     .request_timeout(Duration::from_millis(500));
    /// # drop(b);
    /// ```
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Put before every etcd key this backend writes (default: none), to keep the locks of
    /// one application apart from other data, or to grant a role access to them alone.
    ///
    /// ```
    /// let b = lock_core::EtcdBackend::builder(&["http://127.0.0.1:2379"]).namespace("app/");
    /// # drop(b);
    /// ```
    pub fn namespace(mut self, namespace: &str) -> Self {
        namespace.clone_into(&mut self.namespace);
        self
    }

    /// Authenticates as an etcd user (etcd with `auth enable`): its role needs read and write
    /// on the namespace's keys.
    ///
    /// ```
    /// let b = lock_core::EtcdBackend::builder(&["http://127.0.0.1:2379"]).auth("locks", "secret");
    /// # drop(b);
    /// ```
    pub fn auth(mut self, user: &str, password: &str) -> Self {
        self.auth = Some((user.to_owned(), password.to_owned()));
        self
    }

    /// Connects over TLS (feature `etcd-tls`; give `https://` endpoints): the members'
    /// certificates are checked against `ca_pem` (PEM, the authority that signed them), and
    /// their names against the endpoints' hosts.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let ca = std::fs::read("/etc/etcd/ca.pem").unwrap();
    /// let backend = lock_core::EtcdBackend::builder(&["https://10.0.0.1:2379"])
    ///     .tls(&ca)
    ///     .connect()
    ///     .await?;
    /// # drop(backend); Ok(()) }
    /// ```
    #[cfg(feature = "etcd-tls")]
    pub fn tls(mut self, ca_pem: &[u8]) -> Self {
        let identity = self.tls.take().and_then(|t| t.identity);
        self.tls = Some(Tls {
            ca_pem: ca_pem.to_vec(),
            identity,
        });
        self
    }

    /// With [`tls`](Self::tls): this client's certificate and private key (PEM), for members
    /// that check client certificates (`--client-cert-auth`).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let read = |p: &str| std::fs::read(p).unwrap();
    /// let backend = lock_core::EtcdBackend::builder(&["https://10.0.0.1:2379"])
    ///     .tls(&read("/etc/etcd/ca.pem"))
    ///     .tls_identity(&read("/etc/etcd/client.pem"), &read("/etc/etcd/client-key.pem"))
    ///     .connect()
    ///     .await?;
    /// # drop(backend); Ok(()) }
    /// ```
    #[cfg(feature = "etcd-tls")]
    pub fn tls_identity(mut self, cert_pem: &[u8], key_pem: &[u8]) -> Self {
        let tls = self.tls.get_or_insert_with(|| Tls {
            ca_pem: Vec::new(),
            identity: None,
        });
        tls.identity = Some((cert_pem.to_vec(), key_pem.to_vec()));
        self
    }

    /// Connects, and checks that the cluster answers a linearizable read within the connect
    /// timeout.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for no endpoint or a timeout out of range,
    /// [`LockError::Backend`] when no member answers (or the credentials are refused).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let backend = lock_core::EtcdBackend::builder(&["http://127.0.0.1:2379"]).connect().await?;
    /// # drop(backend); Ok(()) }
    /// ```
    pub async fn connect(self) -> Result<EtcdBackend, LockError> {
        validate_timeouts(
            "the etcd connect and request timeouts",
            &[self.connect_timeout, self.request_timeout],
        )?;
        if self.endpoints.is_empty() {
            return Err(LockError::config("no etcd endpoint given"));
        }
        let mut options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(self.connect_timeout)
            .with_timeout(self.request_timeout)
            // A member without a leader answers watches and keepalives with an error rather
            // than silence.
            .with_require_leader(true)
            // HTTP/2 pings find a connection to a member that vanished without a word; etcd
            // sends GOAWAY to a client pinging more often than every 5 s.
            .with_keep_alive(PING_INTERVAL, self.request_timeout);
        if let Some((user, password)) = &self.auth {
            // etcd's auth tokens expire (simple tokens after 5 idle minutes): a request that
            // finds its token expired gets a new one and is sent again.
            options = options
                .with_user(user.clone(), password.clone())
                .with_auto_token_refresh(true);
        }
        #[cfg(feature = "etcd-tls")]
        if let Some(tls) = &self.tls {
            if tls.ca_pem.is_empty() {
                return Err(LockError::config(
                    "tls_identity needs tls(ca_pem): the authority the members are checked against",
                ));
            }
            let mut config = etcd_client::TlsOptions::new()
                .ca_certificate(etcd_client::Certificate::from_pem(&tls.ca_pem));
            if let Some((cert, key)) = &tls.identity {
                config = config.identity(etcd_client::Identity::from_pem(cert, key));
            }
            options = options.with_tls(config);
        }
        let connecting = Client::connect(&self.endpoints, Some(options));
        let mut client = match tokio::time::timeout(self.connect_timeout, connecting).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => return Err(LockError::backend("connect", None, e)),
            Err(_) => return Err(timed_out("connect", None)),
        };
        // The channel connects lazily: one linearizable read proves a quorum answers.
        let probe = client.get(
            format!("{}lock", self.namespace),
            Some(etcd_client::GetOptions::new().with_count_only()),
        );
        match tokio::time::timeout(self.connect_timeout, probe).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(LockError::backend("connect", None, e)),
            Err(_) => return Err(timed_out("connect", None)),
        }
        let leases = Leases::new(client.clone(), self.request_timeout);
        Ok(EtcdBackend {
            inner: Arc::new(Shared {
                client,
                namespace: self.namespace,
                request_timeout: self.request_timeout,
                listeners: Arc::default(),
                contenders: Mutex::default(),
                leases,
                orphans: sweep::Orphans::default(),
                announcers: Mutex::default(),
                seen_revision: std::sync::atomic::AtomicI64::new(0),
                fair_heard: std::sync::atomic::AtomicU64::new(0),
            }),
        })
    }
}

impl EtcdBackend {
    /// Connects to an etcd cluster with default options (see [`builder`](Self::builder)):
    /// `endpoints` are some of its members' client URLs (`http://host:2379`).
    ///
    /// # Errors
    /// As [`EtcdBackendBuilder::connect`].
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let backend = lock_core::EtcdBackend::connect(&["http://127.0.0.1:2379"]).await?;
    /// # drop(backend); Ok(()) }
    /// ```
    pub async fn connect(endpoints: &[&str]) -> Result<Self, LockError> {
        Self::builder(endpoints).connect().await
    }

    /// A builder for a backend on `endpoints`, to set timeouts, a namespace or credentials.
    ///
    /// ```
    /// let builder = lock_core::EtcdBackend::builder(&["http://127.0.0.1:2379"]);
    /// # drop(builder);
    /// ```
    pub fn builder(endpoints: &[&str]) -> EtcdBackendBuilder {
        EtcdBackendBuilder {
            endpoints: endpoints.iter().map(|e| (*e).to_owned()).collect(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            namespace: String::new(),
            auth: None,
            #[cfg(feature = "etcd-tls")]
            tls: None,
        }
    }

    /// The etcd key prefix of `key`'s contenders: `N K/q/`.
    fn queue_prefix(&self, key: &LockKey) -> String {
        format!("{}{}/q/", self.inner.namespace, key.name())
    }

    /// Our contender key for `key` and `token`: `N K/q/<token>`.
    fn contender_key(&self, key: &LockKey, token: &Token) -> String {
        format!(
            "{}{}/q/{}",
            self.inner.namespace,
            key.name(),
            token.as_str()
        )
    }

    /// The idempotency record of `key`: `N K/result`.
    fn record_key(&self, key: &LockKey) -> String {
        format!("{}{}/result", self.inner.namespace, key.name())
    }

    /// Runs `request` within the request timeout.
    async fn bounded<T>(
        &self,
        operation: &'static str,
        key: Option<&LockKey>,
        request: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, LockError> {
        bounded(self.inner.request_timeout, operation, key, request).await
    }
}

impl EtcdBackend {
    /// Runs transaction `txn` within the request timeout, sent again once after a transport
    /// failure (see [`retried`]).
    async fn txn(
        &self,
        operation: &'static str,
        key: Option<&LockKey>,
        txn: Txn,
    ) -> Result<TxnResponse, LockError> {
        Ok(self.txn_sent(operation, key, txn).await?.0)
    }

    /// [`txn`](Self::txn), and whether the answer is to a transaction sent again: then the
    /// first one may have been applied too (its answer lost with the connection).
    async fn txn_sent(
        &self,
        operation: &'static str,
        key: Option<&LockKey>,
        txn: Txn,
    ) -> Result<(TxnResponse, bool), LockError> {
        let client = &self.inner.client;
        let mut sent = 0;
        let answer = retried(self.inner.request_timeout, operation, key, || {
            sent += 1;
            let (mut kv, txn) = (client.kv_client(), txn.clone());
            async move { kv.txn(txn).await }
        })
        .await?;
        if let Some(header) = answer.header() {
            self.inner
                .seen_revision
                .fetch_max(header.revision(), std::sync::atomic::Ordering::AcqRel);
        }
        Ok((answer, sent > 1))
    }
}

/// Runs the request `send` makes within `timeout`, as [`bounded`]; after a transport failure
/// (a connection found dropped or refused: a member restarted, a link came back), sends it
/// again after a short pause, at most twice and within the same bound, which the client may
/// route to another member or a new connection (a connection that dropped can fail the request
/// in flight and one sent before the client saw it close). For requests safe to send twice
/// only: every one of this backend's is (an acquire is keyed by its token and finds its own
/// key, a delete compares the key's create revision, keepalives and reads change nothing; a
/// lease granted twice leaves one unused, which ends on its own).
async fn retried<T, F>(
    timeout: Duration,
    operation: &'static str,
    key: Option<&LockKey>,
    mut send: impl FnMut() -> F,
) -> Result<T, LockError>
where
    F: Future<Output = Result<T, etcd_client::Error>>,
{
    const PAUSES: [Duration; 2] = [Duration::from_millis(10), Duration::from_millis(50)];
    let deadline = tokio::time::Instant::now() + timeout;
    let user = key.map(LockKey::user);
    let mut pauses = PAUSES.iter();
    loop {
        let failed = match tokio::time::timeout_at(deadline, send()).await {
            Ok(Ok(answer)) => return Ok(answer),
            Ok(Err(e)) => e,
            Err(_) => return Err(timed_out(operation, user)),
        };
        match pauses.next() {
            Some(pause) if transport_failure(&failed) => {
                tracing::debug!(operation, error = %failed, "etcd request failed in transport; sending it again");
                tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + *pause)).await;
            }
            _ => return Err(LockError::backend(operation, user, failed)),
        }
    }
}

/// Whether `e` says the request failed on its way (no connection, a connection that broke),
/// rather than that etcd refused it.
fn transport_failure(e: &etcd_client::Error) -> bool {
    /// gRPC's codes for a call cut short: CANCELLED, UNKNOWN (a broken HTTP/2 stream),
    /// UNAVAILABLE (no connection).
    const CUT_SHORT: [i32; 3] = [1, 2, 14];
    match e {
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        etcd_client::Error::GRpcStatus(status) => CUT_SHORT.contains(&i32::from(status.code())),
        _ => false,
    }
}

/// Runs `request` within `timeout`: a late or failed answer is a [`LockError::Backend`].
async fn bounded<T>(
    timeout: Duration,
    operation: &'static str,
    key: Option<&LockKey>,
    request: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, LockError> {
    let user = key.map(LockKey::user);
    match tokio::time::timeout(timeout, request).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(e)) => Err(LockError::backend(operation, user, e)),
        Err(_) => Err(timed_out(operation, user)),
    }
}

fn timed_out(operation: &'static str, key: Option<&str>) -> LockError {
    LockError::backend(
        operation,
        key,
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "etcd did not answer within the request timeout",
        ),
    )
}

/// The etcd lease length, in whole seconds, behind a lock of `lease`: rounded up, plus one
/// second, so that an acquire covered by a keepalive sent less than a second before it needs no
/// keepalive of its own. `None` below [`ETCD_MIN_LEASE`] or above [`MAX_LEASE`](crate::MAX_LEASE)
/// (the trait is public: a caller other than the engine may ask for `Duration::MAX`).
fn lease_ttl(lease: Duration) -> Option<u64> {
    if !(ETCD_MIN_LEASE..=crate::MAX_LEASE).contains(&lease) {
        return None;
    }
    let secs = lease.as_secs() + u64::from(lease.subsec_nanos() > 0);
    Some(secs + 1)
}

fn lease_refused(lease: Duration) -> LockError {
    if lease > crate::MAX_LEASE {
        return LockError::config(format!(
            "lease {lease:?} is above the maximum of {:?}",
            crate::MAX_LEASE
        ));
    }
    LockError::config(format!(
        "lease {lease:?} is below the etcd backend's floor of {ETCD_MIN_LEASE:?} (etcd counts leases in whole seconds, with a floor of its own)"
    ))
}

super::consensus_backend!(EtcdBackend, "etcd", |this| this
    .inner
    .leases
    .reconnects
    .subscribe());

#[cfg(test)]
mod tests;
