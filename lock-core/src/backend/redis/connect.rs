//! Connection set-up of the Redis backend: the builder, `connect`, and what it learns of the
//! server (version, cluster mode, memory policy); the permission check run once per key
//! prefix; and the watcher that hears of dropped connections.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{AsyncConnectionConfig, Client, ProtocolVersion, PushKind, Script, Value};
use tokio::sync::{OnceCell, mpsc, watch};

use super::subscriber::Subscriber;
use super::{Inner, RedisBackend, retriable};
use crate::LockError;
use crate::key::{LockKey, display_key, validate_prefix};

static PROBE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("scripts/probe.lua")));

/// The lock name the permission check stands in for a lock of a prefix (it writes nothing).
const PROBE_NAME: &str = "__lock_probe__";

/// Where a missing permission is explained.
const ACL_HINT: &str = "see \"Redis permissions\" in the README for the ACL rule";

/// Backoff of the watcher's reconnection attempts.
const WATCH_RETRY_MIN: Duration = Duration::from_millis(10);
const WATCH_RETRY_MAX: Duration = Duration::from_millis(500);

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
}

impl std::fmt::Debug for RedisBackendBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackendBuilder")
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
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

    /// Connects, checks the server answers, and learns whether it has sharded pub/sub.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for a malformed URL or zero timeouts,
    /// [`LockError::Backend`] when the server cannot be reached.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let backend = lock_core::RedisBackend::builder("redis://127.0.0.1/").connect().await?;
    /// # drop(backend); Ok(()) }
    /// ```
    pub async fn connect(self) -> Result<RedisBackend, LockError> {
        if self.connect_timeout.is_zero() || self.response_timeout.is_zero() {
            return Err(LockError::config(
                "Redis connect and response timeouts must be above zero",
            ));
        }
        let client = Client::open(self.url.as_str()).map_err(|e| {
            LockError::config(format!(
                "cannot parse the Redis URL ({e}); expected redis://[user:password@]host[:port][/db], rediss://... or redis+unix:///path"
            ))
        })?;
        let config = manager_config(self.connect_timeout, self.response_timeout);
        let mut conn = ConnectionManager::new_with_config(client.clone(), config)
            .await
            .map_err(|e| LockError::backend("connect", "", e))?;
        let server = server_info(&mut conn).await?;
        let sharded = server.major >= 7;
        let maxmemory_policy = maxmemory_policy(&mut conn).await;
        match maxmemory_policy.as_deref() {
            Some(policy) if evicts(policy) => tracing::warn!(
                policy,
                "the Redis server's maxmemory-policy may evict lock keys when memory runs out \
                 (a lock evicted while held can be taken by another owner): set \
                 maxmemory-policy noeviction on the server that holds the locks, and use \
                 fencing tokens where the storage can check them"
            ),
            Some(_) => {}
            None => tracing::debug!(
                "cannot read the Redis server's maxmemory-policy (CONFIG and INFO refused): \
                 whether it may evict lock keys is unknown"
            ),
        }
        let subscriber = Subscriber::new(
            &client,
            sharded,
            server.major >= 6,
            self.connect_timeout,
            self.response_timeout,
        )?;
        let watcher = Watcher::new(&client, server.major >= 6, self.connect_timeout)?;
        Ok(RedisBackend {
            inner: Arc::new(Inner {
                conn,
                sharded,
                cluster: server.cluster,
                set_nx_get: server.major >= 7,
                subscriber,
                maxmemory_policy,
                permissions: Permissions::default(),
                watcher,
            }),
        })
    }
}

/// What `connect` learns of the server.
struct ServerInfo {
    major: u32,
    cluster: bool,
}

