//! The watcher: hears of dropped connections to the server, for the watchdog.

use std::time::Duration;

use redis::{AsyncConnectionConfig, Client, PushKind};
use tokio::sync::{mpsc, watch};

use super::RedisBackend;
use super::connect::resp3_client;
use crate::LockError;
use crate::background;
use crate::sync::Mutex;

/// Backoff of the watcher's reconnection attempts.
const WATCH_RETRY_MIN: Duration = Duration::from_millis(10);
const WATCH_RETRY_MAX: Duration = Duration::from_millis(500);
/// A connection that stayed up this long resets the backoff; one dropped sooner (a proxy or an
/// operator closing it again and again) is retried after the growing delay, so the watcher
/// never reconnects, nor makes the watchdogs check their locks, in a tight loop.
const STABLE: Duration = Duration::from_secs(2);

impl RedisBackend {
    /// A receiver whose value changes each time the connection to the server was lost and each
    /// time it is back; `None` when the server is too old to tell (before Redis 6) or there is
    /// no runtime to watch on.
    pub(crate) fn reconnects(&self) -> Option<watch::Receiver<u64>> {
        self.inner.watcher.subscribe()
    }
}

/// Hears of dropped connections to the server on a connection of its own that sends nothing
/// (RESP3, so the client library reports the drop as it happens, even when idle), and counts
/// each drop and each return, so the watchdog can check every held lock at once instead of at
/// its next regular renewal. Its task starts with the backend and runs for the backend's life.
pub(super) struct Watcher {
    /// `None` before Redis 6 (no RESP3).
    source: Option<Source>,
    epoch: watch::Sender<u64>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    connect_timeout: Duration,
    /// Keeps the task running from the backend's connect on, so its connection is up before
    /// the first lock is taken (a drop between that lock and a later first connection would
    /// go unseen).
    _listening: Option<watch::Receiver<u64>>,
}

/// What the watcher listens to.
enum Source {
    Single(Client),
    /// Every node of a cluster, through one idle cluster connection.
    #[cfg(feature = "cluster")]
    Cluster(crate::backend::cluster::ClusterSettings),
    /// The primary a Sentinel set names: a move to a new primary counts as a drop (the new
    /// primary may lack locks the old one had), and the watcher connects to the new one.
    #[cfg(feature = "sentinel")]
    Sentinel(std::sync::Arc<crate::backend::sentinel::Master>),
}

impl Watcher {
    /// The watcher of a cluster backend: a drop of any node's connection counts.
    #[cfg(feature = "cluster")]
    pub(super) fn cluster(settings: crate::backend::cluster::ClusterSettings) -> Self {
        let mut watcher = Watcher {
            connect_timeout: settings.connect_timeout,
            source: Some(Source::Cluster(settings)),
            epoch: watch::Sender::new(0),
            task: Mutex::default(),
            _listening: None,
        };
        watcher._listening = watcher.subscribe();
        watcher
    }

    /// Waits (at most `within`) until the watcher's connection is up and counted, so that the
    /// check that follows its first connection comes before any lock of the backend (a
    /// cluster's watcher connects to every node, which takes a while).
    #[cfg(feature = "cluster")]
    pub(super) async fn ready(&self, within: Duration) {
        if let Some(mut epoch) = self.subscribe() {
            let _ = tokio::time::timeout(within, epoch.wait_for(|n| *n > 0)).await;
        }
    }

    /// The watcher of a Sentinel backend (`None` source before Redis 6, as on one server).
    #[cfg(feature = "sentinel")]
    pub(super) fn sentinel(
        master: std::sync::Arc<crate::backend::sentinel::Master>,
        resp3: bool,
        connect_timeout: Duration,
    ) -> Self {
        let mut watcher = Watcher {
            source: resp3.then_some(Source::Sentinel(master)),
            epoch: watch::Sender::new(0),
            task: Mutex::default(),
            connect_timeout,
            _listening: None,
        };
        watcher._listening = watcher.subscribe();
        watcher
    }

    pub(super) fn new(
        client: &Client,
        resp3: bool,
        connect_timeout: Duration,
    ) -> Result<Self, LockError> {
        let client = resp3_client(client, resp3, "connect watcher")?;
        let mut watcher = Watcher {
            source: client.map(Source::Single),
            epoch: watch::Sender::new(0),
            task: Mutex::default(),
            connect_timeout,
            _listening: None,
        };
        watcher._listening = watcher.subscribe();
        Ok(watcher)
    }

