//! [`Hold`]: a lock held on behalf of one request, and how it ends.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use lock_core::{LockError, LockGuard};

use crate::key::LogKey;
use crate::metrics::{Counter, LockLayerMetrics};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A lock held for one request: by its response future, then (with `hold_until_body_end`) by
/// its response body. Dropping it releases the lock in the background.
pub(crate) struct Hold {
    guard: Option<LockGuard>,
    /// Resolves on lease loss. Made on first need: a service that answers at its first poll
    /// never needs it (its lease is checked when it finishes), and making it costs a
    /// subscription and a timer.
    lost: Option<BoxFuture<()>>,
    acquired_at: Instant,
    metrics: LockLayerMetrics,
}

impl Hold {
    pub(crate) fn new(guard: LockGuard, acquired_at: Instant, metrics: LockLayerMetrics) -> Self {
        Hold {
            guard: Some(guard),
            lost: None,
            acquired_at,
            metrics,
        }
    }

    /// Ready once the lease is lost (never while it is ours). Call it when the work under the
    /// lock is pending, so that a loss wakes the task.
    pub(crate) fn poll_lost(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(guard) = &self.guard else {
            return Poll::Pending;
        };
        let lost = self.lost.get_or_insert_with(|| {
            let info = guard.info();
            Box::pin(async move { info.lost().await })
        });
        lost.as_mut().poll(cx)
    }

    /// Whether the lease is still ours by the local clock.
    pub(crate) fn is_held(&self) -> bool {
        self.guard.as_ref().is_some_and(LockGuard::is_held)
    }

    /// The lock key.
    pub(crate) fn key(&self) -> &str {
        self.guard.as_ref().map_or("", LockGuard::key)
    }

    /// The lease was lost while held; `during` says what was running.
    pub(crate) fn lost(self, during: &'static str) {
        self.metrics.incr(Counter::LeasesLost);
        tracing::warn!(key = %LogKey(self.key()), during, "lock lease lost while the request held it");
    }

    /// Releases the lock; the request is done with it. The future says whether the lock was
    /// still ours (`Err` with the key when the backend found it lost: deleted, expired or
    /// taken over since the last renewal, which the answer must not hide). It finishes the
    /// release even when dropped half-way (the rest then runs as a background task).
    pub(crate) fn release(mut self) -> Release {
        let Some(guard) = self.guard.take() else {
            return Release { fut: None };
        };
        let held = self.acquired_at.elapsed();
        self.metrics.released(held);
        let metrics = self.metrics.clone();
        Release {
            fut: Some(Box::pin(async move {
                let info = guard.info();
                match guard.release().await {
                    Ok(()) => {
                        tracing::trace!(held_us = held.as_micros(), "lock released");
                        Ok(())
                    }
                    Err(LockError::LeaseLost { key, .. }) => {
                        // The request finished while the lease was ours by the local clock; the
                        // backend says it was not (deleted, expired or taken over since the
                        // last renewal): the work may have run beside another holder.
                        metrics.incr(Counter::LeasesLost);
                        tracing::warn!(key = %LogKey(&key), "lock lease found lost at its release; the response is not passed on as a success");
                        Err(LostAtRelease { key })
                    }
                    Err(error) => {
                        // Unknown (no answer): the lease was ours when the request finished and
                        // nothing says otherwise; the lease expires on its own.
                        tracing::warn!(key = %LogKey(info.key()), %error, "lock release failed; the lease will expire on its own");
                        Ok(())
                    }
                }
            })),
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Some(guard) = self.guard.take() {
            self.metrics.released(self.acquired_at.elapsed());
            tracing::trace!(
                "lock released in the background (request dropped, lease lost or body ended)"
            );
            // LockGuard's drop releases in the background (best effort, lease as backstop).
            drop(guard);
        }
    }
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hold")
            .field("key", &LogKey(self.key()))
            .field("held", &self.guard.is_some())
            .finish_non_exhaustive()
    }
}

/// The backend found the lock no longer ours when it was released: the request's work may
/// have run beside another holder.
#[derive(Debug)]
pub(crate) struct LostAtRelease {
    pub(crate) key: String,
}

/// The release of a [`Hold`]; see [`Hold::release`].
pub(crate) struct Release {
    fut: Option<BoxFuture<Result<(), LostAtRelease>>>,
}

impl Future for Release {
    type Output = Result<(), LostAtRelease>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(fut) = self.fut.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let released = std::task::ready!(fut.as_mut().poll(cx));
        self.fut = None;
        Poll::Ready(released)
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        // Dropped half-way (the client went away while we released): a release cut short
        // would leave the key locked until its lease ran out, so finish it in the background.
        if let Some(fut) = self.fut.take()
            && let Ok(handle) = tokio::runtime::Handle::try_current()
        {
            handle.spawn(fut);
        }
    }
}

impl std::fmt::Debug for Release {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Release")
            .field("done", &self.fut.is_none())
            .finish()
    }
}
