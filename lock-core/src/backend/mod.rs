//! Where locks live: the embedded memory backend and Redis.
//!
//! A [`Backend`] is what [`Locker::builder`](crate::Locker::builder) takes. Every backend keeps
//! the same semantics (one conformance suite runs against each): atomic acquire with a random
//! token, owner-checked release and renewal, a lease on every lock, a release notification for
//! waiters, and an optional fencing counter.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::LockError;
use crate::key::LockKey;
use crate::sync::{Mutex, MutexGuard};
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

/// A waiter's place in the backend's cross-process queue of a key. While it is there, a release
/// hands the lock straight to it (the lock is set to the ticket's registered token and the
/// release message says so), which saves the waiter its own acquire round trip.
#[derive(Debug, Clone)]
pub(crate) struct QueueTicket {
    /// Random, not secret: it is published to name the waiter a lock was handed to.
    pub(crate) id: String,
    /// How long the ticket stays alive without a refresh (each attempt refreshes it); zero for
    /// a single attempt that must not join the queue.
    pub(crate) ttl: Duration,
    /// Fair mode: the lock is taken only in queue order. Otherwise (the head of a local queue
    /// in the default mode) the ticket takes a free lock whatever its place.
    pub(crate) strict: bool,
    /// Counts this ticket's attempts; a handover names the attempt it was decided on, so the
    /// waiter knows from when to count the lease.
    pub(crate) generation: u64,
    /// The lease a handover sets: the requested lease capped at the ticket lifetime (3 s), so a
    /// waiter that died unseen holds the key only briefly; the new owner's watchdog, or its
    /// next attempt, sets the full lease.
    pub(crate) handover_lease: Duration,
}

/// A lock handed to a waiter by a release: which of its attempts the handover was decided on,
/// and the fencing token drawn for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grant {
    pub(crate) generation: u64,
    pub(crate) fence: Option<u64>,
}

/// What a release (or a waiter leaving) announced on the lock's channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Announcement<'a> {
    /// The lock is free.
    Released,
    /// The lock is free and it is this ticket's turn (a queued waiter that cannot take a
    /// handover).
    Turn(&'a str),
    /// The lock now belongs to this ticket.
    Granted(&'a str, Grant),
}

impl<'a> Announcement<'a> {
    /// Reads a release message: `released`, `<ticket>` or `<ticket>:<generation>:<fence>`
    /// (fence 0 = not fenced). Anything else counts as a plain release.
    pub(crate) fn parse(payload: &'a [u8]) -> Self {
        let Ok(text) = std::str::from_utf8(payload) else {
            return Announcement::Released;
        };
        if !text.starts_with('t') {
            return Announcement::Released;
        }
        let mut parts = text.split(':');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(ticket), None, None, None) => Announcement::Turn(ticket),
            (Some(ticket), Some(generation), Some(fence), None) => {
                match (generation.parse(), fence.parse::<u64>()) {
                    (Ok(generation), Ok(fence)) => Announcement::Granted(
                        ticket,
                        Grant {
                            generation,
                            fence: (fence > 0).then_some(fence),
                        },
                    ),
                    _ => Announcement::Released,
                }
            }
            _ => Announcement::Released,
        }
    }
}

/// Where release messages reach a waiter (a local queue's head, or a fair waiter): a wake-up,
/// and the lock itself when a release handed it to the ticket the inbox expects.
#[derive(Debug, Default)]
pub(crate) struct Inbox {
    notify: Notify,
    state: Mutex<InboxState>,
}

#[derive(Debug, Default)]
struct InboxState {
    ticket: Option<String>,
    grant: Option<Grant>,
}

