//! The embedded, in-process backend.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use std::collections::VecDeque;

use super::{Attempt, FairTicket, Listeners, Renewal};
use crate::key::LockKey;
use crate::token::Token;

/// Below this many live entries the table is never swept.
const MIN_SWEEP: usize = 1024;

/// Locks held in this process's memory, with the same semantics as Redis: a random token per
/// acquisition, owner-checked release and renewal, a lease after which the lock is free, release
/// notifications for waiters and per-key fencing counters.
///
/// Time comes from `tokio::time`, so tests can pause and advance it. Expired locks are swept
/// away as the table grows, so memory does not grow with the number of distinct keys; fencing
/// counters, like their Redis keys, are kept for as long as the backend lives (one `u64` per
/// fenced key name).
///
/// Clones share the same table: lockers built on clones of one backend contend with each other.
///
/// ```
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use lock_core::{Locker, MemoryBackend};
///
/// let backend = MemoryBackend::new();
/// let locker = Locker::builder(backend.clone()).build();
/// let guard = locker.lock("job:nightly").await?;
/// assert_eq!(backend.len(), 1);
/// guard.release().await?;
/// assert_eq!(backend.len(), 0);
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemoryBackend {
    inner: Arc<Mutex<Table>>,
}

#[derive(Debug, Default)]
struct Table {
    locks: HashMap<String, Entry>,
    fences: HashMap<String, u64>,
    /// Fair-mode FIFO per lock: ticket and the instant it dies without a refresh.
    queues: HashMap<String, VecDeque<(String, Instant)>>,
    listeners: Listeners,
    sweep_above: usize,
}

#[derive(Debug)]
struct Entry {
    token: Token,
    expires: Instant,
}

impl MemoryBackend {
    /// An empty backend.
    ///
    /// ```
    /// let backend = lock_core::MemoryBackend::new();
    /// assert!(backend.is_empty());
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// How many locks the table holds now, counting expired ones not yet swept.
    ///
    /// ```
    /// assert_eq!(lock_core::MemoryBackend::new().len(), 0);
    /// ```
    pub fn len(&self) -> usize {
        self.table().locks.len()
    }

    /// Whether the table holds no lock.
    ///
    /// ```
    /// assert!(lock_core::MemoryBackend::new().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Removes every expired lock now (this also happens on its own as the table grows).
    ///
    /// ```
    /// lock_core::MemoryBackend::new().sweep();
    /// ```
    pub fn sweep(&self) {
        let mut t = self.table();
        let now = Instant::now();
        t.sweep(now);
    }

    /// How many release listeners are registered (one per locker and contended key).
    ///
    /// ```
    /// assert_eq!(lock_core::MemoryBackend::new().listener_count(), 0);
    /// ```
    pub fn listener_count(&self) -> usize {
        self.table().listeners.len()
    }

    /// Deletes a lock whatever its owner, as an operator's `DEL` would (for tests and repairs).
    /// Returns whether there was one.
    ///
    /// ```
    /// assert!(!lock_core::MemoryBackend::new().force_delete("order:1"));
    /// ```
    pub fn force_delete(&self, key: &str) -> bool {
        let Ok(names) = LockKey::new(crate::key::DEFAULT_PREFIX, key) else {
            return false;
        };
        self.force_delete_name(names.lock())
    }

    /// Like [`force_delete`](Self::force_delete), for a lock under a custom prefix.
    ///
    /// ```
    /// assert!(!lock_core::MemoryBackend::new().force_delete_prefixed("shop:", "order:1"));
    /// ```
    pub fn force_delete_prefixed(&self, prefix: &str, key: &str) -> bool {
        let Ok(names) = LockKey::new(prefix, key) else {
            return false;
        };
        self.force_delete_name(names.lock())
    }

    fn force_delete_name(&self, name: &str) -> bool {
        self.table().locks.remove(name).is_some()
    }

