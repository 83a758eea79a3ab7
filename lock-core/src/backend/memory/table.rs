//! The memory backend's table: locks, fence counters, queues and records, and the steps on them
//! that its operations share.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::Listeners;
use crate::key::LockKey;
use crate::token::Token;

/// Below this many live entries the table is never swept.
pub(super) const MIN_SWEEP: usize = 1024;

#[derive(Debug, Default)]
pub(super) struct Table {
    pub(super) locks: HashMap<String, Entry>,
    pub(super) fences: HashMap<String, u64>,
    /// Queued waiters per lock, oldest first (see [`QueueEntry`]).
    pub(super) queues: HashMap<String, VecDeque<QueueEntry>>,
    pub(super) listeners: Listeners,
    pub(super) sweep_above: usize,
    /// Idempotency records by record name (`LockKey::result`), swept like the locks.
    pub(super) records: HashMap<String, Record>,
    pub(super) records_sweep_above: usize,
}

#[derive(Debug)]
pub(super) struct Record {
    pub(super) fingerprint: String,
    /// A result, or `Err(mark)` for a "started" mark (its id, one per acquisition: a mark
    /// written twice under one acquisition is written once).
    pub(super) result: Result<Vec<u8>, Token>,
    pub(super) expires: Instant,
}

#[derive(Debug)]
pub(super) struct Entry {
    pub(super) token: Token,
    pub(super) expires: Instant,
    /// Who took it (`AttemptOptions::holder`; empty when not given), and when: an acquire
    /// sent again by its holder keeps both.
    pub(super) holder: Arc<str>,
    pub(super) since: Instant,
}

/// A waiter in a lock's queue: its ticket, when the ticket dies without a refresh, and what a
/// release sets when it hands the lock over (the attempt's token, lease and fencing choice).
#[derive(Debug)]
pub(super) struct QueueEntry {
    pub(super) ticket: String,
    pub(super) dies: Instant,
    pub(super) token: Token,
    pub(super) lease: Duration,
    pub(super) fenced: bool,
    pub(super) generation: u64,
    /// Who waits: the holder the lock names once it is handed over.
    pub(super) holder: Arc<str>,
}

impl Table {
    /// Whether the live lock of `key` holds `token`.
    pub(super) fn ours(&self, key: &LockKey, token: &Token, now: Instant) -> bool {
        self.locks
            .get(key.name())
            .is_some_and(|e| e.token == *token && e.expires > now)
    }

    /// Sets the record (a result, or a mark: `Err(token)`) of `key`.
    pub(super) fn put_record(
        &mut self,
        key: &LockKey,
        fingerprint: &str,
        result: Result<Vec<u8>, Token>,
        ttl: Duration,
        now: Instant,
    ) {
        self.records.insert(
            key.result(),
            Record {
                fingerprint: fingerprint.to_owned(),
                result,
                // `ttl` is at most MAX_RESULT_TTL (checked by the caller): no overflow.
                expires: now.checked_add(ttl).unwrap_or(now),
            },
        );
        if self.records.len() > self.records_sweep_above.max(MIN_SWEEP) {
            self.records.retain(|_, r| r.expires > now);
            self.records_sweep_above = self.records.len() * 2;
        }
    }

    /// Sets the lock (free now, or already `token`'s: an acquire sent again) to `token` of
    /// `holder` for `lease`, drawing a fence when asked.
    pub(super) fn take(
        &mut self,
        key: &LockKey,
        token: Token,
        holder: Arc<str>,
        now: Instant,
        lease: Duration,
        fenced: bool,
    ) -> Option<u64> {
        let since = match self.locks.get(key.name()) {
            Some(e) if e.token == token && e.expires > now => e.since,
            _ => now,
        };
        self.locks.insert(
            key.name().to_owned(),
            Entry {
                token,
                expires: now + lease,
                holder,
                since,
            },
        );
        if self.locks.len() > self.sweep_above.max(MIN_SWEEP) {
            self.sweep(now);
            self.sweep_above = self.locks.len() * 2;
        }
        fenced.then(|| {
            let counter = self.fences.entry(key.fence().to_owned()).or_insert(0);
            *counter += 1;
            *counter
        })
    }

    /// The first live ticket of a lock's queue, dropping dead ones (`keep` is never dropped).
    pub(super) fn queue_head(
        &mut self,
        lock: &str,
        now: Instant,
        keep: Option<&str>,
    ) -> Option<String> {
        let q = self.queues.get_mut(lock)?;
        while let Some(first) = q.front() {
            if first.dies > now || keep == Some(first.ticket.as_str()) {
                return Some(first.ticket.clone());
            }
            q.pop_front();
        }
        self.queues.remove(lock);
        None
    }

    pub(super) fn leave(&mut self, lock: &str, ticket: &str) {
        if let Some(q) = self.queues.get_mut(lock) {
            // The head leaves in O(1) (every fair taker is the head): N fair waiters cost O(N).
            if q.front().is_some_and(|q| q.ticket == ticket) {
                q.pop_front();
            } else {
                q.retain(|q| q.ticket != ticket);
            }
            if q.is_empty() {
                self.queues.remove(lock);
            }
        }
    }

    /// The lock just became free: hands it to the oldest live queued waiter and tells that
    /// waiter, or tells every listener it is free.
    pub(super) fn hand_over(&mut self, key: &LockKey, now: Instant) {
        if self.queue_head(key.name(), now, None).is_some()
            && let Some(next) = self
                .queues
                .get_mut(key.name())
                .and_then(VecDeque::pop_front)
        {
            let fence = self
                .take(key, next.token, next.holder, now, next.lease, next.fenced)
                .unwrap_or(0);
            if self.queues.get(key.name()).is_some_and(VecDeque::is_empty) {
                self.queues.remove(key.name());
            }
            let payload = format!("{}:{}:{fence}", next.ticket, next.generation);
            self.listeners.wake(key.name(), payload.as_bytes());
        } else if self.listeners.len() > 0 {
            self.listeners.wake(key.name(), b"released");
        }
    }

    pub(super) fn sweep(&mut self, now: Instant) {
        self.locks.retain(|_, e| e.expires > now);
        self.records.retain(|_, r| r.expires > now);
        self.queues.retain(|_, q| {
            q.retain(|q| q.dies > now);
            !q.is_empty()
        });
    }
}
