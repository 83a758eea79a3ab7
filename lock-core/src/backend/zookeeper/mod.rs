//! The ZooKeeper backend: locks on a ZooKeeper ensemble, after Apache Curator's
//! `InterProcessMutex` recipe, made safe for retries.
//!
//! Under the backend's root `R` and a lock's name `K` ([`LockKey::name`], escaped into one
//! node name):
//! - `R/K`: a container node (ZooKeeper deletes it once its last child is gone), holding
//! - `R/K/q-<token>-<sequence>` (`f-` for a fair waiter, `t-` for a single attempt, deleted
//!   before it answers unless it holds): one ephemeral sequential node per contender, of this
//!   backend's session. The holder is the contender with the lowest
//!   sequence; its czxid (the zxid that created it, epoch and counter) is the fence: strictly
//!   increasing per lock across leader elections and restarts of the ensemble. The token is in
//!   the name, so a create whose answer was lost is found on retry (Curator's "protected"
//!   mode, ZOOKEEPER-1262). Its data is the taker's stamp (identity, lease, since when it holds
//!   or queues: `backend::stamp`), for `inspect`.
//! - `R/K/result`: the idempotency record, a TTL node written in a multi-op that checks our
//!   contender node still exists.
//!
//! The session is the lease: one per backend, kept by the client's pings; the watchdog's
//! renewal reads every held node in one multi-read. A lock's lease may be at most three
//! quarters of the session timeout the ensemble granted, so that a holder's local deadline
//! (counted from the last confirmed renewal) ends before the session can expire.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use zookeeper_client as zk;

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
mod lock;
mod record;
mod session;

use session::Sessions;

const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(40);
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
const DEFAULT_ROOT: &str = "/lock-core";
/// ZooKeeper's default `jute.maxbuffer`: the largest request a server reads (1 MiB less a byte).
const DEFAULT_MAX_REQUEST: usize = 0xf_ffff;
/// What a record's request carries besides its value: paths, ACLs, the check, headers.
const REQUEST_OVERHEAD: usize = 4096;

/// Locks on a ZooKeeper ensemble: an ephemeral sequential node per contender under the lock's
/// container node, the holder being the lowest; fences from the holder node's czxid; FIFO
/// waiting, each waiter watching only the node just ahead of it; one session per backend as
/// the lease of every lock on it.
///
/// Every lock request may be fenced and fair. A lock's lease may be at most three quarters of
/// the session timeout the ensemble granted ([`session_timeout`](Self::session_timeout)):
/// a longer one is refused with [`LockError::InvalidConfig`]. A holder that dies frees its
/// locks when its session expires (the session timeout, whatever the lease); a lock taken
/// with `watchdog(false)` ends at its lease.
///
/// Operators may [`inspect`](crate::Locker::inspect), [`list`](crate::Locker::list) and
/// [`force_unlock`](crate::Locker::force_unlock) its locks: the fence shown is the holder
/// node's czxid (none once the lock is free: nothing keeps it), `remaining` is the lease the
/// holder took the lock with (nothing in ZooKeeper counts it down; a dead holder's node lasts
/// until its session expires), and `held_for` is counted from the taker's clock (see the
/// guide's "Operating it" chapter). Listing reads the root's children whole (ZooKeeper does
/// not page them), then 100 locks at a time.
///
/// Clones share the session and the remembered acquisitions.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use lock_core::{Locker, ZooKeeperBackend};
///
/// let backend = ZooKeeperBackend::connect("127.0.0.1:2181,127.0.0.1:2182").await?;
/// let locker = Locker::builder(backend).build();
/// let guard = locker.lock("order:42").fenced().await?;
/// assert!(guard.fence().is_some());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ZooKeeperBackend {
    inner: Arc<Shared>,
}

/// Counts only: node names hold tokens, which have no place in logs.
impl std::fmt::Debug for ZooKeeperBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZooKeeperBackend")
            .field("contenders", &self.inner.contenders.lock().len())
            .field("root", &self.inner.root)
            .field("request_timeout", &self.inner.request_timeout)
            .finish_non_exhaustive()
    }
}

