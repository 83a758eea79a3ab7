//! The Redis backend: one Redis server, through a multiplexed connection of our own over plain
//! TCP or a Unix socket (wire.rs), or redis-rs's `ConnectionManager` over TLS. A cluster-mode
//! node that serves every slot itself works too (renewals then go one lock name per call).
//! The cluster backend (`backend::cluster`) is this backend over a cluster connection
//! (`conn::Conn`): the same scripts, calls and reply parsing.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use super::{Attempt, AttemptOptions, Inbox, Renewal};
use crate::LockError;
use crate::key::LockKey;
use crate::token::Token;
use redis::{Script, ScriptInvocation, Value};

mod batch;
mod boundary;
mod cohort;
mod conn;
pub(crate) mod connect;
mod eviction;
mod idempotency;
mod inspect;
#[cfg(feature = "redlock")]
pub(crate) use inspect::{Digest, Seen};
mod permissions;
#[cfg(feature = "redlock")]
mod redlock_waiter;
mod release;
mod server;
#[cfg(feature = "cluster")]
mod shards;
mod subscriber;
pub(crate) mod tls;
mod watcher;
mod wire;

pub use connect::RedisBackendBuilder;
#[cfg(feature = "cluster")]
pub(crate) use shards::answered;

use conn::Conn;
use subscriber::Subscriber;

// The fencing code (fence.lua) is prepended to every script that may draw a token, and the
// handover code (handoff.lua) to every script that frees a lock.
static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("scripts/fence.lua"),
        include_str!("scripts/acquire.lua")
    ))
});
static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("scripts/renew_one.lua"),
        include_str!("scripts/renew.lua")
    ))
});
static ACQUIRE_QUEUED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("scripts/fence.lua"),
        include_str!("scripts/acquire_queued.lua")
    ))
});
static LEAVE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("scripts/fence.lua"),
        include_str!("scripts/handoff.lua"),
        include_str!("scripts/leave.lua")
    ))
});

