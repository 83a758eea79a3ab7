//! Group commit: plain acquires (and releases) of one backend that are asked for while several
//! are already on their way go out together, in one request for all their keys.
//!
//! A request is sent at once, alone, while fewer than [`DIRECT`] of its kind are in flight: a
//! lone or lightly loaded caller pays no added latency. Requests that arrive while [`DIRECT`]
//! are in flight wait in a queue, which goes out whole at the runtime's next turn (a flush task
//! that yields once, so that the tasks woken with the first one queue their requests too), or
//! sooner when an in-flight call of that kind finishes first: a queued request never waits for
//! another call's round trip (more than [`MAX_BATCH`] queued get a flush per batch). So
//! [`DIRECT`] does not bound the calls in flight: besides the direct ones, each runtime turn
//! in which requests queued sends one batch (requests arriving apart go as batches of one);
//! what it saves is the per-request cost when many arrive together. Acquires go as one
//! pipeline of native `SET NX PX GET` commands (one request, one read and one write for the
//! server; a native command costs the server less than the same command from a script),
//! releases as one `EVALSHA` of release_many.lua (one script set-up for all the keys: Redis has
//! no native compare-and-delete). Under load that is one request and one reply for dozens of
//! locks, where the direct path pays each per lock.
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

/// How many requests of one kind go out alone at once before the next ones queue for a batch.
///
/// Our own connection (wire.rs) already sends what many callers queue in one write, so a
/// batch saves the server work (one script call for many releases), not system calls, and
/// costs the client a queue entry, a channel and a flush task per request. Counted with
/// callgrind (lock-bench `--cycles`, 16 and 64 tasks on 4 keys each): with 2, 26,508 and
/// 16,135 client instructions per lock cycle (batches of about 3 at 16 tasks do not pay for
/// themselves), with 16, 19,118 and 19,036, without batches 19,968 and 20,632; the seed design
/// 21,230 and 20,978. Lock cycles/s at 64 and 256 tasks did not tell 64 from no batches apart
/// on this machine (both within its noise of the seed's), and fell with 16 or 2. So up to 64
/// go alone, and batches form only beyond that, where the server's work decides.
pub(super) const DIRECT: usize = 64;

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
    /// The lock's value: the token and its stamp (acquires only; see `super::stamp_onto`).
    pub(super) value: String,
    /// The one-key release (releases only; see release.rs).
    fast: bool,
    answer: oneshot::Sender<Result<Value, LockError>>,
}

/// What a caller asks for, as [`enter`] takes it.
pub(super) struct Entry<'a> {
    pub(super) key: &'a LockKey,
    pub(super) token: &'a Token,
    /// The lease (acquires only).
    pub(super) lease: Duration,
    /// Whether a busy answer should tell how long the holder's lease runs (acquires only).
    pub(super) remaining: bool,
    /// The lock's value: the token and its stamp (acquires only; see `super::stamp_onto`).
    pub(super) value: &'a str,
    /// The one-key release (releases only; see release.rs).
    pub(super) fast: bool,
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
    /// A flush task is spawned and has not taken the queue yet.
    flush_scheduled: bool,
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
pub(crate) struct Batches {
    pub(super) acquire: Lane,
    pub(super) release: Lane,
    /// Requests sent together with at least one other (see [`RedisBackend::batched_requests`]).
    batched: std::sync::atomic::AtomicU64,
    /// The longest a queued request waits for its batch's answer (see [`queued`]).
    answer_bound: Duration,
}

impl Batches {
    /// The lanes of a backend whose connection waits at most `connect` for a connection and
    /// `response` for an answer. A batch is one request, which can take several of each: the
    /// connection retries once after a reconnect, a script the server lost is loaded and sent
    /// again, the backend retries once on a new connection, and a Sentinel backend also asks
    /// the sentinels for the primary and sends again (about 10 connects and 6 responses at
    /// worst). The bound is above all that: it stops a wait without end (the task sending the
    /// batch stopped being run), it is not a latency; a healthy connection answers far sooner.
    pub(super) fn new(connect: Duration, response: Duration) -> Self {
        Batches {
            acquire: Lane::default(),
            release: Lane::default(),
            batched: std::sync::atomic::AtomicU64::new(0),
            // Saturating: the timeouts are the caller's, `Duration::MAX` included.
            answer_bound: connect
                .saturating_add(response)
                .saturating_mul(12)
                .saturating_add(ANSWER_SLACK),
        }
    }
}

