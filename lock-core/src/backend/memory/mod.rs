//! The embedded, in-process backend.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Attempt, BoxFuture, Inbox, Kept, Renewal, Renewed};
use crate::LockError;
use crate::idempotency::{IdempotencyRecord, IdempotencyState, Marked};
use crate::key::LockKey;
use crate::sync::{Mutex, MutexGuard};
use crate::token::Token;

mod ops;
mod table;

use table::{QueueEntry, Record, Table};

/// Locks held in this process's memory, with the same semantics as Redis: a random token per
/// acquisition, owner-checked release and renewal, a lease after which the lock is free, release
/// notifications for waiters and per-key fencing counters.
///
/// Time comes from `tokio::time`, so tests can pause and advance it. Expired locks and
/// idempotency records are swept away as the table grows, so memory does not grow with the number of distinct keys; fencing
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
#[derive(Clone, Default)]
pub struct MemoryBackend {
    inner: Arc<Mutex<Table>>,
}

/// Counts only: the table holds lock keys, idempotency keys and stored responses, which have
/// no place in logs.
impl std::fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let table = self.table();
        f.debug_struct("MemoryBackend")
            .field("locks", &table.locks.len())
            .field("records", &table.records.len())
            .field("fence_counters", &table.fences.len())
            .finish_non_exhaustive()
    }
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

    /// How many idempotency records (see
    /// [`LockGuard::store_result`](crate::LockGuard::store_result)) the table holds now,
    /// counting expired ones not yet swept.
    ///
    /// ```
    /// assert_eq!(lock_core::MemoryBackend::new().record_count(), 0);
    /// ```
    pub fn record_count(&self) -> usize {
        self.table().records.len()
    }

    /// Removes every expired lock and idempotency record now (this also happens on its own as
    /// the table grows).
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

    /// How many live waiters queue for `key` (default prefix) in the backend, where a release
    /// hands the lock to the oldest: one per waiting locker in the default mode (the head of
    /// its local queue), one per waiter in fair mode.
    ///
    /// ```
    /// assert_eq!(lock_core::MemoryBackend::new().queued("order:1"), 0);
    /// ```
    pub fn queued(&self, key: &str) -> usize {
        self.queued_prefixed(crate::key::DEFAULT_PREFIX, key)
    }

    /// Like [`queued`](Self::queued), for a key under a custom prefix.
    ///
    /// ```
    /// assert_eq!(lock_core::MemoryBackend::new().queued_prefixed("shop:", "order:1"), 0);
    /// ```
    pub fn queued_prefixed(&self, prefix: &str, key: &str) -> usize {
        let Ok(names) = LockKey::new(prefix, key) else {
            return 0;
        };
        let now = Instant::now();
        self.table()
            .queues
            .get(names.name())
            .map_or(0, |q| q.iter().filter(|q| q.dies > now).count())
    }

    /// How many live locks (not expired) are held under `prefix`.
    ///
    /// ```
    /// assert_eq!(lock_core::MemoryBackend::new().held_under("shop:"), 0);
    /// ```
    pub fn held_under(&self, prefix: &str) -> usize {
        let now = Instant::now();
        self.table()
            .locks
            .iter()
            .filter(|(name, e)| name.starts_with(prefix) && e.expires > now)
            .count()
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
        self.force_delete_name(names.name())
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
        self.force_delete_name(names.name())
    }

    fn force_delete_name(&self, name: &str) -> bool {
        self.table().locks.remove(name).is_some()
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.inner.lock()
    }

    pub(crate) fn acquire(
        &self,
        key: &LockKey,
        token: &Token,
        lease: Duration,
        options: super::AttemptOptions<'_>,
    ) -> Attempt {
        let super::AttemptOptions {
            fenced,
            ticket,
            holder,
            ..
        } = options;
        let now = Instant::now();
        let mut t = self.table();
        let live = t.locks.get(key.name()).filter(|e| e.expires > now);
        let ours = live.is_some_and(|e| e.token == *token);
        let held_for = live.filter(|_| !ours).map(|e| e.expires - now);
        if let Some(ticket) = ticket {
            // A release may have handed the lock to this ticket already (its message on the
            // way): then the lock is ours, as in Redis, and its lease starts again.
            let head = t.queue_head(key.name(), now, Some(&ticket.id));
            let our_turn = ours || !ticket.strict || head.as_deref().is_none_or(|h| h == ticket.id);
            if held_for.is_some() || !our_turn {
                if !ticket.ttl.is_zero() {
                    let entry = QueueEntry {
                        ticket: ticket.id.clone(),
                        dies: now + ticket.ttl,
                        token: token.clone(),
                        lease: ticket.handover_lease,
                        fenced,
                        generation: ticket.generation,
                        holder: Arc::from(holder),
                    };
                    let q = t.queues.entry(key.name().to_owned()).or_default();
                    match q.iter_mut().find(|q| q.ticket == ticket.id) {
                        Some(place) => *place = entry,
                        None => {
                            q.push_back(entry);
                            if ticket.strict {
                                // As in Redis: a fair waiter says it queues (local hand-off
                                // gives the lock back at its next release).
                                let says = format!("fair:{}", ticket.id);
                                t.listeners.wake(key.name(), says.as_bytes());
                            }
                        }
                    }
                }
                return Attempt::Busy {
                    remaining: held_for,
                };
            }
            t.leave(key.name(), &ticket.id);
        } else if let Some(remaining) = held_for {
            return Attempt::Busy {
                remaining: Some(remaining),
            };
        }
        let fence = t.take(key, token.clone(), holder.into(), now, lease, fenced);
        Attempt::Acquired { fence }
    }

    pub(crate) fn release(&self, key: &LockKey, token: &Token) -> bool {
        let now = Instant::now();
        let mut t = self.table();
        match t.locks.get(key.name()) {
            Some(e) if e.token == *token => {
                let live = e.expires > now;
                t.locks.remove(key.name());
                if live {
                    t.hand_over(key, now);
                }
                live
            }
            _ => false,
        }
    }

    /// Keeps the lock when nobody queues for it (a local hand-off may go on), else releases it
    /// as [`release`](Self::release) does, to the oldest live waiter.
    pub(crate) fn keep_if_alone(&self, key: &LockKey, token: &Token) -> Kept {
        let now = Instant::now();
        let mut t = self.table();
        match t.locks.get(key.name()) {
            Some(e) if e.token == *token && e.expires > now => {}
            _ => return Kept::NotOurs,
        }
        if t.queue_head(key.name(), now, None).is_none() {
            return Kept::Alone;
        }
        t.locks.remove(key.name());
        t.hand_over(key, now);
        Kept::Released
    }

    pub(crate) fn leave_queue(&self, key: &LockKey, ticket: &str, token: &Token) {
        let now = Instant::now();
        let mut t = self.table();
        let was_head = t
            .queues
            .get(key.name())
            .and_then(|q| q.front())
            .is_some_and(|q| q.ticket == ticket);
        t.leave(key.name(), ticket);
        let holder = t
            .locks
            .get(key.name())
            .filter(|e| e.expires > now)
            .map(|e| e.token == *token);
        if holder == Some(true) {
            t.locks.remove(key.name());
        }
        if holder == Some(true) || (was_head && holder.is_none()) {
            t.hand_over(key, now);
        }
    }

    pub(crate) fn renew(&self, items: &[Renewal]) -> Vec<bool> {
        let now = Instant::now();
        let mut t = self.table();
        items
            .iter()
            .map(|r| match t.locks.get_mut(r.key.name()) {
                Some(e) if e.token == r.token && e.expires > now => {
                    e.expires = now + r.lease;
                    true
                }
                _ => false,
            })
            .collect()
    }

    /// Stores an idempotency record if the lock still holds `token`; `false` (nothing
    /// written) otherwise.
    pub(crate) fn store_result(
        &self,
        key: &LockKey,
        token: &Token,
        fingerprint: &str,
        result: &[u8],
        ttl: Duration,
    ) -> bool {
        let now = Instant::now();
        let mut t = self.table();
        if !t.ours(key, token, now) {
            return false;
        }
        // Replaces a mark (or an older record).
        t.put_record(key, fingerprint, Ok(result.to_vec()), ttl, now);
        true
    }

    /// Writes the "started" mark of `key` if the lock still holds `token` and the key has no
    /// live mark or result.
    pub(crate) fn mark_started(
        &self,
        key: &LockKey,
        token: &Token,
        mark: &Token,
        fingerprint: &str,
        ttl: Duration,
    ) -> Marked {
        let now = Instant::now();
        let mut t = self.table();
        if !t.ours(key, token, now) {
            return Marked::NotOurs;
        }
        match t.records.get(&key.result()).filter(|r| r.expires > now) {
            Some(Record { result: Ok(_), .. }) => Marked::Completed,
            Some(Record {
                result: Err(by), ..
            }) if by == mark => Marked::Written,
            Some(r) => Marked::Started {
                fingerprint: r.fingerprint.clone(),
                expires_in: r.expires - now,
            },
            None => {
                t.put_record(key, fingerprint, Err(mark.clone()), ttl, now);
                Marked::Written
            }
        }
    }

    /// Removes the "started" mark of `key` whose id is `mark` if the lock still holds `token`
    /// (never a result, never another mark).
    pub(crate) fn clear_started(&self, key: &LockKey, token: &Token, mark: &Token) -> bool {
        let now = Instant::now();
        let mut t = self.table();
        if !t.ours(key, token, now) {
            return false;
        }
        let name = key.result();
        if t.records
            .get(&name)
            .is_some_and(|r| r.result.as_ref().err() == Some(mark))
        {
            t.records.remove(&name);
        }
        true
    }

    /// The record of `key` if one is live, else whether its lock is held, else its mark.
    pub(crate) fn idempotency_state(&self, key: &LockKey) -> IdempotencyState {
        let now = Instant::now();
        let t = self.table();
        let record = t.records.get(&key.result()).filter(|r| r.expires > now);
        if let Some(Record {
            fingerprint,
            result: Ok(result),
            expires,
        }) = record
        {
            return IdempotencyState::Completed(IdempotencyRecord {
                fingerprint: fingerprint.clone(),
                result: result.clone(),
                expires_in: *expires - now,
            });
        }
        if t.locks.get(key.name()).is_some_and(|e| e.expires > now) {
            return IdempotencyState::InFlight;
        }
        match record {
            Some(mark) => IdempotencyState::Started {
                fingerprint: mark.fingerprint.clone(),
                expires_in: mark.expires - now,
            },
            None => IdempotencyState::Absent,
        }
    }

    pub(crate) fn subscribe(&self, key: &LockKey, inbox: &Arc<Inbox>) {
        // In memory the lock name serves as the channel.
        self.table().listeners.add(key.name(), inbox);
    }

    pub(crate) fn unsubscribe(&self, key: &LockKey, inbox: &Arc<Inbox>) {
        self.table().listeners.remove(key.name(), inbox);
    }
}

