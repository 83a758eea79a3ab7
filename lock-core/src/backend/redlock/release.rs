//! Release, the local hand-off (`keep_if_alone`) and the waiters' queue entries on every
//! server.

use std::time::Duration;

use super::{RedlockBackend, Server, Tally, gather};
use crate::LockError;
use crate::backend::Kept;
use crate::background;
use crate::key::LockKey;
use crate::token::Token;

impl RedlockBackend {
    /// Releases on the servers `which` selects, each in a task of its own that runs to its end
    /// whatever the caller does (bounded by the server's response timeout).
    fn release_on(
        &self,
        key: &LockKey,
        token: &Token,
        which: impl Fn(usize) -> bool,
    ) -> Vec<Option<tokio::task::JoinHandle<Result<bool, LockError>>>> {
        let mut stragglers = self
            .inner
            .stragglers
            .lock()
            .remove(token)
            .unwrap_or_default();
        let bound = self.inner.settings.response_timeout * 2;
        self.inner
            .servers
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let b = s.get().filter(|_| which(i))?.clone();
                let (key, token) = (key.clone(), token.clone());
                let straggler = stragglers
                    .iter()
                    .position(|(j, _)| *j == i)
                    .map(|p| stragglers.swap_remove(p).1);
                background::spawn(async move {
                    if let Some(acquire) = straggler {
                        let _ = tokio::time::timeout(bound, acquire).await;
                    }
                    b.release(&key, &token).await
                })
            })
            .collect()
    }

    /// Waits for the tasks of [`release_on`](Self::release_on) until a quorum said yes (or
    /// can no longer), at most the response timeout; `Ok(true)` when a quorum released it.
    async fn released(
        &self,
        key: &LockKey,
        tasks: Vec<Option<tokio::task::JoinHandle<Result<bool, LockError>>>>,
    ) -> Result<bool, LockError> {
        let quorum = self.inner.quorum;
        let n = tasks.len();
        let bound = self.inner.settings.response_timeout;
        let answers = gather(
            tasks.into_iter().map(|t| async move {
                let t = t?;
                match tokio::time::timeout(bound, t).await {
                    Ok(Ok(Ok(yes))) => Some(yes),
                    _ => None,
                }
            }),
            |answers| Tally::of(answers).decided(quorum, n),
        )
        .await;
        self.verdict(&answers, "release", key)
    }

    /// How many of the tasks of [`release_on`](Self::release_on) released (waiting for all,
    /// each at most the response timeout).
    async fn released_count(
        &self,
        tasks: Vec<Option<tokio::task::JoinHandle<Result<bool, LockError>>>>,
    ) -> usize {
        let bound = self.inner.settings.response_timeout;
        gather(
            tasks.into_iter().map(|t| async move {
                matches!(tokio::time::timeout(bound, t?).await, Ok(Ok(Ok(true)))).then_some(())
            }),
            |_| false,
        )
        .await
        .into_iter()
        .flatten()
        .flatten()
        .count()
    }

    pub(crate) async fn release(&self, key: &LockKey, token: &Token) -> Result<bool, LockError> {
        let tasks = self.release_on(key, token, |_| true);
        self.released(key, tasks).await
    }

    /// Takes a waiter's announcement out of every server's queue, in the background.
    pub(super) fn leave_everywhere(&self, key: &LockKey, ticket: &str) {
        for b in self.inner.servers.iter().filter_map(Server::get) {
            let (b, key, ticket) = (b.clone(), key.clone(), ticket.to_owned());
            background::spawn(async move {
                if let Err(e) = b.redlock_waiter(&key, &ticket, Duration::ZERO, false).await {
                    tracing::debug!(error = %e, "leaving a Redlock server's queue failed; the entry expires on its own");
                }
            });
        }
    }

    /// A waiter gives up: its announcements go (in the background; they expire on their own
    /// otherwise). Nothing was ever handed to it.
    pub(crate) fn leave_queue(&self, key: &LockKey, ticket: &str) {
        self.leave_everywhere(key, ticket);
    }

    /// Local hand-off between the tasks of one locker, at a bound of its turns: `keep.lua` on
    /// every server keeps the lock where it is ours and nobody of another process waits
    /// (waiters announce themselves in each server's queue), and releases it there to the
    /// waiters otherwise. Kept when a quorum kept it and none released it; when any server
    /// released it, it is released everywhere (part of a lock is no lock) and the answer is
    /// `Released`.
    pub(crate) async fn keep_if_alone(
        &self,
        key: &LockKey,
        token: &Token,
    ) -> Result<Kept, LockError> {
        let quorum = self.inner.quorum;
        let n = self.inner.servers.len();
        let bound = self.inner.settings.response_timeout;
        let answers = gather(
            self.inner.servers.iter().map(|s| async move {
                let b = s.get()?;
                tokio::time::timeout(bound, b.keep_if_alone(key, token))
                    .await
                    .ok()?
                    .ok()
            }),
            // Kept by a majority with nobody waiting: decided, a stalled server is not waited
            // for (a waiter announces itself on every server, so the majority would show it).
            // When a server released it, every answer is awaited: the release that follows
            // must not overtake those still on their way.
            |answers| {
                let alone = answers
                    .iter()
                    .filter(|a| matches!(a, Some(Some(Kept::Alone))))
                    .count();
                let released = answers
                    .iter()
                    .filter(|a| matches!(a, Some(Some(Kept::Released))))
                    .count();
                released == 0 && alone >= quorum
            },
        )
        .await;
        let count = |kept: Kept| {
            answers
                .iter()
                .filter(|a| matches!(a, Some(Some(k)) if *k == kept))
                .count()
        };
        let (alone, released) = (count(Kept::Alone), count(Kept::Released));
        let answered = alone + released + count(Kept::NotOurs);
        if released == 0 && alone >= quorum {
            return Ok(Kept::Alone);
        }
        if released > 0 {
            let tasks = self.release_on(key, token, |_| true);
            let rest = self.released_count(tasks).await;
            return Ok(if released + rest >= quorum {
                Kept::Released
            } else {
                Kept::NotOurs
            });
        }
        if alone + (n - answered) >= quorum {
            return Err(self.no_quorum("release", Some(key.user()), answered));
        }
        Ok(Kept::NotOurs)
    }
}
