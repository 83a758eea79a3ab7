//! Orphans: contender keys on one of our leases that nobody holds or waits with. An acquire
//! transaction whose answer was lost may commit after the engine's in-flight release (or our
//! background delete) found nothing to delete: a request held up in a blackholed connection
//! can reach etcd much later. Its key then sits in the queue, kept alive with the lease by
//! this backend's other locks, blocking every waiter behind it for good. Each keepalive tick
//! (at most once a third of the lease per lease) lists the lease's keys and deletes those of
//! our contender keys that this backend knows neither as held or waiting nor as in flight.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, LeaseTimeToLiveOptions, Txn, TxnOp};
use tokio::time::Instant;

use super::{EtcdBackend, Shared, bounded};
use crate::sync::Mutex;

/// How long a lease's last sweep is remembered (a lease no longer kept alive is forgotten).
const FORGET_SWEEPS: Duration = Duration::from_secs(60);

#[derive(Default)]
pub(super) struct Orphans {
    /// Our contender keys whose state we do not know, which someone may still use: an attempt
    /// in flight (registered before it is sent), or a waiter's attempt whose answer was lost
    /// (the waiter tries again with the same token, or leaves).
    pending: Mutex<HashSet<String>>,
    /// When each lease was last swept.
    swept: Mutex<HashMap<i64, Instant>>,
}

/// An attempt on contender key `ck` in flight: the key is not an orphan until it ends (or, with
/// `keep`, until its waiter leaves or tries again).
pub(super) struct Pending<'a> {
    orphans: &'a Orphans,
    ck: &'a str,
    pub(super) keep: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.keep {
            self.orphans.pending.lock().remove(self.ck);
        }
    }
}

impl Orphans {
    /// Registers an attempt on `ck` before it is sent.
    pub(super) fn attempt<'a>(&'a self, ck: &'a str) -> Pending<'a> {
        self.pending.lock().insert(ck.to_owned());
        Pending {
            orphans: self,
            ck,
            keep: false,
        }
    }

    /// Nobody uses `ck` any more (its token was released, or its waiter left).
    pub(super) fn forget(&self, ck: &str) {
        self.pending.lock().remove(ck);
    }
}

impl Shared {
    /// Whether `ck` is one of our keys in use: held, waiting, or with an attempt pending.
    fn knows(&self, ck: &str) -> bool {
        self.contenders.lock().contains_key(ck) || self.orphans.pending.lock().contains(ck)
    }
}

/// The lock name of contender key `key` (`N K/q/<token>`), if it is one under `namespace`.
fn lock_name<'k>(namespace: &str, key: &'k str) -> Option<&'k str> {
    let (name, token) = key.strip_prefix(namespace)?.rsplit_once("/q/")?;
    let token_like = !token.is_empty() && token.bytes().all(|b| b.is_ascii_hexdigit());
    token_like.then_some(name)
}

impl EtcdBackend {
    /// Lease `lease_id` (of `ttl` seconds) was just kept alive: sweeps its orphans in the
    /// background, unless it was swept less than a third of its length ago.
    pub(super) fn sweep_soon(&self, ttl: u64, lease_id: i64) {
        let now = Instant::now();
        self.expire_ended(now);
        {
            let mut swept = self.inner.orphans.swept.lock();
            let period = Duration::from_secs(ttl) / 3;
            if swept.get(&lease_id).is_some_and(|t| now < *t + period) {
                return;
            }
            swept.retain(|_, t| now.duration_since(*t) < FORGET_SWEEPS);
            swept.insert(lease_id, now);
        }
        let inner = Arc::downgrade(&self.inner);
        crate::background::spawn(sweep(inner, lease_id));
    }
}