/// Locks in one Redis server.
///
/// Commands go through one multiplexed, auto-reconnecting connection; release notifications
/// come through one more connection, opened the first time a waiter needs it and shared by
/// every waiter and key of the backend (sharded pub/sub on Redis 7+, plain pub/sub before).
/// Scripts run with `EVALSHA` and are loaded again after `NOSCRIPT` (a restarted server).
/// One more idle connection (Redis 6+), opened with the backend and kept for its life, hears of
/// a dropped connection at once, and every held lock is checked then. Before the first lock of a key prefix, a check
/// that writes nothing makes sure the Redis user may run every command the lock needs
/// (see [`check_permissions`](Self::check_permissions)).
///
/// Clones share the connections.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use std::time::Duration;
/// use lock_core::{Locker, RedisBackend};
///
/// let backend = RedisBackend::builder("redis://app:secret@127.0.0.1:6379/0")
///     .response_timeout(Duration::from_millis(500))
///     .connect()
///     .await?;
/// let locker = Locker::builder(backend).prefix("shop:").build();
/// # drop(locker); Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Conn,
    sharded: bool,
    /// A cluster-mode node refuses one script call over keys of several slots: renewals are
    /// then sent per lock name.
    cluster: bool,
    /// `SET ... NX GET` (Redis 7+): the plain acquire needs no script.
    set_nx_get: bool,
    subscriber: Subscriber,
    /// The server's `maxmemory-policy`, when it could be read at connect.
    maxmemory_policy: Option<String>,
    /// The key prefixes whose permission check passed.
    permissions: permissions::Permissions,
    /// Hears of dropped connections, for the watchdog.
    watcher: watcher::Watcher,
    /// Plain acquires and releases waiting to go out together (never on a cluster node).
    batches: batch::Batches,
    /// Whether a release tries the one-key release first (release.rs): not on a Redlock's
    /// servers, whose waiters do not mark the lock.
    fast_release: bool,
    /// The keys on which waiters were met lately (release.rs).
    contention: release::Contention,
    /// The cluster's slot map (cluster backend only), to group renewals by shard.
    #[cfg(feature = "cluster")]
    topology: Option<Arc<crate::backend::cluster::Topology>>,
    /// The primary a Sentinel set names (Sentinel backend only).
    #[cfg(feature = "sentinel")]
    master: Option<Arc<crate::backend::sentinel::Master>>,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may hold a password: never print it.
        f.debug_struct("RedisBackend")
            .field("sharded_pubsub", &self.inner.sharded)
            .finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// Whether release notifications use sharded pub/sub (`SPUBLISH`/`SSUBSCRIBE`, Redis 7+).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let backend = lock_core::RedisBackend::connect("redis://127.0.0.1/").await?;
    /// println!("sharded pub/sub: {}", backend.sharded_pubsub());
    /// # Ok(()) }
    /// ```
    pub fn sharded_pubsub(&self) -> bool {
        self.inner.sharded
    }

    /// The primary this backend follows, when it is a Sentinel backend.
    #[cfg(feature = "sentinel")]
    pub(crate) fn sentinel_master(&self) -> Option<&Arc<crate::backend::sentinel::Master>> {
        self.inner.master.as_ref()
    }

    /// Runs a script (EVALSHA, loading it again after NOSCRIPT). When the connection was found
    /// dropped or refused, the call is made once more, on a new connection: every script here is safe to run twice (acquire recognises its own token; release,
    /// renew and leave compare it). Timeouts are not retried: the caller's deadline rules.
    async fn invoke(
        &self,
        call: &ScriptInvocation<'_>,
        operation: &'static str,
        key: Option<&str>,
    ) -> Result<Value, LockError> {
        self.invoke_on(self.inner.conn.clone(), call, operation, key)
            .await
    }

    /// [`invoke`](Self::invoke) on a given connection (a cluster's renewals go through a
    /// connection per shard).
    async fn invoke_on(
        &self,
        mut conn: Conn,
        call: &ScriptInvocation<'_>,
        operation: &'static str,
        key: Option<&str>,
    ) -> Result<Value, LockError> {
        match call.invoke_async::<Value>(&mut conn).await {
            Ok(v) => Ok(v),
            Err(e) if retriable(&e) => {
                tracing::debug!(error = %e, operation, "Redis connection lost; retrying once on a new one");
                call.invoke_async::<Value>(&mut conn)
                    .await
                    .map_err(|e| LockError::backend(operation, key, e))
            }
            Err(e) => Err(LockError::backend(operation, key, e)),
        }
    }

    /// Sends `cmd`, an `EVALSHA` of `script` built in one command buffer (a
    /// `ScriptInvocation` copies every key and argument into a vector of its own first), loading
    /// the script after `NOSCRIPT`; retried once as [`invoke`](Self::invoke) is.
    async fn evalsha(
        &self,
        script: &Script,
        cmd: &redis::Cmd,
        operation: &'static str,
        key: Option<&str>,
    ) -> Result<Value, LockError> {
        let mut conn = self.inner.conn.clone();
        match evalsha_once(&mut conn, script, cmd).await {
            Ok(v) => Ok(v),
            Err(e) if retriable(&e) => {
                tracing::debug!(error = %e, operation, "Redis connection lost; retrying once on a new one");
                evalsha_once(&mut conn, script, cmd)
                    .await
                    .map_err(|e| LockError::backend(operation, key, e))
            }
            Err(e) => Err(LockError::backend(operation, key, e)),
        }
    }

    /// Whether `other` reads the keyspace this backend writes to (the same server and
    /// database under another URL: another host name, address or port forward): a key with a
    /// random name is written here, looked for there, then deleted. Redlock counts each
    /// server's vote once; one server under two URLs would count twice.
    ///
    /// The write must succeed (an error here is [`Keyspace::Unknown`]: the caller does not
    /// let the server join yet), except that a refused permission is [`Keyspace::NoPermission`].
    /// A read that fails or times out there while the write here succeeded means `other` does
    /// not answer as this server does: a different server.
    #[cfg(feature = "redlock")]
    pub(crate) async fn same_keyspace(&self, other: &RedisBackend, bound: Duration) -> Keyspace {
        let key = format!(
            "{}{{redlock-identity}}:{:032x}",
            crate::DEFAULT_PREFIX,
            rand::random::<u128>()
        );
        let mut here = self.inner.conn.clone();
        let mut there = other.inner.conn.clone();
        let mut set = redis::cmd("SET");
        set.arg(&key).arg(1).arg("PX").arg(10_000);
        match tokio::time::timeout(bound, set.query_async::<Value>(&mut here)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) => {
                return Keyspace::NoPermission(e.to_string());
            }
            Ok(Err(e)) => return Keyspace::Unknown(e.to_string()),
            Err(_) => return Keyspace::Unknown("the probe write timed out".to_owned()),
        }
        let exists = redis::cmd("EXISTS").arg(&key).clone();
        let seen = tokio::time::timeout(bound, exists.query_async::<i64>(&mut there)).await;
        // The key expires on its own should the delete fail.
        let del = redis::cmd("DEL").arg(&key).clone();
        let _ = tokio::time::timeout(bound, del.query_async::<i64>(&mut here)).await;
        match seen {
            Ok(Ok(n)) if n > 0 => Keyspace::Same,
            Ok(Err(e)) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) => {
                Keyspace::NoPermission(e.to_string())
            }
            _ => Keyspace::Different,
        }
    }

    pub(crate) async fn acquire(
        &self,
        key: &LockKey,
        token: &Token,
        lease: Duration,
        options: AttemptOptions<'_>,
    ) -> Result<Attempt, LockError> {
        self.acquire_stamped(key, token, lease, options, None).await
    }

    /// [`acquire`](Self::acquire), the holding stamped as taken at `since` (`None`: now). A
    /// Redlock acquisition stamps every server with one instant, so that each server holds
    /// one value and `inspect` answers one `since` whichever servers it hears.
    pub(crate) async fn acquire_stamped(
        &self,
        key: &LockKey,
        token: &Token,
        lease: Duration,
        options: AttemptOptions<'_>,
        since: Option<std::time::SystemTime>,
    ) -> Result<Attempt, LockError> {
        let AttemptOptions {
            fenced,
            ticket,
            remaining,
            unrenewed: _,
            holder,
            bounded,
        } = options;
        // Once per key prefix: a permission missing for any command the lock runs is reported
        // here, before a lock is taken, never half-way through a release.
        self.check_permissions_of(key)
            .await
            .map_err(|e| permissions::for_operation(e, "nothing was locked"))?;
        if ticket.is_none() && !fenced && self.inner.set_nx_get {
            // The value in one allocation: the token, then its stamp.
            let mut value = String::with_capacity(token.as_str().len() + holder.len() + 18);
            value.push_str(token.as_str());
            stamp_onto(&mut value, holder, since);
            return self
                .acquire_plain(key, token, &value, lease, remaining, bounded)
                .await;
        }
        let mut stamp = String::new();
        stamp_onto(&mut stamp, holder, since);
        let mut call = match ticket {
            None => ACQUIRE.prepare_invoke(),
            Some(_) => ACQUIRE_QUEUED.prepare_invoke(),
        };
        call.key(key.name())
            .key(key.fence())
            .arg(token.as_str())
            .arg(millis(lease))
            .arg(if fenced { "1" } else { "0" });
        if ticket.is_none() {
            call.arg(&stamp);
        }
        if let Some(ticket) = ticket {
            let ttl = if ticket.ttl.is_zero() {
                0
            } else {
                millis(ticket.ttl)
            };
            call.key(key.queue())
                .key(key.waiters())
                .arg(ticket.id.as_str())
                .arg(ttl)
                .arg(ticket.generation)
                .arg(millis(ticket.handover_lease))
                .arg(if ticket.strict { "1" } else { "0" })
                .arg(key.channel())
                .arg(if self.inner.sharded { "1" } else { "0" })
                .arg(&stamp);
        }
        let reply = self.invoke(&call, "acquire", Some(key.user())).await?;
        match int_pair(&reply) {
            Some((1, _)) if !fenced => Ok(Attempt::Acquired { fence: None }),
            Some((1, fence)) if fence > 0 => Ok(Attempt::Acquired {
                fence: Some(fence.unsigned_abs()),
            }),
            Some((0, pttl)) => {
                if ticket.is_some_and(|t| !t.ttl.is_zero()) {
                    // Queued behind the holder: when this backend holds the key later, its
                    // release goes straight to the hand-over (release.rs).
                    self.inner.contention.note(key);
                }
                Ok(Attempt::Busy {
                    remaining: u64::try_from(pttl).ok().map(Duration::from_millis),
                })
            }
            _ => Err(LockError::protocol(
                "acquire",
                key.user(),
                format!("acquire script answered {reply:?}"),
            )),
        }
    }

    /// The common case without a script: `SET key token NX PX lease GET` (Redis 7+), followed
    /// in the same round trip by `PTTL key` when the caller wants to know how long a holder's
    /// lease runs. Still one atomic acquire; the old value tells a retry that the lock is its
    /// own already. Native commands cost the server a tenth of a script call. `value` is the
    /// token followed by its stamp (see [`stamp_onto`]).
    async fn acquire_plain(
        &self,
        key: &LockKey,
        token: &Token,
        value: &str,
        lease: Duration,
        remaining: bool,
        bounded: bool,
    ) -> Result<Attempt, LockError> {
        // Sent at once while few acquires are in flight, else in the next batch (batch.rs);
        // never batched on a cluster node (a batch's keys would span slots).
        let slot = if self.inner.cluster {
            None
        } else {
            let entry = batch::Entry {
                key,
                token,
                lease,
                remaining,
                value,
                fast: false,
            };
            match batch::enter(self, batch::Kind::Acquire, entry) {
                batch::Turn::Direct(slot) => Some(slot),
                batch::Turn::Queued(answer) => {
                    let reply =
                        batch::queued(self, answer, batch::Kind::Acquire, key, bounded).await?;
                    let pair = match &reply {
                        Value::Array(pair) => pair.as_slice(),
                        _ => &[],
                    };
                    return match pair {
                        [Value::Int(1)] => Ok(Attempt::Acquired { fence: None }),
                        [Value::Int(0), Value::Int(pttl)] => Ok(Attempt::Busy {
                            remaining: u64::try_from(*pttl).ok().map(Duration::from_millis),
                        }),
                        [Value::Int(0)] => Ok(Attempt::Busy { remaining: None }),
                        _ => Err(LockError::protocol(
                            "acquire",
                            key.user(),
                            format!("the acquire batch answered {reply:?}"),
                        )),
                    };
                }
            }
        };
        // Sized up front: built argument by argument, the buffer would grow (and copy) twice.
        let mut set = redis::Cmd::with_capacity(7, 40 + key.name().len() + value.len());
        set.arg("SET")
            .arg(key.name())
            .arg(value)
            .arg("NX")
            .arg("PX")
            .arg(millis(lease))
            .arg("GET");
        // A lone SET goes out as one command, not as a pipeline of one.
        let pipe = remaining.then(|| {
            let mut pipe = redis::pipe();
            pipe.add_command(set.clone()).cmd("PTTL").arg(key.name());
            pipe
        });
        let mut conn = self.inner.conn.clone();
        let mut send = async || match &pipe {
            Some(pipe) => pipe.query_async::<Vec<Value>>(&mut conn).await,
            None => set.query_async::<Value>(&mut conn).await.map(|v| vec![v]),
        };
        let reply: Vec<Value> = match send().await {
            Ok(v) => v,
            Err(e) if retriable(&e) => {
                tracing::debug!(error = %e, "Redis connection lost; retrying once on a new one");
                send()
                    .await
                    .map_err(|e| LockError::backend("acquire", key.user(), e))?
            }
            Err(e) => return Err(LockError::backend("acquire", key.user(), e)),
        };
        drop(slot);
        match reply.as_slice() {
            [Value::Nil, ..] => Ok(Attempt::Acquired { fence: None }),
            [Value::BulkString(old), ..] if release::holds(old, token) => {
                Ok(Attempt::Acquired { fence: None })
            }
            [
                Value::BulkString(_) | Value::SimpleString(_),
                Value::Int(pttl),
            ] => Ok(Attempt::Busy {
                remaining: u64::try_from(*pttl).ok().map(Duration::from_millis),
            }),
            [Value::BulkString(_) | Value::SimpleString(_)] if !remaining => {
                Ok(Attempt::Busy { remaining: None })
            }
            _ => Err(LockError::protocol(
                "acquire",
                key.user(),
                format!("SET NX GET / PTTL answered {reply:?}"),
            )),
        }
    }

    pub(crate) async fn leave_queue(
        &self,
        key: &LockKey,
        ticket: &str,
        token: &Token,
    ) -> Result<(), LockError> {
        let channel = key.channel();
        let mut call = LEAVE.prepare_invoke();
        call.key(key.name())
            .key(key.fence())
            .key(key.queue())
            .key(key.waiters())
            .arg(ticket)
            .arg(&channel)
            .arg(if self.inner.sharded { "1" } else { "0" })
            .arg(token.as_str());
        let reply = self.invoke(&call, "leave queue", Some(key.user())).await?;
        if let Value::Array(items) = &reply
            && let [Value::Int(_), Value::BulkString(message)] = items.as_slice()
        {
            // As after a release: this process's waiters learn at once.
            self.inner.subscriber.deliver(&channel, message);
        }
        Ok(())
    }

    /// On a cluster, the renewal items grouped by where they go (the primary that serves them,
    /// or their slot while it moves): the watchdog sends one call per group, the groups
    /// concurrently. `None` on one server.
    pub(crate) fn renewal_groups(&self, items: &[Renewal]) -> Option<Vec<Vec<usize>>> {
        #[cfg(feature = "cluster")]
        if let Some(topology) = &self.inner.topology {
            return Some(
                topology.group(
                    items
                        .iter()
                        .map(|r| crate::backend::cluster::key_slot(r.key.name().as_bytes())),
                ),
            );
        }
        let _ = items;
        None
    }

    /// One verdict per item: on a cluster each lock's own (a primary that fails leaves only
    /// its locks undecided), elsewhere yes or no for the whole call.
    pub(crate) async fn renew_verdicts(
        &self,
        items: &[Renewal],
    ) -> Result<Vec<super::Renewed>, LockError> {
        #[cfg(feature = "cluster")]
        if let Some(topology) = &self.inner.topology {
            return self.renew_shard(topology, items).await;
        }
        self.renew(items).await.map(super::Renewed::from_bools)
    }

    pub(crate) async fn renew(&self, items: &[Renewal]) -> Result<Vec<bool>, LockError> {
        self.renew_on_server(items, false).await
    }

    /// As [`renew`](Self::renew) on one of a Redlock's servers, where a lease is lengthened
    /// only, never shortened: each server's call runs to its end whatever the Redlock call
    /// decided, and one resent (after `NOSCRIPT` or a reconnect) may land after a later call
    /// for the same lock, which a quorum answered, and which the local deadline counts on.
    #[cfg(feature = "redlock")]
    pub(crate) async fn renew_at_least(&self, items: &[Renewal]) -> Result<Vec<bool>, LockError> {
        self.renew_on_server(items, true).await
    }

    /// One server's renewal (a Redis server, a Sentinel primary, a Redlock server; a cluster
    /// node without a topology: one call per lock name).
    async fn renew_on_server(
        &self,
        items: &[Renewal],
        at_least: bool,
    ) -> Result<Vec<bool>, LockError> {
        if !self.inner.cluster || items.len() <= 1 {
            return self
                .renew_script(self.inner.conn.clone(), items, at_least)
                .await;
        }
        // One lock name per call on a cluster node (its keys share one slot by construction).
        let mut answers = Vec::with_capacity(items.len());
        for item in items {
            let one = std::slice::from_ref(item);
            answers.extend(
                self.renew_script(self.inner.conn.clone(), one, at_least)
                    .await?,
            );
        }
        Ok(answers)
    }

    #[cfg(feature = "cluster")]
    async fn renew_batch_on(&self, conn: Conn, items: &[Renewal]) -> Result<Vec<bool>, LockError> {
        self.renew_script(conn, items, false).await
    }

    /// One `renew.lua` call over `items` (`at_least`: see
    /// [`renew_at_least`](Self::renew_at_least)).
    async fn renew_script(
        &self,
        conn: Conn,
        items: &[Renewal],
        at_least: bool,
    ) -> Result<Vec<bool>, LockError> {
        let first = items.first().map(|r| r.key.user());
        let mut call = RENEW.prepare_invoke();
        for r in items {
            call.key(r.key.name())
                .arg(r.token.as_str())
                .arg(millis(r.lease));
        }
        if at_least {
            call.arg("at-least");
        }
        let reply = self.invoke_on(conn, &call, "renew", first).await?;
        renew_answers(&reply, items.len(), first)
    }

    pub(crate) async fn subscribe(&self, key: &LockKey, inbox: &Arc<Inbox>) -> bool {
        self.inner.subscriber.subscribe(&key.channel(), inbox).await
    }

    pub(crate) fn unsubscribe(&self, key: &LockKey, inbox: &Arc<Inbox>) {
        self.inner.subscriber.unsubscribe(&key.channel(), inbox);
    }

    pub(crate) fn notifications_healthy(&self) -> bool {
        self.inner.subscriber.healthy()
    }

    pub(crate) fn resubscribe_after(&self) -> Option<Duration> {
        self.inner.subscriber.resubscribe_after()
    }
}

