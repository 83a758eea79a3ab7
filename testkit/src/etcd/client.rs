//! A small client for assertions on etcd: its JSON gateway (`/v3/kv/range`, `/v3/kv/put`, ...)
//! over plain HTTP, one connection per call, trying each endpoint in turn.

#![allow(
    clippy::panic,
    reason = "a test harness that cannot do its job fails the test using it, loudly and with the cause"
)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

use super::http::{base64_decode, base64_encode, request};

/// How long one endpoint may take to answer one call before the next endpoint is tried.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// A client of etcd's v3 JSON gateway for assertions: reads and writes keys, leases and
/// revisions without a gRPC client. From [`EtcdCluster::client`](super::EtcdCluster::client)
/// (every member) or [`EtcdCluster::member_client`](super::EtcdCluster::member_client) (one).
///
/// Each call opens a fresh connection to one endpoint; when that endpoint cannot answer (killed,
/// paused, no leader, a timeout) the next one is tried, starting next time with the one that
/// answered. Reads are linearizable (etcd's default): a member cut off from the quorum does
/// not answer them. The typed helpers panic when no endpoint answers, as assertions do;
/// [`call`](Self::call) returns the error instead.
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let cluster = lock_testkit::etcd::EtcdCluster::start().await;
/// let etcd = cluster.client();
/// let revision = etcd.put("order:42", "token").await;
/// let kv = etcd.get("order:42").await.unwrap();
/// assert_eq!(kv.value, b"token");
/// assert_eq!(kv.create_revision, revision);
/// assert!(etcd.delete("order:42").await);
/// # }
/// ```
#[derive(Debug)]
pub struct EtcdClient {
    endpoints: Vec<SocketAddr>,
    timeout: Duration,
    /// The endpoint tried first: the last one that answered.
    next: AtomicUsize,
}

/// A key as etcd stores it (`mvccpb.KeyValue`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    /// The key.
    pub key: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
    /// The revision of the put that created the key (the fence of an etcd lock).
    pub create_revision: i64,
    /// The revision of the last put to it.
    pub mod_revision: i64,
    /// How many puts since it was created (1 after the first).
    pub version: i64,
    /// The lease it is bound to (0: none).
    pub lease: i64,
}

impl KeyValue {
    /// The key as text (lossy: invalid UTF-8 is replaced).
    ///
    /// ```
    /// # let kv = lock_testkit::etcd::KeyValue { key: b"k".to_vec(), value: vec![], create_revision: 2, mod_revision: 2, version: 1, lease: 0 };
    /// assert_eq!(kv.key_str(), "k");
    /// ```
    pub fn key_str(&self) -> String {
        String::from_utf8_lossy(&self.key).into_owned()
    }

    fn from_json(kv: &Value) -> Result<Self, String> {
        Ok(Self {
            key: bytes_field(kv, "key")?,
            value: bytes_field(kv, "value")?,
            create_revision: int_field(kv, "create_revision"),
            mod_revision: int_field(kv, "mod_revision"),
            version: int_field(kv, "version"),
            lease: int_field(kv, "lease"),
        })
    }
}

impl EtcdClient {
    /// A client of these gateway addresses (etcd's client URLs serve it).
    ///
    /// ```
    /// let client = lock_testkit::etcd::EtcdClient::new(["127.0.0.1:2379".parse().unwrap()]);
    /// assert_eq!(client.endpoints().len(), 1);
    /// ```
    pub fn new(endpoints: impl IntoIterator<Item = SocketAddr>) -> Self {
        Self {
            endpoints: endpoints.into_iter().collect(),
            timeout: DEFAULT_TIMEOUT,
            next: AtomicUsize::new(0),
        }
    }

    /// How long one endpoint may take per call (default 2 s) before the next is tried.
    ///
    /// ```
    /// use std::time::Duration;
    /// let client = lock_testkit::etcd::EtcdClient::new(["127.0.0.1:2379".parse().unwrap()])
    ///     .timeout(Duration::from_millis(500));
    /// # drop(client);
    /// ```
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The endpoints, in the order given.
    ///
    /// ```
    /// let addr = "127.0.0.1:2379".parse().unwrap();
    /// assert_eq!(lock_testkit::etcd::EtcdClient::new([addr]).endpoints(), &[addr]);
    /// ```
    pub fn endpoints(&self) -> &[SocketAddr] {
        &self.endpoints
    }