    fn subscribe(&self) -> Option<watch::Receiver<u64>> {
        let source = self.source.as_ref()?;
        // Subscribed before the task starts: it ends as soon as nobody listens.
        let receiver = self.epoch.subscribe();
        let mut task = self.task.lock();
        if task
            .as_ref()
            .is_none_or(tokio::task::JoinHandle::is_finished)
        {
            *task = Some(match source {
                Source::Single(client) => {
                    let client = client.clone();
                    background::spawn(watch_connection(
                        move || Some(client.clone()),
                        None,
                        self.epoch.clone(),
                        self.connect_timeout,
                    ))?
                }
                #[cfg(feature = "sentinel")]
                Source::Sentinel(master) => {
                    let moves = master.moves();
                    let master = master.clone();
                    background::spawn(watch_connection(
                        move || {
                            resp3_client(&master.client(), true, "connect watcher")
                                .ok()
                                .flatten()
                        },
                        Some(moves),
                        self.epoch.clone(),
                        self.connect_timeout,
                    ))?
                }
                #[cfg(feature = "cluster")]
                Source::Cluster(settings) => {
                    background::spawn(watch_cluster(settings.clone(), self.epoch.clone()))?
                }
            });
        }
        Some(receiver)
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        if let Some(task) = self.task.get_mut().take() {
            task.abort();
        }
    }
}

/// The watcher's task: keeps one idle connection, bumps `epoch` when it drops and when a new
/// one is up, the first one too (a lock taken before it connected may have been lost with the
/// server's data meanwhile; with no lock held yet, as at the backend's connect, the check costs
/// nothing); ends when nobody listens any more.
///
/// `client` names the server to watch, asked at each connection; a change of `moves` (the
/// Sentinel backend's primary moved) counts as a drop, and the next connection goes to the
/// new server.
async fn watch_connection(
    client: impl Fn() -> Option<Client> + Send + 'static,
    mut moves: Option<watch::Receiver<u64>>,
    epoch: watch::Sender<u64>,
    connect_timeout: Duration,
) {
    let mut delay = WATCH_RETRY_MIN;
    loop {
        // Marked seen before the server is read: a move in between is seen again at once.
        if let Some(moves) = moves.as_mut() {
            moves.borrow_and_update();
        }
        let Some(client) = client() else { return };
        let (push_tx, mut pushes) = mpsc::unbounded_channel();
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_push_sender(push_tx);
        let connected = tokio::select! {
            () = epoch.closed() => return,
            connected = client.get_multiplexed_async_connection_with_config(&config) => connected,
        };
        match connected {
            Ok(conn) => {
                tracing::debug!("lock server connection up; checking the held locks");
                epoch.send_modify(|n| *n = n.wrapping_add(1));
                let up_since = tokio::time::Instant::now();
                loop {
                    tokio::select! {
                        () = epoch.closed() => return,
                        push = pushes.recv() => match push {
                            Some(push) if push.kind != PushKind::Disconnection => {}
                            _ => break,
                        },
                        () = moved(&mut moves) => break,
                    }
                }
                drop(conn);
                tracing::debug!("lock server connection lost; checking the held locks");
                epoch.send_modify(|n| *n = n.wrapping_add(1));
                if up_since.elapsed() >= STABLE {
                    delay = WATCH_RETRY_MIN;
                } else {
                    tokio::select! {
                        () = epoch.closed() => return,
                        () = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2).min(WATCH_RETRY_MAX);
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "lock server connection watcher cannot connect; retrying");
                tokio::select! {
                    () = epoch.closed() => return,
                    () = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(WATCH_RETRY_MAX);
            }
        }
    }
}

/// Resolves when `moves` changed; never without one (or once its sender is gone).
async fn moved(moves: &mut Option<watch::Receiver<u64>>) {
    let changed = match moves {
        Some(moves) => moves.changed().await.is_ok(),
        None => false,
    };
    if !changed {
        std::future::pending::<()>().await;
    }
}

/// The watcher's task on a cluster: one idle cluster connection (to every node) whose
/// dropped node connections bump `epoch` (redis-rs reconnects the node by itself and tells
/// nothing when it is back: the watchdog's checks that follow find out); the first connect
/// bumps it too, as on one server.
#[cfg(feature = "cluster")]
async fn watch_cluster(
    settings: crate::backend::cluster::ClusterSettings,
    epoch: watch::Sender<u64>,
) {
    let (push_tx, mut pushes) = mpsc::unbounded_channel();
    let Ok(client) = settings.client(Some(push_tx)) else {
        return;
    };
    let mut delay = WATCH_RETRY_MIN;
    let _conn = loop {
        tokio::select! {
            () = epoch.closed() => return,
            connected = client.get_async_connection() => match connected {
                Ok(conn) => break conn,
                Err(e) => {
                    tracing::debug!(error = %e, "cluster connection watcher cannot connect; retrying");
                    tokio::select! {
                        () = epoch.closed() => return,
                        () = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2).min(WATCH_RETRY_MAX);
                }
            },
        }
    };
    epoch.send_modify(|n| *n = n.wrapping_add(1));
    loop {
        tokio::select! {
            () = epoch.closed() => return,
            push = pushes.recv() => match push {
                None => return,
                Some(push) if push.kind == PushKind::Disconnection => {
                    tracing::debug!("a cluster node's connection was lost; checking the held locks");
                    epoch.send_modify(|n| *n = n.wrapping_add(1));
                }
                Some(_) => {}
            },
        }
    }
}
