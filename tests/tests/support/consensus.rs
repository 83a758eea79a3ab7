//! What the consensus backends' fault tests (`etcd/`, `zookeeper/`) share: the fence-checking
//! store a lock protects, and the counts of a fair queue's wake-ups.

#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test support shared by test binaries: a failure here fails the test that uses it"
)]

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

use lock_core::Locker;

/// The storage a lock protects, checking fences: a write carrying a lower fence than one
/// already seen for its key is refused (and counted).
#[derive(Debug, Default)]
pub struct FenceStore {
    highest: Mutex<HashMap<String, u64>>,
    pub accepted: AtomicU64,
    pub refused: AtomicU64,
}

impl FenceStore {
    /// Writes `key` under `fence`: `false` when refused as stale.
    pub fn write(&self, key: &str, fence: u64) -> bool {
        let mut highest = self.highest.lock().unwrap();
        let seen = highest.entry(key.to_owned()).or_insert(0);
        if fence < *seen {
            self.refused.fetch_add(1, SeqCst);
            return false;
        }
        *seen = fence;
        self.accepted.fetch_add(1, SeqCst);
        true
    }
}

/// Backend calls other than renewals: acquire attempts, releases, queue leaves.
pub fn attempts(locker: &Locker) -> u64 {
    let stats = locker.stats();
    stats.backend_calls - stats.renewal_calls
}

/// The backend calls of the waiter just served (the last of `order`) between `before` and
/// `after` (each waiter's [`attempts`]); fails the test if a waiter not yet served made any.
pub fn woken(order: &[usize], before: &[u64], after: &[u64]) -> u64 {
    let i = *order.last().expect("a waiter was served");
    for j in (0..after.len()).filter(|j| !order.contains(j)) {
        assert_eq!(
            after[j], before[j],
            "waiter {j}, still queued, called the backend when waiter {i} was served"
        );
    }
    after[i] - before[i]
}
