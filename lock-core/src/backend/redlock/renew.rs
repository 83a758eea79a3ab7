//! Renewal (and `extend`) on every server: one call per server for a batch of locks, each lock
//! judged on its own answers, by its own per-server bound.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

use super::{RedlockBackend, start};
use crate::LockError;
use crate::backend::{Renewal, Renewed};

impl RedlockBackend {
    /// The watchdog's calls for `items`: one per per-server bound (see
    /// [`server_timeout`](Self::server_timeout)), each on a task of its own, so that a lock
    /// with a short lease is not kept waiting for a long one's bound, nor a long one judged by
    /// a short one's. `None` (one call) when they all share one bound: with the default bound
    /// every lease of 2 s or more does.
    pub(crate) fn renewal_groups(&self, items: &[Renewal]) -> Option<Vec<Vec<usize>>> {
        let mut groups: Vec<(Duration, Vec<usize>)> = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let bound = self.server_timeout(item.lease);
            match groups.iter_mut().find(|(b, _)| *b == bound) {
                Some((_, group)) => group.push(i),
                None => groups.push((bound, vec![i])),
            }
        }
        (groups.len() > 1).then(|| groups.into_iter().map(|(_, group)| group).collect())
    }

    /// One verdict per lock: [`Renewed::Yes`] when a quorum extended it (each extension is
    /// owner-checked), [`Renewed::Lost`] when even the servers that did not answer could not
    /// make a quorum with those that said yes, else [`Renewed::Unknown`] (the watchdog retries
    /// only those). Each lock is judged on its own answers: one undecided lock decides nothing
    /// for another. The call waits for each lock until its verdict is known or its own
    /// per-server bound has passed, whichever is first; an answer heard by then counts for
    /// every lock, whoever it was waited for. `Err` only when fewer than a quorum answered and
    /// no lock is decided.
    pub(crate) async fn renew(&self, items: &[Renewal]) -> Result<Vec<Renewed>, LockError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let bounds: Vec<Duration> = items.iter().map(|r| self.server_timeout(r.lease)).collect();
        let longest = bounds.iter().copied().max().unwrap_or_default();
        let quorum = self.inner.quorum;
        let n = self.inner.servers.len();
        let began = Instant::now();
        // Each server's call runs to its end in a task of its own, whatever this call decides
        // without it (every server asked gets it: a call dropped at the quorum was never sent
        // if its request still sat in the connection's queue). Each is polled once here first,
        // so its request is queued on its connection before this call returns: a later call
        // for the same lock (the lock's renewals are serial) cannot overtake it there.
        let life = self.inner.settings.response_timeout * 2;
        let shared: Arc<[Renewal]> = items.into();
        let mut started = Vec::with_capacity(n);
        for s in &self.inner.servers {
            let Some(b) = s.get().cloned() else {
                started.push(None);
                continue;
            };
            let items = shared.clone();
            started.push(
                start(async move {
                    match tokio::time::timeout(life, b.renew(&items)).await {
                        Ok(Ok(answers)) if answers.len() == items.len() => Some(answers),
                        Ok(Err(e)) => {
                            tracing::debug!(error = %e, "a Redlock server failed a renewal");
                            None
                        }
                        _ => None,
                    }
                })
                .await,
            );
        }
        let mut calls: Vec<Option<Pin<Box<_>>>> = started
            .into_iter()
            .map(|call| Some(Box::pin(async move { call?.finish().await? })))
            .collect();
        // Per server: `None` while its call runs, then its answer (`Some(None)`: none).
        let mut answers: Vec<Option<Option<Vec<bool>>>> = vec![None; n];
        let mut wake = Box::pin(tokio::time::sleep_until(began + longest));
        std::future::poll_fn(|cx| {
            for (slot, answer) in calls.iter_mut().zip(answers.iter_mut()) {
                if let Some(call) = slot
                    && let Poll::Ready(v) = call.as_mut().poll(cx)
                {
                    *answer = Some(v);
                    *slot = None;
                }
            }
            if calls.iter().all(Option::is_none) {
                return Poll::Ready(());
            }
            let got: Vec<&Vec<bool>> = answers.iter().flatten().flatten().collect();
            let elapsed = began.elapsed();
            // The nearest bound of a lock still open: neither decided nor past its bound.
            let open = bounds
                .iter()
                .enumerate()
                .filter(|&(i, bound)| elapsed < *bound && !decided(&got, i, quorum, n))
                .map(|(_, bound)| *bound)
                .min();
            let Some(next) = open else {
                return Poll::Ready(());
            };
            wake.as_mut().reset(began + next);
            if wake.as_mut().poll(cx).is_ready() {
                cx.waker().wake_by_ref();
            }
            Poll::Pending
        })
        .await;
        let got: Vec<&Vec<bool>> = answers.iter().flatten().flatten().collect();
        let verdicts = verdicts(&got, items.len(), quorum, n);
        if got.len() < quorum && verdicts.iter().all(|v| *v == Renewed::Unknown) {
            let first = items.first().map(|r| r.key.user());
            return Err(self.no_quorum("renew", first, got.len()));
        }
        Ok(verdicts)
    }
}

/// Whether lock `i`'s verdict is known from the answers heard (`got`) whatever the others
/// answer: a quorum said yes, or too many said no for one.
fn decided(got: &[&Vec<bool>], i: usize, quorum: usize, n: usize) -> bool {
    let yes = got.iter().filter(|a| a.get(i) == Some(&true)).count();
    yes >= quorum || got.len() - yes > n - quorum
}

/// Each lock's verdict from the answers heard (`got`: one yes/no per lock from each server
/// that answered) of `n` servers: yes on a quorum of yes; lost when the yes and the servers
/// not heard together fall short of a quorum; otherwise unknown (the servers not heard may
/// hold it still: too few answers, or a quorum answered without a quorum of yes). Nothing is
/// extended locally without a quorum of yes.
pub(super) fn verdicts(got: &[&Vec<bool>], locks: usize, quorum: usize, n: usize) -> Vec<Renewed> {
    let silent = n - got.len();
    (0..locks)
        .map(|i| {
            let yes = got.iter().filter(|a| a.get(i) == Some(&true)).count();
            if yes >= quorum {
                Renewed::Yes
            } else if yes + silent < quorum {
                Renewed::Lost
            } else {
                Renewed::Unknown
            }
        })
        .collect()
}
