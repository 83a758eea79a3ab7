//! Connecting: [`RedlockBackendBuilder`], and each server's connection, made at connect or
//! later in the background when the server was down.

use std::collections::HashSet;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

#[cfg(doc)]
use super::{DEFAULT_SERVER_TIMEOUT, NoQuorum};
use super::{Inner, RedlockBackend, Server, Settings};
use crate::LockError;
use crate::backend::redis::{Keyspace, RedisBackend};
use crate::background;
use crate::sync::Mutex;

/// Options for connecting a [`RedlockBackend`].
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use std::time::Duration;
/// let backend = lock_core::RedlockBackend::builder(&["redis://a/", "redis://b/", "redis://c/"])
///     .connect_timeout(Duration::from_secs(1))
///     .server_timeout(Duration::from_millis(50))
///     .connect()
///     .await?;
/// # drop(backend); Ok(()) }
/// ```
#[must_use]
pub struct RedlockBackendBuilder {
    pub(super) urls: Vec<String>,
    pub(super) settings: Settings,
}

impl std::fmt::Debug for RedlockBackendBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedlockBackendBuilder")
            .field("servers", &self.urls.len())
            .field("connect_timeout", &self.settings.connect_timeout)
            .field("response_timeout", &self.settings.response_timeout)
            .field("server_timeout", &self.settings.server_timeout)
            .field("tls", &self.settings.tls)
            .finish_non_exhaustive()
    }
}

