//! The primary a Sentinel set names, followed across failovers.
//!
//! redis-rs resolves a primary through the sentinels once and then talks to that address for
//! good (its connection manager reconnects to the same address, by then a replica or gone).
//! [`Master`] keeps the current primary's client and command connection and moves them when
//! the primary changed: on a sentinel's `+switch-master` message, and when a command is
//! refused in a way that says the address is no longer the primary (`READONLY`, refused or
//! dropped connections). Each move bumps a generation that the subscriber and the watcher
//! follow: the watcher then has the watchdog check every held lock at once (replication is
//! asynchronous, so a lock written to the old primary may be missing on the new one).

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, PushKind,
    RedisConnectionInfo, RedisFuture, Value,
};
use tokio::sync::{Mutex as AsyncMutex, mpsc, watch};

use crate::LockError;
use crate::backend::redis::connect::with_resp3;
use crate::sync::Mutex;

/// A resolution that found no new primary is not repeated sooner than this, doubled after each
/// such resolution up to [`RECHECK_MAX`] (every failing command asks for one while the primary
/// is down: the sentinels are asked a few times a second at most, not once per command).
const RECHECK: Duration = Duration::from_millis(100);
const RECHECK_MAX: Duration = Duration::from_secs(1);
/// How often the `+switch-master` listener checks that its sentinel still answers (an idle
/// connection to a vanished host would otherwise stay silent for minutes).
const LISTEN_PING: Duration = Duration::from_secs(1);
/// How long an address a sentinel announced (`+switch-master`) is waited for to be named by a
/// majority of the sentinels: the others learn a new configuration from each other's hello
/// messages, sent every 2 s, and a stale sentinel's announcement never gets there.
const ANNOUNCED_CONFIRM: Duration = Duration::from_secs(10);
/// Backoff of the `+switch-master` listener's reconnections.
const LISTEN_RETRY_MIN: Duration = Duration::from_millis(50);
const LISTEN_RETRY_MAX: Duration = Duration::from_secs(1);

/// How to reach the sentinels and the primary they name.
#[derive(Clone)]
pub(crate) struct SentinelSettings {
    pub(crate) sentinels: Vec<ConnectionInfo>,
    pub(crate) master_name: String,
    /// The primary's user, password and database (the sentinels' own are in their URLs).
    pub(crate) master: RedisConnectionInfo,
    /// Whether the primary is reached over TLS, and how: as the first sentinel is.
    pub(crate) transport: ConnectionAddr,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
}

/// The current primary.
struct Current {
    addr: (String, u16),
    client: Client,
    conn: ConnectionManager,
}

/// The primary of one Sentinel-monitored group, followed across failovers. Shared by the
/// backend's command connection ([`SentinelConn`]), subscriber and watcher.
pub(crate) struct Master {
    settings: SentinelSettings,
    current: Mutex<Current>,
    /// Bumped each time the primary moved; the subscriber and the watcher follow it.
    generation: watch::Sender<u64>,
    /// One resolution at a time.
    following: AsyncMutex<()>,
    /// When a resolution last found nothing new, and how many did so in a row.
    checked: Mutex<(Option<Instant>, u32)>,
    /// The `+switch-master` listener (aborted with the backend).
    listener: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for Master {
    fn drop(&mut self) {
        if let Some(task) = self.listener.get_mut().take() {
            task.abort();
        }
    }
}

impl Master {
    /// Asks the sentinels for the primary, connects to it, and starts listening for
    /// failovers.
    pub(crate) async fn connect(settings: SentinelSettings) -> Result<Arc<Self>, LockError> {
        let addr = resolve(&settings).await?;
        let (client, conn) = open(&settings, &addr).await?;
        let master = Arc::new(Master {
            settings,
            current: Mutex::new(Current { addr, client, conn }),
            generation: watch::Sender::new(0),
            following: AsyncMutex::new(()),
            checked: Mutex::default(),
            listener: Mutex::default(),
        });
        *master.listener.lock() = crate::background::spawn(listen(Arc::downgrade(&master)));
        Ok(master)
    }

