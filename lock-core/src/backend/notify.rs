//! Release messages: what a release (or a waiter leaving) announces on a lock's channel, and
//! where those messages reach the waiters of this process (an [`Inbox`] per waiter, registered
//! per channel in [`Listeners`]).

use std::future::Future;
use std::sync::Arc;

use tokio::sync::Notify;

use crate::sync::{Mutex, MutexGuard};

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
    /// A fair waiter (this ticket) joined the queue: the lock is not to be passed between the
    /// tasks of a process (local hand-off) ahead of it.
    FairWaiting(&'a str),
}

impl<'a> Announcement<'a> {
    /// Reads a release message: `released`, `<ticket>`, `<ticket>:<generation>:<fence>`
    /// (fence 0 = not fenced) or `fair:<ticket>`. Anything else counts as a plain release.
    pub(crate) fn parse(payload: &'a [u8]) -> Self {
        let Ok(text) = std::str::from_utf8(payload) else {
            return Announcement::Released;
        };
        if let Some(ticket) = text.strip_prefix("fair:") {
            return Announcement::FairWaiting(ticket);
        }
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
///
/// The engine makes inboxes and registers them with
/// [`Backend::subscribe`](crate::backend::Backend::subscribe); a backend wakes them when the
/// key is released ([`wake`](Self::wake)), or delivers release messages through
/// [`Listeners`].
///
/// ```
/// # async fn demo() {
/// let inbox = lock_core::backend::Inbox::default();
/// inbox.wake(); // kept until the waiter waits
/// inbox.notified().await;
/// # }
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(demo());
/// ```
#[derive(Debug, Default)]
pub struct Inbox {
    notify: Notify,
    state: Mutex<InboxState>,
    /// A fair waiter of another queue joined the backend's queue since this was last cleared.
    fair_waiting: std::sync::atomic::AtomicBool,
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
    ///
    /// ```
    /// let inbox = lock_core::backend::Inbox::default();
    /// let next = inbox.notified();
    /// # drop(next);
    /// ```
    pub fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }

    /// Wakes the waiter (a permit is kept when it is not waiting yet): the key may be free,
    /// the waiter tries again.
    ///
    /// ```
    /// lock_core::backend::Inbox::default().wake();
    /// ```
    pub fn wake(&self) {
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

    /// Whether a fair waiter announced itself (see [`Announcement::FairWaiting`]).
    pub(crate) fn fair_waiting(&self) -> bool {
        self.fair_waiting.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Forgets announced fair waiters (the backend's queue was just read).
    pub(crate) fn clear_fair_waiting(&self) {
        self.fair_waiting
            .store(false, std::sync::atomic::Ordering::Release);
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

/// Registrations of release listeners per channel, shared by the backends.
///
/// A listener is an [`Inbox`]: a local queue's head or a fair waiter, expecting handovers to
/// its ticket once it has one. A handover reaches only the inbox expecting its ticket (the lock
/// is held again, nobody else needs to wake); a turn message wakes the ticket's inbox and the
/// inboxes without a ticket; a plain release wakes everyone.
///
/// A backend keeps one per process (behind its own lock), adds an inbox in
/// [`Backend::subscribe`](crate::backend::Backend::subscribe), removes it in `unsubscribe`,
/// and calls [`wake`](Self::wake) with the message of each release it sees. Messages:
/// `released` (the lock is free: every listener wakes), `<ticket>` (the lock is free and it is
/// that queued ticket's turn), `<ticket>:<generation>:<fence>` (the lock was handed to that
/// ticket, fence 0 = not fenced) and `fair:<ticket>` (a fair waiter queued). A backend without
/// a queue sends only `released`.
///
/// ```
/// use std::sync::Arc;
/// use lock_core::backend::{Inbox, Listeners};
/// # async fn demo() {
/// let mut listeners = Listeners::default();
/// let inbox = Arc::new(Inbox::default());
/// listeners.add("lock:{job}", &inbox);
/// listeners.wake("lock:{job}", b"released");
/// inbox.notified().await; // woken
/// assert!(listeners.remove("lock:{job}", &inbox)); // the last one
/// # }
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(demo());
/// ```
#[derive(Debug, Default)]
pub struct Listeners {
    by_channel: std::collections::HashMap<String, Vec<Arc<Inbox>>>,
}

impl Listeners {
    /// Adds a listener (once: adding the same one again changes nothing).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// let mut l = lock_core::backend::Listeners::default();
    /// let inbox = Arc::new(lock_core::backend::Inbox::default());
    /// l.add("c", &inbox);
    /// l.add("c", &inbox);
    /// assert!(l.remove("c", &inbox));
    /// ```
    pub fn add(&mut self, channel: &str, inbox: &Arc<Inbox>) {
        let list = self.by_channel.entry(channel.to_owned()).or_default();
        if !list.iter().any(|l| Arc::ptr_eq(l, inbox)) {
            list.push(inbox.clone());
        }
    }

    /// Removes a listener; `true` when the channel has none left.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// let mut l = lock_core::backend::Listeners::default();
    /// assert!(!l.remove("c", &Arc::new(lock_core::backend::Inbox::default())));
    /// ```
    pub fn remove(&mut self, channel: &str, inbox: &Arc<Inbox>) -> bool {
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

    /// Delivers a release message on `channel` (the formats are in the type's docs).
    ///
    /// ```
    /// lock_core::backend::Listeners::default().wake("nobody", b"released");
    /// ```
    pub fn wake(&self, channel: &str, payload: &[u8]) {
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
            Announcement::FairWaiting(ticket) => {
                for l in list.iter().filter(|l| !l.expects(ticket)) {
                    l.fair_waiting
                        .store(true, std::sync::atomic::Ordering::Release);
                }
            }
            Announcement::Turn(_) | Announcement::Released => {
                for l in list {
                    l.wake();
                }
            }
        }
    }

    /// Wakes every listener of every channel (used when notifications may have been missed:
    /// a connection that came back).
    ///
    /// ```
    /// lock_core::backend::Listeners::default().wake_all();
    /// ```
    pub fn wake_all(&self) {
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
