//! The one subscriber connection of a Redis backend.
//!
//! Waiters register an `Inbox` per lock channel; the first registration of a channel subscribes
//! it, the last removal unsubscribes it. One task owns the connection and sends the
//! (un)subscribe commands in the order they were asked for, so an unsubscribe can never overtake
//! a later subscribe of the same channel. When the connection drops, waiters are woken and told
//! notifications are unhealthy (they fall back to bounded retries); the task reconnects with
//! backoff, subscribes every channel again, and wakes everyone once more, because releases
//! published while it was away were missed.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, PushInfo, PushKind, Value};
use tokio::sync::{Mutex as AsyncMutex, mpsc, oneshot};

use crate::LockError;
#[cfg(feature = "sentinel")]
use crate::backend::sentinel::Master;
use crate::backend::{Inbox, Listeners};
use crate::sync::{Mutex, MutexGuard};

const RECOVERY_MIN: Duration = Duration::from_millis(20);
const RECOVERY_MAX: Duration = Duration::from_secs(1);

pub(super) struct Subscriber {
    /// `None` when the server is too old for RESP3 pushes: waiters then always retry on timers.
    source: Option<Source>,
    shared: Arc<Shared>,
    /// The connection task's inbox; replaced when the task has ended (its runtime shut down).
    commands: Mutex<Option<mpsc::UnboundedSender<Command>>>,
    /// Serializes (re)connecting.
    connecting: AsyncMutex<()>,
    /// After a failed connect: when a failed subscription may connect again, and the back-off
    /// after the next failure.
    retry: Mutex<Option<(std::time::Instant, Duration)>>,
    connect_timeout: Duration,
    response_timeout: Duration,
}

struct Shared {
    sharded: bool,
    healthy: AtomicBool,
    listeners: Mutex<Listeners>,
}

impl Shared {
    fn listeners(&self) -> MutexGuard<'_, Listeners> {
        self.listeners.lock()
    }
}

/// Where the subscriber connects.
enum Source {
    Single(Client),
    /// A cluster: one cluster connection, each channel subscribed (`SSUBSCRIBE`) on the node
    /// that owns its slot; redis-rs resubscribes them after a node reconnects or a slot map
    /// refresh, and `run` after the server dropped one (a slot moved away).
    #[cfg(feature = "cluster")]
    Cluster(crate::backend::cluster::ClusterSettings),
    /// The primary a Sentinel set names: the connection moves with it (`SentinelSub`).
    #[cfg(feature = "sentinel")]
    Sentinel(Arc<Master>),
}

enum Command {
    Subscribe(String, oneshot::Sender<bool>),
    Unsubscribe(String),
}

