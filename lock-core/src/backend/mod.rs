//! Where locks live: the embedded memory backend and Redis.
//!
//! A [`Backend`] is what [`Locker::builder`](crate::Locker::builder) takes. Every backend keeps
//! the same semantics (one conformance suite runs against each): atomic acquire with a random
//! token, owner-checked release and renewal, a lease on every lock, a release notification for
//! waiters, and an optional fencing counter.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::LockError;
use crate::key::LockKey;
use crate::token::Token;

pub(crate) mod memory;
#[cfg(feature = "redis")]
pub(crate) mod redis;

pub use memory::MemoryBackend;
#[cfg(feature = "redis")]
pub use redis::{RedisBackend, RedisBackendBuilder};

/// A lock backend, as taken by [`Locker::builder`](crate::Locker::builder).
///
/// Made from a [`MemoryBackend`] or a [`RedisBackend`] with `.into()` (the builder does it).
///
/// ```
/// use lock_core::{Backend, Locker, MemoryBackend};
///
/// let shared = MemoryBackend::new();
/// // Two lockers on one backend contend like two processes on one Redis.
/// let a = Locker::builder(shared.clone()).build();
/// let b = Locker::builder(Backend::from(shared)).build();
/// # drop((a, b));
/// ```
#[derive(Debug, Clone)]
pub struct Backend(pub(crate) BackendKind);

#[derive(Debug, Clone)]
pub(crate) enum BackendKind {
    Memory(MemoryBackend),
    #[cfg(feature = "redis")]
    Redis(RedisBackend),
}

impl From<MemoryBackend> for Backend {
    fn from(b: MemoryBackend) -> Self {
        Backend(BackendKind::Memory(b))
    }
}

#[cfg(feature = "redis")]
impl From<RedisBackend> for Backend {
    fn from(b: RedisBackend) -> Self {
        Backend(BackendKind::Redis(b))
    }
}

/// The answer to one acquire attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// Ours now; the fencing token when one was asked for.
    Acquired { fence: Option<u64> },
    /// Held by someone else; how long their lease still runs, when known.
    Busy { remaining: Option<Duration> },
}

/// A fair waiter's place in the key's cross-process FIFO queue.
#[derive(Debug, Clone)]
pub(crate) struct FairTicket {
    /// Random, not secret: it is published to name the next waiter.
    pub(crate) id: String,
    /// How long the ticket stays alive without a refresh (each attempt refreshes it); zero for
    /// a single attempt that must not join the queue.
    pub(crate) ttl: Duration,
}

/// One lock to renew (or extend) in a batch.
#[derive(Debug, Clone)]
pub(crate) struct Renewal {
    pub(crate) key: LockKey,
    pub(crate) token: Token,
    pub(crate) lease: Duration,
}

impl BackendKind {
    pub(crate) async fn acquire(
        &self,
        key: &LockKey,
        token: &Token,
        lease: Duration,
        fenced: bool,
        fair: Option<&FairTicket>,
    ) -> Result<Attempt, LockError> {
        match self {
            BackendKind::Memory(m) => Ok(m.acquire(key, token, lease, fenced, fair)),
            #[cfg(feature = "redis")]
            BackendKind::Redis(r) => r.acquire(key, token, lease, fenced, fair).await,
        }
    }

    /// Takes a fair waiter's ticket out of the key's queue (it gave up).
    pub(crate) async fn leave_queue(&self, key: &LockKey, ticket: &str) -> Result<(), LockError> {
        match self {
            BackendKind::Memory(m) => {
                m.leave_queue(key, ticket);
                Ok(())
            }
            #[cfg(feature = "redis")]
            BackendKind::Redis(r) => r.leave_queue(key, ticket).await,
        }
    }

    /// `Ok(true)` when the lock was ours and is now deleted (and waiters were notified).
    pub(crate) async fn release(&self, key: &LockKey, token: &Token) -> Result<bool, LockError> {
        match self {
            BackendKind::Memory(m) => Ok(m.release(key, token)),
            #[cfg(feature = "redis")]
            BackendKind::Redis(r) => r.release(key, token).await,
        }
    }

