//! Idempotency records on every server: storing a result on a quorum, and reading the state
//! back from every server that answers (see `merge_states`).

use std::time::Duration;

use super::{RedlockBackend, Tally, gather};
use crate::LockError;
use crate::background;
use crate::idempotency::{IdempotencyRecord, IdempotencyState};
use crate::key::LockKey;
use crate::token::Token;

impl RedlockBackend {
    pub(crate) async fn store_result(
        &self,
        key: &LockKey,
        token: &Token,
        fingerprint: &str,
        result: &[u8],
        ttl: Duration,
    ) -> Result<bool, LockError> {
        let quorum = self.inner.quorum;
        let n = self.inner.servers.len();
        let bound = self.inner.settings.response_timeout;
        // Each store in a task of its own: a server that is slow still gets the record.
        let tasks: Vec<_> = self
            .inner
            .servers
            .iter()
            .map(|s| {
                let b = s.get()?.clone();
                let (key, token) = (key.clone(), token.clone());
                let (fingerprint, result) = (fingerprint.to_owned(), result.to_vec());
                background::spawn(async move {
                    b.store_result(&key, &token, &fingerprint, &result, ttl)
                        .await
                })
            })
            .collect();
        let answers = gather(
            tasks.into_iter().map(|t| async move {
                match tokio::time::timeout(bound, t?).await {
                    Ok(Ok(Ok(stored))) => Some(stored),
                    Ok(Ok(Err(e))) => {
                        tracing::debug!(error = %e, "a Redlock server failed to store a result");
                        None
                    }
                    _ => None,
                }
            }),
            |answers| Tally::of(answers).decided(quorum, n),
        )
        .await;
        self.verdict(&answers, "store result", key)
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
        Ok(merge_states(states))
    }
}

/// One idempotency state from the answers of every server that answered within the bound (at
/// least a quorum): a record on any of them wins (the most common one, should two differ),
/// then a lock in flight, else absent.
///
/// A record whose store succeeded is on a quorum of servers, so any quorum of answers includes
/// a copy of it: every reader sees it. A record whose store failed (its holder was told so)
/// may be on a minority only: a reader that hears from one of those servers sees it, one that
/// does not sees the state without it. Waiting for every server that answers, not only the
/// first quorum, makes readers that reach the same servers decide alike; readers separated by
/// a fault can still differ about such a record, never about one that was stored.
pub(super) fn merge_states(states: Vec<IdempotencyState>) -> IdempotencyState {
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
    IdempotencyState::Absent
}