impl RedlockBackendBuilder {
    /// Bound on establishing (and re-establishing) a connection to one server. Default 2 s.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let b = lock_core::RedlockBackend::builder(&["redis://a/"]).connect_timeout(Duration::from_secs(1));
    /// # drop(b);
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.settings.connect_timeout = timeout;
        self
    }

    /// Bound on one server's answer to a release, a result store or read, a subscription.
    /// Default 2 s. Calls wait for a quorum, not for every server: a stalled minority does
    /// not slow them.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let b = lock_core::RedlockBackend::builder(&["redis://a/"]).response_timeout(Duration::from_millis(500));
    /// # drop(b);
    /// ```
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.settings.response_timeout = timeout;
        self
    }

    /// Bound on one server's answer to an acquire or a renewal: a server that has not
    /// answered by then counts as down for that call. Default: a tenth of the lease, at most
    /// [`DEFAULT_SERVER_TIMEOUT`]; never more than half the lease. Keep it well under the
    /// lease: it is time taken from the lock's validity when servers are slow.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let b = lock_core::RedlockBackend::builder(&["redis://a/"]).server_timeout(Duration::from_millis(50));
    /// # drop(b);
    /// ```
    pub fn server_timeout(mut self, timeout: Duration) -> Self {
        self.settings.server_timeout = Some(timeout);
        self
    }

    /// Checks every server's certificate against `ca_pem` (PEM: the authority that signed
    /// them), instead of the public roots compiled in (feature `tls`; give `rediss://` URLs),
    /// as [`RedisBackendBuilder::tls`](crate::RedisBackendBuilder::tls) does for one server.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let ca = std::fs::read("/etc/redis/tls/ca.crt").unwrap();
    /// let backend = lock_core::RedlockBackend::builder(&["rediss://a:6380/", "rediss://b:6380/", "rediss://c:6380/"])
    ///     .tls(&ca)
    ///     .connect()
    ///     .await?;
    /// # drop(backend); Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls(mut self, ca_pem: &[u8]) -> Self {
        Arc::make_mut(&mut self.settings.tls).set_ca(ca_pem);
        self
    }

    /// Presents this client certificate and its private key (PEM) to every server, for
    /// servers that check clients' certificates (`tls-auth-clients yes`; feature `tls`,
    /// `rediss://` URLs).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let read = |p: &str| std::fs::read(p).unwrap();
    /// let backend = lock_core::RedlockBackend::builder(&["rediss://a:6380/", "rediss://b:6380/", "rediss://c:6380/"])
    ///     .tls(&read("/etc/redis/tls/ca.crt"))
    ///     .tls_identity(&read("/etc/redis/tls/client.crt"), &read("/etc/redis/tls/client.key"))
    ///     .connect()
    ///     .await?;
    /// # drop(backend); Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls_identity(mut self, cert_pem: &[u8], key_pem: &[u8]) -> Self {
        Arc::make_mut(&mut self.settings.tls).set_identity(cert_pem, key_pem);
        self
    }

    /// Connects to every server at once. Needs a quorum of them to answer; the others are
    /// connected in the background and join when they answer.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for no URLs, the same URL twice, one server under two URLs
    /// (found by a probe key, see [`RedlockBackend`]), a malformed URL, zero timeouts, or TLS
    /// certificates that do not parse or come with a URL that is not `rediss://`;
    /// [`LockError::Backend`] with a [`NoQuorum`] source when fewer than a quorum of servers
    /// could be reached (a server that refuses the TLS handshake is one that could not: the
    /// reason is logged, and it is tried again in the background); its count of the servers
    /// that answered includes those that answer within the connect timeout after enough others
    /// refused.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let backend = lock_core::RedlockBackend::builder(&["redis://a/", "redis://b/", "redis://c/"])
    ///     .connect()
    ///     .await?;
    /// # drop(backend); Ok(()) }
    /// ```
    pub async fn connect(self) -> Result<RedlockBackend, LockError> {
        let Settings {
            connect_timeout,
            response_timeout,
            server_timeout,
            tls: _,
        } = self.settings.clone();
        crate::backend::validate_timeouts(
            "Redlock connect, response and server timeouts",
            &[
                connect_timeout,
                response_timeout,
                server_timeout.unwrap_or(connect_timeout),
            ],
        )?;
        if self.urls.is_empty() {
            return Err(LockError::config(
                "a Redlock backend needs the URL of at least one server",
            ));
        }
        let distinct: HashSet<&str> = self.urls.iter().map(|u| u.trim_end_matches('/')).collect();
        if distinct.len() != self.urls.len() {
            return Err(LockError::config(
                "the same Redlock server URL is given twice: the servers must be independent",
            ));
        }
        let n = self.urls.len();
        let (reconnects, _) = watch::channel(0);
        let inner = Arc::new(Inner {
            servers: (0..n)
                .map(|_| Server {
                    backend: OnceLock::new(),
                })
                .collect(),
            quorum: n / 2 + 1,
            settings: self.settings.clone(),
            reconnects,
            stragglers: Mutex::default(),
            taking_back: Mutex::default(),
            joining: tokio::sync::Mutex::new(()),
        });
        let backend = RedlockBackend { inner };
        // Every server is connected by a task of its own, which reports its first outcome and,
        // when the server did not answer, goes on trying in the background. The backend is
        // ready once a majority is connected: a stalled minority does not hold it up.
        let (outcomes, mut first) = tokio::sync::mpsc::unbounded_channel();
        for (i, url) in self.urls.iter().enumerate() {
            let (inner, url, settings) = (
                Arc::downgrade(&backend.inner),
                url.clone(),
                self.settings.clone(),
            );
            let outcomes = outcomes.clone();
            background::spawn(async move {
                match connect_one(url.clone(), settings).await {
                    Ok(b) => {
                        let _ = outcomes.send(Outcome::Connected);
                        let joined = match inner.upgrade() {
                            Some(inner) => join(&inner, i, b).await,
                            None => Joined::Yes,
                        };
                        match joined {
                            Joined::Yes => {
                                let _ = outcomes.send(Outcome::Joined(Ok(())));
                            }
                            Joined::Double(e) => {
                                let _ = outcomes.send(Outcome::Joined(Err(e)));
                            }
                            Joined::NotYet => {
                                let _ = outcomes.send(Outcome::Unchecked);
                                connect_later(inner, i, url).await;
                            }
                        }
                    }
                    Err(e @ LockError::InvalidConfig { .. }) => {
                        let _ = outcomes.send(Outcome::Joined(Err(e)));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "a Redlock server cannot be reached; connecting it in the background");
                        let _ = outcomes.send(Outcome::Down);
                        connect_later(inner, i, url).await;
                    }
                }
            });
        }
        drop(outcomes);
        let quorum = backend.inner.quorum;
        let started = Instant::now();
        let mut tally = Joining::default();
        while tally.up < quorum && tally.down <= n - quorum {
            match first.recv().await {
                Some(outcome) => tally.count(outcome)?,
                // No runtime to connect on (spawn refused): nothing more will come.
                None => break,
            }
        }
        let grace = if tally.up < quorum {
            // No majority can join now (enough servers refused at once, which can be sooner
            // than the others' answers): the others are waited for, within the connect
            // timeout, so that the error counts every server that answers.
            connect_timeout
        } else {
            // The others usually answer a moment later: a short grace (twice what the majority
            // took, plus 100 ms) lets them join before the first locks, so that these are on
            // every server that answers; a stalled one is not waited for longer.
            (started.elapsed() * 2 + Duration::from_millis(100)).min(connect_timeout)
        };
        let grace = tokio::time::sleep(grace);
        tokio::pin!(grace);
        while tally.up + tally.down < n {
            tokio::select! {
                outcome = first.recv() => match outcome {
                    Some(outcome) => tally.count(outcome)?,
                    None => break,
                },
                () = &mut grace => break,
            }
        }
        if tally.up < quorum {
            return Err(backend.no_quorum("connect", None, tally.up));
        }
        // A server that answered is not left half-checked: whether it is one already joined
        // under a second URL is known before connect returns (each check is bounded by the
        // response timeout).
        while tally.checking > 0 {
            match first.recv().await {
                Some(outcome) => tally.count(outcome)?,
                None => break,
            }
        }
        Ok(backend)
    }
}

