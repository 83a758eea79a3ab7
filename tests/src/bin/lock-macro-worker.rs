//! `lock-macro-worker`: `#[distributed_lock]` functions in their own OS process on Redis,
//! driven line by line on stdin by `tests/macro_redis.rs`. Every answer is one line on stdout.
//!
//! ```text
//! lock-macro-worker --url redis://127.0.0.1:PORT/
//! READY
//! COUNT <name> <calls>  -> COUNTED <name> calls=<n> fenced=<n> max_fence=<n>  | ERR <error>
//! TRY <name>            -> TRY ran                                             (no_wait, lock free)
//!                       -> TRY busy key=<key> retry_after_ms=<n|none> ran=<bool> | TRY err <error>
//! FENCE <name>          -> FENCE <token>                                      | ERR <error>
//! NEST <name> <depth>   -> NESTED <n>                                         | ERR <error>
//! ```
//!
//! The process-wide locker (`lock_core::set_global`) and the `Counter`'s own locker are two
//! distinct `Locker`s on the same Redis (two clients), with the default prefix `lock:`.
//!
//! `COUNT` makes `<calls>` calls cycling through three annotated functions that all lock
//! `counter:<name>`: a free function on the global locker keyed by its argument, a method with
//! `locker = self.locker`, and a `fenced` method. Each runs the same non-atomic critical
//! section on Redis: `INCR app:<name>:inside` (above 1: `INCR app:overlaps`), for the fenced one
//! a compare-and-set of its token into `app:<name>:fence` (not strictly above the stored one:
//! `INCR app:fence_violations`), `GET app:<name>:count`, yield, sleep 200 us, `SET` plus one,
//! `DECR app:<name>:inside`.
//!
//! `TRY` calls a `no_wait` method on `counter:<name>` whose body only sets a flag. `FENCE`
//! calls a `fenced` method on `ledger:<name>` returning `lock_core::current_fence()`. `NEST`
//! calls a free function on `nest:<name>` (global locker) that recurses `<depth>` times and
//! then calls a `no_wait` function on the same key: it fails with `Busy` unless nested calls
//! are reentrant. The process exits when stdin ends.

#![forbid(unsafe_code)]
#![allow(
    clippy::print_stdout,
    reason = "the worker talks to the test that spawned it through stdout lines"
)]

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lock_core::{LockError, Locker, current_fence, distributed_lock};
use redis::aio::MultiplexedConnection;
use redis::{AsyncCommands, Script};
use tokio::io::{AsyncBufReadExt, BufReader};

use lock_testkit::process::{flag, say};
use lock_tests::probe::CHECK_FENCE;

/// The user's error type of the annotated functions.
#[derive(Debug)]
enum WorkerError {
    Lock(LockError),
    Redis(redis::RedisError),
    Broken(&'static str),
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
            WorkerError::Broken(what) => write!(f, "broken {what}"),
        }
    }
}

/// The Redis state the critical sections touch.
#[derive(Clone)]
struct Store {
    conn: MultiplexedConnection,
    check_fence: Script,
}

impl Store {
    /// One non-atomic increment of `app:<name>:count`, probing for overlapping sections.
    async fn bump(&self, name: &str) -> Result<u64, WorkerError> {
        let mut conn = self.conn.clone();
        let inside_key = format!("app:{name}:inside");
        let inside: i64 = conn.incr(&inside_key, 1).await?;
        if inside > 1 {
            let _: i64 = conn.incr("app:overlaps", 1).await?;
        }
        let count_key = format!("app:{name}:count");
        let value: Option<u64> = conn.get(&count_key).await?;
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_micros(200)).await;
        let next = value.unwrap_or(0) + 1;
        let () = conn.set(&count_key, next).await?;
        let _: i64 = conn.decr(&inside_key, 1).await?;
        Ok(next)
    }

    /// Stores `fence` as the highest token of `name` if it is strictly above the stored one,
    /// else counts a violation.
    async fn check_fence(&self, name: &str, fence: u64) -> Result<(), WorkerError> {
        let mut conn = self.conn.clone();
        let _: i64 = self
            .check_fence
            .key(format!("app:{name}:fence"))
            .key("app:fence_violations")
            .arg(fence)
            .invoke_async(&mut conn)
            .await?;
        Ok(())
    }
}

/// A free function on the process-wide locker, keyed by its argument.
#[distributed_lock(key = "counter:{name}", wait = "30s")]
async fn bump_global(store: &Store, name: &str) -> Result<u64, WorkerError> {
    store.bump(name).await
}

/// Reentrant nesting on the process-wide locker: `depth` nested calls, then a `no_wait` one.
#[distributed_lock(key = "nest:{name}", wait = "5s")]
async fn nest(name: &str, depth: u32) -> Result<u32, WorkerError> {
    if depth == 0 {
        return nest_leaf(name).await;
    }
    Ok(Box::pin(nest(name, depth - 1)).await? + 1)
}