    /// One gateway call: POSTs `body` (JSON; `bytes` fields base64, see [`encode`]) to `path`
    /// (`/v3/kv/txn`, `/v3/lease/grant`, ...) and returns the JSON answer (int64 fields come
    /// as strings). Tries each endpoint in turn.
    ///
    /// # Errors
    /// When no endpoint answers `200 OK`: what each one said.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::etcd::EtcdCluster::start_single().await;
    /// let status = cluster.client().call("/v3/maintenance/status", &serde_json::json!({})).await.unwrap();
    /// assert_eq!(status["version"], "3.4.23");
    /// # }
    /// ```
    pub async fn call(&self, path: &str, body: &Value) -> Result<Value, String> {
        let body = body.to_string();
        let start = self.next.load(Ordering::Relaxed);
        let mut errors = Vec::new();
        for k in 0..self.endpoints.len() {
            let i = (start + k) % self.endpoints.len();
            let addr = self.endpoints[i];
            match call_one(addr, path, body.as_bytes(), self.timeout).await {
                Ok(answer) => {
                    self.next.store(i, Ordering::Relaxed);
                    return Ok(answer);
                }
                Err(e) => errors.push(format!("{addr}: {e}")),
            }
        }
        if errors.is_empty() {
            errors.push("no endpoints".to_owned());
        }
        Err(format!("POST {path}: {}", errors.join("; ")))
    }

    /// The key, or `None` when it does not exist.
    ///
    /// # Panics
    /// When no endpoint answers.
    ///
    /// See the [type's example](Self).
    pub async fn get(&self, key: impl AsRef<[u8]>) -> Option<KeyValue> {
        let answer = self
            .expect("/v3/kv/range", json!({ "key": encode(key) }))
            .await;
        kvs(&answer).into_iter().next()
    }

    /// Every key starting with `prefix`, in key order.
    ///
    /// # Panics
    /// When no endpoint answers.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::etcd::EtcdCluster::start_single().await;
    /// let etcd = cluster.client();
    /// etcd.put("lock/a/1", "x").await;
    /// etcd.put("lock/a/2", "y").await;
    /// etcd.put("lock/b/1", "z").await;
    /// let keys: Vec<String> = etcd.range_prefix("lock/a/").await.iter().map(|kv| kv.key_str()).collect();
    /// assert_eq!(keys, ["lock/a/1", "lock/a/2"]);
    /// # }
    /// ```
    pub async fn range_prefix(&self, prefix: impl AsRef<[u8]>) -> Vec<KeyValue> {
        let prefix = prefix.as_ref();
        let answer = self
            .expect(
                "/v3/kv/range",
                json!({ "key": encode(prefix), "range_end": encode(prefix_end(prefix)) }),
            )
            .await;
        kvs(&answer)
    }