struct Shared {
    sessions: Sessions,
    root: String,
    /// Nodes are created readable and writable by their creator alone when the backend
    /// authenticates, by anyone otherwise.
    creator_only: bool,
    request_timeout: Duration,
    /// The largest request the servers read (`jute.maxbuffer`).
    max_request: usize,
    listeners: Arc<Mutex<Listeners>>,
    /// Our contender nodes, by lock name and token.
    contenders: Mutex<HashMap<String, Contender>>,
    /// The watch announcing fair waiters, per lock with listeners here (see `announce`).
    announcers: Mutex<HashMap<String, tokio::task::JoinHandle<()>>>,
    /// Fair waiters announced to this process's listeners.
    fair_heard: std::sync::atomic::AtomicU64,
}

impl Drop for Shared {
    fn drop(&mut self) {
        for (_, watch) in self.announcers.lock().drain() {
            watch.abort();
        }
    }
}

impl Shared {
    fn acls(&self) -> zk::Acls<'static> {
        if self.creator_only {
            zk::Acls::creator_all()
        } else {
            zk::Acls::anyone_all()
        }
    }
}

/// One of our contender nodes: its path, czxid (the fence, and the proof that the node is
/// the one we created) and session, and what runs for it.
#[derive(Debug)]
struct Contender {
    path: String,
    czxid: i64,
    session: i64,
    /// While it waits, the watch of the node ahead of it; held without the watchdog, the task
    /// that ends it at its lease.
    watch: Option<tokio::task::JoinHandle<()>>,
    /// When a lock held without the watchdog ends (moved on by each `extend`).
    ends: Option<tokio::time::Instant>,
    /// The generation of this waiter's latest answered attempt (0: none): its session was
    /// alive then, so a handover may name it.
    turn: Arc<std::sync::atomic::AtomicU64>,
    /// The node's data as created (its stamp, see `backend::stamp`) until it is known to hold
    /// the lock: then rewritten "held since" when the stamp does not say so already.
    written: Option<Vec<u8>>,
}

impl Drop for Contender {
    fn drop(&mut self) {
        if let Some(watch) = self.watch.take() {
            watch.abort();
        }
    }
}

/// Connects a [`ZooKeeperBackend`] with options: the session timeout, the root node,
/// timeouts, digest auth.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use std::time::Duration;
/// let backend = lock_core::ZooKeeperBackend::builder("127.0.0.1:2181")
///     .session_timeout(Duration::from_secs(20))
///     .root("/billing/locks")
///     .connect()
///     .await?;
/// # drop(backend); Ok(()) }
/// ```
#[derive(Clone)]
pub struct ZooKeeperBackendBuilder {
    hosts: String,
    session_timeout: Duration,
    connect_timeout: Duration,
    request_timeout: Duration,
    root: String,
    auth: Option<(String, String)>,
    max_request: usize,
}

/// Never the password.
impl std::fmt::Debug for ZooKeeperBackendBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZooKeeperBackendBuilder")
            .field("hosts", &self.hosts)
            .field("session_timeout", &self.session_timeout)
            .field("root", &self.root)
            .field("auth", &self.auth.is_some())
            .finish_non_exhaustive()
    }
}

