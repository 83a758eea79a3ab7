//! [`Store`]: where the services keep their state, next to their locks.
//!
//! Deliberately naive: plain `GET` and `SET` of strings, and an append-only list. No
//! compare-and-set, no transactions, no scripts. A read-modify-write built from these is only
//! correct while a lock serializes it, which is exactly what the examples demonstrate.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use redis::AsyncCommands;
use redis::aio::ConnectionManager;

/// A failure of the state store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Redis could not be reached or answered with an error.
    #[error("state store (Redis) failed: {0}")]
    Redis(#[from] redis::RedisError),
    /// A stored value could not be read back (written by something else?).
    #[error("state store holds an unreadable value under {key:?}: {reason}")]
    Corrupt {
        /// The key, without the namespace.
        key: String,
        /// What was wrong with it.
        reason: String,
    },
}

/// Key-value state shared by every copy of the service: in process memory, or in Redis.
///
/// Every key is put under a namespace, so several runs can share one Redis.
///
/// ```
/// # async fn demo() -> Result<(), lock_examples::StoreError> {
/// let store = lock_examples::Store::memory("shop:");
/// store.set("stock:sku-1", "10").await?;
/// assert_eq!(store.get("stock:sku-1").await?.as_deref(), Some("10"));
/// store.push("sales:sku-1", "alice").await?;
/// assert_eq!(store.list("sales:sku-1").await?, vec!["alice".to_owned()]);
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
/// ```
#[derive(Clone)]
pub struct Store {
    namespace: Arc<str>,
    kind: Kind,
}

#[derive(Clone)]
enum Kind {
    Memory(Arc<Mutex<Memory>>),
    Redis(ConnectionManager),
}

#[derive(Default)]
struct Memory {
    values: HashMap<String, String>,
    lists: HashMap<String, Vec<String>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("namespace", &self.namespace)
            .field("backend", &self.backend_name())
            .finish()
    }
}

impl Store {
    /// A store in this process's memory (what the embedded lock backend pairs with).
    ///
    /// ```
    /// let store = lock_examples::Store::memory("shop:");
    /// assert_eq!(store.backend_name(), "memory");
    /// ```
    pub fn memory(namespace: &str) -> Self {
        Store {
            namespace: namespace.into(),
            kind: Kind::Memory(Arc::default()),
        }
    }

    /// A store in Redis at `url`, every key under `namespace`.
    ///
    /// # Errors
    /// [`StoreError::Redis`] when the URL is bad or Redis cannot be reached.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_examples::StoreError> {
    /// let store = lock_examples::Store::redis("redis://127.0.0.1:6379/", "shop:").await?;
    /// # drop(store); Ok(()) }
    /// ```
    pub async fn redis(url: &str, namespace: &str) -> Result<Self, StoreError> {
        let client = redis::Client::open(url)?;
        let connection = client.get_connection_manager().await?;
        Ok(Store {
            namespace: namespace.into(),
            kind: Kind::Redis(connection),
        })
    }

