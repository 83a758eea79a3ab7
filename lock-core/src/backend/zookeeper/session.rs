//! The backend's ZooKeeper session: made at connect, followed across reconnections by the
//! client (which moves to another server of the connect string by itself, same session), and
//! made anew once it expired or closed (its ephemeral nodes, and every lock on them, went with
//! it). Each change of state is signalled to the watchdog, which renews at once: a lock whose
//! node went is reported lost without waiting for its next tick.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use zookeeper_client as zk;

use crate::LockError;
use crate::sync::Mutex;

/// What a session is made with.
pub(super) struct Settings {
    pub(super) hosts: String,
    pub(super) session_timeout: Duration,
    pub(super) connect_timeout: Duration,
    pub(super) auth: Option<(String, String)>,
}

/// One session: its client, id, and the timeout the ensemble granted.
pub(super) struct Session {
    pub(super) client: zk::Client,
    pub(super) id: i64,
    pub(super) timeout: Duration,
}

pub(super) struct Sessions {
    settings: Settings,
    current: Mutex<Option<Arc<Session>>>,
    /// One connect at a time.
    connecting: tokio::sync::Mutex<()>,
    /// Bumped at each change of the session's state (disconnected, connected again, expired).
    reconnects: watch::Sender<u64>,
    /// The timeout the ensemble granted the latest session (the one asked for before).
    granted: Mutex<Duration>,
    /// The task following the current session's state.
    follower: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for Sessions {
    fn drop(&mut self) {
        if let Some(follower) = self.follower.lock().take() {
            follower.abort();
        }
    }
}

impl Sessions {
    pub(super) fn new(settings: Settings) -> Self {
        let asked = settings.session_timeout;
        Sessions {
            settings,
            current: Mutex::default(),
            connecting: tokio::sync::Mutex::new(()),
            reconnects: watch::Sender::new(0),
            granted: Mutex::new(asked),
            follower: Mutex::default(),
        }
    }

    pub(super) fn reconnects(&self) -> watch::Receiver<u64> {
        self.reconnects.subscribe()
    }

    pub(super) fn granted(&self) -> Duration {
        *self.granted.lock()
    }

    /// The live session, if there is one (no connect).
    pub(super) fn live(&self) -> Option<Arc<Session>> {
        self.current
            .lock()
            .clone()
            .filter(|s| !s.client.state().is_terminated())
    }

    /// The live session, or a new one when the last expired or closed.
    pub(super) async fn current(&self) -> Result<Arc<Session>, LockError> {
        if let Some(session) = self.live() {
            return Ok(session);
        }
        let _one = self.connecting.lock().await;
        if let Some(session) = self.live() {
            return Ok(session);
        }
        let session = Arc::new(self.connect().await?);
        *self.granted.lock() = session.timeout;
        let follower = crate::background::spawn(follow(
            session.client.state_watcher(),
            self.reconnects.clone(),
        ));
        if let Some(old) = std::mem::replace(&mut *self.follower.lock(), follower) {
            old.abort();
        }
        let replaced = self.current.lock().replace(session.clone());
        if replaced.is_some() {
            // A new session: every node of the old one is gone.
            self.reconnects.send_modify(|n| *n += 1);
        }
        Ok(session)
    }

    async fn connect(&self) -> Result<Session, LockError> {
        let s = &self.settings;
        let mut connector = zk::Client::connector()
            .with_session_timeout(s.session_timeout)
            .with_connection_timeout(s.connect_timeout.min(s.session_timeout * 2 / 5));
        if let Some((user, password)) = &s.auth {
            connector = connector.with_auth("digest", format!("{user}:{password}").as_bytes());
        }
        let client =
            match tokio::time::timeout(s.connect_timeout, connector.connect(&s.hosts)).await {
                Ok(Ok(client)) => client,
                Ok(Err(zk::Error::BadArguments(why))) => {
                    return Err(LockError::config(format!(
                        "ZooKeeper connect string {:?} refused: {why}",
                        s.hosts
                    )));
                }
                Ok(Err(e)) => return Err(LockError::backend("connect", None, e)),
                Err(_) => {
                    return Err(LockError::backend(
                        "connect",
                        None,
                        std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "no ZooKeeper server granted a session within the connect timeout",
                        ),
                    ));
                }
            };
        Ok(Session {
            id: client.session_id().0,
            timeout: client.session_timeout(),
            client,
        })
    }
}

/// Signals each change of a session's state until it ends.
async fn follow(mut states: zk::StateWatcher, reconnects: watch::Sender<u64>) {
    loop {
        let state = states.changed().await;
        reconnects.send_modify(|n| *n += 1);
        if state.is_terminated() {
            return;
        }
    }
}
