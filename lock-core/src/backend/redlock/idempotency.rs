//! Idempotency records on every server: writing a mark or a result on a quorum, and reading
//! the state back from every server that answers (see `merge_states`).

use std::future::Future;
use std::time::Duration;

use super::{RedlockBackend, Tally, gather};
use crate::LockError;
use crate::backend::RedisBackend;
use crate::background;
use crate::idempotency::{IdempotencyRecord, IdempotencyState, Marked};
use crate::key::LockKey;
use crate::token::Token;

impl RedlockBackend {
    /// Runs `call` on every server, each in a task of its own (a server that is slow still
    /// gets the write), and gathers the answers within the per-server bound until `done`:
    /// per server, `None` when it did not answer (or failed), else its answer.
    async fn on_every_server<T, F>(
        &self,
        what: &'static str,
        call: impl Fn(RedisBackend) -> F,
        done: impl FnMut(&[Option<Option<T>>]) -> bool,
    ) -> Vec<Option<Option<T>>>
    where
        F: Future<Output = Result<T, LockError>> + Send + 'static,
        T: Send + 'static,
    {
        let bound = self.inner.settings.response_timeout;
        let tasks: Vec<_> = self
            .inner
            .servers
            .iter()
            .map(|s| background::spawn(call(s.get()?.clone())))
            .collect();
        gather(
            tasks.into_iter().map(|t| async move {
                match tokio::time::timeout(bound, t?).await {
                    Ok(Ok(Ok(answer))) => Some(answer),
                    Ok(Ok(Err(e))) => {
                        tracing::debug!(error = %e, operation = what, "a Redlock server failed");
                        None
                    }
                    _ => None,
                }
            }),
            done,
        )
        .await
    }

    pub(crate) async fn store_result(
        &self,
        key: &LockKey,
        token: &Token,
        fingerprint: &str,
        result: &[u8],
        ttl: Duration,
    ) -> Result<bool, LockError> {
        let (quorum, n) = (self.inner.quorum, self.inner.servers.len());
        let answers = self
            .on_every_server(
                "store result",
                |b| {
                    let (key, token) = (key.clone(), token.clone());
                    let (fingerprint, result) = (fingerprint.to_owned(), result.to_vec());
                    async move {
                        b.store_result(&key, &token, &fingerprint, &result, ttl)
                            .await
                    }
                },
                |answers| Tally::of(answers).decided(quorum, n),
            )
            .await;
        self.verdict(&answers, "store result", key)
    }

    /// A quorum write of the mark, like `store_result`'s. Written when a quorum wrote it.
    /// Otherwise a result found anywhere is `Completed`; "not ours" on more servers than may
    /// miss a quorum is `NotOurs`; another holder's mark is `Started` once the servers that
    /// could still write cannot make a quorum (a mark that reached a quorum leaves at most
    /// N - quorum servers writable, so it is always found); anything else is undecided (a
    /// `Backend` error: the caller does not run, and takes its partial marks back).
    pub(crate) async fn mark_started(
        &self,
        key: &LockKey,
        token: &Token,
        mark: &Token,
        fingerprint: &str,
        ttl: Duration,
    ) -> Result<Marked, LockError> {
        let (quorum, n) = (self.inner.quorum, self.inner.servers.len());
        let as_vote = |m: &Option<Option<Marked>>| {
            m.as_ref()
                .map(|m| m.as_ref().map(|m| *m == Marked::Written))
        };
        let answers = self
            .on_every_server(
                "mark started",
                |b| {
                    let (key, token, mark) = (key.clone(), token.clone(), mark.clone());
                    let fingerprint = fingerprint.to_owned();
                    async move { b.mark_started(&key, &token, &mark, &fingerprint, ttl).await }
                },
                |answers| {
                    let votes: Vec<_> = answers.iter().map(as_vote).collect();
                    Tally::of(&votes).decided(quorum, n)
                },
            )
            .await;
        let votes: Vec<_> = answers.iter().map(as_vote).collect();
        let tally = Tally::of(&votes);
        let marks: Vec<&Marked> = answers.iter().flatten().flatten().collect();
        if tally.yes >= quorum {
            return Ok(Marked::Written);
        }
        if marks.contains(&&Marked::Completed) {
            return Ok(Marked::Completed);
        }
        let not_ours = marks.iter().filter(|m| ***m == Marked::NotOurs).count();
        if not_ours > n - quorum {
            return Ok(Marked::NotOurs);
        }
        if tally.yes + (n - tally.answered) < quorum
            && let Some(started) = most_common_mark(&marks)
        {
            return Ok(started);
        }
        match self.verdict(&votes, "mark started", key)? {
            true => Ok(Marked::Written),
            false => Ok(Marked::NotOurs),
        }
    }

    pub(crate) async fn clear_started(
        &self,
        key: &LockKey,
        token: &Token,
        mark: &Token,
    ) -> Result<bool, LockError> {
        let (quorum, n) = (self.inner.quorum, self.inner.servers.len());
        let answers = self
            .on_every_server(
                "clear started",
                |b| {
                    let (key, token, mark) = (key.clone(), token.clone(), mark.clone());
                    async move { b.clear_started(&key, &token, &mark).await }
                },
                |answers| Tally::of(answers).decided(quorum, n),
            )
            .await;
        self.verdict(&answers, "clear started", key)
    }