/// The answers of one renew script call over `n` locks: `true` when still ours.
fn renew_answers(reply: &Value, n: usize, first: Option<&str>) -> Result<Vec<bool>, LockError> {
    let answers = match reply {
        Value::Array(v) if v.len() == n => v,
        _ => {
            return Err(LockError::protocol(
                "renew",
                first,
                format!("renew script answered {reply:?} for {n} locks"),
            ));
        }
    };
    answers
        .iter()
        .map(|a| match a {
            Value::Int(1) => Ok(true),
            Value::Int(0) => Ok(false),
            other => Err(LockError::protocol(
                "renew",
                first,
                format!("renew script answered {other:?} for one lock"),
            )),
        })
        .collect()
}

/// One `EVALSHA` (see [`RedisBackend::evalsha`]); after `NOSCRIPT` (a restarted or flushed
/// server) the script is loaded and the call sent again.
async fn evalsha_once(
    conn: &mut Conn,
    script: &Script,
    cmd: &redis::Cmd,
) -> redis::RedisResult<Value> {
    match cmd.query_async::<Value>(conn).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            script.prepare_invoke().load_async(conn).await?;
            cmd.query_async::<Value>(conn).await
        }
        answer => answer,
    }
}

/// A call that failed because the connection was found dropped or refused (not a timeout):
/// the manager reconnects, and a second try is worth it.
fn retriable(e: &redis::RedisError) -> bool {
    !e.is_timeout() && (e.is_connection_dropped() || e.is_connection_refusal() || e.is_io_error())
}