    pub(crate) fn settings(&self) -> &SentinelSettings {
        &self.settings
    }

    /// The current primary's `host:port`.
    pub(crate) fn addr(&self) -> String {
        let current = self.current.lock();
        format!("{}:{}", current.addr.0, current.addr.1)
    }

    /// A client for the current primary (for the subscriber's and the watcher's connections).
    pub(crate) fn client(&self) -> Client {
        self.current.lock().client.clone()
    }

    /// The current primary's command connection and the generation it belongs to.
    fn conn(&self) -> (ConnectionManager, u64) {
        let generation = *self.generation.borrow();
        (self.current.lock().conn.clone(), generation)
    }

    /// Changes each time the primary moved.
    pub(crate) fn moves(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    pub(crate) fn generation(&self) -> u64 {
        *self.generation.borrow()
    }

    /// Makes sure the connection follows the primary a majority of the sentinels name now;
    /// `true` when it moved since generation `seen` (by this call or another). `announced`
    /// tells that a sentinel's `+switch-master` named a new primary: the call is then not
    /// subject to the back-off that spaces resolutions which found nothing new, but the
    /// announced address is taken only as the majority's answer (one sentinel, stale or cut
    /// off from the others, must not move the backend to a server the others do not name).
    pub(crate) async fn follow(&self, seen: u64, announced: bool) -> bool {
        if self.generation() != seen {
            return true;
        }
        let _one = self.following.lock().await;
        if self.generation() != seen {
            return true;
        }
        if !announced {
            let (at, misses) = *self.checked.lock();
            let wait = RECHECK.saturating_mul(1 << misses.min(4)).min(RECHECK_MAX);
            if at.is_some_and(|at| at.elapsed() < wait) {
                return false;
            }
        }
        let current = self.current.lock().addr.clone();
        let found = resolve(&self.settings).await;
        let moved = match found {
            Ok(addr) if addr != current => match open(&self.settings, &addr).await {
                Ok((client, conn)) => {
                    tracing::warn!(
                        primary = %format!("{}:{}", addr.0, addr.1),
                        "the Redis primary moved (Sentinel failover); following it and checking every held lock"
                    );
                    *self.current.lock() = Current { addr, client, conn };
                    self.generation.send_modify(|g| *g = g.wrapping_add(1));
                    true
                }
                Err(e) => {
                    tracing::debug!(error = %e, "cannot connect to the new Redis primary yet");
                    false
                }
            },
            Ok(_) => false,
            Err(e) => {
                tracing::debug!(error = %e, "cannot learn the Redis primary from the sentinels");
                false
            }
        };
        let mut checked = self.checked.lock();
        *checked = if moved {
            (None, 0)
        } else {
            (Some(Instant::now()), checked.1.saturating_add(1))
        };
        moved
    }

    /// [`follow`](Self::follow) on a task of its own, awaited for at most one connect and one
    /// answer: a caller's command is never held longer than that by sentinels that do not
    /// answer (the resolution goes on without it).
    async fn follow_bounded(self: &Arc<Self>, seen: u64) -> bool {
        let master = self.clone();
        let Some(task) = crate::background::spawn(async move { master.follow(seen, false).await })
        else {
            return false;
        };
        // Saturating: the timeouts are the caller's, `Duration::MAX` included.
        let bound = self
            .settings
            .connect_timeout
            .saturating_add(self.settings.response_timeout);
        matches!(tokio::time::timeout(bound, task).await, Ok(Ok(true)))
    }
}

/// Whether `e` says the address may no longer be the primary: it refuses writes (a demoted
/// primary), cannot be reached, or does not answer in time (a host gone silent).
pub(crate) fn says_moved(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
        || e.to_string().contains("READONLY")
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.is_io_error()
        || e.is_timeout()
}

/// Whether a pipeline's answers hold a `READONLY` refusal (a pipeline's errors come back
/// inside its answers, not as its error).
fn refused_readonly(values: &[Value]) -> bool {
    values.iter().any(|v| match v {
        Value::ServerError(e) => {
            e.kind() == Some(redis::ServerErrorKind::ReadOnly)
                || e.code() == "READONLY"
                || e.details().is_some_and(|d| d.contains("READONLY"))
        }
        Value::Array(items) => refused_readonly(items),
        _ => false,
    })
}

/// The command connection of a Sentinel backend: the current primary's connection manager.
/// A command refused in a way that says the primary may have moved has the sentinels asked;
/// when they name a new primary, the command is sent once more, there. So is a command whose
/// answer came while the primary moved (from the old primary, which may take writes for
/// seconds after the promotion): every answer a caller gets is the current primary's. Every
/// command of the backend is safe to send twice: the acquire recognises its own token, the
/// others compare it; a `READONLY` answer ran nothing.
#[derive(Clone)]
pub(crate) struct SentinelConn {
    master: Arc<Master>,
}

impl SentinelConn {
    pub(crate) fn new(master: Arc<Master>) -> Self {
        SentinelConn { master }
    }

