//! Redlock behind the [`Backend`] trait.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::RedlockBackend;
use crate::LockError;
use crate::backend::{Attempt, AttemptOptions, Backend, BoxFuture, Inbox, Kept, Renewal, Renewed};
use crate::idempotency::{IdempotencyState, Marked};
use crate::key::LockKey;
use crate::token::Token;

/// A queue with hand-over, group commit and per-lease-class renewal; no fencing, no fair mode,
/// and failed attempts are taken back by their own ballot.
impl Backend for RedlockBackend {
    super::super::forward_to_inherent!(RedlockBackend);

    fn kind(&self) -> &'static str {
        "redlock"
    }

    fn renew<'a>(&'a self, items: &'a [Renewal]) -> BoxFuture<'a, Result<Vec<Renewed>, LockError>> {
        Box::pin(RedlockBackend::renew(self, items))
    }

    fn refuses(&self, fenced: bool, fair: bool) -> Option<&'static str> {
        if fenced {
            Some(super::FENCING_REFUSED)
        } else if fair {
            Some(super::FAIR_REFUSED)
        } else {
            None
        }
    }

    fn takes_back_failed_attempts(&self) -> bool {
        true
    }

    fn leave_queue<'a>(
        &'a self,
        key: &'a LockKey,
        ticket: &'a str,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        RedlockBackend::leave_queue(self, key, ticket);
        let _ = token;
        Box::pin(async { Ok(()) })
    }

    /// The queue is kept in this process (the servers keep none).
    fn leave_queue_at_once(&self, key: &LockKey, ticket: &str, _token: &Token) -> bool {
        RedlockBackend::leave_queue(self, key, ticket);
        true
    }
}