#[distributed_lock(key = "nest:{name}", no_wait)]
async fn nest_leaf(name: &str) -> Result<u32, WorkerError> {
    Ok(0)
}

/// A service holding its own locker: the methods lock with `locker = self.locker`.
struct Counter {
    locker: Locker,
    store: Store,
}

impl Counter {
    #[distributed_lock(key = "counter:{name}", locker = self.locker, wait = "30s")]
    async fn bump(&self, name: &str) -> Result<u64, WorkerError> {
        self.store.bump(name).await
    }

    /// Returns the fencing token the section ran with.
    #[distributed_lock(key = "counter:{name}", locker = self.locker, wait = "30s", fenced)]
    async fn bump_fenced(&self, name: &str) -> Result<u64, WorkerError> {
        let fence = current_fence().ok_or(WorkerError::Broken("no fencing token in the body"))?;
        self.store.check_fence(name, fence).await?;
        self.store.bump(name).await?;
        Ok(fence)
    }

    #[distributed_lock(key = "counter:{name}", locker = self.locker, no_wait)]
    async fn try_once(&self, name: &str, ran: &AtomicBool) -> Result<(), WorkerError> {
        ran.store(true, Ordering::SeqCst);
        Ok(())
    }

    #[distributed_lock(key = "ledger:{name}", locker = self.locker, wait = "30s", fenced)]
    async fn fence(&self, name: &str) -> Result<u64, WorkerError> {
        current_fence().ok_or(WorkerError::Broken("no fencing token in the body"))
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let Some(url) = flag(&args, "--url") else {
        say("ERR usage: lock-macro-worker --url URL");
        return ExitCode::from(2);
    };
    let (global, own) = match (Locker::redis(url).await, Locker::redis(url).await) {
        (Ok(global), Ok(own)) => (global, own),
        (Err(e), _) | (_, Err(e)) => {
            say(&format!("ERR connect {e}"));
            return ExitCode::from(1);
        }
    };
    let conn = match redis::Client::open(url) {
        Ok(client) => client.get_multiplexed_async_connection().await,
        Err(e) => Err(e),
    };
    let conn = match conn {
        Ok(conn) => conn,
        Err(e) => {
            say(&format!("ERR storage {e}"));
            return ExitCode::from(1);
        }
    };
    lock_core::set_global(global);
    let counter = Counter {
        locker: own,
        store: Store {
            conn,
            check_fence: Script::new(CHECK_FENCE),
        },
    };
    say("READY");
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["COUNT", name, calls] => match calls.parse::<u64>() {
                Ok(calls) => say(&count(&counter, name, calls).await),
                Err(_) => say(&format!("ERR bad count {calls:?}")),
            },
            ["TRY", name] => {
                let ran = AtomicBool::new(false);
                let answer = match counter.try_once(name, &ran).await {
                    Ok(()) => "TRY ran".to_owned(),
                    Err(WorkerError::Lock(LockError::Busy {
                        key, retry_after, ..
                    })) => format!(
                        "TRY busy key={key} retry_after_ms={} ran={}",
                        retry_after
                            .map_or_else(|| "none".to_owned(), |d| d.as_millis().to_string()),
                        ran.load(Ordering::SeqCst)
                    ),
                    Err(e) => format!("TRY err {e}"),
                };
                say(&answer);
            }
            ["FENCE", name] => match counter.fence(name).await {
                Ok(fence) => say(&format!("FENCE {fence}")),
                Err(e) => say(&format!("ERR {e}")),
            },
            ["NEST", name, depth] => match depth.parse::<u32>() {
                Ok(depth) => match nest(name, depth).await {
                    Ok(n) => say(&format!("NESTED {n}")),
                    Err(e) => say(&format!("ERR {e}")),
                },
                Err(_) => say(&format!("ERR bad depth {depth:?}")),
            },
            _ => say(&format!("ERR unknown command {line:?}")),
        }
    }
    ExitCode::SUCCESS
}

/// `calls` increments of `name`, cycling through the global free function, the method and the
/// fenced method.
async fn count(counter: &Counter, name: &str, calls: u64) -> String {
    let (mut fenced, mut max_fence) = (0u64, 0u64);
    for i in 0..calls {
        let outcome = match i % 3 {
            0 => bump_global(&counter.store, name).await.map(drop),
            1 => counter.bump(name).await.map(drop),
            _ => counter.bump_fenced(name).await.map(|fence| {
                fenced += 1;
                max_fence = max_fence.max(fence);
            }),
        };
        if let Err(e) = outcome {
            return format!("ERR call {i}: {e}");
        }
    }
    format!("COUNTED {name} calls={calls} fenced={fenced} max_fence={max_fence}")
}
