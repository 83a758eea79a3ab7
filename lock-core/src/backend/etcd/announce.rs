//! Fair waiters heard across processes. A fair waiter's contender key carries `fair:<ticket>`
//! at the start of its value (its stamp follows, see `backend::stamp`); while this process has listeners for a lock (a local queue, whose holder may
//! pass the lock between its tasks), one watch of the lock's contender prefix turns each new
//! fair key into a [`FairWaiting`](crate::backend::notify::Announcement::FairWaiting)
//! announcement: the holder's next release asks etcd whether anyone else queues, and gives the
//! lock back rather than passing it on locally (as the Redis backend's `fair:` message does).
//!
//! The watch starts at the revision after the latest answer this backend had from etcd, so a
//! fair key created while it is being set up is still heard; a watch that breaks is made again
//! from where it stopped, and one that cannot resume (a compacted history) announces a fair
//! waiter at once, so the holder asks etcd rather than trust the silence.

use std::sync::Weak;
use std::sync::atomic::Ordering;
use std::time::Duration;

use etcd_client::{EventType, WatchFilterType, WatchOptions};

use super::{EtcdBackend, Shared};
use crate::backend::Inbox;
use crate::key::LockKey;

/// What a watch that cannot resume announces: a fair waiter may have queued unheard.
const UNHEARD: &[u8] = b"fair:";

impl EtcdBackend {
    /// Adds `inbox` to the listeners of `key`, and makes sure the fair waiters of `key` are
    /// heard while it has listeners here.
    pub(super) fn hear_fair_waiters(&self, key: &LockKey, inbox: &std::sync::Arc<Inbox>) {
        // Under the watches' lock, with `stop_hearing`: a listener added as the last one goes
        // keeps its key's watch.
        let mut watches = self.inner.announcers.lock();
        self.inner.listeners.lock().add(key.name(), inbox);
        if watches.get(key.name()).is_some_and(|w| !w.is_finished()) {
            return;
        }
        let from = self.inner.seen_revision.load(Ordering::Acquire) + 1;
        let watch = crate::background::spawn(announce(
            std::sync::Arc::downgrade(&self.inner),
            self.queue_prefix(key),
            key.name().to_owned(),
            from,
        ));
        // The engine subscribes from its tasks: a runtime is there to run the watch.
        if let Some(watch) = watch {
            watches.insert(key.name().to_owned(), watch);
        }
    }

    /// Takes `inbox` from the listeners of `key`; the last one gone, the watch ends.
    pub(super) fn stop_hearing(&self, key: &LockKey, inbox: &std::sync::Arc<Inbox>) {
        let mut watches = self.inner.announcers.lock();
        if self.inner.listeners.lock().remove(key.name(), inbox)
            && let Some(watch) = watches.remove(key.name())
        {
            watch.abort();
        }
    }
}

/// Watches the creation of contender keys under `prefix` from revision `from` on, and
/// announces each fair one to the listeners of lock `name`; until the backend is gone.
async fn announce(shared: Weak<Shared>, prefix: String, name: String, mut from: i64) {
    let mut pause = Duration::from_millis(50);
    loop {
        let Some(client) = shared.upgrade().map(|s| s.client.watch_client()) else {
            return;
        };
        let mut options = WatchOptions::new()
            .with_prefix()
            .with_filters([WatchFilterType::NoDelete]);
        if from > 1 {
            options = options.with_start_revision(from);
        }
        let mut client = client;
        if let Ok(mut stream) = client.watch(prefix.as_str(), Some(options)).await {
            while let Ok(Some(answer)) = stream.message().await {
                let Some(shared) = shared.upgrade() else {
                    return;
                };
                if answer.compact_revision() > 0 {
                    // The history from `from` is gone: what happened in it is unknown.
                    shared.listeners.lock().wake(&name, UNHEARD);
                    shared.fair_heard.fetch_add(1, Ordering::Relaxed);
                    from = answer.compact_revision();
                    break;
                }
                if answer.created() {
                    // A fair key made before the watch started (between the holder's first
                    // ask and `from`) would go unheard: the holder asks etcd once more.
                    shared.listeners.lock().wake(&name, UNHEARD);
                    shared.fair_heard.fetch_add(1, Ordering::Relaxed);
                }
                if !answer.events().is_empty() {
                    pause = Duration::from_millis(50);
                }
                for event in answer.events() {
                    let Some(kv) = event.kv() else { continue };
                    from = from.max(kv.mod_revision() + 1);
                    let created = event.event_type() == EventType::Put && kv.version() == 1;
                    let fair = crate::backend::stamp::fair_part(kv.value());
                    if created && fair.starts_with(UNHEARD) {
                        // The announcement alone, not the holder's stamp after it.
                        shared.listeners.lock().wake(&name, fair);
                        shared.fair_heard.fetch_add(1, Ordering::Relaxed);
                    }
                }
                if answer.canceled() {
                    break;
                }
            }
        }
        // Broken (a member restarted, the connection dropped): made again from where it
        // stopped, which replays what came meanwhile.
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}
