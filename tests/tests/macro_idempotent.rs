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

use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use lock_core::{IdempotencyState, LockError, Locker, distributed_lock};
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

/// What `pay` fails with: the lock's errors, or its own.
#[derive(Debug)]
enum PayError {
    Lock(LockError),
    Declined,
}

impl From<LockError> for PayError {
    fn from(e: LockError) -> Self {
        PayError::Lock(e)
    }
}

/// Counts its runs; fills the server's memory on the runs listed in `fill_on`, and fails with
/// `Declined` on those in `decline_on` (1-based).
#[distributed_lock(key = "pay:{order}", locker = locker, idempotent)]
async fn pay(
    locker: &Locker,
    server: &RedisServer,
    runs: &AtomicUsize,
    plan: &Plan,
    order: u32,
) -> Result<usize, PayError> {
    let run = runs.fetch_add(1, SeqCst) + 1;
    if plan.fill_on.contains(&run) {
        // Leaves the server over its limit: every write that adds memory is refused then.
        server.fill("filler", 16 << 20).await;
    }
    if plan.decline_on.contains(&run) {
        return Err(PayError::Declined);
    }
    Ok(run)
}

#[derive(Default)]
struct Plan {
    fill_on: Vec<usize>,
    decline_on: Vec<usize>,
}

fn full_server() -> RedisServer {
    RedisServer::start_with(["--maxmemory", "8mb", "--maxmemory-policy", "noeviction"])
}

/// A server with `full_server`'s memory limit, a locker on it, a run counter and a plan that
/// fills the server on the first run (its value cannot be stored).
async fn refused_first_store() -> (RedisServer, Locker, AtomicUsize, Plan) {
    let server = full_server();
    let locker = Locker::redis(&server.url()).await.unwrap();
    let plan = Plan {
        fill_on: vec![1],
        ..Plan::default()
    };
    (server, locker, AtomicUsize::new(0), plan)
}

/// Issue 29, item 9, the macro: Redis refuses the value's record (`maxmemory` reached,
/// `noeviction`) after the body ran. The call fails; a later call, once memory is freed, gets
/// `OutcomeUnknown` and never runs the body again (before the "started" mark it ran it twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_record_write_never_lets_a_later_call_run_the_body_again() {
    let (server, locker, runs, plan) = refused_first_store().await;
    match pay(&locker, &server, &runs, &plan, 1).await {
        Err(PayError::Lock(LockError::Backend { .. })) => {}
        other => panic!("expected the refused store's Backend error, got {other:?}"),
    }
    assert_eq!(server.del("filler").await, 1);
    for _ in 0..2 {
        match pay(&locker, &server, &runs, &plan, 1).await {
            Err(PayError::Lock(LockError::OutcomeUnknown { key, .. })) => {
                assert_eq!(key, "pay:1");
            }
            other => panic!("expected OutcomeUnknown, got {other:?}"),
        }
    }
    assert_eq!(runs.load(SeqCst), 1, "the body ran again");
    assert!(matches!(
        locker.idempotency_state("pay:1").await.unwrap(),
        IdempotencyState::Started { .. }
    ));
    // Another key runs and is replayed as before.
    assert_eq!(pay(&locker, &server, &runs, &plan, 2).await.unwrap(), 2);
    assert_eq!(pay(&locker, &server, &runs, &plan, 2).await.unwrap(), 2);
}

/// Issue 29, item 9 (review): two calls in one lock scope. A caller that holds the key's lock
/// already (a retry loop inside `locker.lock(key).run(..)`) calls the idempotent function,
/// whose value cannot be stored, then calls it again: the second call's lock is reentrant and
/// shares the outer lock's token, and it must not take the first call's "started" mark for
/// its own (before, the mark was the token's, and the body ran twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_call_in_one_lock_scope_never_runs_the_body_again() {
    let (server, locker, runs, plan) = refused_first_store().await;
    let second = locker
        .lock("pay:4")
        .run(async {
            let first = pay(&locker, &server, &runs, &plan, 4).await;
            assert!(
                matches!(first, Err(PayError::Lock(LockError::Backend { .. }))),
                "{first:?}"
            );
            assert_eq!(server.del("filler").await, 1);
            pay(&locker, &server, &runs, &plan, 4).await
        })
        .await
        .expect("the outer lock");
    assert!(
        matches!(
            second,
            Err(PayError::Lock(LockError::OutcomeUnknown { .. }))
        ),
        "{second:?}"
    );
    assert_eq!(runs.load(SeqCst), 1, "the body ran again");
}

/// An `Err` from the body is not stored: its mark is taken back under the lock, so the next
/// call runs the body again (and its `Ok` is stored and replayed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_err_from_the_body_takes_its_mark_back() {
    let server = RedisServer::start();
    let locker = Locker::redis(&server.url()).await.unwrap();
    let runs = AtomicUsize::new(0);
    let plan = Plan {
        decline_on: vec![1],
        ..Plan::default()
    };
    assert!(matches!(
        pay(&locker, &server, &runs, &plan, 3).await,
        Err(PayError::Declined)
    ));
    assert_eq!(
        locker.idempotency_state("pay:3").await.unwrap(),
        IdempotencyState::Absent
    );
    assert_eq!(pay(&locker, &server, &runs, &plan, 3).await.unwrap(), 2);
    assert_eq!(pay(&locker, &server, &runs, &plan, 3).await.unwrap(), 2);
    assert_eq!(runs.load(SeqCst), 2);
}

#[derive(Debug)]
struct ChargeError(lock_core::LockError);

impl From<lock_core::LockError> for ChargeError {
    fn from(e: lock_core::LockError) -> Self {
        ChargeError(e)
    }
}

static RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

#[lock_core::distributed_lock(key = "order:{order}", locker = locker, idempotent)]
async fn charge(locker: &Locker, order: u64) -> Result<String, ChargeError> {
    RUNS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    Ok(format!("charged {order}"))
}

#[lock_core::distributed_lock(key = "order:{order}", locker = locker, idempotent)]
async fn refund(locker: &Locker, order: u64) -> Result<String, ChargeError> {
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
        Err(ChargeError(lock_core::LockError::IdempotencyKeyReused {
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
