//! Shared by the crate's unit tests: a hang guard, one-shot hooks that run a test's code at a
//! chosen point of the crate's own code, and a locker whose lock is passed on locally.

use std::time::Duration;

use tokio::sync::mpsc;

use crate::engine::held::Held;
use crate::{LockError, LockGuard, Locker};

/// How long a step may take before the test fails instead of hanging.
pub(crate) const BOUND: Duration = Duration::from_secs(20);

/// `step`, or a test failure after [`BOUND`].
pub(crate) async fn within<T>(step: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, step)
        .await
        .expect("a step did not end within its bound")
}

/// A test's code, run once when the crate's code reaches the hook's point for a lock of the
/// named key.
pub(crate) type Hook = Box<dyn FnOnce(&Held) + Send>;

/// A point in the crate's code where a test may run a [`Hook`].
pub(crate) struct HookPoint(std::sync::Mutex<Option<(&'static str, Hook)>>);

impl HookPoint {
    pub(crate) const fn new() -> Self {
        HookPoint(std::sync::Mutex::new(None))
    }

    /// Runs `hook` the next time this point is reached for a lock of `key`.
    pub(crate) fn set(&self, key: &'static str, hook: Hook) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some((key, hook));
    }

    /// The point is reached for `held`: runs the hook set for its key, if any (once).
    pub(crate) fn reached(&self, held: &Held) {
        let hook = {
            let mut hook = self.0.lock().unwrap_or_else(|e| e.into_inner());
            match &*hook {
                Some((key, _)) if held.key.user() == *key => hook.take(),
                _ => None,
            }
        };
        if let Some((_, run)) = hook {
            run(held);
        }
    }
}

/// What [`passing_locally`] gives: the holder, and the guards of the waiters as they get the
/// lock.
pub(crate) type Passing = (
    LockGuard,
    mpsc::UnboundedReceiver<Result<LockGuard, LockError>>,
);

/// `key` held on `locker` with `waiters` tasks of it waiting, past the first turns (which go
/// through the backend): the holder's next release may pass the lock on without asking the
/// backend, and a waiter is left to take it.
pub(crate) async fn passing_locally(locker: &Locker, key: &'static str, waiters: usize) -> Passing {
    let mut holder = locker.lock(key).await.unwrap();
    let (handed_tx, mut handed) = mpsc::unbounded_channel();
    for _ in 0..waiters {
        let (locker, handed_tx) = (locker.clone(), handed_tx.clone());
        tokio::spawn(async move {
            let guard = locker.lock(key).wait(Duration::from_secs(10)).await;
            let _ = handed_tx.send(guard);
        });
    }
    within(async {
        while locker.inner.queues.waiters() < waiters {
            tokio::task::yield_now().await;
        }
    })
    .await;
    // The first turns go through the backend (a hand-over, then a release that asks whether
    // another process waits before it passes the lock on).
    let mut left = waiters;
    while locker.stats().local_handoffs == 0 && left > 0 {
        holder.release().await.unwrap();
        holder = within(handed.recv()).await.unwrap().unwrap();
        left -= 1;
    }
    assert!(left > 0, "a waiter is left to pass the lock to");
    (holder, handed)
}

/// The end of a [`passing_locally`] whose holder's lock must not be passed on: its release
/// says `LeaseLost`, and the next waiter takes the key through the backend (the locker's count
/// of local hand-offs stays `passes`).
pub(crate) async fn released_lost_and_not_passed(
    (holder, mut handed): Passing,
    locker: &Locker,
    passes: u64,
) {
    let released = holder.release().await;
    assert!(
        matches!(released, Err(LockError::LeaseLost { .. })),
        "{released:?}"
    );
    let next = within(handed.recv()).await.unwrap().unwrap();
    assert_eq!(locker.stats().local_handoffs, passes, "passed locally");
    next.release().await.unwrap();
}

/// A fair waiter's queue ticket named `id`, at its first attempt (3 s ticket and handover
/// lease), for tests that drive a backend's acquire by hand.
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
pub(crate) fn fair_ticket(id: &str) -> crate::backend::QueueTicket {
    crate::backend::QueueTicket {
        id: id.to_owned(),
        ttl: Duration::from_secs(3),
        strict: true,
        generation: 1,
        handover_lease: Duration::from_secs(3),
    }
}

/// A waiter's attempt with `ticket` (asking the holder's remaining lease), fenced or not.
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
pub(crate) fn queued(
    ticket: &crate::backend::QueueTicket,
    fenced: bool,
) -> crate::backend::AttemptOptions<'_> {
    crate::backend::AttemptOptions {
        fenced,
        ticket: Some(ticket),
        remaining: true,
        unrenewed: false,
        holder: "",
        bounded: false,
    }
}