impl ZooKeeperBackendBuilder {
    /// The session timeout asked of the ensemble (default 40 s, the most a server grants with
    /// its default settings; it grants between 2 and 20 of its ticks unless configured
    /// otherwise). Locks' leases may be at most three quarters of the timeout granted, and a
    /// holder that dies frees its locks when its session expires.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let b = lock_core::ZooKeeperBackend::builder("127.0.0.1:2181")
    ///     .session_timeout(Duration::from_secs(10));
    /// # drop(b);
    /// ```
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// Bound on connecting (a session established). Default 5 s.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let b = lock_core::ZooKeeperBackend::builder("127.0.0.1:2181")
    ///     .connect_timeout(Duration::from_secs(2));
    /// # drop(b);
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Bound on every request. Default 5 s. (While the client reconnects to another server,
    /// requests wait for it.)
    ///
    /// ```
    /// # use std::time::Duration;
    /// let b = lock_core::ZooKeeperBackend::builder("127.0.0.1:2181")
    ///     .request_timeout(Duration::from_secs(1));
    /// # drop(b);
    /// ```
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The node under which every lock lives (default `/lock-core`), created if missing.
    ///
    /// ```
    /// let b = lock_core::ZooKeeperBackend::builder("127.0.0.1:2181").root("/app/locks");
    /// # drop(b);
    /// ```
    pub fn root(mut self, root: &str) -> Self {
        root.trim_end_matches('/').clone_into(&mut self.root);
        self
    }

    /// Authenticates with ZooKeeper's `digest` scheme as `user`: every node this backend
    /// creates is then readable and writable by that user alone (`creator_all` ACLs).
    ///
    /// ```
    /// let b = lock_core::ZooKeeperBackend::builder("127.0.0.1:2181").auth("locks", "secret");
    /// # drop(b);
    /// ```
    pub fn auth(mut self, user: &str, password: &str) -> Self {
        self.auth = Some((user.to_owned(), password.to_owned()));
        self
    }

    /// The largest request the servers read: their `jute.maxbuffer` (default 1 MiB less a
    /// byte, ZooKeeper's own default). An idempotency record is one node written in one
    /// request: a result that would not fit is refused with [`LockError::InvalidConfig`]
    /// rather than sent (a server drops the connection of a request too large). Raise both
    /// the servers' `-Djute.maxbuffer` and this for results near
    /// [`MAX_RESULT_LEN`](crate::MAX_RESULT_LEN).
    ///
    /// ```
    /// let b = lock_core::ZooKeeperBackend::builder("127.0.0.1:2181").max_request(4 << 20);
    /// # drop(b);
    /// ```
    pub fn max_request(mut self, bytes: usize) -> Self {
        self.max_request = bytes;
        self
    }

    /// Connects (a session established within the connect timeout) and creates the root node
    /// if it is missing.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for no host, a root that is not an absolute node path, or
    /// a timeout out of range; [`LockError::Backend`] when no server answers in time or the
    /// root cannot be created (no permission).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let backend = lock_core::ZooKeeperBackend::builder("127.0.0.1:2181").connect().await?;
    /// # drop(backend); Ok(()) }
    /// ```
    pub async fn connect(self) -> Result<ZooKeeperBackend, LockError> {
        validate_timeouts(
            "the ZooKeeper session, connect and request timeouts",
            &[
                self.session_timeout,
                self.connect_timeout,
                self.request_timeout,
            ],
        )?;
        if self.hosts.trim().is_empty() {
            return Err(LockError::config("no ZooKeeper host given"));
        }
        if !self.root.starts_with('/') || self.root.len() < 2 || self.root.contains("//") {
            return Err(LockError::config(format!(
                "ZooKeeper root {:?} is not an absolute node path (like \"/locks\")",
                self.root
            )));
        }
        let creator_only = self.auth.is_some();
        let sessions = Sessions::new(session::Settings {
            hosts: self.hosts,
            session_timeout: self.session_timeout,
            connect_timeout: self.connect_timeout,
            auth: self.auth,
        });
        let backend = ZooKeeperBackend {
            inner: Arc::new(Shared {
                sessions,
                root: self.root,
                creator_only,
                request_timeout: self.request_timeout,
                max_request: self.max_request,
                listeners: Arc::default(),
                contenders: Mutex::default(),
                announcers: Mutex::default(),
                fair_heard: std::sync::atomic::AtomicU64::new(0),
            }),
        };
        let session = backend.inner.sessions.current().await?;
        let acls = backend.inner.acls();
        let options = zk::CreateMode::Persistent.with_acls(acls);
        let made = session.client.mkdir(&backend.inner.root, &options);
        backend.bounded("create the root", None, made).await?;
        Ok(backend)
    }
}

impl ZooKeeperBackend {
    /// Connects to a ZooKeeper ensemble with default options (see [`builder`](Self::builder)):
    /// `hosts` is a connect string, `host:port` pairs separated by commas.
    ///
    /// # Errors
    /// As [`ZooKeeperBackendBuilder::connect`].
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let backend = lock_core::ZooKeeperBackend::connect("127.0.0.1:2181").await?;
    /// # drop(backend); Ok(()) }
    /// ```
    pub async fn connect(hosts: &str) -> Result<Self, LockError> {
        Self::builder(hosts).connect().await
    }