/// Appends to `out` what a lock's value holds after its token (see release_fast.lua):
/// `|<since>|<holder>|`, `since` in ms since 1970 by this process's clock (now when `None`);
/// nothing for a holder that names none.
fn stamp_onto(out: &mut String, holder: &str, since: Option<std::time::SystemTime>) {
    if holder.is_empty() {
        return;
    }
    let since = since
        .unwrap_or_else(std::time::SystemTime::now)
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    // Not `write!`: `core::fmt` costs several times the rest of the stamp on every acquire.
    out.push('|');
    out.push_str(itoa::Buffer::new().format(since));
    out.push('|');
    out.push_str(holder);
    out.push('|');
}

/// Milliseconds for PX/PEXPIRE, rounded up so a lease is never shorter than asked.
fn millis(d: Duration) -> u64 {
    let ms = d.as_millis();
    let up = if d.subsec_nanos().is_multiple_of(1_000_000) {
        ms
    } else {
        ms + 1
    };
    u64::try_from(up).unwrap_or(u64::MAX).max(1)
}

fn int_pair(v: &Value) -> Option<(i64, i64)> {
    match v {
        Value::Array(items) => match items.as_slice() {
            [Value::Int(a), Value::Int(b)] => Some((*a, *b)),
            _ => None,
        },
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_round_up() {
        assert_eq!(millis(Duration::from_millis(30)), 30);
        assert_eq!(millis(Duration::from_micros(30_001)), 31);
        assert_eq!(millis(Duration::from_nanos(1)), 1);
    }

    #[test]
    fn pairs() {
        assert_eq!(
            int_pair(&Value::Array(vec![Value::Int(1), Value::Int(5)])),
            Some((1, 5))
        );
        assert_eq!(int_pair(&Value::Int(1)), None);
    }
}

/// What [`RedisBackend::same_keyspace`] found.
#[cfg(feature = "redlock")]
#[derive(Debug)]
pub(crate) enum Keyspace {
    /// A key written through one is read through the other: one server.
    Same,
    Different,
    /// The probe key may not be written (an ACL without the default prefix).
    NoPermission(String),
    /// The probe could not be written (an error or a timeout): try again later.
    Unknown(String),
}