/// Version and mode from `HELLO` (no protocol argument: it answers in the current protocol,
/// and needs no `@dangerous` permission; Redis 6.2+), else from `INFO` (older servers).
async fn server_info(conn: &mut ConnectionManager) -> Result<ServerInfo, LockError> {
    let hello_error = match redis::cmd("HELLO").query_async::<Value>(conn).await {
        Ok(reply) => {
            if let Some(version) = hello_field(&reply, "version") {
                return Ok(ServerInfo {
                    major: major_version(&version),
                    cluster: hello_field(&reply, "mode").as_deref() == Some("cluster"),
                });
            }
            None
        }
        Err(e) => Some(e),
    };
    let mut info = async |section: &str| {
        redis::cmd("INFO")
            .arg(section)
            .query_async::<String>(&mut *conn)
            .await
    };
    match (info("server").await, info("cluster").await) {
        (Ok(server), Ok(cluster)) => Ok(ServerInfo {
            major: server_major_version(&server),
            cluster: cluster.contains("cluster_enabled:1"),
        }),
        (Err(e), _) | (_, Err(e)) => match hello_error {
            Some(hello) if is_noperm(&hello) || is_noperm(&e) => Err(LockError::config(format!(
                "the Redis user may run neither HELLO nor INFO ({hello}; {e}); grant +@connection: {ACL_HINT}"
            ))),
            _ => Err(LockError::backend("connect", "", e)),
        },
    }
}

/// A field of a `HELLO` answer: a map in RESP3, a flat list of names and values in RESP2.
fn hello_field(reply: &Value, name: &str) -> Option<String> {
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) | Value::VerbatimString { text: s, .. } => Some(s.clone()),
        _ => None,
    };
    match reply {
        Value::Map(pairs) => pairs
            .iter()
            .find(|(k, _)| text(k).as_deref() == Some(name))
            .and_then(|(_, v)| text(v)),
        Value::Array(items) => items
            .chunks_exact(2)
            .find(|pair| text(&pair[0]).as_deref() == Some(name))
            .and_then(|pair| text(&pair[1])),
        _ => None,
    }
}

/// `CONFIG GET maxmemory-policy`, else `INFO memory`; `None` when both are refused (both need
/// `@dangerous` permissions) or answer nothing readable.
async fn maxmemory_policy(conn: &mut ConnectionManager) -> Option<String> {
    let config: Result<Vec<String>, _> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory-policy")
        .query_async(&mut *conn)
        .await;
    if let Ok(answer) = config
        && let [_, policy] = answer.as_slice()
    {
        return Some(policy.clone());
    }
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(conn)
        .await
        .ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("maxmemory_policy:"))
        .map(|p| p.trim().to_owned())
}

/// Whether a `maxmemory-policy` may evict lock keys: every policy but `noeviction`.
fn evicts(policy: &str) -> bool {
    !policy.eq_ignore_ascii_case("noeviction")
}

fn is_noperm(e: &redis::RedisError) -> bool {
    e.code() == Some("NOPERM")
}

fn manager_config(connect: Duration, response: Duration) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(connect))
        .set_response_timeout(Some(response))
        .set_number_of_retries(1)
        .set_min_delay(Duration::from_millis(10))
        .set_max_delay(Duration::from_millis(500))
}

fn server_major_version(info: &str) -> u32 {
    info.lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .map_or(0, major_version)
}

/// `7` for `"7.0.15"`; 0 when unreadable.
fn major_version(version: &str) -> u32 {
    version
        .trim()
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0)
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

    /// Options for connecting. Accepts `redis://`, `rediss://` (when redis-rs is built with TLS),
    /// `redis+unix://` and `unix://` URLs, with an ACL user and password in the URL.
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
        }
    }
}

