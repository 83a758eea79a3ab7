//! A worker process for `tests/tests/macro_idempotent.rs`: calls an idempotent
//! `#[distributed_lock]` function from several tasks at once, on a Redis locker of its own.
//!
//! Usage: `lock-idempotent-worker --url URL`; prints `READY`, then answers each stdin line:
//! - `CHARGE <order> <tasks>`: `<tasks>` concurrent calls of `charge(order)`; answers
//!   `CHARGED run=<n> pid=<pid> distinct=<d>`, the value they returned (the run number counted
//!   in Redis and the process that ran the body) and how many distinct values they got;
//!   `ERR <error>` when a call failed.

#![forbid(unsafe_code)]
#![allow(
    clippy::print_stdout,
    reason = "the worker talks to the test that spawned it through stdout lines"
)]

use std::collections::BTreeSet;
use std::process::ExitCode;
use std::time::Duration;

use lock_core::{LockError, Locker, distributed_lock};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use tokio::io::{AsyncBufReadExt, BufReader};

use lock_testkit::process::{flag, say};

#[derive(Debug)]
enum WorkerError {
    Lock(LockError),
    Redis(redis::RedisError),
}

impl From<LockError> for WorkerError {
    fn from(e: LockError) -> Self {
        WorkerError::Lock(e)
    }
}

impl From<redis::RedisError> for WorkerError {
    fn from(e: redis::RedisError) -> Self {
        WorkerError::Redis(e)
    }
}

impl std::fmt::Display for WorkerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WorkerError::Lock(e) => write!(f, "lock {e:?}"),
            WorkerError::Redis(e) => write!(f, "redis {e}"),
        }
    }
}

/// Runs at most once per order, in all processes: counts its runs in Redis, and returns the
/// run number with the id of the process that ran it.
#[distributed_lock(key = "charge:{order}", locker = locker, wait = "30s", idempotent)]
async fn charge(
    locker: &Locker,
    conn: &MultiplexedConnection,
    order: u64,
) -> Result<(u64, u32), WorkerError> {
    let mut conn = conn.clone();
    let run: u64 = conn.incr(format!("app:runs:{order}"), 1).await?;
    // Long enough for every duplicate, in every process, to arrive while it runs.
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok((run, std::process::id()))
}

async fn answer(locker: &Locker, conn: &MultiplexedConnection, order: u64, tasks: usize) -> String {
    let mut calls = Vec::new();
    for _ in 0..tasks {
        let (locker, conn) = (locker.clone(), conn.clone());
        calls.push(tokio::spawn(
            async move { charge(&locker, &conn, order).await },
        ));
    }
    let mut values = BTreeSet::new();
    for call in calls {
        match call.await {
            Ok(Ok(value)) => {
                values.insert(value);
            }
            Ok(Err(e)) => return format!("ERR {e}"),
            Err(e) => return format!("ERR task {e}"),
        }
    }
    match values.first() {
        Some((run, pid)) => format!("CHARGED run={run} pid={pid} distinct={}", values.len()),
        None => "ERR no calls".to_owned(),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let Some(url) = flag(&args, "--url") else {
        say("ERR usage: lock-idempotent-worker --url URL");
        return ExitCode::FAILURE;
    };
    let locker = match Locker::redis(url).await {
        Ok(locker) => locker,
        Err(e) => {
            say(&format!("ERR connect {e}"));
            return ExitCode::FAILURE;
        }
    };
    let conn = match redis::Client::open(url) {
        Ok(client) => match client.get_multiplexed_async_connection().await {
            Ok(conn) => conn,
            Err(e) => {
                say(&format!("ERR storage {e}"));
                return ExitCode::FAILURE;
            }
        },
        Err(e) => {
            say(&format!("ERR storage {e}"));
            return ExitCode::FAILURE;
        }
    };
    say("READY");
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let words: Vec<&str> = line.split_whitespace().collect();
        let reply = match words.as_slice() {
            ["CHARGE", order, tasks] => match (order.parse(), tasks.parse()) {
                (Ok(order), Ok(tasks)) => answer(&locker, &conn, order, tasks).await,
                _ => format!("ERR bad command {line:?}"),
            },
            _ => format!("ERR unknown command {line:?}"),
        };
        say(&reply);
    }
    ExitCode::SUCCESS
}