    /// Puts `value` under `key` (no lease) and returns the revision of the put.
    ///
    /// # Panics
    /// When no endpoint answers.
    ///
    /// See the [type's example](Self).
    pub async fn put(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> i64 {
        self.put_with_lease(key, value, 0).await
    }

    /// Puts `value` under `key` bound to `lease` (from [`grant_lease`](Self::grant_lease)): the
    /// key goes when the lease does. Returns the revision of the put.
    ///
    /// # Panics
    /// When no endpoint answers or the lease does not exist.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::etcd::EtcdCluster::start_single().await;
    /// let etcd = cluster.client();
    /// let lease = etcd.grant_lease(1).await;
    /// etcd.put_with_lease("k", "v", lease).await;
    /// assert_eq!(etcd.get("k").await.unwrap().lease, lease);
    /// # }
    /// ```
    pub async fn put_with_lease(
        &self,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
        lease: i64,
    ) -> i64 {
        let answer = self
            .expect(
                "/v3/kv/put",
                json!({ "key": encode(key), "value": encode(value), "lease": lease.to_string() }),
            )
            .await;
        header_revision(&answer)
    }

    /// Deletes `key`; whether it existed.
    ///
    /// # Panics
    /// When no endpoint answers.
    ///
    /// See the [type's example](Self).
    pub async fn delete(&self, key: impl AsRef<[u8]>) -> bool {
        let answer = self
            .expect("/v3/kv/deleterange", json!({ "key": encode(key) }))
            .await;
        int_field(&answer, "deleted") > 0
    }

    /// The store's current revision (from a linearizable read): it never goes backwards, not
    /// across a leader change nor a restart of the whole cluster.
    ///
    /// # Panics
    /// When no endpoint answers.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::etcd::EtcdCluster::start_single().await;
    /// let etcd = cluster.client();
    /// let before = etcd.revision().await;
    /// assert_eq!(etcd.put("k", "v").await, before + 1);
    /// assert_eq!(etcd.revision().await, before + 1);
    /// # }
    /// ```
    pub async fn revision(&self) -> i64 {
        // A range over one key that need not exist: only the header is wanted.
        let answer = self
            .expect(
                "/v3/kv/range",
                json!({ "key": encode("\0"), "count_only": true }),
            )
            .await;
        header_revision(&answer)
    }

    /// Grants a lease of `ttl_secs` seconds (not kept alive) and returns its id.
    ///
    /// # Panics
    /// When no endpoint answers.
    ///
    /// See [`put_with_lease`](Self::put_with_lease).
    pub async fn grant_lease(&self, ttl_secs: i64) -> i64 {
        let answer = self
            .expect("/v3/lease/grant", json!({ "TTL": ttl_secs.to_string() }))
            .await;
        int_field(&answer, "ID")
    }

    /// The seconds left on `lease`, or `None` when it has expired or was revoked.
    ///
    /// # Panics
    /// When no endpoint answers.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::etcd::EtcdCluster::start_single().await;
    /// let etcd = cluster.client();
    /// let lease = etcd.grant_lease(60).await;
    /// assert!(etcd.lease_ttl(lease).await.is_some());
    /// etcd.revoke_lease(lease).await;
    /// assert_eq!(etcd.lease_ttl(lease).await, None);
    /// # }
    /// ```
    pub async fn lease_ttl(&self, lease: i64) -> Option<i64> {
        let answer = self
            .expect("/v3/lease/timetolive", json!({ "ID": lease.to_string() }))
            .await;
        let ttl = int_field(&answer, "TTL");
        (ttl >= 0).then_some(ttl)
    }

    /// Revokes `lease`: every key bound to it is deleted. Revoking a lease that is gone is
    /// not an error.
    ///
    /// # Panics
    /// When no endpoint answers.
    ///
    /// See [`lease_ttl`](Self::lease_ttl).
    pub async fn revoke_lease(&self, lease: i64) {
        match self
            .call("/v3/lease/revoke", &json!({ "ID": lease.to_string() }))
            .await
        {
            Ok(_) => {}
            Err(e) if e.contains("requested lease not found") => {}
            Err(e) => panic!("etcd: {e}"),
        }
    }

    /// Compacts the history up to `revision`: older revisions can no longer be read or
    /// watched (a watch from before it is cancelled with `compact_revision`).
    ///
    /// # Panics
    /// When no endpoint answers, or `revision` is in the future or already compacted.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::etcd::EtcdCluster::start_single().await;
    /// let etcd = cluster.client();
    /// let revision = etcd.put("k", "v").await;
    /// etcd.compact(revision).await;
    /// # }
    /// ```
    pub async fn compact(&self, revision: i64) {
        self.expect(
            "/v3/kv/compaction",
            json!({ "revision": revision.to_string(), "physical": true }),
        )
        .await;
    }

    async fn expect(&self, path: &str, body: Value) -> Value {
        self.call(path, &body)
            .await
            .unwrap_or_else(|e| panic!("etcd: {e}"))
    }
}

/// A key or value as the gateway takes it (base64).
///
/// ```
/// assert_eq!(lock_testkit::etcd::encode("foo"), "Zm9v");
/// ```
pub fn encode(bytes: impl AsRef<[u8]>) -> String {
    base64_encode(bytes.as_ref())
}

/// One call to one endpoint: the JSON answer of a `200 OK`, else what went wrong.
async fn call_one(
    addr: SocketAddr,
    path: &str,
    body: &[u8],
    timeout: Duration,
) -> Result<Value, String> {
    let (status, body) = request(addr, "POST", path, body, timeout).await?;
    let text = String::from_utf8_lossy(&body);
    if status != 200 {
        return Err(format!("HTTP {status}: {}", text.trim()));
    }
    serde_json::from_str(&text).map_err(|e| format!("not JSON ({e}): {text}"))
}

/// The `kvs` of a range answer, in order (a malformed entry panics: the gateway wrote it).
fn kvs(answer: &Value) -> Vec<KeyValue> {
    answer["kvs"]
        .as_array()
        .map(|kvs| {
            kvs.iter()
                .map(|kv| KeyValue::from_json(kv).unwrap_or_else(|e| panic!("etcd: {e} in {kv}")))
                .collect()
        })
        .unwrap_or_default()
}

/// `header.revision` of an answer.
fn header_revision(answer: &Value) -> i64 {
    int_field(&answer["header"], "revision")
}

/// An int64 field: the gateway writes them as strings and leaves out zeros.
pub(super) fn int_field(value: &Value, name: &str) -> i64 {
    match &value[name] {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

/// A uint64 field (member ids), written as a string.
pub(super) fn uint_field(value: &Value, name: &str) -> u64 {
    match &value[name] {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_u64().unwrap_or(0),
        _ => 0,
    }
}

/// A bytes field (base64; left out when empty).
fn bytes_field(value: &Value, name: &str) -> Result<Vec<u8>, String> {
    match &value[name] {
        Value::String(s) => base64_decode(s),
        _ => Ok(Vec::new()),
    }
}

/// The first key after every key with `prefix` (etcd's `range_end` for a prefix read).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte is 0xff (or no prefix): to the end of the key space.
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::prefix_end;

    #[test]
    fn prefix_end_is_the_next_key_after_the_prefix() {
        assert_eq!(prefix_end(b"lock/a/"), b"lock/a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), b"\0");
        assert_eq!(prefix_end(b""), b"\0");
    }
}
