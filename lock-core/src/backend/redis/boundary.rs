//! The Redis backend (one server, Cluster, Sentinel) behind the [`Backend`] trait.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::RedisBackend;
use crate::LockError;
use crate::backend::{
    Attempt, AttemptOptions, Backend, BoxFuture, Inbox, Kept, KeyPattern, ListPage, Renewal,
    Renewed,
};
use crate::idempotency::{IdempotencyState, Marked};
use crate::inspect::LockState;
use crate::key::LockKey;
use crate::token::Token;

/// Every capability: a queue with hand-over, group commit, fencing, per-shard renewal.
impl Backend for RedisBackend {
    super::super::forward_to_inherent!(RedisBackend);

    fn kind(&self) -> &'static str {
        self.inner.conn.kind()
    }

    fn renew<'a>(&'a self, items: &'a [Renewal]) -> BoxFuture<'a, Result<Vec<Renewed>, LockError>> {
        Box::pin(self.renew_verdicts(items))
    }

    fn refuses(&self, _fenced: bool, _fair: bool) -> Option<&'static str> {
        None
    }

    fn leave_queue<'a>(
        &'a self,
        key: &'a LockKey,
        ticket: &'a str,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(RedisBackend::leave_queue(self, key, ticket, token))
    }

    /// Leaving the queue is a script on the server.
    fn leave_queue_at_once(&self, _key: &LockKey, _ticket: &str, _token: &Token) -> bool {
        false
    }

    fn inspect<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<LockState, LockError>> {
        Box::pin(self.inspect_lock(key))
    }

    fn force_unlock<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<LockState>, LockError>> {
        Box::pin(self.force_unlock_lock(key))
    }

    fn force_unlock_seen<'a>(
        &'a self,
        key: &'a LockKey,
        seen: &'a LockState,
    ) -> BoxFuture<'a, Result<crate::Unlocked, LockError>> {
        Box::pin(self.force_unlock_seen_lock(key, seen))
    }

    fn list_page<'a>(
        &'a self,
        prefix: &'a str,
        pattern: &'a KeyPattern,
        cursor: Option<&'a str>,
    ) -> BoxFuture<'a, Result<ListPage, LockError>> {
        Box::pin(self.list_locks(prefix, pattern, cursor))
    }
}
