//! `#[distributed_lock]` on real Redis (issue 5): mutual exclusion for annotated functions
//! called from many tasks and from several OS processes (exact counters in Redis), `no_wait`
//! returning `Busy` through the user's error type across processes, lease loss cancelling the
//! body, the fencing token visible in the body and strictly increasing across processes,
//! reentrant nested calls, and the `locker` expression taken from `self`.
//!
//! The memory-backend versions are in `lock-macros/tests/runtime.rs`. The processes are
//! `lock-macro-worker` children (see `src/bin/lock-macro-worker.rs`), driven over stdin/stdout.
//! The process-wide locker is only set inside the workers: tests here run in parallel, each on
//! its own redis-server, and pass their locker with `locker = ...`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout,
    reason = "test code: a failed expectation fails the test; figures are printed for the notes"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

use lock_core::{LockError, Locker, RedisBackend, current_fence, current_lock, distributed_lock};
use lock_testkit::{ChildProcess, RedisServer};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;

mod support;

use support::ready;

/// How long a worker may take to answer one command (generous: CI machines are slow). A
/// correctness bound: a worker stuck on a lock fails the test instead of hanging it.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// The user's error type of the annotated functions here.
#[derive(Debug)]
enum AppError {
    Lock(LockError),
    Redis(String),
    Invalid(String),
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AppError::Lock(e) => write!(f, "lock: {e}"),
            AppError::Redis(e) => write!(f, "redis: {e}"),
            AppError::Invalid(what) => write!(f, "invalid: {what}"),
        }
    }
}

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError::Lock(e)
    }
}

impl From<redis::RedisError> for AppError {
    fn from(e: redis::RedisError) -> Self {
        AppError::Redis(e.to_string())
    }
}

/// One `lock-macro-worker` process.
async fn worker(url: &str) -> ChildProcess {
    let child = ChildProcess::spawn(env!("CARGO_BIN_EXE_lock-macro-worker"), ["--url", url]);
    ready(child.answer_timeout(ANSWER_TIMEOUT)).await
}

/// A Redis locker of its own (its own connections: another client).
async fn redis_locker(server: &RedisServer) -> Locker {
    Locker::redis(&server.url()).await.expect("connect")
}

async fn connection(server: &RedisServer) -> MultiplexedConnection {
    server.client().await
}

/// An integer kept in Redis (0 when absent).
async fn int(server: &RedisServer, key: &str) -> u64 {
    server
        .get(key)
        .await
        .map_or(0, |v| v.parse().unwrap_or_else(|_| panic!("{key} = {v:?}")))
}