impl RedisBackend {
    /// The server's `maxmemory-policy`, read when the backend connected; `None` when the user
    /// may read neither `CONFIG` nor `INFO` (both are `@dangerous`). Every policy but
    /// `noeviction` lets a server that reaches `maxmemory` evict keys, lock keys among them
    /// (`volatile-*` policies pick keys with a TTL: exactly the locks); `connect` logs a warning
    /// then, and [`LockerStats::eviction_risk`](crate::LockerStats::eviction_risk) says so.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let backend = lock_core::RedisBackend::connect("redis://127.0.0.1:6379/").await?;
    /// match backend.maxmemory_policy() {
    ///     Some("noeviction") => {}
    ///     Some(policy) => eprintln!("Redis may evict lock keys (maxmemory-policy {policy})"),
    ///     None => eprintln!("cannot tell whether Redis may evict lock keys"),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn maxmemory_policy(&self) -> Option<&str> {
        self.inner.maxmemory_policy.as_deref()
    }

    /// Whether the server may evict lock keys: `None` when its policy is unknown.
    pub(crate) fn eviction_risk(&self) -> Option<bool> {
        self.maxmemory_policy().map(evicts)
    }

    /// Checks that the Redis user may run everything the lock runs on the keys and channels of
    /// `prefix` (keys `<prefix>*`, channels `<prefix>*`, the commands of the README's ACL rule),
    /// without writing anything. The backend does it by itself before the first acquire of each
    /// prefix, and [`Locker::redis`](crate::Locker::redis) at connect for the default prefix;
    /// call it at start-up to learn of a missing permission before the first lock. A success is
    /// remembered per prefix.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] naming the refused commands, keys or channels (and for a
    /// prefix with braces or too long), [`LockError::Backend`] when Redis cannot be reached.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let backend = lock_core::RedisBackend::connect("redis://shop:secret@127.0.0.1:6379/").await?;
    /// backend.check_permissions("shop:").await?; // ACL: ~shop:* &shop:* ...
    /// let locker = lock_core::Locker::builder(backend).prefix("shop:").build();
    /// # drop(locker); Ok(()) }
    /// ```
    pub async fn check_permissions(&self, prefix: &str) -> Result<(), LockError> {
        validate_prefix(prefix)?;
        self.inner
            .permissions
            .cell(prefix)
            .get_or_try_init(|| self.probe(prefix))
            .await
            .map(|_| ())
    }

    /// Runs the permission check of the key's prefix unless it passed already (one map lookup
    /// then).
    pub(super) async fn check_permissions_of(&self, key: &LockKey) -> Result<(), LockError> {
        // A prefix holds no brace: the lock name's first `{` opens the hash tag.
        let lock = key.lock();
        let prefix = lock.split_once('{').map_or(lock, |(prefix, _)| prefix);
        let cell = self.inner.permissions.cell(prefix);
        if cell.initialized() {
            return Ok(());
        }
        cell.get_or_try_init(|| self.probe(prefix))
            .await
            .map(|_| ())
    }

    async fn probe(&self, prefix: &str) -> Result<(), LockError> {
        let key = LockKey::new(prefix, PROBE_NAME)?;
        let channel = key.channel();
        let mut call = PROBE.prepare_invoke();
        call.key(key.lock())
            .key(key.fence())
            .key(key.queue())
            .key(key.waiters())
            .arg(&channel)
            .arg(if self.inner.sharded { "1" } else { "0" });
        let mut conn = self.inner.conn.clone();
        let answer = match call.invoke_async::<Value>(&mut conn).await {
            Err(e) if retriable(&e) => call.invoke_async::<Value>(&mut conn).await,
            answer => answer,
        };
        let shown = display_key(prefix);
        let refused = match answer {
            Ok(Value::Array(items)) => items,
            Ok(other) => {
                return Err(LockError::protocol(
                    "check permissions",
                    "",
                    format!("the permission check answered {other:?}"),
                ));
            }
            Err(e) if is_noperm(&e) => {
                return Err(LockError::config(format!(
                    "the Redis user may not run the lock's scripts on the keys of prefix {shown:?} ({e}); it needs keys ~{shown}*, channels &{shown}* and +@scripting: {ACL_HINT}"
                )));
            }
            Err(e) => return Err(LockError::backend("check permissions", "", e)),
        };
        if refused.is_empty() {
            return Ok(());
        }
        // Each refusal is `<kind> <COMMAND> <name>`; told once per kind, commands and names
        // each listed once.
        let mut kinds: [(&str, Vec<String>, Vec<String>); 3] = [
            ("key", Vec::new(), Vec::new()),
            ("channel", Vec::new(), Vec::new()),
            ("command", Vec::new(), Vec::new()),
        ];
        for item in &refused {
            let text = match item {
                Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                Value::SimpleString(s) => s.clone(),
                other => format!("{other:?}"),
            };
            let mut parts = text.splitn(3, ' ');
            let (kind, command, name) = (parts.next(), parts.next(), parts.next());
            let Some((_, commands, names)) = kinds.iter_mut().find(|(k, ..)| Some(*k) == kind)
            else {
                let (_, commands, _) = &mut kinds[2];
                commands.push(display_key(&text));
                continue;
            };
            for (list, value) in [(commands, command), (names, name.filter(|n| *n != "-"))] {
                if let Some(value) = value.map(display_key)
                    && !list.contains(&value)
                {
                    list.push(value);
                }
            }
        }
        let missing: Vec<String> = kinds
            .iter()
            .filter(|(_, commands, _)| !commands.is_empty())
            .map(|(kind, commands, names)| match *kind {
                "key" => format!(
                    "{} on keys {} (grant ~{shown}* and +@read +@write)",
                    commands.join(", "),
                    names.join(", ")
                ),
                "channel" => format!(
                    "{} on channel {} (grant &{shown}* and +@pubsub)",
                    commands.join(", "),
                    names.join(", ")
                ),
                _ => format!("the commands {}", commands.join(", ")),
            })
            .collect();
        Err(LockError::config(format!(
            "the Redis user lacks permissions the lock needs for prefix {shown:?}: {}; nothing was locked: {ACL_HINT}",
            missing.join("; ")
        )))
    }

    /// A receiver whose value changes each time the connection to the server was lost and each
    /// time it is back; `None` when the server is too old to tell (before Redis 6) or there is
    /// no runtime to watch on.
    pub(crate) fn reconnects(&self) -> Option<watch::Receiver<u64>> {
        self.inner.watcher.subscribe()
    }
}