    // A panic while the table was locked cannot leave it half-updated (every update is a single
    // map operation), so a poisoned lock is safe to keep using.
    fn table(&self) -> MutexGuard<'_, Table> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn acquire(
        &self,
        key: &LockKey,
        token: &Token,
        lease: Duration,
        fenced: bool,
        fair: Option<&FairTicket>,
    ) -> Attempt {
        let now = Instant::now();
        let mut t = self.table();
        let held_for = t
            .locks
            .get(key.lock())
            .filter(|e| e.expires > now)
            .map(|e| e.expires - now);
        if let Some(fair) = fair {
            let head = t.queue_head(key.lock(), now, Some(&fair.id));
            let our_turn = head.as_deref().is_none_or(|h| h == fair.id);
            if held_for.is_some() || !our_turn {
                if !fair.ttl.is_zero() {
                    let q = t.queues.entry(key.lock().to_owned()).or_default();
                    match q.iter_mut().find(|(id, _)| *id == fair.id) {
                        Some(entry) => entry.1 = now + fair.ttl,
                        None => q.push_back((fair.id.clone(), now + fair.ttl)),
                    }
                }
                return Attempt::Busy {
                    remaining: held_for,
                };
            }
            if head.is_some() {
                t.leave(key.lock(), &fair.id);
            }
        } else if let Some(remaining) = held_for {
            return Attempt::Busy {
                remaining: Some(remaining),
            };
        }
        t.locks.insert(
            key.lock().to_owned(),
            Entry {
                token: token.clone(),
                expires: now + lease,
            },
        );
        if t.locks.len() > t.sweep_above.max(MIN_SWEEP) {
            t.sweep(now);
            t.sweep_above = t.locks.len() * 2;
        }
        let fence = fenced.then(|| {
            let counter = t.fences.entry(key.fence().to_owned()).or_insert(0);
            *counter += 1;
            *counter
        });
        Attempt::Acquired { fence }
    }

    pub(crate) fn release(&self, key: &LockKey, token: &Token) -> bool {
        let now = Instant::now();
        let mut t = self.table();
        match t.locks.get(key.lock()) {
            Some(e) if e.token == *token => {
                let live = e.expires > now;
                t.locks.remove(key.lock());
                if live {
                    t.announce_release(key, now);
                }
                live
            }
            _ => false,
        }
    }

    pub(crate) fn leave_queue(&self, key: &LockKey, ticket: &str) {
        let now = Instant::now();
        let mut t = self.table();
        let was_head = t.queue_head(key.lock(), now, None).as_deref() == Some(ticket);
        t.leave(key.lock(), ticket);
        let free = t.locks.get(key.lock()).is_none_or(|e| e.expires <= now);
        if was_head && free {
            t.announce_release(key, now);
        }
    }

    pub(crate) fn renew(&self, items: &[Renewal]) -> Vec<bool> {
        let now = Instant::now();
        let mut t = self.table();
        items
            .iter()
            .map(|r| match t.locks.get_mut(r.key.lock()) {
                Some(e) if e.token == r.token && e.expires > now => {
                    e.expires = now + r.lease;
                    true
                }
                _ => false,
            })
            .collect()
    }

    pub(crate) fn subscribe(&self, key: &LockKey, notify: &Arc<Notify>, ticket: Option<&str>) {
        // In memory the lock name serves as the channel.
        self.table().listeners.add(key.lock(), notify, ticket);
    }

    pub(crate) fn unsubscribe(&self, key: &LockKey, notify: &Arc<Notify>) {
        self.table().listeners.remove(key.lock(), notify);
    }
}

impl Table {
    /// The first live ticket of a lock's fair queue, dropping dead ones (`keep` is never dropped).
    fn queue_head(&mut self, lock: &str, now: Instant, keep: Option<&str>) -> Option<String> {
        let q = self.queues.get_mut(lock)?;
        while let Some((id, dies)) = q.front() {
            if *dies > now || keep == Some(id.as_str()) {
                return Some(id.clone());
            }
            q.pop_front();
        }
        self.queues.remove(lock);
        None
    }

    fn leave(&mut self, lock: &str, ticket: &str) {
        if let Some(q) = self.queues.get_mut(lock) {
            q.retain(|(id, _)| id != ticket);
            if q.is_empty() {
                self.queues.remove(lock);
            }
        }
    }

    /// Wakes the waiters of a lock that just became free: the next fair ticket, if any, by name.
    fn announce_release(&mut self, key: &LockKey, now: Instant) {
        if self.listeners.len() == 0 {
            return;
        }
        let next = self.queue_head(key.lock(), now, None);
        let payload = next.as_deref().unwrap_or("released");
        self.listeners.wake(key.lock(), payload.as_bytes());
    }

    fn sweep(&mut self, now: Instant) {
        self.locks.retain(|_, e| e.expires > now);
        self.queues.retain(|_, q| {
            q.retain(|(_, dies)| *dies > now);
            !q.is_empty()
        });
    }
}