impl Subscriber {
    /// A subscriber that connects to `source` when first needed; without one (a server too
    /// old for RESP3 pushes) it is never healthy and waiters retry on timers.
    fn with_source(
        source: Option<Source>,
        sharded: bool,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Self {
        Subscriber {
            shared: Arc::new(Shared {
                sharded,
                healthy: AtomicBool::new(source.is_some()),
                listeners: Mutex::default(),
            }),
            source,
            commands: Mutex::default(),
            connecting: AsyncMutex::new(()),
            retry: Mutex::default(),
            connect_timeout,
            response_timeout,
        }
    }

    pub(super) fn new(
        client: &Client,
        sharded: bool,
        resp3: bool,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Result<Self, LockError> {
        let client = super::connect::resp3_client(client, resp3, "connect subscriber")?;
        Ok(Self::with_source(
            client.map(Source::Single),
            sharded,
            connect_timeout,
            response_timeout,
        ))
    }

    /// The subscriber of a cluster backend (sharded pub/sub).
    #[cfg(feature = "cluster")]
    pub(super) fn cluster(settings: crate::backend::cluster::ClusterSettings) -> Self {
        let (connect_timeout, response_timeout) =
            (settings.connect_timeout, settings.response_timeout);
        Self::with_source(
            Some(Source::Cluster(settings)),
            true,
            connect_timeout,
            response_timeout,
        )
    }

    /// The subscriber of a Sentinel backend: on the current primary, moving with it.
    #[cfg(feature = "sentinel")]
    pub(super) fn sentinel(
        master: Arc<Master>,
        sharded: bool,
        resp3: bool,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Self {
        Self::with_source(
            resp3.then_some(Source::Sentinel(master)),
            sharded,
            connect_timeout,
            response_timeout,
        )
    }

    pub(super) fn healthy(&self) -> bool {
        self.shared.healthy.load(Ordering::Acquire)
    }

    /// When a subscription that failed, or whose connection has gone, may succeed if asked for
    /// again: now while the connection is healthy, or while there is none (the next
    /// subscription connects, and subscribes every registered channel) once the back-off after
    /// the last failed connect is over. `None` on a server too old for pushes, and while a
    /// connection recovers (it subscribes every registered channel itself).
    pub(super) fn resubscribe_after(&self) -> Option<Duration> {
        self.source.as_ref()?;
        if self.healthy() {
            return Some(Duration::ZERO);
        }
        if self.live_sender().is_some() {
            return None;
        }
        let retry = *self.retry.lock();
        Some(retry.map_or(Duration::ZERO, |(at, _)| {
            at.saturating_duration_since(std::time::Instant::now())
        }))
    }

    /// Registers `notify` for `channel` and waits until the server confirmed the subscription.
    /// `false` when it could not be confirmed (the caller falls back to bounded retries).
    pub(super) async fn subscribe(&self, channel: &str, inbox: &Arc<Inbox>) -> bool {
        let commands = self.commands().await;
        let (reply, confirmed) = oneshot::channel();
        {
            // Registered and sent under one lock, so commands reach the task in the order the
            // registrations decided them. The registration stays even when the subscriber is
            // down: recovery subscribes it and wakes it.
            let mut listeners = self.shared.listeners();
            listeners.add(channel, inbox);
            let Some(commands) = commands else {
                return false;
            };
            if commands
                .send(Command::Subscribe(channel.to_owned(), reply))
                .is_err()
            {
                return false;
            }
        }
        confirmed.await.unwrap_or(false)
    }

    /// Delivers a release message that did not come through the connection (the releasing
    /// process's own copy), as if it had.
    pub(super) fn deliver(&self, channel: &str, message: &[u8]) {
        self.shared.listeners().wake(channel, message);
    }

    pub(super) fn unsubscribe(&self, channel: &str, inbox: &Arc<Inbox>) {
        let mut listeners = self.shared.listeners();
        if listeners.remove(channel, inbox)
            && let Some(commands) = self.live_sender()
        {
            let _ = commands.send(Command::Unsubscribe(channel.to_owned()));
        }
    }

    fn live_sender(&self) -> Option<mpsc::UnboundedSender<Command>> {
        let slot = self.commands.lock();
        slot.as_ref().filter(|tx| !tx.is_closed()).cloned()
    }

    async fn commands(&self) -> Option<mpsc::UnboundedSender<Command>> {
        let source = self.source.as_ref()?;
        if let Some(tx) = self.live_sender() {
            return Some(tx);
        }
        let _connecting = self.connecting.lock().await;
        if let Some(tx) = self.live_sender() {
            return Some(tx);
        }
        let (push_tx, push_rx) = mpsc::unbounded_channel();
        // Release messages wake their waiters right where the connection reads them (one task
        // hop less on the handoff path); everything else goes to the connection's task.
        let shared = self.shared.clone();
        let on_push = move |push: PushInfo| {
            if !deliver(&shared, &push) {
                push_tx.send(push)?;
            }
            Ok::<(), mpsc::error::SendError<PushInfo>>(())
        };
        let (tx, rx) = mpsc::unbounded_channel();
        // A new connection subscribes whatever is registered already (channels whose
        // subscription failed while there was no connection, or whose connection went with
        // the runtime it ran on); notifications are healthy once it has.
        let resync = self.shared.listeners().len() > 0;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout))
            .set_number_of_retries(1);
        let connected = match source {
            Source::Single(client) => {
                ConnectionManager::new_with_config(client.clone(), config.set_push_sender(on_push))
                    .await
                    .map(|conn| {
                        tokio::spawn(run(conn, rx, push_rx, self.shared.clone(), resync));
                    })
                    .map_err(|e| e.to_string())
            }
            #[cfg(feature = "sentinel")]
            Source::Sentinel(master) => {
                SentinelSub::connect(master.clone(), config.set_push_sender(on_push))
                    .await
                    .map(|conn| {
                        tokio::spawn(run(conn, rx, push_rx, self.shared.clone(), resync));
                    })
                    .map_err(|e| e.to_string())
            }
            #[cfg(feature = "cluster")]
            Source::Cluster(settings) => match settings.client(Some(on_push)) {
                Ok(client) => client
                    .get_async_connection()
                    .await
                    .map(|conn| {
                        tokio::spawn(run(conn, rx, push_rx, self.shared.clone(), resync));
                    })
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            },
        };
        match connected {
            Ok(()) => {
                if !resync {
                    self.shared.healthy.store(true, Ordering::Release);
                }
                *self.retry.lock() = None;
                *self.commands.lock() = Some(tx.clone());
                Some(tx)
            }
            Err(e) => {
                tracing::warn!(error = %e, "lock notifications unavailable: cannot connect the subscriber; waiters retry on timers");
                self.shared.healthy.store(false, Ordering::Release);
                let mut retry = self.retry.lock();
                let backoff = retry.map_or(RECOVERY_MIN, |(_, d)| d);
                *retry = Some((
                    std::time::Instant::now() + backoff,
                    (backoff * 2).min(RECOVERY_MAX),
                ));
                None
            }
        }
    }
}

/// What `run` needs of a subscriber connection.
trait SubConn: Send + 'static {
    /// Sends one (un)subscribe command for one channel; `false` when it failed.
    fn send(
        &mut self,
        command: &'static str,
        channel: &str,
    ) -> impl std::future::Future<Output = bool> + Send;
    /// Whether the connection answers (before recovery resubscribes).
    fn ping(&mut self) -> impl std::future::Future<Output = bool> + Send;
    /// Resolves when the server subscribed to is no longer the one to listen to (a Sentinel
    /// failover): the subscriber then recovers, on the new one. Never, but on Sentinel.
    fn moved(&mut self) -> impl std::future::Future<Output = ()> + Send {
        std::future::pending()
    }
}

