//! Group commit: plain acquires (and releases) of one backend that are asked for while several
//! are already on their way go out together, in one request for all their keys.
//!
//! A request is sent at once, alone, while fewer than [`DIRECT`] of its kind are in flight: a
//! lone or lightly loaded caller pays no added latency. Requests that arrive while [`DIRECT`]
//! are in flight wait in a queue; the first in-flight call of that kind to finish sends the
//! whole queue together: acquires as one pipeline of native `SET NX PX GET` commands (one
//! request, one read and one write for the server; a native command costs the server less than
//! the same command from a script), releases as one `EVALSHA` of release_many.lua (one script
//! set-up for all the keys: Redis has no native compare-and-delete). Under load that is one
//! request and one reply for dozens of locks, where the direct path pays each per lock.
//!
//! Per key nothing changes: each key's step is the same atomic step as the lone call (SET NX
//! PX GET, or the token-checked delete, and for a release the hand-over to a queued
//! waiter in the same call), two requests for one key in a batch are two steps in order (one
//! acquire wins), a retry after a dropped connection is as safe as the lone call's (acquire
//! recognises its token, release compares it), every caller gets its own answer or its own
//! typed error. A caller that gives up (its future dropped) leaves its request in the batch;
//! an acquire that then succeeds for nobody is released by the batch itself, as the lone path's
//! `InFlight` does. Batches never form on a cluster-mode node: their keys would span slots.

use std::time::Duration;

use redis::Value;
use tokio::sync::oneshot;

use super::{RedisBackend, millis};
use crate::LockError;
use crate::key::LockKey;
use crate::sync::{Mutex, MutexGuard};
use crate::token::Token;

/// How many requests of one kind go out alone at once before the next ones wait for a batch.
///
/// A queued request waits for an in-flight call to come back (a round trip) before it is
/// sent, so a low limit costs latency at moderate concurrency, while the batch saves the
/// server a script set-up per release only when many requests pile up. Measured with lock-bench's
/// many-keys scenario, the same binary alternating limits (3 runs each): 8 in flight did 25 %
/// more lock cycles/s than 2 at 16 tasks (55,600-63,200/s against 42,900-48,900/s) and 8 %
/// more at 64, and the same at 256 (where batches still form).
pub(super) const DIRECT: usize = 8;

/// The most requests in one batch (the rest wait for the next one).
const MAX_BATCH: usize = 256;

/// What one queued request needs.
pub(super) struct Request {
    pub(super) key: LockKey,
    pub(super) token: Token,
    /// The lease (acquires only).
    pub(super) lease: Duration,
    /// Whether a busy answer should tell how long the holder's lease runs (acquires only).
    pub(super) remaining: bool,
    answer: oneshot::Sender<Result<Value, LockError>>,
}

/// The two kinds of request that batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Acquire,
    Release,
}

#[derive(Default)]
struct State {
    in_flight: usize,
    queue: Vec<Request>,
}

/// The in-flight count and queue of one kind.
#[derive(Default)]
pub(crate) struct Lane {
    state: Mutex<State>,
}

impl Lane {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }
}

/// The lanes of one backend.
#[derive(Default)]
pub(crate) struct Batches {
    pub(super) acquire: Lane,
    pub(super) release: Lane,
}

/// Either a slot to send at once (held until the call is over), or a queued request's answer.
pub(super) enum Turn<'a> {
    Direct(Slot<'a>),
    Queued(oneshot::Receiver<Result<Value, LockError>>),
}

/// One in-flight call of a lane; on drop (the call finished, failed or was cancelled) it frees
/// its place and sends what queued meanwhile.
pub(super) struct Slot<'a> {
    backend: &'a RedisBackend,
    kind: Kind,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        finished(self.backend, self.kind);
    }
}

fn lane(backend: &RedisBackend, kind: Kind) -> &Lane {
    match kind {
        Kind::Acquire => &backend.inner.batches.acquire,
        Kind::Release => &backend.inner.batches.release,
    }
}

/// Takes a place for a request of `kind`: at once while few are in flight, else in the queue.
pub(super) fn enter<'a>(
    backend: &'a RedisBackend,
    kind: Kind,
    key: &LockKey,
    token: &Token,
    lease: Duration,
    remaining: bool,
) -> Turn<'a> {
    let mut state = lane(backend, kind).state();
    if state.in_flight < DIRECT {
        state.in_flight += 1;
        return Turn::Direct(Slot { backend, kind });
    }
    let (answer, receiver) = oneshot::channel();
    state.queue.push(Request {
        key: key.clone(),
        token: token.clone(),
        lease,
        remaining,
        answer,
    });
    Turn::Queued(receiver)
}

/// A call of `kind` is over: its place goes to the queue, sent as one batch, if anything queued.
fn finished(backend: &RedisBackend, kind: Kind) {
    let batch = {
        let mut state = lane(backend, kind).state();
        if state.queue.is_empty() {
            state.in_flight -= 1;
            return;
        }
        let take = state.queue.len().min(MAX_BATCH);
        // The place stays taken: the batch is in flight now.
        state.queue.drain(..take).collect::<Vec<_>>()
    };
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        // No runtime (it is shutting down): nothing can be sent; the callers get an error (their
        // futures are being dropped with it anyway) and the place is freed.
        lane(backend, kind).state().in_flight -= 1;
        for request in batch {
            let _ = request.answer.send(Err(LockError::protocol(
                operation(kind),
                request.key.user(),
                "the tokio runtime is shutting down",
            )));
        }
        return;
    };
    let backend = backend.clone();
    runtime.spawn(async move {
        let slot = Slot {
            backend: &backend,
            kind,
        };
        send(&backend, kind, batch).await;
        drop(slot);
    });
}