/// What a server's connecting task reports.
enum Outcome {
    /// It answers; whether it may join is being checked.
    Connected,
    /// It joined, or was refused.
    Joined(Result<(), LockError>),
    /// It does not answer yet (tried again in the background).
    Down,
    /// It answered but could not be checked against the others yet (tried again in the
    /// background): as good as down for now.
    Unchecked,
}

/// The servers' first outcomes, as they come.
#[derive(Default)]
struct Joining {
    up: usize,
    down: usize,
    checking: usize,
}

impl Joining {
    /// Counts `outcome`; a refused server fails the connect.
    fn count(&mut self, outcome: Outcome) -> Result<(), LockError> {
        match outcome {
            Outcome::Connected => self.checking += 1,
            Outcome::Joined(joined) => {
                self.checking = self.checking.saturating_sub(1);
                joined?;
                self.up += 1;
            }
            Outcome::Down => self.down += 1,
            Outcome::Unchecked => {
                self.checking = self.checking.saturating_sub(1);
                self.down += 1;
            }
        }
        Ok(())
    }
}

async fn connect_one(url: String, settings: Settings) -> Result<RedisBackend, LockError> {
    let connect = RedisBackend::builder(&url)
        .connect_timeout(settings.connect_timeout)
        .response_timeout(settings.response_timeout)
        .full_releases()
        .tls_settings(settings.tls.as_ref().clone())
        .connect();
    match tokio::time::timeout(
        settings.connect_timeout * 2 + settings.response_timeout * 2,
        connect,
    )
    .await
    {
        Ok(answer) => answer,
        Err(_) => Err(LockError::backend(
            "connect",
            None,
            std::io::Error::from(std::io::ErrorKind::TimedOut),
        )),
    }
}

/// Server `i` is connected: unless it is a server already joined under another URL, it takes
/// part from now on, and its dropped connections reach the watchdog. One server counted twice
/// would let a lock be decided by fewer independent servers than a majority, so a double is
/// refused ([`Joined::Double`], saying which two); a server whose probe key cannot be written
/// yet (an error or a timeout: out of memory, loading, stalled) does not join now
/// ([`Joined::NotYet`]: tried again later); one not allowed to write its probe key (an ACL
/// without the default prefix) joins with a warning.
async fn join(inner: &Arc<Inner>, i: usize, backend: RedisBackend) -> Joined {
    let _joining = inner.joining.lock().await;
    let bound = inner.settings.response_timeout;
    let backend_ref = &backend;
    let checks = inner
        .servers
        .iter()
        .enumerate()
        .filter_map(|(j, s)| {
            let other = s.get()?;
            let check: std::pin::Pin<Box<dyn Future<Output = _> + Send + '_>> =
                Box::pin(async move { (j, backend_ref.same_keyspace(other, bound).await) });
            Some(check)
        })
        .collect();
    for (j, found) in crate::backend::join_all(checks).await {
        match found {
            Keyspace::Different => {}
            Keyspace::Same => {
                let e = LockError::config(format!(
                    "Redlock servers {j} and {i} (by their place in the URL list) are one Redis \
                     server under two URLs (a key written through one is read through the \
                     other): its vote would count twice; give each server once"
                ));
                tracing::error!(error = %e, "a Redlock server is refused");
                return Joined::Double(e);
            }
            Keyspace::NoPermission(e) => {
                tracing::warn!(error = %e, first = j, second = i, "cannot check that two Redlock servers are distinct: the probe key needs the default `lock:` prefix in the ACL");
            }
            Keyspace::Unknown(e) => {
                tracing::warn!(error = %e, server = i, "a Redlock server cannot be checked against the others yet; it joins once it can");
                return Joined::NotYet;
            }
        }
    }
    let watcher = backend.reconnects();
    if inner.servers[i].backend.set(backend).is_err() {
        return Joined::Yes;
    }
    inner.reconnects.send_modify(|v| *v += 1);
    if let Some(mut rx) = watcher {
        let weak = Arc::downgrade(inner);
        background::spawn(async move {
            while rx.changed().await.is_ok() {
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                inner.reconnects.send_modify(|v| *v += 1);
            }
        });
    }
    Joined::Yes
}

/// Whether a connected server joined.
enum Joined {
    Yes,
    /// One already joined under another URL: never joins.
    Double(LockError),
    /// Not checked yet: tried again later.
    NotYet,
}

/// Connects server `i`, down at connect, once it answers (every second, while the backend
/// lives).
async fn connect_later(inner: Weak<Inner>, i: usize, url: String) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let Some(settings) = inner.upgrade().map(|i| i.settings.clone()) else {
            return;
        };
        if let Ok(b) = connect_one(url.clone(), settings).await {
            let Some(inner) = inner.upgrade() else {
                return;
            };
            match join(&inner, i, b).await {
                Joined::Yes => {
                    tracing::info!(server = i, "a Redlock server down at connect has joined");
                    return;
                }
                Joined::Double(_) => return,
                Joined::NotYet => {}
            }
        }
    }
}