    /// A builder for a backend on `hosts` (a connect string), to set the session timeout, the
    /// root node, timeouts or credentials.
    ///
    /// ```
    /// let builder = lock_core::ZooKeeperBackend::builder("127.0.0.1:2181,127.0.0.1:2182");
    /// # drop(builder);
    /// ```
    pub fn builder(hosts: &str) -> ZooKeeperBackendBuilder {
        ZooKeeperBackendBuilder {
            hosts: hosts.to_owned(),
            session_timeout: DEFAULT_SESSION_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            root: DEFAULT_ROOT.to_owned(),
            auth: None,
            max_request: DEFAULT_MAX_REQUEST,
        }
    }

    /// The session timeout the ensemble granted the current session.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let backend = lock_core::ZooKeeperBackend::connect("127.0.0.1:2181").await?;
    /// println!("sessions last {:?}", backend.session_timeout());
    /// # Ok(()) }
    /// ```
    pub fn session_timeout(&self) -> Duration {
        self.inner.sessions.granted()
    }

    /// The container node of `key`: `R/K`, with `K` escaped into one node name.
    fn lock_path(&self, key: &LockKey) -> String {
        format!("{}/{}", self.inner.root, escape(key.name()))
    }

    /// Where our contender for `key` and `token` is remembered.
    fn contender_id(key: &LockKey, token: &Token) -> String {
        format!("{}\n{}", key.name(), token.as_str())
    }

    /// Runs `request` within the request timeout.
    async fn bounded<T>(
        &self,
        operation: &'static str,
        key: Option<&LockKey>,
        request: impl Future<Output = Result<T, zk::Error>>,
    ) -> Result<T, LockError> {
        let user = key.map(LockKey::user);
        match self.within(request).await {
            Some(Ok(answer)) => Ok(answer),
            Some(Err(e)) => Err(backend_error(operation, user, e)),
            None => Err(timed_out(operation, user)),
        }
    }

    /// Runs `request` within the request timeout: `None` when it did not answer in time.
    async fn within<T, E>(
        &self,
        request: impl Future<Output = Result<T, E>>,
    ) -> Option<Result<T, E>> {
        tokio::time::timeout(self.inner.request_timeout, request)
            .await
            .ok()
    }

    /// Refuses a lease the session granted `granted` cannot vouch for.
    fn check_lease(&self, lease: Duration, granted: Duration) -> Result<(), LockError> {
        let most = max_lease(granted);
        if lease.is_zero() || lease > most {
            return Err(LockError::config(format!(
                "lease {lease:?} is out of range for this ZooKeeper session: above zero and at most {most:?}, three quarters of the session timeout the ensemble granted (ask for a longer session_timeout, within the servers' maxSessionTimeout)"
            )));
        }
        Ok(())
    }
}

/// The longest lease a session of `granted` vouches for: three quarters of it. A follower
/// that answers a renewal tells the leader of the session's activity on its next ping; the
/// quarter covers a follower cut off from the leader in between (it stops serving within its
/// sync limit, a few ticks, where the session is at least two).
fn max_lease(granted: Duration) -> Duration {
    granted / 4 * 3
}

/// `name` as one ZooKeeper node name: bytes outside `[A-Za-z0-9_:{}@=,+-]` (a `/` would make a
/// child, `.` and `..` are refused, control and some Unicode ranges are not allowed) as `%XX`.
fn escape(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b"_:{}@=,+-".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn backend_error(operation: &'static str, key: Option<&str>, e: zk::Error) -> LockError {
    if matches!(e, zk::Error::NoAuth | zk::Error::AuthFailed) {
        return LockError::config(format!(
            "ZooKeeper refused to {operation}: {e} (the backend's credentials lack a permission on its nodes)"
        ));
    }
    LockError::backend(operation, key, e)
}

fn timed_out(operation: &'static str, key: Option<&str>) -> LockError {
    LockError::backend(
        operation,
        key,
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "ZooKeeper did not answer within the request timeout",
        ),
    )
}

super::consensus_backend!(ZooKeeperBackend, "zookeeper", |this| this
    .inner
    .sessions
    .reconnects());

#[cfg(test)]
mod tests;
