//! The local wait queue: within one locker, waiters for one key queue up in arrival order and
//! only the head contends in the backend, where it keeps a ticket in the key's queue so that a
//! release can hand it the lock directly.
//!
//! The head hears through the queue's inbox: a handover or release message (one subscription per
//! locker and key, made when the queue forms and dropped [`LINGER`] after it empties, so a burst
//! of contention subscribes once), a release through this locker; and it tries again when the
//! holder's remaining lease runs out (a key that expires publishes nothing). A waiter that times
//! out, is dropped or whose task is aborted leaves the queue in its `Drop`, handing the turn on.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use std::time::Duration;

use tokio::sync::{Notify, OnceCell};

use crate::backend::Inbox;
use crate::background;
use crate::key::LockKey;
use crate::locker::LockerInner;
use crate::sync::{Mutex, MutexGuard};

/// How long an emptied queue keeps its release subscription for the next waiter.
pub(crate) const LINGER: Duration = Duration::from_millis(250);

#[derive(Debug, Default)]
pub(crate) struct WaitQueues {
    by_key: Mutex<HashMap<String, Queue>>,
}

#[derive(Debug)]
struct Queue {
    waiters: VecDeque<Waiter>,
    /// Where the head hears of releases and handovers (notifications and local releases).
    inbox: Arc<Inbox>,
    /// Whether the backend confirmed the release subscription (set once per queue).
    subscribed: Arc<OnceCell<bool>>,
    /// Bumped whenever the queue empties or is joined: a pending removal of an emptied queue
    /// goes ahead only if nothing happened since.
    generation: u64,
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    turn: Arc<Notify>,
}

impl WaitQueues {
    fn map(&self) -> MutexGuard<'_, HashMap<String, Queue>> {
        self.by_key.lock()
    }

    /// Whether any local waiter queues for `key`.
    pub(crate) fn has_waiters(&self, key: &LockKey) -> bool {
        self.map()
            .get(key.name())
            .is_some_and(|q| !q.waiters.is_empty())
    }

    /// How many keys have local waiters.
    pub(crate) fn waiting_keys(&self) -> usize {
        self.map()
            .values()
            .filter(|q| !q.waiters.is_empty())
            .count()
    }

    /// How many local waiters there are in all.
    pub(crate) fn waiters(&self) -> usize {
        self.map().values().map(|q| q.waiters.len()).sum()
    }

    /// A lock of this locker was released: wake the key's head at once.
    pub(crate) fn wake_local(&self, key: &LockKey) {
        if let Some(q) = self.map().get(key.name()).filter(|q| !q.waiters.is_empty()) {
            q.inbox.wake();
        }
    }

    /// Joins the queue of `key` at its tail.
    pub(crate) fn join(&self, locker: &Arc<LockerInner>, key: &LockKey) -> Ticket {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        let turn = Arc::new(Notify::new());
        let mut map = self.map();
        let q = map.entry(key.name().to_owned()).or_insert_with(|| Queue {
            waiters: VecDeque::new(),
            inbox: Arc::new(Inbox::default()),
            subscribed: Arc::new(OnceCell::new()),
            generation: 0,
        });
        q.generation += 1;
        q.waiters.push_back(Waiter {
            id,
            turn: turn.clone(),
        });
        Ticket {
            locker: locker.clone(),
            key: key.clone(),
            id,
            turn,
            inbox: q.inbox.clone(),
            subscribed: q.subscribed.clone(),
        }
    }
}

/// A place in a key's local queue. Dropping it leaves the queue.
#[derive(Debug)]
pub(crate) struct Ticket {
    locker: Arc<LockerInner>,
    key: LockKey,
    id: u64,
    turn: Arc<Notify>,
    inbox: Arc<Inbox>,
    subscribed: Arc<OnceCell<bool>>,
}

impl Ticket {
    /// Whether this waiter is the head.
    fn is_head(&self) -> bool {
        let map = self.locker.queues.map();
        map.get(self.key.name())
            .and_then(|q| q.waiters.front())
            .is_some_and(|w| w.id == self.id)
    }

    /// Waits until this waiter is the head.
    pub(crate) async fn my_turn(&self) {
        loop {
            let notified = self.turn.notified();
            if self.is_head() {
                return;
            }
            notified.await;
        }
    }

    /// Makes sure the backend delivers release notifications for this key to the queue.
    /// `false` when it could not confirm them (the caller then retries on timers).
    pub(crate) async fn subscribe(&self) -> bool {
        *self
            .subscribed
            .get_or_init(|| self.locker.backend.subscribe(&self.key, &self.inbox))
            .await
    }

    /// The queue's inbox, which its head uses while it waits.
    pub(crate) fn inbox(&self) -> Arc<Inbox> {
        self.inbox.clone()
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let queues = &self.locker.queues;
        let mut map = queues.map();
        let Some(q) = map.get_mut(self.key.name()) else {
            return;
        };
        let Some(pos) = q.waiters.iter().position(|w| w.id == self.id) else {
            return;
        };
        q.waiters.remove(pos);
        if pos == 0
            && let Some(next) = q.waiters.front_mut()
        {
            next.turn.notify_one();
        }
        if q.waiters.is_empty() {
            q.generation += 1;
            let generation = q.generation;
            drop(map);
            let (locker, key) = (self.locker.clone(), self.key.clone());
            let lingering = background::spawn(async move {
                tokio::time::sleep(LINGER).await;
                locker.queues.remove_if_idle(&locker, &key, generation);
            });
            if lingering.is_none() {
                queues.remove_if_idle(&self.locker, &self.key, generation);
            }
        }
    }
}

impl WaitQueues {
    /// Removes an emptied queue and its subscription, unless it was joined since `generation`.
    fn remove_if_idle(&self, locker: &LockerInner, key: &LockKey, generation: u64) {
        let mut map = self.map();
        let idle = map
            .get(key.name())
            .is_some_and(|q| q.waiters.is_empty() && q.generation == generation);
        if idle && let Some(q) = map.remove(key.name()) {
            drop(map);
            // Unconditional: removing a listener that was never registered does nothing.
            locker.backend.unsubscribe(key, &q.inbox);
        }
    }
}