/// Added to a queued request's bound: reconnect back-offs and scheduling.
const ANSWER_SLACK: Duration = Duration::from_millis(500);

impl RedisBackend {
    /// How many acquires and releases went out in a batch of two or more so far.
    pub(crate) fn batched_requests(&self) -> u64 {
        let batches = &self.inner.batches;
        batches.batched.load(std::sync::atomic::Ordering::Relaxed)
    }
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

/// Takes a place for a request of `kind`: at once while few are in flight, else in the queue,
/// sent at the runtime's next turn by a flush task (one per lane at a time).
pub(super) fn enter<'a>(backend: &'a RedisBackend, kind: Kind, entry: Entry<'_>) -> Turn<'a> {
    let Entry {
        key,
        token,
        lease,
        remaining,
        value,
        fast,
    } = entry;
    let receiver = {
        let mut state = lane(backend, kind).state();
        if state.in_flight < DIRECT {
            state.in_flight += 1;
            return Turn::Direct(Slot { backend, kind });
        }
        // Made here, not for every request: the direct path needs no channel.
        let (answer, receiver) = oneshot::channel();
        state.queue.push(Request {
            key: key.clone(),
            token: token.clone(),
            lease,
            remaining,
            value: value.to_owned(),
            fast,
            answer,
        });
        if !schedule_flush(&mut state) {
            return Turn::Queued(receiver);
        }
        receiver
    };
    spawn_flush(backend, kind);
    Turn::Queued(receiver)
}

/// Whether a flush must be spawned for the queue: none is pending yet. It is then counted as
/// pending and as a call in flight (it holds a place until its batch is answered).
fn schedule_flush(state: &mut State) -> bool {
    if state.flush_scheduled {
        return false;
    }
    state.flush_scheduled = true;
    state.in_flight += 1;
    true
}

/// Spawns the flush [`schedule_flush`] counted, with the lane unlocked: a runtime that is
/// shutting down drops the task at once, and the drop takes the lock.
fn spawn_flush(backend: &RedisBackend, kind: Kind) {
    let place = SpawnedSlot {
        backend: backend.clone(),
        kind,
        pending_flush: true,
    };
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn(flush(place))),
        // No runtime: the drop answers the queue (see `finished`).
        Err(_) => drop(place),
    }
}

/// A place in flight held by a spawned call (a flush, or a batch `finished` sends). Dropped
/// (after its call is answered, or unpolled, with its runtime), it gives the place back, or
/// passes it to what queued meanwhile; a flush that never took the queue also lets the next
/// queued request schedule one.
struct SpawnedSlot {
    backend: RedisBackend,
    kind: Kind,
    /// A flush that has not taken the queue yet (`flush_scheduled` is still its own).
    pending_flush: bool,
}

impl Drop for SpawnedSlot {
    fn drop(&mut self) {
        if self.pending_flush {
            lane(&self.backend, self.kind).state().flush_scheduled = false;
        }
        finished(&self.backend, self.kind);
    }
}

