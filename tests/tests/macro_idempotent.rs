//! `#[distributed_lock(idempotent)]` on real Redis across OS processes (issue 14): concurrent
//! duplicates from several tasks in several `lock-idempotent-worker` processes run the body
//! once and all get its value; later calls, in any process, get it again without running.
//!
//! The memory-backend tests are in `lock-macros/tests/idempotent.rs`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed expectation fails the test"
)]

use std::time::Duration;

use lock_core::{IdempotencyState, Locker};
use lock_testkit::{ChildProcess, RedisServer};

mod support;

use support::ready;

const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

async fn worker(url: &str) -> ChildProcess {
    let child = ChildProcess::spawn(env!("CARGO_BIN_EXE_lock-idempotent-worker"), ["--url", url]);
    ready(child.answer_timeout(ANSWER_TIMEOUT)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_across_processes_run_the_body_once_and_get_its_value() {
    const WORKERS: usize = 3;
    const TASKS: usize = 4;
    let server = RedisServer::start();
    let mut workers = Vec::new();
    for _ in 0..WORKERS {
        workers.push(worker(&server.url()).await);
    }
    // Concurrent: every worker's tasks call at once.
    for w in &mut workers {
        w.send(&format!("CHARGE 42 {TASKS}")).await;
    }
    let mut answers = Vec::new();
    for w in &mut workers {
        answers.push(w.line().await);
    }
    assert!(answers[0].starts_with("CHARGED run=1 pid="), "{answers:?}");
    assert!(answers[0].ends_with(" distinct=1"), "{answers:?}");
    assert!(answers.iter().all(|a| *a == answers[0]), "{answers:?}");
    // Sequential retries, in every process: replayed.
    for w in &mut workers {
        assert_eq!(w.ask("CHARGE 42 1").await, answers[0]);
    }
    assert_eq!(server.get("app:runs:42").await.as_deref(), Some("1"));
    // The record is in Redis, under the lock's prefix, as JSON.
    let locker = Locker::redis(&server.url()).await.unwrap();
    let IdempotencyState::Completed(record) = locker.idempotency_state("charge:42").await.unwrap()
    else {
        panic!("no record");
    };
    assert_eq!(
        record.fingerprint,
        "json2:lock_idempotent_worker::charge -> (u64, u32)"
    );
    assert!(String::from_utf8(record.result).unwrap().starts_with("[1,"));
    // Another order runs on its own.
    assert!(
        workers[1]
            .ask("CHARGE 7 2")
            .await
            .starts_with("CHARGED run=1 pid=")
    );
}

#[derive(Debug)]
struct PayError(lock_core::LockError);

impl From<lock_core::LockError> for PayError {
    fn from(e: lock_core::LockError) -> Self {
        PayError(e)
    }
}

static RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

#[lock_core::distributed_lock(key = "order:{order}", locker = locker, idempotent)]
async fn charge(locker: &Locker, order: u64) -> Result<String, PayError> {
    RUNS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    Ok(format!("charged {order}"))
}

#[lock_core::distributed_lock(key = "order:{order}", locker = locker, idempotent)]
async fn refund(locker: &Locker, order: u64) -> Result<String, PayError> {
    RUNS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    Ok(format!("refunded {order}"))
}

/// Two idempotent functions on one key template, on Redis, from two lockers (as two
/// processes): the second gets `IdempotencyKeyReused`, never the first one's value, and does
/// not run. Issue 29, item 11.
#[tokio::test]
async fn another_function_under_the_same_key_is_refused_on_redis() {
    let server = RedisServer::start();
    let first = Locker::redis(&server.url()).await.unwrap();
    let second = Locker::redis(&server.url()).await.unwrap();
    assert_eq!(charge(&first, 5).await.unwrap(), "charged 5");
    match refund(&second, 5).await {
        Err(PayError(lock_core::LockError::IdempotencyKeyReused {
            key,
            stored,
            caller,
            ..
        })) => {
            assert_eq!(key, "order:5");
            assert_eq!(
                stored,
                "json2:macro_idempotent::charge -> alloc::string::String"
            );
            assert_eq!(
                caller,
                "json2:macro_idempotent::refund -> alloc::string::String"
            );
        }
        other => panic!("refund got {other:?}"),
    }
    assert_eq!(charge(&second, 5).await.unwrap(), "charged 5");
    assert_eq!(RUNS.load(std::sync::atomic::Ordering::SeqCst), 1);
}