/// The prefixes whose permission check passed (one cell per prefix: concurrent first locks of
/// a prefix wait for one check; a failed check is not remembered and runs again next time).
#[derive(Default)]
pub(super) struct Permissions {
    checked: Mutex<HashMap<String, Arc<OnceCell<()>>>>,
}

impl Permissions {
    fn cell(&self, prefix: &str) -> Arc<OnceCell<()>> {
        // A map of cells: a poisoned lock still holds consistent data.
        let mut checked = self.checked.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(cell) = checked.get(prefix) {
            return cell.clone();
        }
        checked.entry(prefix.to_owned()).or_default().clone()
    }
}

/// Hears of dropped connections to the server on a connection of its own that sends nothing
/// (RESP3, so the client library reports the drop as it happens, even when idle), and counts
/// each drop and each return, so the watchdog can check every held lock at once instead of at
/// its next regular renewal. Its task runs while someone listens (a locker's watchdog).
pub(super) struct Watcher {
    /// `None` before Redis 6 (no RESP3).
    client: Option<Client>,
    epoch: watch::Sender<u64>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    connect_timeout: Duration,
}

impl Watcher {
    fn new(client: &Client, resp3: bool, connect_timeout: Duration) -> Result<Self, LockError> {
        let client = resp3_client(client, resp3, "connect watcher")?;
        Ok(Watcher {
            client,
            epoch: watch::Sender::new(0),
            task: Mutex::new(None),
            connect_timeout,
        })
    }

    fn subscribe(&self) -> Option<watch::Receiver<u64>> {
        let client = self.client.as_ref()?;
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let receiver = self.epoch.subscribe();
        let mut task = self.task.lock().unwrap_or_else(PoisonError::into_inner);
        if task
            .as_ref()
            .is_none_or(tokio::task::JoinHandle::is_finished)
        {
            *task = Some(runtime.spawn(watch_connection(
                client.clone(),
                self.epoch.clone(),
                self.connect_timeout,
            )));
        }
        Some(receiver)
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        if let Some(task) = self
            .task
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            task.abort();
        }
    }
}

