//! Group commit: plain acquires (and releases) of one backend that are asked for while several
//! are already on their way go out together, as one script call over all their keys.
//!
//! A request is sent at once, alone, while fewer than [`DIRECT`] of its kind are in flight: a
//! lone or lightly loaded caller pays no added latency. Requests that arrive while [`DIRECT`]
//! are in flight wait in a queue; the first in-flight call of that kind to finish sends the
//! whole queue as one `EVALSHA` (acquire_many.lua, release_many.lua), whose answer has one
//! entry per request. Under load that is one command, one script set-up and one reply for
//! dozens of locks, for the client and for the server, where the direct path pays each per lock.
//!
//! Per key nothing changes: each key's step in the script is the same atomic step as the lone
//! call (SET NX PX or the token-checked delete, and for a release the hand-over to a queued
//! waiter in the same call), two requests for one key in a batch are two steps in order (one
//! acquire wins), a retry after a dropped connection is as safe as the lone call's (acquire
//! recognises its token, release compares it), every caller gets its own answer or its own
//! typed error. A caller that gives up (its future dropped) leaves its request in the batch;
//! an acquire that then succeeds for nobody is released by the batch itself, as the lone path's
//! `InFlight` does. Batches never form on a cluster-mode node: their keys would span slots.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use redis::Value;
use tokio::sync::oneshot;

use super::{RedisBackend, millis};
use crate::LockError;
use crate::key::LockKey;
use crate::token::Token;

/// How many requests of one kind go out alone at once before the next ones wait for a batch.
pub(super) const DIRECT: usize = 2;

/// The most requests in one batch (the rest wait for the next one).
const MAX_BATCH: usize = 256;

/// What one queued request needs.
pub(super) struct Request {
    pub(super) key: LockKey,
    pub(super) token: Token,
    /// The lease (acquires only).
    pub(super) lease: Duration,
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
        // The state is consistent between statements: a panic elsewhere leaves it usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
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

/// Sends one batch and hands every caller its own answer.
async fn send(backend: &RedisBackend, kind: Kind, batch: Vec<Request>) {
    let script = match kind {
        Kind::Acquire => &*super::ACQUIRE_MANY,
        Kind::Release if backend.inner.sharded => &*super::RELEASE_MANY_SHARDED,
        Kind::Release => &*super::RELEASE_MANY,
    };
    let keys_per_request = match kind {
        Kind::Acquire => 1,
        Kind::Release => 2,
    };
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash())
        .arg(keys_per_request * batch.len());
    for r in &batch {
        cmd.arg(r.key.name());
        if kind == Kind::Release {
            cmd.arg(r.key.queue_name());
        }
    }
    for r in &batch {
        cmd.arg(r.token.as_str());
        if kind == Kind::Acquire {
            cmd.arg(millis(r.lease));
        }
    }
    let first = batch.first().map(|r| r.key.user());
    let reply = backend.evalsha(script, &cmd, operation(kind), first).await;
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