/// Every call answers in its first poll: the futures are ready values.
impl super::Backend for MemoryBackend {
    fn kind(&self) -> &'static str {
        "memory"
    }

    fn acquire<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        lease: Duration,
        options: super::AttemptOptions<'a>,
    ) -> BoxFuture<'a, Result<Attempt, LockError>> {
        ready(Ok(MemoryBackend::acquire(self, key, token, lease, options)))
    }

    fn release<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<bool, LockError>> {
        ready(Ok(MemoryBackend::release(self, key, token)))
    }

    fn renew<'a>(&'a self, items: &'a [Renewal]) -> BoxFuture<'a, Result<Vec<Renewed>, LockError>> {
        ready(Ok(Renewed::from_bools(MemoryBackend::renew(self, items))))
    }

    fn subscribe<'a>(&'a self, key: &'a LockKey, inbox: &'a Arc<Inbox>) -> BoxFuture<'a, bool> {
        MemoryBackend::subscribe(self, key, inbox);
        ready(true)
    }

    fn unsubscribe(&self, key: &LockKey, inbox: &Arc<Inbox>) {
        MemoryBackend::unsubscribe(self, key, inbox);
    }

    fn store_result<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        fingerprint: &'a str,
        result: &'a [u8],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, LockError>> {
        ready(Ok(MemoryBackend::store_result(
            self,
            key,
            token,
            fingerprint,
            result,
            ttl,
        )))
    }

    fn mark_started<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        mark: &'a Token,
        fingerprint: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Marked, LockError>> {
        ready(Ok(MemoryBackend::mark_started(
            self,
            key,
            token,
            mark,
            fingerprint,
            ttl,
        )))
    }

    fn clear_started<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        mark: &'a Token,
    ) -> BoxFuture<'a, Result<bool, LockError>> {
        ready(Ok(MemoryBackend::clear_started(self, key, token, mark)))
    }

    fn idempotency_state<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<IdempotencyState, LockError>> {
        ready(Ok(MemoryBackend::idempotency_state(self, key)))
    }

    /// Fencing and the fair queue are both kept here.
    fn refuses(&self, _fenced: bool, _fair: bool) -> Option<&'static str> {
        None
    }

    fn in_process(&self) -> bool {
        true
    }

    fn leave_queue<'a>(
        &'a self,
        key: &'a LockKey,
        ticket: &'a str,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        MemoryBackend::leave_queue(self, key, ticket, token);
        ready(Ok(()))
    }

    fn leave_queue_at_once(&self, key: &LockKey, ticket: &str, token: &Token) -> bool {
        MemoryBackend::leave_queue(self, key, ticket, token);
        true
    }

    fn keep_if_alone<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<Kept, LockError>> {
        ready(Ok(MemoryBackend::keep_if_alone(self, key, token)))
    }

    fn inspect<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<crate::LockState, LockError>> {
        ready(Ok(self.inspect_now(key)))
    }

    fn force_unlock<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<crate::LockState>, LockError>> {
        ready(Ok(self.force_unlock_now(key)))
    }

    fn force_unlock_seen<'a>(
        &'a self,
        key: &'a LockKey,
        seen: &'a crate::LockState,
    ) -> BoxFuture<'a, Result<crate::Unlocked, LockError>> {
        ready(Ok(self.force_unlock_seen_now(key, seen)))
    }

    fn list_page<'a>(
        &'a self,
        prefix: &'a str,
        pattern: &'a super::KeyPattern,
        cursor: Option<&'a str>,
    ) -> BoxFuture<'a, Result<super::ListPage, LockError>> {
        ready(Ok(self.list_now(prefix, pattern, cursor)))
    }

    fn eviction_risk(&self) -> Option<bool> {
        Some(false)
    }
}

/// A future that is ready with `value`.
fn ready<'a, T: Send + 'a>(value: T) -> BoxFuture<'a, T> {
    Box::pin(std::future::ready(value))
}