    /// Whether `answer` (sent at `generation`) must be sent again on the current primary.
    async fn again<T>(
        &self,
        answer: &redis::RedisResult<T>,
        generation: u64,
        refused: impl Fn(&T) -> bool,
    ) -> bool {
        let moved_away = match answer {
            Ok(v) => refused(v),
            Err(e) => says_moved(e),
        };
        if moved_away {
            self.master.follow_bounded(generation).await
        } else {
            self.master.generation() != generation
        }
    }
}

impl ConnectionLike for SentinelConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (mut conn, generation) = self.master.conn();
            let answer = conn.req_packed_command(cmd).await;
            if self.again(&answer, generation, |_| false).await {
                return self.master.conn().0.req_packed_command(cmd).await;
            }
            answer
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (mut conn, generation) = self.master.conn();
            let answer = conn.req_packed_commands(pipeline, offset, count).await;
            let refused = |values: &Vec<Value>| refused_readonly(values);
            if self.again(&answer, generation, refused).await {
                return self
                    .master
                    .conn()
                    .0
                    .req_packed_commands(pipeline, offset, count)
                    .await;
            }
            answer
        })
    }

    fn get_db(&self) -> i64 {
        self.master.settings.master.db()
    }
}

/// What went wrong while asking the sentinels or reaching the primary they named.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct SentinelError(String);

/// Asks every sentinel at once for the primary of `settings.master_name` and takes the address
/// that a majority of the configured sentinels name (counted over all of them, not over those
/// that answered), once it answers as a primary (the role in its `HELLO`). Nothing else is
/// ever taken: not the address fewer sentinels name when the majority's does not answer (a
/// stale or cut-off sentinel's server, where the backend would stay and hold locks beside the
/// real primary's holders), not a tie. Without a majority the resolution fails, and is asked
/// again later (the next failing command, the listener).
async fn resolve(settings: &SentinelSettings) -> Result<(String, u16), LockError> {
    let asks = settings
        .sentinels
        .iter()
        .map(|sentinel| {
            Box::pin(async move {
                let mut conn = connect_once(sentinel.clone(), settings).await?;
                let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(&settings.master_name)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
                addr.ok_or_else(|| {
                    format!(
                        "the sentinel monitors no primary named {:?}",
                        settings.master_name
                    )
                })
            })
                as std::pin::Pin<Box<dyn std::future::Future<Output = Result<_, String>> + Send>>
        })
        .collect();
    let answers = crate::backend::join_all(asks).await;
    let checked = match majority(answers, settings.sentinels.len()) {
        Ok(addr) => is_primary(settings, &addr)
            .await
            .map(|()| addr)
            .map_err(|e| {
                format!("the primary a majority of the sentinels name does not answer as one: {e}")
            }),
        Err(e) => Err(e),
    };
    checked.map_err(|e| {
        LockError::backend(
            "find the Redis primary through Sentinel",
            None,
            SentinelError(e),
        )
    })
}