/// The watcher's task: keeps one idle connection, bumps `epoch` when it drops and when a new
/// one is up; ends when nobody listens any more.
async fn watch_connection(client: Client, epoch: watch::Sender<u64>, connect_timeout: Duration) {
    let mut connected_before = false;
    let mut delay = WATCH_RETRY_MIN;
    loop {
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
                if connected_before {
                    tracing::debug!("lock server connection back; checking the held locks");
                    epoch.send_modify(|n| *n = n.wrapping_add(1));
                }
                connected_before = true;
                delay = WATCH_RETRY_MIN;
                loop {
                    tokio::select! {
                        () = epoch.closed() => return,
                        push = pushes.recv() => match push {
                            Some(push) if push.kind != PushKind::Disconnection => {}
                            _ => break,
                        },
                    }
                }
                drop(conn);
                tracing::debug!("lock server connection lost; checking the held locks");
                epoch.send_modify(|n| *n = n.wrapping_add(1));
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
    let info = client.get_connection_info().clone();
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    Client::open(info.set_redis_settings(settings))
        .map(Some)
        .map_err(|e| LockError::backend(operation, "", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_parse() {
        assert_eq!(
            server_major_version("# Server\r\nredis_version:7.0.15\r\n"),
            7
        );
        assert_eq!(server_major_version("garbage"), 0);
        assert_eq!(major_version("6.2.14"), 6);
        assert_eq!(major_version(""), 0);
    }

    #[test]
    fn hello_fields_in_both_protocols() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let resp2 = Value::Array(vec![
            bulk("server"),
            bulk("redis"),
            bulk("version"),
            bulk("7.0.15"),
            bulk("proto"),
            Value::Int(2),
            bulk("mode"),
            bulk("cluster"),
        ]);
        assert_eq!(hello_field(&resp2, "version").as_deref(), Some("7.0.15"));
        assert_eq!(hello_field(&resp2, "mode").as_deref(), Some("cluster"));
        assert_eq!(hello_field(&resp2, "proto"), None);
        assert_eq!(hello_field(&resp2, "role"), None);
        let resp3 = Value::Map(vec![
            (bulk("version"), bulk("6.2.0")),
            (bulk("mode"), Value::SimpleString("standalone".into())),
        ]);
        assert_eq!(hello_field(&resp3, "version").as_deref(), Some("6.2.0"));
        assert_eq!(hello_field(&resp3, "mode").as_deref(), Some("standalone"));
        assert_eq!(hello_field(&Value::Nil, "version"), None);
        // An odd-length list is read pair by pair, never out of bounds.
        assert_eq!(
            hello_field(&Value::Array(vec![bulk("version")]), "version"),
            None
        );
    }

    #[test]
    fn eviction_policies() {
        assert!(!evicts("noeviction"));
        for policy in [
            "volatile-lru",
            "allkeys-lru",
            "volatile-ttl",
            "allkeys-random",
        ] {
            assert!(evicts(policy), "{policy}");
        }
    }

    /// Every command the lock's scripts run is in the permission check: a command added to a
    /// script without it would be refused half-way through that script for a restricted user.
    #[test]
    fn the_permission_check_covers_every_command_the_scripts_run() {
        let probe = include_str!("scripts/probe.lua");
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/backend/redis/scripts");
        let mut scripts = 0;
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{dir}: {e}")) {
            let path = entry.unwrap_or_else(|e| panic!("{dir}: {e}")).path();
            if path.extension().is_none_or(|e| e != "lua") || path.ends_with("probe.lua") {
                continue;
            }
            scripts += 1;
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            for call in ["redis.call(", "redis.pcall("] {
                for rest in text.split(call).skip(1) {
                    let rest = rest.trim_start();
                    let Some(quote) = rest.chars().next().filter(|c| *c == '\'' || *c == '"')
                    else {
                        panic!(
                            "{}: a command name that is not a literal ({}...): keep the permission check complete by hand",
                            path.display(),
                            &rest[..rest.len().min(30)]
                        );
                    };
                    let name: String = rest[1..].chars().take_while(|c| *c != quote).collect();
                    let name = name.to_ascii_uppercase();
                    let listed = ["'", "\""]
                        .iter()
                        .any(|q| probe.contains(&format!("{q}{name}{q}")));
                    assert!(
                        listed,
                        "{} runs {name}, which scripts/probe.lua does not check",
                        path.display()
                    );
                }
            }
        }
        assert!(scripts >= 5, "read {scripts} scripts from {dir}");
    }
}