impl SubConn for ConnectionManager {
    async fn send(&mut self, command: &'static str, channel: &str) -> bool {
        logged(
            command,
            redis::cmd(command).arg(channel).exec_async(self).await,
        )
    }

    async fn ping(&mut self) -> bool {
        redis::cmd("PING").exec_async(self).await.is_ok()
    }
}

/// On a cluster connection, `SSUBSCRIBE`/`SUNSUBSCRIBE` through redis-rs's own methods: routed
/// to the channel's slot and tracked for its automatic resubscription.
#[cfg(feature = "cluster")]
impl SubConn for redis::cluster_async::ClusterConnection {
    async fn send(&mut self, command: &'static str, channel: &str) -> bool {
        let answer = if command == "SSUBSCRIBE" {
            self.ssubscribe(channel).await
        } else {
            self.sunsubscribe(channel).await
        };
        logged(command, answer)
    }

    /// There is no one node to ask (a PING goes to every primary): the resubscriptions that
    /// follow are the check.
    async fn ping(&mut self) -> bool {
        true
    }
}

/// The subscriber connection of a Sentinel backend: to the current primary, made again on the
/// new primary at the first `ping` of recovery after a move (a release published there is not
/// heard on the old one, which may be gone).
#[cfg(feature = "sentinel")]
struct SentinelSub {
    master: Arc<Master>,
    /// The primary's generation `conn` is connected to.
    generation: u64,
    moves: tokio::sync::watch::Receiver<u64>,
    conn: ConnectionManager,
    config: ConnectionManagerConfig,
}