/// The address named by more than half of the `configured` sentinels, from their `answers`;
/// else an error that says what each named and why the others did not answer.
fn majority(
    answers: Vec<Result<(String, u16), String>>,
    configured: usize,
) -> Result<(String, u16), String> {
    let mut counts: Vec<((String, u16), usize)> = Vec::new();
    let mut failed = Vec::new();
    for answer in answers {
        match answer {
            Ok(addr) => match counts.iter_mut().find(|(a, _)| *a == addr) {
                Some((_, n)) => *n += 1,
                None => counts.push((addr, 1)),
            },
            Err(e) => failed.push(e),
        }
    }
    let needed = configured / 2 + 1;
    if let Some(at) = counts.iter().position(|(_, n)| *n >= needed) {
        return Ok(counts.swap_remove(at).0);
    }
    let named: Vec<String> = counts
        .iter()
        .map(|((host, port), n)| format!("{host}:{port} by {n}"))
        .collect();
    Err(format!(
        "no address is named by a majority ({needed}) of the {configured} configured sentinels \
         (named: {}; {} did not answer{}); the sentinels are asked again later",
        if named.is_empty() {
            "none".to_owned()
        } else {
            named.join(", ")
        },
        failed.len(),
        failed
            .first()
            .map(|e| format!(", e.g. {e}"))
            .unwrap_or_default(),
    ))
}

/// `Ok` when the server at `addr` says it is a primary.
async fn is_primary(settings: &SentinelSettings, addr: &(String, u16)) -> Result<(), String> {
    let mut primary = connect_once(master_info(settings, addr)?, settings).await?;
    // HELLO (no version: the connection's protocol stays) tells the role and needs only
    // @connection, which the lock's ACL rule has (ROLE is @dangerous).
    let hello: Value = redis::cmd("HELLO")
        .query_async(&mut primary)
        .await
        .map_err(|e| e.to_string())?;
    match role(&hello) {
        Some(b"master") => Ok(()),
        other => Err(format!(
            "{}:{} is not a primary (yet): its role is {:?}",
            addr.0,
            addr.1,
            other.map(String::from_utf8_lossy)
        )),
    }
}

/// The `role` field of a `HELLO` answer (a map in RESP3, pairs in a flat array in RESP2).
fn role(hello: &Value) -> Option<&[u8]> {
    fn text(v: &Value) -> Option<&[u8]> {
        match v {
            Value::BulkString(b) => Some(b.as_slice()),
            Value::SimpleString(s) => Some(s.as_bytes()),
            _ => None,
        }
    }
    match hello {
        Value::Map(pairs) => pairs
            .iter()
            .find(|(k, _)| text(k) == Some(b"role".as_slice()))
            .and_then(|(_, v)| text(v)),
        Value::Array(items) => items
            .chunks(2)
            .find(|pair| pair.first().and_then(text) == Some(b"role".as_slice()))
            .and_then(|pair| pair.get(1).and_then(text)),
        _ => None,
    }
}

/// One connection with the backend's timeouts, for a question or two.
async fn connect_once(
    info: ConnectionInfo,
    settings: &SentinelSettings,
) -> Result<MultiplexedConnection, String> {
    let tls = crate::backend::redis::tls::is_tls(&info);
    let client = Client::open(info).map_err(|e| e.to_string())?;
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(settings.connect_timeout))
        .set_response_timeout(Some(settings.response_timeout));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|e| crate::backend::redis::connect::describe_connect_error(&e, tls))
}

/// How to reach the primary at `addr`: the primary's user, password and database, over TLS
/// when the sentinels are reached so.
fn master_info(
    settings: &SentinelSettings,
    addr: &(String, u16),
) -> Result<ConnectionInfo, String> {
    let tcp = match &settings.transport {
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host: addr.0.clone(),
            port: addr.1,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => ConnectionAddr::Tcp(addr.0.clone(), addr.1),
    };
    tcp.into_connection_info()
        .map(|info| info.set_redis_settings(settings.master.clone()))
        .map_err(|e| e.to_string())
}

