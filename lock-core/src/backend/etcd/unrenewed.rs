//! Locks the watchdog does not renew (`watchdog(false)`). Their key is on the etcd lease this
//! backend keeps alive for its other locks of the same lease length, so etcd alone would keep
//! them for as long as this process renews anything. This backend ends each one itself: a task
//! deletes the key (if it is still the one acquired) once the lock's lease has run since the
//! answer that granted it, or since the last `extend`. The engine's deadline, counted from
//! before the request was sent, has passed by then.

use std::sync::{Arc, Weak};
use std::time::Duration;

use etcd_client::{Compare, CompareOp};
use tokio::time::Instant;

use super::{EtcdBackend, Shared};
use crate::key::LockKey;

impl EtcdBackend {
    /// Our key `ck` was just acquired without the watchdog: it ends `lease` from now.
    pub(super) fn end_at_lease(&self, key: &LockKey, ck: &str, lease: Duration) {
        let ends = Instant::now() + lease;
        let mut contenders = self.inner.contenders.lock();
        let Some(c) = contenders.get_mut(ck) else {
            return;
        };
        c.ends = Some(ends);
        if let Some(old) = c.watch.take() {
            old.abort();
        }
        c.watch = crate::background::spawn(end(
            Arc::downgrade(&self.inner),
            key.clone(),
            ck.to_owned(),
            c.create_revision,
            ends,
        ));
    }
}

/// Sleeps until our key `ck` (created at `revision`) ends, following `extend`s, then forgets
/// it and deletes it. Nothing when it was released (or lost) before.
async fn end(shared: Weak<Shared>, key: LockKey, ck: String, revision: i64, mut at: Instant) {
    loop {
        tokio::time::sleep_until(at).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        {
            let mut contenders = shared.contenders.lock();
            let Some(c) = contenders
                .get_mut(&ck)
                .filter(|c| c.create_revision == revision)
            else {
                return;
            };
            match c.ends {
                Some(ends) if ends > Instant::now() => {
                    at = ends;
                    continue;
                }
                Some(_) => {}
                None => return,
            }
            // Out of the entry before it goes: dropping the entry would abort this task.
            drop(c.watch.take());
            contenders.remove(&ck);
        }
        tracing::debug!(key = %key.display(), "an unrenewed etcd lock reached the end of its lease");
        // Forgotten, it is no one's: a delete that fails here leaves it to the sweep.
        let ours = Compare::create_revision(ck.as_str(), CompareOp::Equal, revision);
        let backend = EtcdBackend { inner: shared };
        let _ = backend
            .delete(&key, &ck, ours, "end an unrenewed lock")
            .await;
        return;
    }
}
