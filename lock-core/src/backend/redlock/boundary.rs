//! Redlock behind the [`Backend`] trait.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::RedlockBackend;
use crate::LockError;
use crate::backend::{
    Attempt, AttemptOptions, Backend, BoxFuture, Inbox, Kept, KeyPattern, ListPage, Renewal,
    Renewed,
};
use crate::idempotency::{IdempotencyState, Marked};
use crate::inspect::LockState;
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

    /// The quorum's view: held when a quorum of servers hold one acquisition.
    fn inspect<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<LockState, LockError>> {
        Box::pin(self.inspect_lock(key))
    }

    /// The quorum's acquisition, removed on every server that holds it (no other).
    fn force_unlock<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<LockState>, LockError>> {
        Box::pin(self.force_unlock_lock(key))
    }

    /// `SCAN` on N − quorum + 1 servers in turn, each lock listed once.
    fn list_page<'a>(
        &'a self,
        prefix: &'a str,
        pattern: &'a KeyPattern,
        cursor: Option<&'a str>,
    ) -> BoxFuture<'a, Result<ListPage, LockError>> {
        Box::pin(self.list_locks(prefix, pattern, cursor))
    }

    /// The queue is kept in this process (the servers keep none).
    fn leave_queue_at_once(&self, key: &LockKey, ticket: &str, _token: &Token) -> bool {
        RedlockBackend::leave_queue(self, key, ticket);
        true
    }
}