/// The primary's client and command connection.
async fn open(
    settings: &SentinelSettings,
    addr: &(String, u16),
) -> Result<(Client, ConnectionManager), LockError> {
    let client = master_info(settings, addr)
        .and_then(|info| Client::open(info).map_err(|e| e.to_string()))
        .map_err(|e| LockError::backend("connect", None, SentinelError(e)))?;
    let config = crate::backend::redis::connect::manager_config(
        settings.connect_timeout,
        settings.response_timeout,
    );
    let tls = crate::backend::redis::tls::is_tls(client.get_connection_info());
    let conn = ConnectionManager::new_with_config(client.clone(), config)
        .await
        .map_err(|e| crate::backend::redis::connect::connect_error(e, tls))?;
    Ok((client, conn))
}

/// The new primary a `+switch-master` message names, when it is about `name` (its payload is
/// `"<name> <old ip> <old port> <new ip> <new port>"`).
fn switched(data: &[Value], name: &str) -> Option<(String, u16)> {
    let Some(Value::BulkString(payload)) = data.get(1) else {
        return None;
    };
    let payload = std::str::from_utf8(payload).ok()?;
    match payload.split(' ').collect::<Vec<_>>().as_slice() {
        [n, _, _, ip, port] if *n == name => Some(((*ip).to_owned(), port.parse().ok()?)),
        _ => None,
    }
}

