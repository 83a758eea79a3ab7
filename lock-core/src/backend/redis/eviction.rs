//! The server's `maxmemory-policy`: read at connect, and whether it may evict lock keys.

use super::conn::Conn;

use super::RedisBackend;

/// `CONFIG GET maxmemory-policy`, else `INFO memory`; `None` when both are refused (both need
/// `@dangerous` permissions) or answer nothing readable.
pub(super) async fn maxmemory_policy(conn: &mut Conn) -> Option<String> {
    // A map in RESP3, a flat array in RESP2: read as pairs either way.
    let config: Result<Vec<(String, String)>, _> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory-policy")
        .query_async(&mut *conn)
        .await;
    if let Ok(answer) = config
        && let [(_, policy)] = answer.as_slice()
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

/// Warns when the server's policy may evict lock keys (or when it cannot be read).
pub(super) fn warn_if_evicting(maxmemory_policy: Option<&str>) {
    match maxmemory_policy {
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