/// The value of `name=<u64>` in a worker's answer.
fn field(line: &str, name: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name}= in {line:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_worker_processes_keep_an_exact_counter() {
    const WORKERS: usize = 4;
    const CALLS: u64 = 60;
    let server = RedisServer::start();
    let mut workers = Vec::new();
    for _ in 0..WORKERS {
        workers.push(worker(&server.url()).await);
    }
    let started = Instant::now();
    // All start together: each is waiting on stdin when its command arrives.
    for w in &mut workers {
        w.send(&format!("COUNT shared {CALLS}")).await;
    }
    let mut fenced = 0;
    let mut max_fence = 0;
    for w in &mut workers {
        let line = w.line().await;
        assert!(line.starts_with("COUNTED shared "), "{line}");
        assert_eq!(field(&line, "calls"), CALLS);
        fenced += field(&line, "fenced");
        max_fence = max_fence.max(field(&line, "max_fence"));
    }
    let took = started.elapsed();
    let count = int(&server, "app:shared:count").await;
    let overlaps = int(&server, "app:overlaps").await;
    let violations = int(&server, "app:fence_violations").await;
    println!(
        "{WORKERS} processes x {CALLS} calls ({fenced} fenced) in {took:?}: counter {count}, \
         overlaps {overlaps}, fence violations {violations}, highest token {max_fence}"
    );
    assert_eq!(count, WORKERS as u64 * CALLS, "an increment was lost");
    assert_eq!(overlaps, 0, "two bodies ran at once");
    assert_eq!(violations, 0, "a fencing token did not increase");
    assert_eq!(fenced, WORKERS as u64 * (CALLS / 3));
    // Tokens strictly increased in the order the sections ran: the last stored is the highest.
    assert_eq!(int(&server, "app:shared:fence").await, max_fence);
    assert_eq!(int(&server, "app:shared:inside").await, 0);
    assert!(
        !server.exists("lock:{counter:shared}").await,
        "still locked"
    );
}

/// A counter in Redis incremented by a separate GET and SET with a yield and a sleep in
/// between: concurrent increments are lost unless the bodies never overlap.
#[distributed_lock(key = "counter:{name}", locker = locker, wait = "30s")]
async fn bump(
    locker: &Locker,
    conn: &MultiplexedConnection,
    name: &str,
    inside: &AtomicUsize,
    max_inside: &AtomicUsize,
) -> Result<(), AppError> {
    max_inside.fetch_max(inside.fetch_add(1, SeqCst) + 1, SeqCst);
    let mut conn = conn.clone();
    let key = format!("app:{name}:count");
    let value: Option<u64> = conn.get(&key).await?;
    tokio::task::yield_now().await;
    tokio::time::sleep(Duration::from_micros(100)).await;
    let () = conn.set(&key, value.unwrap_or(0) + 1).await?;
    inside.fetch_sub(1, SeqCst);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_tasks_in_one_process_keep_an_exact_counter() {
    const TASKS: usize = 16;
    const ROUNDS: usize = 16;
    let server = RedisServer::start();
    // Two clients in this process: half the tasks lock through each.
    let lockers = [redis_locker(&server).await, redis_locker(&server).await];
    let conn = connection(&server).await;
    let inside = Arc::new(AtomicUsize::new(0));
    let max_inside = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let locker = lockers[t % 2].clone();
        let (conn, inside, max_inside) = (conn.clone(), inside.clone(), max_inside.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                bump(&locker, &conn, "tasks", &inside, &max_inside)
                    .await
                    .unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let count = int(&server, "app:tasks:count").await;
    println!(
        "{TASKS} tasks x {ROUNDS} calls on 2 lockers in {:?}: counter {count}, most bodies inside at once {}",
        started.elapsed(),
        max_inside.load(SeqCst)
    );
    assert_eq!(count, (TASKS * ROUNDS) as u64, "an increment was lost");
    assert_eq!(max_inside.load(SeqCst), 1, "two bodies ran at once");
    assert!(!server.exists("lock:{counter:tasks}").await, "still locked");
}

#[distributed_lock(key = "counter:{name}", locker = locker, no_wait)]
async fn try_once(locker: &Locker, name: &str, ran: &AtomicBool) -> Result<(), AppError> {
    ran.store(true, SeqCst);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_wait_returns_busy_through_the_users_error_type() {
    let server = RedisServer::start();
    let holder = redis_locker(&server).await;
    let mine = redis_locker(&server).await;
    let mut worker = worker(&server.url()).await;
    let held = holder.lock("counter:busy").await.unwrap();

    // In another process: Busy reaches the worker's own error type, the body did not run.
    let answer = worker.ask("TRY busy").await;
    assert!(
        answer.starts_with("TRY busy key=counter:busy ") && answer.ends_with(" ran=false"),
        "{answer}"
    );
    // In this process, through another client.
    let ran = AtomicBool::new(false);
    match try_once(&mine, "busy", &ran).await {
        Err(AppError::Lock(LockError::Busy {
            key, retry_after, ..
        })) => {
            assert_eq!(key, "counter:busy");
            println!("Busy: worker said {answer:?}; here retry_after {retry_after:?}");
        }
        other => panic!("expected Busy through AppError, got {other:?}"),
    }
    assert!(!ran.load(SeqCst), "the body ran without the lock");
    // Another key is free meanwhile.
    assert_eq!(worker.ask("TRY other").await, "TRY ran");

    held.release().await.unwrap();
    assert_eq!(worker.ask("TRY busy").await, "TRY ran");
    try_once(&mine, "busy", &ran).await.unwrap();
    assert!(ran.load(SeqCst));
}

#[distributed_lock(key = "lease:{id}", locker = locker)]
async fn outlive_the_lease(
    locker: &Locker,
    id: u32,
    started: tokio::sync::oneshot::Sender<()>,
    finished: &AtomicBool,
) -> Result<(), AppError> {
    let _ = started.send(());
    tokio::time::sleep(Duration::from_secs(60)).await;
    finished.store(true, SeqCst);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_loss_cancels_the_body() {
    let server = RedisServer::start();
    let lease = Duration::from_millis(600);
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let locker = Locker::builder(backend).lease(lease).watchdog(true).build();
    let finished = Arc::new(AtomicBool::new(false));
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let call = tokio::spawn({
        let (locker, finished) = (locker.clone(), finished.clone());
        async move { outlive_the_lease(&locker, 1, started_tx, &finished).await }
    });
    started_rx.await.expect("the body started");
    // The watchdog keeps the short lease while the body runs...
    tokio::time::sleep(2 * lease).await;
    assert!(server.pttl("lock:{lease:1}").await > 0, "not renewed");
    assert!(!call.is_finished());
    // ...until the key is deleted behind the holder's back.
    assert_eq!(server.del("lock:{lease:1}").await, 1);
    let deleted = Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("the body was not cancelled")
        .unwrap();
    println!(
        "lease loss (lease {lease:?}) ended the call {:?} after the deletion",
        deleted.elapsed()
    );
    match result {
        Err(AppError::Lock(LockError::LeaseLost { key, .. })) => assert_eq!(key, "lease:1"),
        other => panic!("expected LeaseLost through AppError, got {other:?}"),
    }
    assert!(
        !finished.load(SeqCst),
        "the body went on after the lease was lost"
    );
}

#[distributed_lock(key = "ledger:{name}", locker = locker, fenced)]
async fn fence_here(locker: &Locker, name: &str) -> Result<u64, AppError> {
    let lock = current_lock().ok_or_else(|| AppError::Invalid("no current lock".into()))?;
    if lock.key() != format!("ledger:{name}") || lock.fence() != current_fence() {
        return Err(AppError::Invalid(format!("current lock {lock:?}")));
    }
    current_fence().ok_or_else(|| AppError::Invalid("no fencing token in the body".into()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_seen_in_bodies_strictly_increase_across_processes() {
    let server = RedisServer::start();
    let mut workers = [worker(&server.url()).await, worker(&server.url()).await];
    let locker = redis_locker(&server).await;
    let mut tokens = Vec::new();
    for round in 0..4 {
        for (i, w) in workers.iter_mut().enumerate() {
            let answer = w.ask("FENCE acc").await;
            let token = answer
                .strip_prefix("FENCE ")
                .and_then(|t| t.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("worker {i}, round {round}: {answer}"));
            tokens.push(token);
        }
        tokens.push(fence_here(&locker, "acc").await.unwrap());
    }
    println!("tokens seen in bodies (worker 1, worker 2, this process, ...): {tokens:?}");
    assert!(
        tokens.windows(2).all(|w| w[1] > w[0]),
        "not strictly increasing: {tokens:?}"
    );
    // The token in the body is the one Redis issued for that acquisition.
    assert_eq!(
        int(&server, "lock:{ledger:acc}:fence").await,
        *tokens.last().unwrap()
    );
}

/// Nested calls on one key: after each nested call returns, the lock must still be ours
/// (another client is refused), or an inner exit released the outer call's lock.
#[distributed_lock(key = "account:{id}", locker = locker, wait = "5s")]
async fn transfer(locker: &Locker, other: &Locker, id: u32, depth: u32) -> Result<u32, AppError> {
    let inner = if depth == 0 {
        audit(locker, other, id).await?
    } else {
        Box::pin(transfer(locker, other, id, depth - 1)).await?
    };
    still_held_against(other, id).await?;
    Ok(inner + 1)
}

/// `no_wait`: fails with Busy if the nested call is not reentrant.
#[distributed_lock(key = "account:{id}", locker = locker, no_wait)]
async fn audit(locker: &Locker, other: &Locker, id: u32) -> Result<u32, AppError> {
    still_held_against(other, id).await?;
    Ok(0)
}

async fn still_held_against(other: &Locker, id: u32) -> Result<(), AppError> {
    match other.try_lock(format!("account:{id}")).await {
        Err(LockError::Busy { .. }) => Ok(()),
        Ok(guard) => {
            guard.release().await?;
            Err(AppError::Invalid(format!(
                "account:{id} was free inside a nested call"
            )))
        }
        Err(e) => Err(e.into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_calls_with_the_same_key_are_reentrant() {
    let server = RedisServer::start();
    let locker = redis_locker(&server).await;
    let other = redis_locker(&server).await;
    let out = tokio::time::timeout(Duration::from_secs(20), transfer(&locker, &other, 5, 3))
        .await
        .expect("a nested call waited for its own lock")
        .unwrap();
    assert_eq!(out, 4);
    // The outermost exit released the lock.
    assert!(!server.exists("lock:{account:5}").await, "still locked");
    other
        .try_lock("account:5")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // The same through the process-wide locker in a worker process.
    let mut worker = worker(&server.url()).await;
    assert_eq!(worker.ask("NEST job 3").await, "NESTED 3");
    assert!(!server.exists("lock:{nest:job}").await, "still locked");
}

/// A service with its own locker: `locker = self.locker`.
struct Shard {
    locker: Locker,
    conn: MultiplexedConnection,
}

impl Shard {
    /// Returns the Redis key of the lock it ran under, which it finds in Redis.
    #[distributed_lock(key = "item:{item}", locker = self.locker, no_wait)]
    async fn handle(&self, item: u32) -> Result<String, AppError> {
        let key = format!("{}{{item:{item}}}", self.locker.prefix());
        let held: bool = self.conn.clone().exists(&key).await?;
        if held {
            Ok(key)
        } else {
            Err(AppError::Invalid(format!("{key} is not in Redis")))
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locker_expression_from_self_is_the_services_locker() {
    let server = RedisServer::start();
    let shard = |prefix: &'static str| {
        let server = &server;
        async move {
            let backend = RedisBackend::connect(&server.url()).await.unwrap();
            Shard {
                locker: Locker::builder(backend).prefix(prefix).build(),
                conn: connection(server).await,
            }
        }
    };
    let a = shard("shard-a:").await;
    let b = shard("shard-b:").await;
    assert_eq!(a.handle(7).await.unwrap(), "shard-a:{item:7}");
    assert_eq!(b.handle(7).await.unwrap(), "shard-b:{item:7}");
    // Another client holds item 7 under a's prefix: only a is refused.
    let other = Locker::builder(RedisBackend::connect(&server.url()).await.unwrap())
        .prefix("shard-a:")
        .build();
    let held = other.lock("item:7").await.unwrap();
    match a.handle(7).await {
        Err(AppError::Lock(LockError::Busy { key, .. })) => assert_eq!(key, "item:7"),
        other => panic!("expected Busy through AppError, got {other:?}"),
    }
    assert_eq!(b.handle(7).await.unwrap(), "shard-b:{item:7}");
    held.release().await.unwrap();
    assert_eq!(a.handle(7).await.unwrap(), "shard-a:{item:7}");
    assert_eq!(server.dbsize().await, 0, "a lock was left behind");
}
