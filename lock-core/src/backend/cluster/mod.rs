//! The Redis Cluster backend: the Redis backend's scripts and logic over redis-rs's cluster
//! client. Every key of one lock shares a hash slot (the hash tag of [`LockKey`]), so every
//! script call is routed to the one primary that owns its slot; redis-rs follows MOVED and ASK
//! during resharding and refreshes its slot map after a failover.
//!
//! [`LockKey`]: crate::key::LockKey

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{ProtocolVersion, Value};

use crate::LockError;
use crate::backend::redis::RedisBackend;
use crate::backend::redis::connect::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_RESPONSE_TIMEOUT};
use crate::sync::Mutex;

mod conn;

pub(crate) use conn::{ClusterConn, key_slot};

/// How many times redis-rs retries a cluster request (redirections, reconnects, CLUSTERDOWN)
/// before it answers with an error (its default, 16 with waits from 1.28 s, would hold a lock
/// request for tens of seconds when a primary is down).
const RETRIES: u32 = 3;
const MIN_RETRY_WAIT_MS: u64 = 10;
const MAX_RETRY_WAIT_MS: u64 = 200;

/// Locks in a Redis Cluster (Redis 7+: sharded pub/sub).
///
/// The same locks as [`RedisBackend`](crate::RedisBackend) (the same scripts, the same
/// semantics; the conformance suite runs on both), spread over the cluster's shards by key:
/// every key of one lock shares one hash slot, so each call goes to the one primary that owns
/// it. Commands go through one redis-rs cluster connection (slot routing, MOVED/ASK during
/// resharding, slot map refresh after a failover, reconnects); release notifications use
/// sharded pub/sub (`SSUBSCRIBE` on the node that owns each channel's slot) on a connection of
/// their own; one more idle cluster connection hears of a node's dropped connection, and every
/// held lock is checked then. The watchdog renews the locks of each shard in one call per
/// shard, the shards concurrently and each on a cluster connection of its own: a shard that
/// stops answering loses its own locks (their holders are told when the leases run out) and
/// delays no other shard's renewals.
///
/// A limit of the cluster client (redis-rs): while one node does not answer (paused or
/// partitioned, not refused), requests on the same cluster connection to other nodes wait too,
/// up to the request bound (twice the response timeout). Acquires and releases share one
/// connection, so they may be slowed then; renewals are not (their connections are per shard).
///
/// What a failover means for a held lock: replication is asynchronous, so a lock written to a
/// primary that dies before its replica got it is gone after the failover; its holder's
/// watchdog finds it missing and reports the lease lost (fencing tokens are the mitigation).
///
/// Clones share the connections.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use std::time::Duration;
/// use lock_core::{Locker, RedisClusterBackend};
///
/// let backend = RedisClusterBackend::builder(&["redis://10.0.0.1:7000/", "redis://10.0.0.2:7000/"])
///     .response_timeout(Duration::from_millis(500))
///     .connect()
///     .await?;
/// let locker = Locker::builder(backend).prefix("shop:").build();
/// # drop(locker); Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisClusterBackend {
    pub(crate) backend: RedisBackend,
}

impl std::fmt::Debug for RedisClusterBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URLs may hold a password: never print them.
        f.debug_struct("RedisClusterBackend")
            .finish_non_exhaustive()
    }
}

impl RedisClusterBackend {
    /// Connects with default options; see [`RedisClusterBackend::builder`].
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let backend = lock_core::RedisClusterBackend::connect(&["redis://127.0.0.1:7000/"]).await?;
    /// # drop(backend); Ok(()) }
    /// ```
    pub async fn connect(urls: &[&str]) -> Result<Self, LockError> {
        Self::builder(urls).connect().await
    }

    /// Options for connecting. `urls` are some nodes of the cluster (one that answers is
    /// enough; the others are learnt from it), `redis://` or `rediss://` (when redis-rs is
    /// built with TLS), with an ACL user and password in the first URL (used for every node).
    ///
    /// ```
    /// let builder = lock_core::RedisClusterBackend::builder(&["redis://127.0.0.1:7000/"]);
    /// # drop(builder);
    /// ```
    pub fn builder(urls: &[&str]) -> RedisClusterBackendBuilder {
        RedisClusterBackendBuilder {
            settings: ClusterSettings {
                urls: urls.iter().map(|u| (*u).to_owned()).collect(),
                connect_timeout: DEFAULT_CONNECT_TIMEOUT,
                response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            },
        }
    }

    /// Checks that the Redis user may run everything the lock runs on the keys and channels of
    /// `prefix`, as [`RedisBackend::check_permissions`](crate::RedisBackend::check_permissions)
    /// does. On a cluster the check runs on the shard that owns the probe's hash slot: ACLs
    /// are set per node, so give every node the same rule.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] naming what is refused, [`LockError::Backend`] when the
    /// cluster cannot be reached.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let backend = lock_core::RedisClusterBackend::connect(&["redis://127.0.0.1:7000/"]).await?;
    /// backend.check_permissions("shop:").await?;
    /// # Ok(()) }
    /// ```
    pub async fn check_permissions(&self, prefix: &str) -> Result<(), LockError> {
        self.backend.check_permissions(prefix).await
    }