    /// `"memory"` or `"redis"`.
    ///
    /// ```
    /// assert_eq!(lock_examples::Store::memory("").backend_name(), "memory");
    /// ```
    pub fn backend_name(&self) -> &'static str {
        match self.kind {
            Kind::Memory(_) => "memory",
            Kind::Redis(_) => "redis",
        }
    }

    /// The namespace put before every key.
    ///
    /// ```
    /// assert_eq!(lock_examples::Store::memory("shop:").namespace(), "shop:");
    /// ```
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    fn full(&self, key: &str) -> String {
        format!("{}{key}", self.namespace)
    }

    /// The value under `key` (a plain `GET`).
    ///
    /// # Errors
    /// [`StoreError::Redis`] on a Redis failure.
    ///
    /// ```
    /// # async fn demo() {
    /// let store = lock_examples::Store::memory("");
    /// assert_eq!(store.get("missing").await.unwrap(), None);
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub async fn get(&self, key: &str) -> Result<Option<String>, StoreError> {
        let key = self.full(key);
        match &self.kind {
            Kind::Memory(memory) => Ok(lock(memory).values.get(&key).cloned()),
            Kind::Redis(connection) => Ok(connection.clone().get(key).await?),
        }
    }

    /// Sets `key` to `value` (a plain `SET`, last writer wins).
    ///
    /// # Errors
    /// [`StoreError::Redis`] on a Redis failure.
    ///
    /// ```
    /// # async fn demo() {
    /// let store = lock_examples::Store::memory("");
    /// store.set("k", "1").await.unwrap();
    /// store.set("k", "2").await.unwrap();
    /// assert_eq!(store.get("k").await.unwrap().as_deref(), Some("2"));
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub async fn set(&self, key: &str, value: &str) -> Result<(), StoreError> {
        let key = self.full(key);
        match &self.kind {
            Kind::Memory(memory) => {
                lock(memory).values.insert(key, value.to_owned());
                Ok(())
            }
            Kind::Redis(connection) => Ok(connection.clone().set(key, value).await?),
        }
    }

    /// Appends `value` to the list under `key` (`RPUSH`: atomic, nothing is ever lost). The
    /// services use lists as ledgers that record every sale and every draw, so that the demo can
    /// count what really happened independently of the read-modify-written counters.
    ///
    /// # Errors
    /// [`StoreError::Redis`] on a Redis failure.
    ///
    /// ```
    /// # async fn demo() {
    /// let store = lock_examples::Store::memory("");
    /// store.push("log", "a").await.unwrap();
    /// store.push("log", "b").await.unwrap();
    /// assert_eq!(store.list("log").await.unwrap(), ["a", "b"]);
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub async fn push(&self, key: &str, value: &str) -> Result<(), StoreError> {
        let key = self.full(key);
        match &self.kind {
            Kind::Memory(memory) => {
                lock(memory)
                    .lists
                    .entry(key)
                    .or_default()
                    .push(value.to_owned());
                Ok(())
            }
            Kind::Redis(connection) => {
                let _len: u64 = connection.clone().rpush(key, value).await?;
                Ok(())
            }
        }
    }

    /// The whole list under `key` (empty when there is none).
    ///
    /// # Errors
    /// [`StoreError::Redis`] on a Redis failure.
    ///
    /// ```
    /// # async fn demo() {
    /// let store = lock_examples::Store::memory("");
    /// assert!(store.list("none").await.unwrap().is_empty());
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub async fn list(&self, key: &str) -> Result<Vec<String>, StoreError> {
        let key = self.full(key);
        match &self.kind {
            Kind::Memory(memory) => Ok(lock(memory).lists.get(&key).cloned().unwrap_or_default()),
            Kind::Redis(connection) => Ok(connection.clone().lrange(key, 0, -1).await?),
        }
    }

    /// Removes `key` (value or list).
    ///
    /// # Errors
    /// [`StoreError::Redis`] on a Redis failure.
    ///
    /// ```
    /// # async fn demo() {
    /// let store = lock_examples::Store::memory("");
    /// store.set("k", "v").await.unwrap();
    /// store.delete("k").await.unwrap();
    /// assert_eq!(store.get("k").await.unwrap(), None);
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub async fn delete(&self, key: &str) -> Result<(), StoreError> {
        let key = self.full(key);
        match &self.kind {
            Kind::Memory(memory) => {
                let mut memory = lock(memory);
                memory.values.remove(&key);
                memory.lists.remove(&key);
                Ok(())
            }
            Kind::Redis(connection) => {
                let _removed: u64 = connection.clone().del(key).await?;
                Ok(())
            }
        }
    }

    /// Removes every key under the namespace (state, and in Redis also the locks' and the
    /// idempotency records' keys, which live under `{namespace}lock:`), and returns how many
    /// were removed: what the demo does when it is done, so that a run leaves nothing behind
    /// in a user's Redis. Redis is walked with `SCAN` (never `KEYS`) and cleared with `UNLINK`,
    /// a batch at a time.
    ///
    /// # Errors
    /// [`StoreError::Redis`] on a Redis failure.
    ///
    /// ```
    /// # async fn demo() {
    /// let store = lock_examples::Store::memory("run-1:");
    /// store.set("a", "1").await.unwrap();
    /// store.push("b", "x").await.unwrap();
    /// assert_eq!(store.clear().await.unwrap(), 2);
    /// assert_eq!(store.get("a").await.unwrap(), None);
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub async fn clear(&self) -> Result<u64, StoreError> {
        match &self.kind {
            Kind::Memory(memory) => {
                let mut memory = lock(memory);
                let ns: &str = &self.namespace;
                let before = memory.values.len() + memory.lists.len();
                memory.values.retain(|k, _| !k.starts_with(ns));
                memory.lists.retain(|k, _| !k.starts_with(ns));
                Ok((before - memory.values.len() - memory.lists.len()) as u64)
            }
            Kind::Redis(connection) => {
                let mut connection = connection.clone();
                let pattern = format!("{}*", glob_escape(&self.namespace));
                let mut cursor: u64 = 0;
                let mut removed = 0;
                loop {
                    let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(&pattern)
                        .arg("COUNT")
                        .arg(500)
                        .query_async(&mut connection)
                        .await?;
                    if !keys.is_empty() {
                        let n: u64 = redis::cmd("UNLINK")
                            .arg(&keys)
                            .query_async(&mut connection)
                            .await?;
                        removed += n;
                    }
                    if next == 0 {
                        return Ok(removed);
                    }
                    cursor = next;
                }
            }
        }
    }

    /// Reads an integer (`None` when absent).
    pub(crate) async fn get_i64(&self, key: &str) -> Result<Option<i64>, StoreError> {
        match self.get(key).await? {
            None => Ok(None),
            Some(text) => text.parse().map(Some).map_err(|e| StoreError::Corrupt {
                key: key.to_owned(),
                reason: format!("{text:?} is not an integer: {e}"),
            }),
        }
    }

    /// Reads a JSON value (`None` when absent).
    pub(crate) async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        key: &str,
    ) -> Result<Option<T>, StoreError> {
        match self.get(key).await? {
            None => Ok(None),
            Some(text) => serde_json::from_str(&text)
                .map(Some)
                .map_err(|e| StoreError::Corrupt {
                    key: key.to_owned(),
                    reason: e.to_string(),
                }),
        }
    }

    /// Writes a JSON value.
    pub(crate) async fn set_json<T: serde::Serialize>(
        &self,
        key: &str,
        value: &T,
    ) -> Result<(), StoreError> {
        let text = serde_json::to_string(value).map_err(|e| StoreError::Corrupt {
            key: key.to_owned(),
            reason: e.to_string(),
        })?;
        self.set(key, &text).await
    }
}

/// `text` with Redis glob characters escaped, for `SCAN MATCH`.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn lock(memory: &Mutex<Memory>) -> std::sync::MutexGuard<'_, Memory> {
    // Every critical section here is a single map operation: a poisoned map is still consistent.
    memory.lock().unwrap_or_else(PoisonError::into_inner)
}