    pub(crate) async fn idempotency_state(
        &self,
        key: &LockKey,
    ) -> Result<IdempotencyState, LockError> {
        let bound = self.inner.settings.response_timeout;
        let answers = gather(
            self.inner.servers.iter().map(|s| async move {
                let b = s.get()?;
                match tokio::time::timeout(bound, b.idempotency_state(key)).await {
                    Ok(Ok(state)) => Some(state),
                    Ok(Err(e @ LockError::InvalidConfig { .. })) => {
                        tracing::warn!(error = %e, "a Redlock server refuses the idempotency read");
                        None
                    }
                    _ => None,
                }
            }),
            // Every server that answers within the bound is heard (see `merge_states`), not
            // only the first quorum: readers that reach the same servers decide alike.
            |_| false,
        )
        .await;
        let states: Vec<IdempotencyState> = answers.into_iter().flatten().flatten().collect();
        self.quorum_or("idempotency state", Some(key.user()), states.len())?;
        Ok(merge_states(
            states,
            self.inner.servers.len(),
            self.inner.quorum,
        ))
    }
}

/// The mark most servers hold (the shortest of its TTLs), if any server holds one.
fn most_common_mark(marks: &[&Marked]) -> Option<Marked> {
    let started: Vec<(&str, Duration)> = marks
        .iter()
        .filter_map(|m| match m {
            Marked::Started {
                fingerprint,
                expires_in,
            } => Some((fingerprint.as_str(), *expires_in)),
            _ => None,
        })
        .collect();
    let (fingerprint, expires_in) = most_common(&started)?;
    Some(Marked::Started {
        fingerprint: fingerprint.to_owned(),
        expires_in,
    })
}

/// The fingerprint most entries have, with the shortest expiry among its copies.
fn most_common<'a>(entries: &[(&'a str, Duration)]) -> Option<(&'a str, Duration)> {
    let mut best: Option<(usize, &str, Duration)> = None;
    for (fingerprint, _) in entries {
        let copies: Vec<Duration> = entries
            .iter()
            .filter(|(f, _)| f == fingerprint)
            .map(|(_, e)| *e)
            .collect();
        if best.is_none_or(|(n, _, _)| copies.len() > n) {
            let shortest = copies.iter().min().copied().unwrap_or_default();
            best = Some((copies.len(), fingerprint, shortest));
        }
    }
    best.map(|(_, f, e)| (f, e))
}

/// One idempotency state from the answers of every server that answered within the bound (at
/// least a quorum): a record on any of them wins (the most common one, should two differ),
/// then a lock in flight, else absent.
///
/// Marks (`Started`) count only when numerous enough to be a mark that reached a quorum.
///
/// A record whose store succeeded is on a quorum of servers, so any quorum of answers includes
/// a copy of it: every reader sees it. A record whose store failed (its holder was told so)
/// may be on a minority only: a reader that hears from one of those servers sees it, one that
/// does not sees the state without it. Waiting for every server that answers, not only the
/// first quorum, makes readers that reach the same servers decide alike; readers separated by
/// a fault can still differ about such a record, never about one that was stored.
pub(super) fn merge_states(
    states: Vec<IdempotencyState>,
    n: usize,
    quorum: usize,
) -> IdempotencyState {
    let records: Vec<&IdempotencyRecord> = states
        .iter()
        .filter_map(|s| match s {
            IdempotencyState::Completed(r) => Some(r),
            _ => None,
        })
        .collect();
    // Copies on different servers differ only in how long each keeps it: the shortest counts.
    let same = |a: &IdempotencyRecord, b: &IdempotencyRecord| {
        a.fingerprint == b.fingerprint && a.result == b.result
    };
    let mut best: Option<(usize, IdempotencyRecord)> = None;
    for r in &records {
        let copies: Vec<&&IdempotencyRecord> = records.iter().filter(|o| same(o, r)).collect();
        if best.as_ref().is_none_or(|(n, _)| copies.len() > *n) {
            let mut record = (*r).clone();
            record.expires_in = copies
                .iter()
                .map(|c| c.expires_in)
                .min()
                .unwrap_or_default();
            best = Some((copies.len(), record));
        }
    }
    if let Some((_, record)) = best {
        return IdempotencyState::Completed(record);
    }
    if states.contains(&IdempotencyState::InFlight) {
        return IdempotencyState::InFlight;
    }
    // A mark that reached a quorum is on at least `answered - (n - quorum)` of the servers
    // that answered: then the outcome is unknown. Fewer copies are the leftovers of a mark
    // write that failed (its request never ran).
    let marks: Vec<(&str, Duration)> = states
        .iter()
        .filter_map(|s| match s {
            IdempotencyState::Started {
                fingerprint,
                expires_in,
            } => Some((fingerprint.as_str(), *expires_in)),
            _ => None,
        })
        .collect();
    let needed = states.len().saturating_sub(n.saturating_sub(quorum)).max(1);
    if marks.len() >= needed
        && let Some((fingerprint, expires_in)) = most_common(&marks)
    {
        return IdempotencyState::Started {
            fingerprint: fingerprint.to_owned(),
            expires_in,
        };
    }
    IdempotencyState::Absent
}