/// Sends the lane's queue one turn of the runtime after the first request queued, so that the
/// tasks woken together with it (by one read of replies, say) queue theirs too and go in the
/// same batch.
async fn flush(mut place: SpawnedSlot) {
    tokio::task::yield_now().await;
    let (batch, more) = {
        let mut state = lane(&place.backend, place.kind).state();
        state.flush_scheduled = false;
        place.pending_flush = false;
        let take = state.queue.len().min(MAX_BATCH);
        let batch = state.queue.drain(..take).collect::<Vec<_>>();
        // More than a batch queued: the rest gets a flush of its own, not a wait for an answer.
        let more = !state.queue.is_empty() && schedule_flush(&mut state);
        (batch, more)
    };
    if more {
        spawn_flush(&place.backend, place.kind);
    }
    // Empty when an in-flight call that finished first took the queue.
    if !batch.is_empty() {
        send(&place.backend, place.kind, batch).await;
    }
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
    // The place is owned before the task runs: a task dropped unpolled (its runtime shutting
    // down) still gives it back, instead of leaving the lane one call fuller for good.
    let place = SpawnedSlot {
        backend: backend.clone(),
        kind,
        pending_flush: false,
    };
    runtime.spawn(async move {
        send(&place.backend, place.kind, batch).await;
        drop(place);
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
            .arg(&r.value)
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
            (Some(Value::BulkString(old)), _) if super::release::holds(&old, &r.token) => {
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
    if kind == Kind::Release && batch.iter().any(|r| r.fast) && batch.iter().any(|r| !r.fast) {
        // One-key releases and full ones (keys where waiters were met lately) go as two
        // calls at once, each of one kind: a full release in the batch does not make every
        // other key of the batch pay for the queue lookup.
        let (fast, full): (Vec<_>, Vec<_>) = batch.into_iter().partition(|r| r.fast);
        tokio::join!(
            Box::pin(send(backend, kind, fast)),
            Box::pin(send(backend, kind, full))
        );
        return;
    }
    if batch.len() > 1 {
        let n = u64::try_from(batch.len()).unwrap_or(u64::MAX);
        let batched = &backend.inner.batches.batched;
        batched.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }
    let reply = match kind {
        Kind::Acquire => acquire_pipeline(backend, &batch).await,
        Kind::Release => {
            // One-key releases (answers 1, 2 or 0, see release_fast_many.lua) or full ones: a
            // batch that mixes them was split above.
            let fast = batch.iter().all(|r| r.fast);
            let script = super::release::script(fast, true, backend.inner.sharded);
            let mut cmd = redis::cmd("EVALSHA");
            let keys = if fast { batch.len() } else { 4 * batch.len() };
            cmd.arg(script.get_hash()).arg(keys);
            for r in &batch {
                cmd.arg(r.key.name());
                if !fast {
                    cmd.arg(r.key.queue_name())
                        .arg(r.key.fence())
                        .arg(r.key.waiters());
                }
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
        // A one-key release that found the lock marked did nothing: its caller sends the full
        // release next (release.rs).
        let marked = kind == Kind::Release && r.fast && answer == Value::Int(2);
        if let Err(Ok(_)) = r.answer.send(Ok(answer))
            && (acquired || marked)
        {
            // The caller gave up while its request was in the batch: an acquire's lock is
            // nobody's, and a marked lock is still the caller's with a waiter queued for it;
            // either is released now (handed over) rather than left to its lease.
            if marked {
                backend.inner.contention.note(&r.key);
            }
            let (backend, key, token) = (backend.clone(), r.key, r.token);
            tokio::spawn(async move {
                if let Err(e) = backend.release(&key, &token).await {
                    tracing::debug!(key = %key.display(), error = %e, "release of a lock acquired for a dropped caller failed; the lease will expire");
                }
            });
        }
    }
}

/// The answer of a queued request, as the lone call would have given it. Bounded like the
/// lone call: the batch is sent by a spawned task, which may stop being run (a runtime that is
/// only driven now and then, sharing the backend with others) while the connection's own
/// timeouts wait for it; the caller then gets a `Backend` error at the bound, and the batch,
/// if it ever runs, releases a lock it took for this caller (see [`send`]). Not when the caller
/// is `bounded` (`AttemptOptions::bounded`): its own deadline drops this future, and a timer
/// per queued request (about 900 instructions) would only duplicate it.
pub(super) async fn queued(
    backend: &RedisBackend,
    receiver: oneshot::Receiver<Result<Value, LockError>>,
    kind: Kind,
    key: &LockKey,
    bounded: bool,
) -> Result<Value, LockError> {
    let bound = backend.inner.batches.answer_bound;
    let answer = if bounded {
        Ok(receiver.await)
    } else {
        tokio::time::timeout(bound, receiver).await
    };
    match answer {
        Ok(Ok(answer)) => answer,
        Ok(Err(_)) => Err(LockError::protocol(
            operation(kind),
            key.user(),
            "the batch carrying this request was dropped",
        )),
        Err(_) => Err(LockError::backend(
            operation(kind),
            key.user(),
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the batch carrying this request got no answer in {bound:?}"),
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULT_TIMEOUTS: Duration = Duration::from_secs(2);

    /// A current-thread runtime (driven only when the test says so) and a backend connected
    /// on it, with this connect and response timeout.
    fn connected(
        server: &lock_testkit::RedisServer,
        timeouts: Duration,
    ) -> (tokio::runtime::Runtime, RedisBackend) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let builder = RedisBackend::builder(&server.url())
            .connect_timeout(timeouts)
            .response_timeout(timeouts);
        let backend = runtime.block_on(builder.connect()).unwrap();
        (runtime, backend)
    }

    fn acquire<'a>(key: &'a LockKey, token: &'a Token, lease: Duration) -> Entry<'a> {
        Entry {
            key,
            token,
            lease,
            remaining: false,
            value: token.as_str(),
            fast: false,
        }
    }

    fn lane_state(backend: &RedisBackend) -> (usize, bool, usize) {
        let state = lane(backend, Kind::Acquire).state();
        (state.in_flight, state.flush_scheduled, state.queue.len())
    }

    /// A batch of releases that mixes one-key releases with full ones goes out as two calls,
    /// one of each kind: the one-key releases read no queue (the full release pops its key's
    /// queue's head with `LPOP`), and every caller gets its own answer.
    #[test]
    fn a_mixed_batch_of_releases_goes_out_as_one_call_of_each_kind() {
        let server = lock_testkit::RedisServer::start();
        let (runtime, backend) = connected(&server, DEFAULT_TIMEOUTS);
        let mixed = async |name: &str| {
            let mut batch = Vec::new();
            let mut answers = Vec::new();
            for (i, fast) in [true, false, true, true].into_iter().enumerate() {
                let key = LockKey::new("lock:", &format!("{name}{i}")).unwrap();
                let token = Token::new(true);
                server.set(key.name(), token.as_str()).await;
                let (answer, receiver) = oneshot::channel();
                batch.push(Request {
                    key,
                    token,
                    lease: Duration::ZERO,
                    remaining: false,
                    value: String::new(),
                    fast,
                    answer,
                });
                answers.push(receiver);
            }
            send(&backend, Kind::Release, batch).await;
            for receiver in answers {
                assert_eq!(receiver.await.unwrap().unwrap(), Value::Int(1));
            }
        };
        runtime.block_on(async {
            // Both scripts loaded first: no NOSCRIPT retry in the counts.
            mixed("warm").await;
            server.reset_stats().await;
            mixed("mixed").await;
            let stats = server.commandstats().await;
            assert_eq!(stats.get("evalsha"), Some(&2), "{stats:?}");
            assert_eq!(stats.get("lpop"), Some(&1), "{stats:?}");
            assert_eq!(stats.get("lindex"), None, "{stats:?}");
            assert_eq!(stats.get("del"), Some(&4), "{stats:?}");
        });
    }

    /// Calls spawned by the lane (a flush, a batch sent when a call finished) whose runtime
    /// shuts down before they run still give their places back: the lane ends empty, and the
    /// next request goes out at once. Before, a batch task dropped unpolled kept its place for
    /// good, and a flush never run would have kept the lane flushing nothing.
    #[test]
    fn spawned_calls_dropped_with_their_runtime_give_their_places_back() {
        let server = lock_testkit::RedisServer::start();
        let (runtime, backend) = connected(&server, DEFAULT_TIMEOUTS);
        let key = |n: &str| LockKey::new("lock:", n).unwrap();
        let token = Token::new(true);
        let lease = Duration::from_secs(5);
        let context = runtime.enter();
        let mut direct: Vec<_> = (0..DIRECT)
            .map(|i| {
                enter(
                    &backend,
                    Kind::Acquire,
                    acquire(&key(&format!("d{i}")), &token, lease),
                )
            })
            .collect();
        assert!(direct.iter().all(|t| matches!(t, Turn::Direct(_))));
        // The next queues and schedules a flush; nothing runs (the runtime is never driven).
        let Turn::Queued(answer) =
            enter(&backend, Kind::Acquire, acquire(&key("c"), &token, lease))
        else {
            panic!("a request past DIRECT went out alone");
        };
        assert_eq!(lane_state(&backend), (DIRECT + 1, true, 1));
        // A direct call finishing sends the queue as a batch, in a task of its own.
        direct.pop();
        assert_eq!(lane_state(&backend), (DIRECT + 1, true, 0));
        drop(context);
        drop(runtime);
        // Both spawned tasks went unpolled: the flush's place and the batch's are back, the
        // queued caller has its answer (an error), the lane may flush again.
        assert_eq!(lane_state(&backend), (DIRECT - 1, false, 0));
        assert!(answer.blocking_recv().map_or(true, |a| a.is_err()));
        drop(direct);
        assert_eq!(lane_state(&backend), (0, false, 0));
    }

    /// More than a batch queued at once all goes out without waiting for an answer: what the
    /// first flush leaves gets a flush of its own. The server is frozen, so nothing is answered.
    #[test]
    fn more_than_a_batch_queued_all_goes_out() {
        let mut server = lock_testkit::RedisServer::start();
        let (runtime, backend) = connected(&server, DEFAULT_TIMEOUTS);
        let token = Token::new(true);
        let lease = Duration::from_secs(5);
        server.pause();
        runtime.block_on(async {
            let mut turns = Vec::new();
            for i in 0..DIRECT + MAX_BATCH + 44 {
                let key = LockKey::new("lock:", &format!("m{i}")).unwrap();
                turns.push(enter(&backend, Kind::Acquire, acquire(&key, &token, lease)));
            }
            assert_eq!(lane_state(&backend).2, MAX_BATCH + 44);
            let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
            while lane_state(&backend).2 > 0 {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{} requests left queued",
                    lane_state(&backend).2
                );
                tokio::task::yield_now().await;
            }
            // Two flushes in flight besides the direct calls.
            assert_eq!(lane_state(&backend), (DIRECT + 2, false, 0));
        });
        drop(runtime);
        server.resume();
    }

    /// A queued request whose batch is never sent (its flush was spawned on a runtime that is
    /// not driven any more, while another runtime waits for the answer) gets a `Backend` error
    /// at its bound (twelve connects and responses, plus slack), not a wait without end.
    #[test]
    fn a_queued_request_whose_batch_never_runs_gets_an_error_at_its_bound() {
        let server = lock_testkit::RedisServer::start();
        let timeouts = Duration::from_millis(50);
        let (idle, backend) = connected(&server, timeouts);
        let key = LockKey::new("lock:", "stranded").unwrap();
        let token = Token::new(true);
        let lease = Duration::from_secs(5);
        let context = idle.enter();
        let direct: Vec<_> = (0..DIRECT)
            .map(|_| enter(&backend, Kind::Acquire, acquire(&key, &token, lease)))
            .collect();
        let Turn::Queued(answer) = enter(&backend, Kind::Acquire, acquire(&key, &token, lease))
        else {
            panic!("a request past DIRECT went out alone");
        };
        drop(context);
        let other = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let bound = timeouts * 24 + ANSWER_SLACK;
        other.block_on(async {
            let start = tokio::time::Instant::now();
            let waited = tokio::time::timeout(
                bound + Duration::from_secs(2),
                queued(&backend, answer, Kind::Acquire, &key, false),
            )
            .await
            .expect("the queued request waited past its bound");
            assert!(
                matches!(waited, Err(LockError::Backend { .. })),
                "{waited:?}"
            );
            assert!(start.elapsed() >= bound);
        });
        drop(direct);
        drop(idle);
    }
}