impl Inbox {
    fn state(&self) -> MutexGuard<'_, InboxState> {
        self.state.lock()
    }

    /// Resolves on the next wake-up (or at once for one that came since the last wait).
    pub(crate) fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }

    /// Wakes the waiter (a permit is kept when it is not waiting yet).
    pub(crate) fn wake(&self) {
        self.notify.notify_one();
    }

    /// From now on, handovers to `ticket` are kept here (and nothing older).
    pub(crate) fn expect(&self, ticket: Option<&str>) {
        let mut state = self.state();
        state.ticket = ticket.map(str::to_owned);
        state.grant = None;
    }

    /// Drops a wake-up kept for an earlier waiter of a shared inbox (a local queue's previous
    /// head): the new waiter's first attempt reads the lock's state anyway, and a stale wake-up
    /// would only cost it a needless second attempt.
    pub(crate) fn clear_wakeup(&self) {
        let notified = std::pin::pin!(self.notify.notified());
        // Polling once takes a kept permit; otherwise the future registers and is dropped.
        let _ = notified.poll(&mut std::task::Context::from_waker(std::task::Waker::noop()));
    }

    /// A handover received for the expected ticket, taken out.
    pub(crate) fn take_grant(&self) -> Option<Grant> {
        self.state().grant.take()
    }

    /// Stops expecting `ticket` (its waiter is gone), unless another ticket is expected by now.
    pub(crate) fn forget(&self, ticket: &str) {
        let mut state = self.state();
        if state.ticket.as_deref() == Some(ticket) {
            state.ticket = None;
            state.grant = None;
        }
    }

    fn expects(&self, ticket: &str) -> bool {
        self.state().ticket.as_deref() == Some(ticket)
    }

    fn expects_any(&self) -> bool {
        self.state().ticket.is_some()
    }

    /// Keeps a handover for `ticket` and wakes the waiter, when it is the one expected.
    fn offer(&self, ticket: &str, grant: Grant) -> bool {
        let mut state = self.state();
        if state.ticket.as_deref() != Some(ticket) {
            return false;
        }
        state.grant = Some(grant);
        drop(state);
        self.wake();
        true
    }
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
        ticket: Option<&QueueTicket>,
    ) -> Result<Attempt, LockError> {
        match self {
            BackendKind::Memory(m) => Ok(m.acquire(key, token, lease, fenced, ticket)),
            #[cfg(feature = "redis")]
            BackendKind::Redis(r) => r.acquire(key, token, lease, fenced, ticket).await,
        }
    }

    /// Takes a waiter's ticket out of the key's queue (it gave up). If a release handed the
    /// lock to the ticket meanwhile (`token`), the lock is passed on as a release would.
    pub(crate) async fn leave_queue(
        &self,
        key: &LockKey,
        ticket: &str,
        token: &Token,
    ) -> Result<(), LockError> {
        match self {
            BackendKind::Memory(m) => {
                m.leave_queue(key, ticket, token);
                Ok(())
            }
            #[cfg(feature = "redis")]
            BackendKind::Redis(r) => r.leave_queue(key, ticket, token).await,
        }
    }

    /// Leaves the queue at once when that needs no I/O (memory); `false` when it must go
    /// through [`leave_queue`](Self::leave_queue).
    pub(crate) fn leave_queue_at_once(&self, key: &LockKey, ticket: &str, token: &Token) -> bool {
        match self {
            BackendKind::Memory(m) => {
                m.leave_queue(key, ticket, token);
                true
            }
            #[cfg(feature = "redis")]
            BackendKind::Redis(_) => false,
        }
    }

    /// `Ok(true)` when the lock was ours and is now deleted or handed to a queued waiter (and
    /// waiters, in this process too, were told).
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

    /// Registers `inbox` for the release messages of `key`. Returns `false` when the backend
    /// could not confirm the subscription: the caller must then fall back to bounded retries.
    pub(crate) async fn subscribe(&self, key: &LockKey, inbox: &Arc<Inbox>) -> bool {
        match self {
            BackendKind::Memory(m) => {
                m.subscribe(key, inbox);
                true
            }
            #[cfg(feature = "redis")]
            BackendKind::Redis(r) => r.subscribe(key, inbox).await,
        }
    }

    pub(crate) fn unsubscribe(&self, key: &LockKey, inbox: &Arc<Inbox>) {
        match self {
            BackendKind::Memory(m) => m.unsubscribe(key, inbox),
            #[cfg(feature = "redis")]
            BackendKind::Redis(r) => r.unsubscribe(key, inbox),
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

    /// Whether the backend may evict lock keys under memory pressure (`None`: unknown).
    pub(crate) fn eviction_risk(&self) -> Option<bool> {
        match self {
            BackendKind::Memory(_) => Some(false),
            #[cfg(feature = "redis")]
            BackendKind::Redis(r) => r.eviction_risk(),
        }
    }

    /// A receiver whose value changes each time the connection to the server was lost or came
    /// back (held locks may have gone with the server's data: the watchdog checks them all at
    /// once); `None` when the backend cannot tell (memory: nothing to lose).
    pub(crate) fn reconnects(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        match self {
            BackendKind::Memory(_) => None,
            #[cfg(feature = "redis")]
            BackendKind::Redis(r) => r.reconnects(),
        }
    }
}

/// Registrations of release listeners per channel, shared by the backends.
///
/// A listener is an [`Inbox`]: a local queue's head or a fair waiter, expecting handovers to
/// its ticket once it has one. A handover reaches only the inbox expecting its ticket (the lock
/// is held again, nobody else needs to wake); a turn message wakes the ticket's inbox and the
/// inboxes without a ticket; a plain release wakes everyone.
#[derive(Debug, Default)]
pub(crate) struct Listeners {
    by_channel: std::collections::HashMap<String, Vec<Arc<Inbox>>>,
}

impl Listeners {
    /// Adds a listener (once: adding the same one again changes nothing).
    pub(crate) fn add(&mut self, channel: &str, inbox: &Arc<Inbox>) {
        let list = self.by_channel.entry(channel.to_owned()).or_default();
        if !list.iter().any(|l| Arc::ptr_eq(l, inbox)) {
            list.push(inbox.clone());
        }
    }

    /// Removes a listener; `true` when the channel has none left.
    pub(crate) fn remove(&mut self, channel: &str, inbox: &Arc<Inbox>) -> bool {
        let Some(list) = self.by_channel.get_mut(channel) else {
            return false;
        };
        if let Some(pos) = list.iter().position(|l| Arc::ptr_eq(l, inbox)) {
            list.swap_remove(pos);
        }
        if list.is_empty() {
            self.by_channel.remove(channel);
            true
        } else {
            false
        }
    }

    /// Delivers a release message on `channel`.
    pub(crate) fn wake(&self, channel: &str, payload: &[u8]) {
        let Some(list) = self.by_channel.get(channel) else {
            return;
        };
        match Announcement::parse(payload) {
            Announcement::Granted(ticket, grant) => {
                for l in list {
                    if l.offer(ticket, grant) {
                        break;
                    }
                }
            }
            Announcement::Turn(ticket) if list.iter().any(|l| l.expects(ticket)) => {
                for l in list
                    .iter()
                    .filter(|l| l.expects(ticket) || !l.expects_any())
                {
                    l.wake();
                }
            }
            Announcement::Turn(_) | Announcement::Released => {
                for l in list {
                    l.wake();
                }
            }
        }
    }

    #[cfg(feature = "redis")]
    /// Wakes every listener of every channel (used when notifications may have been missed).
    pub(crate) fn wake_all(&self) {
        for l in self.by_channel.values().flatten() {
            l.wake();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announcements_parse() {
        assert_eq!(Announcement::parse(b"released"), Announcement::Released);
        assert_eq!(Announcement::parse(b"t00ff"), Announcement::Turn("t00ff"));
        assert_eq!(
            Announcement::parse(b"t00ff:7:0"),
            Announcement::Granted(
                "t00ff",
                Grant {
                    generation: 7,
                    fence: None
                }
            )
        );
        assert_eq!(
            Announcement::parse(b"t00ff:7:12"),
            Announcement::Granted(
                "t00ff",
                Grant {
                    generation: 7,
                    fence: Some(12)
                }
            )
        );
        for odd in [&b"t1:x:1"[..], b"t1:1", b"t1:1:2:3", b"\xff\xfe", b""] {
            assert_eq!(Announcement::parse(odd), Announcement::Released, "{odd:?}");
        }
    }

    #[test]
    fn a_handover_reaches_only_the_inbox_expecting_it() {
        let mut listeners = Listeners::default();
        let (a, b, idle) = (
            Arc::new(Inbox::default()),
            Arc::new(Inbox::default()),
            Arc::new(Inbox::default()),
        );
        a.expect(Some("ta"));
        b.expect(Some("tb"));
        for l in [&a, &b, &idle] {
            listeners.add("c", l);
        }
        listeners.wake("c", b"tb:3:9");
        assert_eq!(a.take_grant(), None);
        assert_eq!(
            b.take_grant(),
            Some(Grant {
                generation: 3,
                fence: Some(9)
            })
        );
        // A later expectation forgets an unclaimed handover of an earlier ticket.
        listeners.wake("c", b"ta:1:0");
        a.expect(Some("ta2"));
        assert_eq!(a.take_grant(), None);
    }
}