    /// One answer per item, in order: `true` when still ours and the lease was reset.
    pub(crate) async fn renew(&self, items: &[Renewal]) -> Result<Vec<bool>, LockError> {
        match self {
            BackendKind::Memory(m) => Ok(m.renew(items)),
            #[cfg(feature = "redis")]
            BackendKind::Redis(r) => r.renew(items).await,
        }
    }

    /// Registers `notify` to be woken (`notify_one`) when `key` is released. Returns `false`
    /// when the backend could not confirm the subscription: the caller must then fall back to
    /// bounded retries.
    pub(crate) async fn subscribe(
        &self,
        key: &LockKey,
        notify: &Arc<Notify>,
        ticket: Option<&str>,
    ) -> bool {
        match self {
            BackendKind::Memory(m) => {
                m.subscribe(key, notify, ticket);
                true
            }
            #[cfg(feature = "redis")]
            BackendKind::Redis(r) => r.subscribe(key, notify, ticket).await,
        }
    }

    pub(crate) fn unsubscribe(&self, key: &LockKey, notify: &Arc<Notify>) {
        match self {
            BackendKind::Memory(m) => m.unsubscribe(key, notify),
            #[cfg(feature = "redis")]
            BackendKind::Redis(r) => r.unsubscribe(key, notify),
        }
    }

    /// Whether release notifications are flowing right now.
    pub(crate) fn notifications_healthy(&self) -> bool {
        match self {
            BackendKind::Memory(_) => true,
            #[cfg(feature = "redis")]
            BackendKind::Redis(r) => r.notifications_healthy(),
        }
    }
}

/// Registrations of release listeners per channel, shared by the backends.
///
/// A listener is a local queue's head (no ticket) or a fair waiter (its ticket). A release whose
/// payload names a ticket wakes that waiter and the untargeted listeners only; any other payload
/// wakes everyone.
#[derive(Debug, Default)]
pub(crate) struct Listeners {
    by_channel: std::collections::HashMap<String, Vec<Listener>>,
}

#[derive(Debug)]
struct Listener {
    notify: Arc<Notify>,
    ticket: Option<String>,
}

impl Listeners {
    /// Adds a listener (once: adding the same one again changes nothing).
    pub(crate) fn add(&mut self, channel: &str, notify: &Arc<Notify>, ticket: Option<&str>) {
        let list = self.by_channel.entry(channel.to_owned()).or_default();
        if !list.iter().any(|l| Arc::ptr_eq(&l.notify, notify)) {
            list.push(Listener {
                notify: notify.clone(),
                ticket: ticket.map(str::to_owned),
            });
        }
    }

    /// Removes a listener; `true` when the channel has none left.
    pub(crate) fn remove(&mut self, channel: &str, notify: &Arc<Notify>) -> bool {
        let Some(list) = self.by_channel.get_mut(channel) else {
            return false;
        };
        if let Some(pos) = list.iter().position(|l| Arc::ptr_eq(&l.notify, notify)) {
            list.swap_remove(pos);
        }
        if list.is_empty() {
            self.by_channel.remove(channel);
            true
        } else {
            false
        }
    }

    /// Delivers a release on `channel` with its payload (a fair waiter's ticket, or anything).
    pub(crate) fn wake(&self, channel: &str, payload: &[u8]) {
        let Some(list) = self.by_channel.get(channel) else {
            return;
        };
        let targeted = list
            .iter()
            .any(|l| l.ticket.as_deref().is_some_and(|t| t.as_bytes() == payload));
        for l in list {
            let hit = match &l.ticket {
                None => true,
                Some(t) => !targeted || t.as_bytes() == payload,
            };
            if hit {
                l.notify.notify_one();
            }
        }
    }

    #[cfg(feature = "redis")]
    /// Wakes every listener of every channel (used when notifications may have been missed).
    pub(crate) fn wake_all(&self) {
        for l in self.by_channel.values().flatten() {
            l.notify.notify_one();
        }
    }

    #[cfg(feature = "redis")]
    pub(crate) fn channels(&self) -> impl Iterator<Item = &str> {
        self.by_channel.keys().map(String::as_str)
    }

    pub(crate) fn len(&self) -> usize {
        self.by_channel.len()
    }
}