fn operation(kind: Kind) -> &'static str {
    match kind {
        Kind::Acquire => "acquire",
        Kind::Release => "release",
    }
}

/// Sends a batch of acquires as one pipeline of native `SET key token NX PX lease GET`
/// commands (each followed by `PTTL key` when its caller wants the holder's remaining lease):
/// one request for the client, one read and one write for the server, and per key the same
/// atomic command as the lone acquire (a native command costs the server less than the same
/// command called from a script). Answers per request: `[1]` acquired (also when the lock
/// already held the request's own token: a retry), `[0, pttl]` or `[0]` busy.
async fn acquire_pipeline(backend: &RedisBackend, batch: &[Request]) -> Result<Value, LockError> {
    let mut pipe = redis::pipe();
    for r in batch {
        pipe.cmd("SET")
            .arg(r.key.name())
            .arg(r.token.as_str())
            .arg("NX")
            .arg("PX")
            .arg(millis(r.lease))
            .arg("GET");
        if r.remaining {
            pipe.cmd("PTTL").arg(r.key.name());
        }
    }
    let mut conn = backend.inner.conn.clone();
    let first = batch.first().map(|r| r.key.user());
    let replies = match pipe.query_async::<Vec<Value>>(&mut conn).await {
        Err(e) if super::retriable(&e) => {
            tracing::debug!(error = %e, "Redis connection lost; retrying once on a new one");
            pipe.query_async::<Vec<Value>>(&mut conn).await
        }
        replies => replies,
    }
    .map_err(|e| LockError::backend("acquire", first, e))?;
    let mut replies = replies.into_iter();
    let mut answers = Vec::with_capacity(batch.len());
    for r in batch {
        let set = replies.next();
        let pttl = if r.remaining { replies.next() } else { None };
        let answer = match (set, pttl) {
            (Some(Value::Nil), _) => vec![Value::Int(1)],
            (Some(Value::BulkString(old)), _) if old.as_slice() == r.token.as_str().as_bytes() => {
                vec![Value::Int(1)]
            }
            (Some(Value::BulkString(_) | Value::SimpleString(_)), Some(Value::Int(pttl))) => {
                vec![Value::Int(0), Value::Int(pttl)]
            }
            (Some(Value::BulkString(_) | Value::SimpleString(_)), None) if !r.remaining => {
                vec![Value::Int(0)]
            }
            (set, pttl) => {
                return Err(LockError::protocol(
                    "acquire",
                    r.key.user(),
                    format!("SET NX GET / PTTL answered {set:?} / {pttl:?} in a batch"),
                ));
            }
        };
        answers.push(Value::Array(answer));
    }
    Ok(Value::Array(answers))
}

/// Sends one batch and hands every caller its own answer.
async fn send(backend: &RedisBackend, kind: Kind, batch: Vec<Request>) {
    let reply = match kind {
        Kind::Acquire => acquire_pipeline(backend, &batch).await,
        Kind::Release => {
            let script = if backend.inner.sharded {
                &*super::RELEASE_MANY_SHARDED
            } else {
                &*super::RELEASE_MANY
            };
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(script.get_hash()).arg(4 * batch.len());
            for r in &batch {
                cmd.arg(r.key.name())
                    .arg(r.key.queue_name())
                    .arg(r.key.fence())
                    .arg(r.key.waiters());
            }
            for r in &batch {
                cmd.arg(r.token.as_str());
            }
            let first = batch.first().map(|r| r.key.user());
            backend.evalsha(script, &cmd, "release", first).await
        }
    };
    let answers = match reply {
        Ok(Value::Array(answers)) if answers.len() == batch.len() => answers,
        Ok(other) => {
            let what = format!(
                "the batch script answered {other:?} for {} requests",
                batch.len()
            );
            for r in batch {
                let error = LockError::protocol(operation(kind), r.key.user(), what.clone());
                let _ = r.answer.send(Err(error));
            }
            return;
        }
        Err(LockError::Backend {
            operation, source, ..
        }) => {
            // Each caller's error names its own key.
            for r in batch {
                let error = LockError::Backend {
                    operation,
                    key: Some(r.key.user().to_owned()),
                    source: source.clone(),
                };
                let _ = r.answer.send(Err(error));
            }
            return;
        }
        Err(e) => {
            for r in batch {
                let _ = r.answer.send(Err(e.clone()));
            }
            return;
        }
    };
    for (r, answer) in batch.into_iter().zip(answers) {
        let acquired = kind == Kind::Acquire
            && matches!(&answer, Value::Array(pair) if matches!(pair.first(), Some(Value::Int(1))));
        if let Err(Ok(_)) = r.answer.send(Ok(answer))
            && acquired
        {
            // The caller gave up while its acquire was in the batch: the lock is nobody's,
            // released now rather than left to its lease.
            let (backend, key, token) = (backend.clone(), r.key, r.token);
            tokio::spawn(async move {
                if let Err(e) = backend.release(&key, &token).await {
                    tracing::debug!(key = %key.display(), error = %e, "release of a lock acquired for a dropped caller failed; the lease will expire");
                }
            });
        }
    }
}

/// The answer of a queued request, as the lone call would have given it.
pub(super) async fn queued(
    receiver: oneshot::Receiver<Result<Value, LockError>>,
    kind: Kind,
    key: &LockKey,
) -> Result<Value, LockError> {
    receiver.await.unwrap_or_else(|_| {
        Err(LockError::protocol(
            operation(kind),
            key.user(),
            "the batch carrying this request was dropped",
        ))
    })
}
