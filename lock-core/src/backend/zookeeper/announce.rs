//! Fair waiters heard across processes. A fair waiter's node is named `f-<token>-<sequence>`;
//! while this process has listeners for a lock (a local queue, whose holder may pass the lock
//! between its tasks), one persistent watch of the lock's container turns each new `f-` child
//! into a [`FairWaiting`](crate::backend::notify::Announcement::FairWaiting) announcement: the
//! holder's next release asks ZooKeeper whether anyone else queues and gives the lock back
//! rather than passing it on locally (as the Redis and etcd backends do).
//!
//! A watch announces once when it starts (a fair node made before it would go unheard), and
//! again whenever the session reconnects (events during a reconnection can be lost,
//! ZOOKEEPER-4698) or ends (the watch is made again on the next session).

use std::collections::HashSet;
use std::sync::{Arc, Weak};
use std::time::Duration;

use zookeeper_client as zk;

use super::{Shared, ZooKeeperBackend};
use crate::backend::Inbox;
use crate::key::LockKey;

/// What a watch announces when it cannot tell: a fair waiter may have queued unheard.
const UNHEARD: &[u8] = b"fair:";

impl ZooKeeperBackend {
    /// Adds `inbox` to the listeners of `key`, and makes sure the fair waiters of `key` are
    /// heard while it has listeners here.
    pub(super) fn hear_fair_waiters(&self, key: &LockKey, inbox: &Arc<Inbox>) {
        // Under the watches' lock, with `stop_hearing`: a listener added as the last one goes
        // keeps its key's watch.
        let mut watches = self.inner.announcers.lock();
        self.inner.listeners.lock().add(key.name(), inbox);
        if watches.get(key.name()).is_some_and(|w| !w.is_finished()) {
            return;
        }
        let watch = crate::background::spawn(announce(
            Arc::downgrade(&self.inner),
            self.lock_path(key),
            key.name().to_owned(),
        ));
        // The engine subscribes from its tasks: a runtime is there to run the watch.
        if let Some(watch) = watch {
            watches.insert(key.name().to_owned(), watch);
        }
    }

    /// Takes `inbox` from the listeners of `key`; the last one gone, the watch ends.
    pub(super) fn stop_hearing(&self, key: &LockKey, inbox: &Arc<Inbox>) {
        let mut watches = self.inner.announcers.lock();
        if self.inner.listeners.lock().remove(key.name(), inbox)
            && let Some(watch) = watches.remove(key.name())
        {
            watch.abort();
        }
    }
}

/// Tells the listeners of lock `name` that a fair waiter may queue.
fn tell(shared: &Shared, name: &str, payload: &[u8]) {
    shared.listeners.lock().wake(name, payload);
    shared
        .fair_heard
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// Watches the children of container `dir` and announces each new fair one to the listeners
/// of lock `name`; until the backend is gone (or the task aborted).
async fn announce(shared: Weak<Shared>, dir: String, name: String) {
    let mut pause = Duration::from_millis(50);
    loop {
        let Some(strong) = shared.upgrade() else {
            return;
        };
        let session = strong.sessions.live();
        let timeout = strong.request_timeout;
        drop(strong);
        let Some(session) = session else {
            // No session now: the next request makes one; the watch waits for it.
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
            continue;
        };
        let made = tokio::time::timeout(
            timeout,
            session.client.watch(&dir, zk::AddWatchMode::Persistent),
        )
        .await;
        let Ok(Ok(mut watcher)) = made else {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
            continue;
        };
        pause = Duration::from_millis(50);
        let Some(strong) = shared.upgrade() else {
            return;
        };
        // A fair node made before the watch started would go unheard: the holder asks once.
        tell(&strong, &name, UNHEARD);
        let mut seen: HashSet<String> = HashSet::new();
        drop(strong);
        loop {
            let event = watcher.changed().await;
            let Some(strong) = shared.upgrade() else {
                return;
            };
            match event.event_type {
                zk::EventType::Session if event.session_state.is_terminated() => {
                    // The session ended, and the watch with it: made again on the next one.
                    tell(&strong, &name, UNHEARD);
                    break;
                }
                zk::EventType::Session
                    if event.session_state == zk::SessionState::SyncConnected =>
                {
                    // Events during a reconnection can be lost.
                    tell(&strong, &name, UNHEARD);
                }
                zk::EventType::NodeChildrenChanged => {
                    let listed = tokio::time::timeout(timeout, session.client.list_children(&dir));
                    match listed.await {
                        Ok(Ok(children)) => {
                            let fair: HashSet<String> = children
                                .into_iter()
                                .filter(|c| c.starts_with("f-"))
                                .collect();
                            if fair.iter().any(|c| !seen.contains(c)) {
                                tell(&strong, &name, UNHEARD);
                            }
                            seen = fair;
                        }
                        Ok(Err(zk::Error::NoNode)) => seen.clear(),
                        _ => tell(&strong, &name, UNHEARD),
                    }
                }
                _ => {}
            }
        }
    }
}