#[cfg(feature = "sentinel")]
impl SentinelSub {
    async fn connect(
        master: Arc<Master>,
        config: ConnectionManagerConfig,
    ) -> redis::RedisResult<Self> {
        let mut moves = master.moves();
        let generation = *moves.borrow_and_update();
        let conn = ConnectionManager::new_with_config(
            super::connect::with_resp3(&master.client())?,
            config.clone(),
        )
        .await?;
        Ok(SentinelSub {
            master,
            generation,
            moves,
            conn,
            config,
        })
    }
}

#[cfg(feature = "sentinel")]
impl SubConn for SentinelSub {
    async fn send(&mut self, command: &'static str, channel: &str) -> bool {
        self.conn.send(command, channel).await
    }

    async fn ping(&mut self) -> bool {
        let generation = self.master.generation();
        if generation != self.generation {
            let connected = match super::connect::with_resp3(&self.master.client()) {
                Ok(client) => ConnectionManager::new_with_config(client, self.config.clone()).await,
                Err(e) => Err(e),
            };
            match connected {
                Ok(conn) => {
                    self.conn = conn;
                    self.generation = generation;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "cannot connect the subscriber to the new primary yet");
                    return false;
                }
            }
        }
        self.conn.ping().await
    }

    async fn moved(&mut self) {
        if self.moves.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

fn logged(command: &str, answer: redis::RedisResult<()>) -> bool {
    match answer {
        Ok(()) => true,
        Err(e) => {
            tracing::debug!(error = %e, command, "subscription command failed");
            false
        }
    }
}

async fn run<C: SubConn>(
    mut conn: C,
    mut commands: mpsc::UnboundedReceiver<Command>,
    mut pushes: mpsc::UnboundedReceiver<PushInfo>,
    shared: Arc<Shared>,
    resync: bool,
) {
    let (sub, unsub) = verbs(&shared);
    // Unsubscribes not sent while in backoff. The connection may have survived (a command that
    // timed out, not a drop), its server side still subscribed: recovery unsubscribes these
    // unless someone listens to them again by then.
    let mut unsent_unsubscribes: HashSet<String> = HashSet::new();
    // Channels registered while there was no connection are subscribed before any command is
    // read: the subscription that made this connection is then confirmed, not refused for a
    // recovery about to happen.
    let _ended = Ended(shared.clone());
    let mut backoff: Option<Duration> = None;
    if resync && !recover(&mut conn, &shared, &mut unsent_unsubscribes).await {
        backoff = Some(mark_unhealthy(&shared));
    }
    loop {
        let recovery = async {
            match backoff {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            command = commands.recv() => match command {
                None => return,
                Some(Command::Subscribe(channel, reply)) => {
                    unsent_unsubscribes.remove(&channel);
                    let ok = backoff.is_none() && conn.send(sub, &channel).await;
                    if !ok {
                        backoff.get_or_insert_with(|| mark_unhealthy(&shared));
                    }
                    let _ = reply.send(ok);
                }
                Some(Command::Unsubscribe(channel)) => {
                    if backoff.is_some() || !conn.send(unsub, &channel).await {
                        unsent_unsubscribes.insert(channel);
                        backoff.get_or_insert_with(|| mark_unhealthy(&shared));
                    }
                }
            },
            () = conn.moved() => {
                backoff.get_or_insert_with(|| mark_unhealthy(&shared));
            }
            push = pushes.recv() => match push {
                None => return,
                Some(push) => match push.kind {
                    PushKind::Message | PushKind::SMessage => {
                        deliver(&shared, &push);
                    }
                    PushKind::Disconnection => {
                        backoff.get_or_insert_with(|| mark_unhealthy(&shared));
                    }
                    // The server dropped a sharded subscription by itself (its slot moved to
                    // another node, or the node became a replica), or confirms our own
                    // unsubscribe: subscribed again, on the slot's current owner, while
                    // someone listens (redis-rs forgets a channel the server dropped).
                    PushKind::SUnsubscribe if backoff.is_none() => {
                        if let [channel, ..] = push.data.as_slice()
                            && let Some(channel) = bytes(channel)
                        {
                            let channel = String::from_utf8_lossy(channel).into_owned();
                            let listened = shared.listeners().channels().any(|c| c == channel);
                            if listened && !conn.send(sub, &channel).await {
                                backoff.get_or_insert_with(|| mark_unhealthy(&shared));
                            }
                        }
                    }
                    _ => {}
                },
            },
            () = recovery => {
                backoff = if recover(&mut conn, &shared, &mut unsent_unsubscribes).await {
                    None
                } else {
                    backoff.map(|d| (d * 2).clamp(RECOVERY_MIN, RECOVERY_MAX))
                };
            }
        }
    }
}

/// Marks notifications unhealthy when the connection's task ends (its runtime shut down, or
/// the subscriber was dropped): its connection, and every subscription on it, is gone. The
/// next subscription asked for connects again.
struct Ended(Arc<Shared>);

impl Drop for Ended {
    fn drop(&mut self) {
        self.0.healthy.store(false, Ordering::Release);
        self.0.listeners().wake_all();
    }
}

/// Subscribes every registered channel again and sends the unsubscribes that could not be
/// sent; when all went through, notifications are healthy again and every listener is woken
/// (releases published meanwhile were missed). `false` when something failed.
async fn recover<C: SubConn>(
    conn: &mut C,
    shared: &Shared,
    unsent_unsubscribes: &mut HashSet<String>,
) -> bool {
    let (sub, unsub) = verbs(shared);
    let channels: Vec<String> = shared.listeners().channels().map(str::to_owned).collect();
    let mut ok = conn.ping().await;
    for channel in &channels {
        ok = ok && conn.send(sub, channel).await;
    }
    let stale: Vec<String> = unsent_unsubscribes
        .iter()
        .filter(|c| !channels.contains(c))
        .cloned()
        .collect();
    for channel in &stale {
        ok = ok && conn.send(unsub, channel).await;
    }
    if ok {
        unsent_unsubscribes.clear();
        shared.healthy.store(true, Ordering::Release);
        tracing::info!(channels = channels.len(), "lock notifications restored");
        shared.listeners().wake_all();
    }
    ok
}

/// The subscribe and unsubscribe commands of the subscriber's kind of pub/sub.
fn verbs(shared: &Shared) -> (&'static str, &'static str) {
    if shared.sharded {
        ("SSUBSCRIBE", "SUNSUBSCRIBE")
    } else {
        ("SUBSCRIBE", "UNSUBSCRIBE")
    }
}

/// Wakes the listeners of a release message; `false` when `push` is not one.
fn deliver(shared: &Shared, push: &PushInfo) -> bool {
    if !matches!(push.kind, PushKind::Message | PushKind::SMessage) {
        return false;
    }
    if let [channel, payload, ..] = push.data.as_slice()
        && let (Some(channel), Some(payload)) = (bytes(channel), bytes(payload))
    {
        shared
            .listeners()
            .wake(&String::from_utf8_lossy(channel), payload);
    }
    true
}

fn mark_unhealthy(shared: &Shared) -> Duration {
    shared.healthy.store(false, Ordering::Release);
    tracing::warn!("lock notification connection lost; waiters retry on timers until it is back");
    shared.listeners().wake_all();
    RECOVERY_MIN
}

fn bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}