    /// The `maxmemory-policy` of one primary of the cluster, read when the backend connected
    /// (`None` when it could not be read); see
    /// [`RedisBackend::maxmemory_policy`](crate::RedisBackend::maxmemory_policy). Set the
    /// same policy (`noeviction`) on every node.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let backend = lock_core::RedisClusterBackend::connect(&["redis://127.0.0.1:7000/"]).await?;
    /// assert_eq!(backend.maxmemory_policy(), Some("noeviction"));
    /// # Ok(()) }
    /// ```
    pub fn maxmemory_policy(&self) -> Option<&str> {
        self.backend.maxmemory_policy()
    }
}

/// Options for connecting a [`RedisClusterBackend`].
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use std::time::Duration;
/// let backend = lock_core::RedisClusterBackend::builder(&["redis://127.0.0.1:7000/"])
///     .connect_timeout(Duration::from_secs(1))
///     .connect()
///     .await?;
/// # drop(backend); Ok(()) }
/// ```
#[must_use]
pub struct RedisClusterBackendBuilder {
    settings: ClusterSettings,
}

impl std::fmt::Debug for RedisClusterBackendBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisClusterBackendBuilder")
            .field("nodes", &self.settings.urls.len())
            .field("connect_timeout", &self.settings.connect_timeout)
            .field("response_timeout", &self.settings.response_timeout)
            .finish_non_exhaustive()
    }
}

impl RedisClusterBackendBuilder {
    /// Bound on establishing (and re-establishing) a connection to a node. Default 2 s.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let b = lock_core::RedisClusterBackend::builder(&["redis://127.0.0.1:7000/"])
    ///     .connect_timeout(Duration::from_secs(1));
    /// # drop(b);
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.settings.connect_timeout = timeout;
        self
    }

    /// Bound on waiting for one answer from a node. Default 2 s. A whole request, with the
    /// cluster client's few retries and redirections, is bounded by twice this: a lock whose
    /// primary is down fails with [`LockError::Backend`] within it.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let b = lock_core::RedisClusterBackend::builder(&["redis://127.0.0.1:7000/"])
    ///     .response_timeout(Duration::from_millis(300));
    /// # drop(b);
    /// ```
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.settings.response_timeout = timeout;
        self
    }

    /// Connects to the cluster and learns its slot map.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for no or malformed URLs or zero timeouts,
    /// [`LockError::Backend`] when no node can be reached.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let backend = lock_core::RedisClusterBackend::builder(&["redis://127.0.0.1:7000/"])
    ///     .connect()
    ///     .await?;
    /// # drop(backend); Ok(()) }
    /// ```
    pub async fn connect(self) -> Result<RedisClusterBackend, LockError> {
        if self.settings.connect_timeout.is_zero() || self.settings.response_timeout.is_zero() {
            return Err(LockError::config(
                "Redis connect and response timeouts must be above zero",
            ));
        }
        if self.settings.urls.is_empty() {
            return Err(LockError::config(
                "a Redis Cluster backend needs the URL of at least one node",
            ));
        }
        let backend = crate::backend::redis::connect::connect_cluster(self.settings).await?;
        Ok(RedisClusterBackend { backend })
    }
}

/// How to reach the cluster; every connection of the backend is made from it.
#[derive(Clone)]
pub(crate) struct ClusterSettings {
    urls: Vec<String>,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
}

impl ClusterSettings {
    /// A client with bounded timeouts and retries; with `push` (RESP3), one that reports
    /// pub/sub messages and dropped node connections to it.
    pub(crate) fn client(
        &self,
        push: Option<impl redis::aio::AsyncPushSender>,
    ) -> Result<ClusterClient, LockError> {
        let mut builder = ClusterClientBuilder::new(self.urls.iter().map(String::as_str))
            .connection_timeout(self.connect_timeout)
            .response_timeout(self.response_timeout)
            .overall_response_timeout(Some(self.response_timeout * 2))
            .retries(RETRIES)
            .min_retry_wait(MIN_RETRY_WAIT_MS)
            .max_retry_wait(MAX_RETRY_WAIT_MS);
        if let Some(push) = push {
            builder = builder
                .use_protocol(ProtocolVersion::RESP3)
                .push_sender(push);
        }
        builder.build().map_err(|e| {
            LockError::config(format!(
                "cannot use these Redis Cluster URLs ({e}); expected redis://[user:password@]host:port/ or rediss://..., all with the same credentials"
            ))
        })
    }
}

/// Which primary serves each slot, from `CLUSTER SLOTS`: only to group the watchdog's
/// renewals by shard (routing itself is redis-rs's, by slot). Refreshed when a renewal call
/// fails and when a node's connection drops.
pub(crate) struct Topology {
    /// `(first slot, last slot, primary "host:port")`, sorted.
    ranges: Mutex<Vec<(u16, u16, Arc<str>)>>,
    /// One cluster connection per shard for its renewals (redis-rs holds every request of a
    /// cluster connection while one of its nodes does not answer); made at connect for the
    /// shards known then, later for new ones.
    renewers: Mutex<HashMap<Arc<str>, ClusterConn>>,
    /// `None` in unit tests: no renewal connections.
    settings: Option<ClusterSettings>,
}