impl EtcdBackend {
    /// Forgets our held keys whose lock ended: not renewed for a lease since it was granted
    /// or last renewed (the watchdog stopped at `max_hold`, or on a guard dropped where no
    /// release could run). Forgotten, each is an orphan, which the sweep deletes: the etcd
    /// lease they share, kept alive for this backend's other locks, would keep them. A renewal
    /// answered after this finds no entry and says no "yes" (its verdict and this check take
    /// the same lock).
    fn expire_ended(&self, now: Instant) {
        self.inner
            .contenders
            .lock()
            .retain(|_, c| c.ends.is_none_or(|ends| ends > now));
    }
}

/// Deletes the contender keys on `lease_id` that the backend does not know, each by its create
/// revision (a key made again meanwhile is spared), and wakes this process's waiters of their
/// locks. Best effort: a failed request waits for the next tick.
async fn sweep(inner: Weak<Shared>, lease_id: i64) {
    let Some(shared) = inner.upgrade() else {
        return;
    };
    let (mut leases, mut kv) = (shared.client.lease_client(), shared.client.kv_client());
    let (namespace, timeout) = (shared.namespace.clone(), shared.request_timeout);
    // Not kept across requests: a backend dropped meanwhile revokes its leases at once.
    drop(shared);
    let options = LeaseTimeToLiveOptions::new().with_keys();
    let listing = leases.time_to_live(lease_id, Some(options));
    let Ok(listed) = bounded(timeout, "sweep orphans", None, listing).await else {
        return;
    };
    let unknown = |keys: Vec<String>| -> Vec<String> {
        let Some(shared) = inner.upgrade() else {
            return Vec::new();
        };
        keys.into_iter().filter(|k| !shared.knows(k)).collect()
    };
    // Listed first, then checked: a key listed was created by an attempt registered before.
    let keys = listed
        .keys()
        .iter()
        .filter_map(|k| String::from_utf8(k.clone()).ok())
        .filter(|k| lock_name(&namespace, k).is_some())
        .collect();
    let candidates = unknown(keys);
    if candidates.is_empty() {
        return;
    }
    let read = Txn::new().and_then(
        candidates
            .iter()
            .map(|k| TxnOp::get(k.as_str(), Some(GetOptions::new().with_keys_only())))
            .collect::<Vec<_>>(),
    );
    let Ok(found) = bounded(timeout, "sweep orphans", None, kv.txn(read)).await else {
        return;
    };
    let found: Vec<(String, i64)> = super::lock::ranges(&found)
        .into_iter()
        .flatten()
        .filter(|kv| kv.lease() == lease_id)
        .filter_map(|kv| Some((kv.key_str().ok()?.to_owned(), kv.create_revision())))
        .collect();
    for (key, revision) in found {
        if unknown(vec![key.clone()]).is_empty() {
            continue;
        }
        let delete = Txn::new()
            .when([Compare::create_revision(
                key.as_str(),
                CompareOp::Equal,
                revision,
            )])
            .and_then([TxnOp::delete(key.as_str(), None)]);
        let Ok(answer) = bounded(timeout, "sweep orphans", None, kv.txn(delete)).await else {
            return;
        };
        if !answer.succeeded() {
            continue;
        }
        tracing::debug!(
            revision,
            "deleted an orphan contender key (an attempt nobody waits for)"
        );
        if let (Some(shared), Some(name)) = (inner.upgrade(), lock_name(&namespace, &key)) {
            shared.listeners.lock().wake(name, b"released");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::lock_name;

    #[test]
    fn only_contender_keys_under_the_namespace_name_a_lock() {
        let token = "0123456789abcdef0123456789abcdef";
        assert_eq!(
            lock_name("n/", &format!("n/lock:{{a}}/q/{token}")),
            Some("lock:{a}")
        );
        assert_eq!(
            lock_name("n/", &format!("n/lock:{{a/q/b}}/q/{token}")),
            Some("lock:{a/q/b}")
        );
        assert_eq!(lock_name("n/", "n/lock:{a/q/b}/result"), None);
        assert_eq!(lock_name("m/", &format!("n/lock:{{a}}/q/{token}")), None);
    }
}