/// Follows the primary a sentinel announced once a majority of the sentinels name it (and it
/// answers as a primary and can be connected to), trying again for a while: the other
/// sentinels learn of a failover seconds after the one that announced it, and the
/// announcement is not repeated. A stale sentinel's announcement is never followed.
async fn follow_announced(master: &Master, announced: (String, u16)) {
    let mut delay = LISTEN_RETRY_MIN;
    let started = Instant::now();
    let span = master
        .settings
        .connect_timeout
        .saturating_mul(5)
        .max(ANNOUNCED_CONFIRM);
    loop {
        let seen = master.generation();
        if master.current.lock().addr == announced
            || master.follow(seen, true).await
            || started.elapsed() >= span
        {
            return;
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(LISTEN_RETRY_MAX);
    }
}

/// Listens for `+switch-master` on one sentinel at a time (the next one when it drops), and
/// has the master follow the primary each time its name is in one; also after each
/// (re)connection, since a failover may have happened while nobody listened. The connection is
/// pinged every [`LISTEN_PING`]: one that does not answer is left for the next sentinel. Ends
/// with the backend.
async fn listen(master: Weak<Master>) {
    let mut delay = LISTEN_RETRY_MIN;
    let mut next = 0usize;
    loop {
        let (settings, seen) = match master.upgrade() {
            Some(m) => (m.settings.clone(), m.generation()),
            None => return,
        };
        let sentinel = settings.sentinels[next % settings.sentinels.len()].clone();
        next = next.wrapping_add(1);
        let (tx, mut pushes) = mpsc::unbounded_channel();
        let subscribed = async {
            let client = with_resp3(&Client::open(sentinel.clone())?)?;
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(settings.connect_timeout))
                .set_response_timeout(Some(settings.response_timeout))
                .set_push_sender(tx);
            let mut conn = client
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            conn.subscribe("+switch-master").await?;
            Ok::<_, redis::RedisError>(conn)
        };
        let mut conn = match subscribed.await {
            Ok(conn) => conn,
            Err(e) => {
                tracing::debug!(error = %e, "cannot listen to a sentinel; trying the next one");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(LISTEN_RETRY_MAX);
                continue;
            }
        };
        let up_since = Instant::now();
        // A failover while nobody listened.
        match master.upgrade() {
            Some(m) => {
                *m.checked.lock() = (None, 0);
                m.follow(seen, false).await;
            }
            None => return,
        }
        let mut ping = tokio::time::interval(LISTEN_PING);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let push = tokio::select! {
                push = pushes.recv() => push,
                _ = ping.tick() => {
                    // A sentinel (or its host) gone silent: listen to the next one.
                    if redis::cmd("PING").exec_async(&mut conn).await.is_err() {
                        break;
                    }
                    continue;
                }
            };
            let Some(push) = push else { break };
            match push.kind {
                PushKind::Disconnection => break,
                PushKind::Message => {
                    if let Some(announced) = switched(&push.data, &settings.master_name) {
                        let Some(m) = master.upgrade() else { return };
                        follow_announced(&m, announced).await;
                    }
                }
                _ => {}
            }
            if master.strong_count() == 0 {
                return;
            }
        }
        drop(conn);
        if up_since.elapsed() > Duration::from_secs(2) {
            delay = LISTEN_RETRY_MIN;
        } else {
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(LISTEN_RETRY_MAX);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_role_is_read_from_hello_in_both_protocols() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let resp2 = Value::Array(vec![
            bulk("server"),
            bulk("redis"),
            bulk("role"),
            bulk("master"),
        ]);
        assert_eq!(role(&resp2), Some(b"master".as_slice()));
        let resp3 = Value::Map(vec![
            (bulk("proto"), Value::Int(3)),
            (bulk("role"), bulk("replica")),
        ]);
        assert_eq!(role(&resp3), Some(b"replica".as_slice()));
        assert_eq!(role(&Value::Nil), None);
        assert_eq!(role(&Value::Array(vec![bulk("role")])), None);
    }

    #[test]
    fn only_an_address_a_majority_of_the_configured_sentinels_name_is_taken() {
        let a = ("10.0.0.1".to_owned(), 6379);
        let b = ("10.0.0.2".to_owned(), 6379);
        let down = || Err::<(String, u16), _>("timed out".to_owned());
        // One stale sentinel names another address, two the primary.
        assert_eq!(
            majority(vec![Ok(a.clone()), Ok(b.clone()), Ok(b.clone())], 3),
            Ok(b.clone())
        );
        // A tie of the answering sentinels is no majority of the configured ones.
        let tie = majority(vec![Ok(a.clone()), Ok(b.clone()), down()], 3);
        assert!(
            tie.as_ref().is_err_and(|e| e.contains("10.0.0.1:6379 by 1")
                && e.contains("10.0.0.2:6379 by 1")
                && e.contains("1 did not answer")),
            "{tie:?}"
        );
        // One answer of three is not enough, even when it is the only one.
        assert!(majority(vec![Ok(a.clone()), down(), down()], 3).is_err());
        // Two of four is not a majority; three of four is.
        assert!(
            majority(
                vec![Ok(a.clone()), Ok(a.clone()), Ok(b.clone()), Ok(b.clone())],
                4
            )
            .is_err()
        );
        assert_eq!(
            majority(vec![Ok(a.clone()), Ok(a.clone()), Ok(a.clone()), down()], 4),
            Ok(a.clone())
        );
        // A single configured sentinel is its own majority.
        assert_eq!(majority(vec![Ok(a.clone())], 1), Ok(a));
        assert!(majority(Vec::new(), 0).is_err());
    }

    #[test]
    fn a_switch_names_the_new_primary_of_our_name_only() {
        let msg = |s: &str| {
            vec![
                Value::BulkString(b"+switch-master".to_vec()),
                Value::BulkString(s.as_bytes().to_vec()),
            ]
        };
        assert_eq!(
            switched(&msg("mymaster 10.0.0.1 6379 10.0.0.2 6380"), "mymaster"),
            Some(("10.0.0.2".to_owned(), 6380))
        );
        assert_eq!(
            switched(&msg("other 10.0.0.1 6379 10.0.0.2 6380"), "mymaster"),
            None
        );
        assert_eq!(switched(&msg("mymaster 10.0.0.1 6379"), "mymaster"), None);
        assert_eq!(switched(&msg("mymaster a b c notaport"), "mymaster"), None);
    }

    #[test]
    fn readonly_is_found_inside_a_pipelines_answers() {
        let readonly =
            redis::parse_redis_value(b"-READONLY You can't write against a read only replica.\r\n")
                .expect("an error reply");
        assert!(matches!(readonly, Value::ServerError(_)));
        assert!(refused_readonly(&[Value::Okay, readonly.clone()]));
        assert!(refused_readonly(&[Value::Array(vec![readonly])]));
        assert!(!refused_readonly(&[Value::Okay, Value::Int(1)]));
    }
}