impl Topology {
    pub(crate) fn new(settings: Option<ClusterSettings>) -> Self {
        Topology {
            ranges: Mutex::default(),
            renewers: Mutex::default(),
            settings,
        }
    }

    /// The renewal connection of the shard that serves `slot` (made now if it is new);
    /// `None` when the shard is unknown or the connection cannot be made (the caller uses
    /// the backend's own).
    pub(crate) async fn renewer(&self, slot: u16) -> Option<ClusterConn> {
        let shard = self.shard_of(slot)?;
        if let Some(conn) = self.renewers.lock().get(&shard) {
            return Some(conn.clone());
        }
        let settings = self.settings.as_ref()?;
        let client = settings
            .client(None::<tokio::sync::mpsc::UnboundedSender<redis::PushInfo>>)
            .ok()?;
        let connect = client.get_async_connection();
        let conn = match tokio::time::timeout(settings.connect_timeout * 2, connect).await {
            Ok(Ok(conn)) => ClusterConn::new(conn),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "cannot connect a shard's renewal connection");
                return None;
            }
            Err(_) => return None,
        };
        Some(self.renewers.lock().entry(shard).or_insert(conn).clone())
    }

    /// Makes the renewal connection of every known shard.
    pub(crate) async fn connect_renewers(&self) {
        let firsts: Vec<u16> = self
            .ranges
            .lock()
            .iter()
            .map(|(first, _, _)| *first)
            .collect();
        for slot in firsts {
            self.renewer(slot).await;
        }
    }

    /// The primary that serves `slot`, when known.
    pub(crate) fn shard_of(&self, slot: u16) -> Option<Arc<str>> {
        let ranges = self.ranges.lock();
        ranges
            .iter()
            .find(|(first, last, _)| (*first..=*last).contains(&slot))
            .map(|(_, _, addr)| addr.clone())
    }

    /// Reads `CLUSTER SLOTS` from one primary; keeps the old map when that fails.
    pub(crate) async fn refresh(&self, conn: &mut ClusterConn) {
        let reply = conn
            .inner()
            .route_command(
                redis::cmd("CLUSTER").arg("SLOTS").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary),
            )
            .await;
        match reply {
            Ok(reply) => {
                let ranges = parse_slots(&reply);
                if !ranges.is_empty() {
                    *self.ranges.lock() = ranges;
                }
            }
            Err(e) => tracing::debug!(error = %e, "cannot read the cluster's slot map"),
        }
    }

    /// Groups `slots` (one per item) by the primary that serves them; items of slots with no
    /// known primary are grouped by slot.
    pub(crate) fn group(&self, slots: impl Iterator<Item = u16>) -> Vec<Vec<usize>> {
        let mut groups: HashMap<Result<Arc<str>, u16>, Vec<usize>> = HashMap::new();
        for (i, slot) in slots.enumerate() {
            groups
                .entry(self.shard_of(slot).ok_or(slot))
                .or_default()
                .push(i);
        }
        groups.into_values().collect()
    }
}

fn parse_slots(reply: &Value) -> Vec<(u16, u16, Arc<str>)> {
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let Value::Array(entries) = reply else {
        return Vec::new();
    };
    let mut ranges: Vec<(u16, u16, Arc<str>)> = entries
        .iter()
        .filter_map(|entry| {
            let Value::Array(fields) = entry else {
                return None;
            };
            match fields.as_slice() {
                [
                    Value::Int(first),
                    Value::Int(last),
                    Value::Array(primary),
                    ..,
                ] => {
                    let (host, port) = match primary.as_slice() {
                        [host, Value::Int(port), ..] => (text(host)?, *port),
                        _ => return None,
                    };
                    Some((
                        u16::try_from(*first).ok()?,
                        u16::try_from(*last).ok()?,
                        Arc::from(format!("{host}:{port}")),
                    ))
                }
                _ => None,
            }
        })
        .collect();
    ranges.sort();
    ranges
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_map_parse_and_group() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let node = |port| Value::Array(vec![bulk("127.0.0.1"), Value::Int(port), bulk("id")]);
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(8192),
                Value::Int(16383),
                node(7001),
                node(7004),
            ]),
            Value::Array(vec![Value::Int(0), Value::Int(8191), node(7000)]),
            Value::Int(3),
        ]);
        let topology = Topology::new(None);
        *topology.ranges.lock() = parse_slots(&reply);
        assert_eq!(topology.shard_of(0).as_deref(), Some("127.0.0.1:7000"));
        assert_eq!(topology.shard_of(16383).as_deref(), Some("127.0.0.1:7001"));
        let mut groups = topology.group([1, 9000, 2, 8191].into_iter());
        groups.sort();
        assert_eq!(groups, vec![vec![0, 2, 3], vec![1]]);
        let empty = Topology::new(None);
        let mut by_slot = empty.group([5, 6, 5].into_iter());
        by_slot.sort();
        assert_eq!(by_slot, vec![vec![0, 2], vec![1]]);
    }
}
