//! `lock-worker`: one OS process contending for a lock on Redis, spawned by the multi-process
//! tests. See `lock_tests::worker` for its command line and output lines.

#![forbid(unsafe_code)]
#![allow(
    clippy::print_stdout,
    reason = "the worker talks to the test that spawned it through stdout lines"
)]

use std::io::Write as _;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use lock_core::{LockError, LockGuard, Locker, RedisBackend, current_fence};
use lock_tests::worker::{Mode, WorkerArgs, WorkerSummary};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use tokio::io::{AsyncBufReadExt, BufReader, Lines, Stdin};

/// A failure: what was being done and why.
struct Failure {
    op: &'static str,
    kind: String,
    message: String,
}

impl Failure {
    fn lock(op: &'static str, e: &LockError) -> Self {
        Failure {
            op,
            kind: variant(e).to_owned(),
            message: e.to_string(),
        }
    }

    fn redis(op: &'static str, e: &redis::RedisError) -> Self {
        Failure {
            op,
            kind: "redis".to_owned(),
            message: e.to_string(),
        }
    }

    fn usage(message: String) -> Self {
        Failure {
            op: "args",
            kind: "usage".to_owned(),
            message,
        }
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn variant(e: &LockError) -> &'static str {
    match e {
        LockError::Busy { .. } => "Busy",
        LockError::Timeout { .. } => "Timeout",
        LockError::LeaseLost { .. } => "LeaseLost",
        LockError::MaxHoldExceeded { .. } => "MaxHoldExceeded",
        LockError::InvalidKey { .. } => "InvalidKey",
        LockError::InvalidConfig { .. } => "InvalidConfig",
        LockError::NoGlobalLocker => "NoGlobalLocker",
        LockError::Backend { .. } => "Backend",
        _ => "Other",
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let result = match WorkerArgs::parse(std::env::args().skip(1)) {
        Ok(args) => run(args).await,
        Err(e) => Err(Failure::usage(e)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            say(&format!(
                "error op={} kind={} message={}",
                f.op,
                f.kind,
                f.message.replace('\n', " ")
            ));
            ExitCode::from(2)
        }
    }
}

async fn run(args: WorkerArgs) -> Result<(), Failure> {
    let backend = RedisBackend::connect(&args.url)
        .await
        .map_err(|e| Failure::lock("connect", &e))?;
    let mut builder = Locker::builder(backend).wait(Duration::from_millis(args.wait_ms));
    if let Some(p) = &args.prefix {
        builder = builder.prefix(p.clone());
    }
    if let Some(ms) = args.lease_ms {
        builder = builder.lease(Duration::from_millis(ms));
    }
    let locker = builder
        .try_build()
        .map_err(|e| Failure::lock("configure", &e))?;
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    match args.mode {
        Mode::Count => count(&args, &locker, &mut stdin).await,
        Mode::Hold => hold(&args, &locker, &mut stdin).await,
    }
}

async fn wait_go(stdin: &mut Lines<BufReader<Stdin>>) -> Result<(), Failure> {
    say("ready");
    match stdin.next_line().await {
        Ok(Some(line)) if line.trim() == "go" => Ok(()),
        other => Err(Failure::usage(format!(
            "expected `go` on stdin, got {other:?}"
        ))),
    }
}

async fn count(
    args: &WorkerArgs,
    locker: &Locker,
    stdin: &mut Lines<BufReader<Stdin>>,
) -> Result<(), Failure> {
    let client = redis::Client::open(args.url.as_str()).map_err(|e| Failure::redis("open", &e))?;
    let conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| Failure::redis("connect counter", &e))?;
    if args.wait_go {
        wait_go(stdin).await?;
    }
    let started = Instant::now();
    let mut summary = WorkerSummary {
        pid: std::process::id(),
        iterations: args.iterations,
        increments: 0,
        max_fence: 0,
        fence_violations: 0,
        elapsed_ms: 0,
    };
    for _ in 0..args.iterations {
        let body = increment(args, conn.clone());
        let outcome = if args.no_lock {
            body.await
        } else {
            let mut request = locker.lock(&args.key);
            if args.fence_key.is_some() {
                request = request.fenced();
            }
            request
                .run(body)
                .await
                .map_err(|e| Failure::lock("lock", &e))?
        }?;
        summary.increments += 1;
        if let Some((fence, violated)) = outcome {
            summary.max_fence = summary.max_fence.max(fence);
            summary.fence_violations += u64::from(violated);
        }
    }
    summary.elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    say(&summary.to_line());
    Ok(())
}

/// One non-atomic read-modify-write of the counter (and, when fenced, the fence check).
/// Returns the fence drawn and whether it failed to be above the highest one stored.
async fn increment(
    args: &WorkerArgs,
    mut conn: MultiplexedConnection,
) -> Result<Option<(u64, bool)>, Failure> {
    let value: Option<u64> = conn
        .get(&args.counter_key)
        .await
        .map_err(|e| Failure::redis("get counter", &e))?;
    // The window a missing lock would lose updates in.
    tokio::task::yield_now().await;
    if args.work_us > 0 {
        tokio::time::sleep(Duration::from_micros(args.work_us)).await;
    }
    let () = conn
        .set(&args.counter_key, value.unwrap_or(0) + 1)
        .await
        .map_err(|e| Failure::redis("set counter", &e))?;
    let Some(fence_key) = &args.fence_key else {
        return Ok(None);
    };
    let Some(fence) = current_fence() else {
        return Err(Failure::usage("a fenced lock has no fencing token".into()));
    };
    let seen: Option<u64> = conn
        .get(fence_key)
        .await
        .map_err(|e| Failure::redis("get fence", &e))?;
    let violated = seen.is_some_and(|s| fence <= s);
    if !violated {
        let () = conn
            .set(fence_key, fence)
            .await
            .map_err(|e| Failure::redis("set fence", &e))?;
    }
    Ok(Some((fence, violated)))
}

async fn hold(
    args: &WorkerArgs,
    locker: &Locker,
    stdin: &mut Lines<BufReader<Stdin>>,
) -> Result<(), Failure> {
    if args.wait_go {
        wait_go(stdin).await?;
    }
    let mut request = locker.lock(&args.key);
    if args.fenced {
        request = request.fenced();
    }
    if args.no_watchdog {
        request = request.watchdog(false);
    }
    let guard = request.await.map_err(|e| Failure::lock("acquire", &e))?;
    say(&format!(
        "acquired fence={}",
        guard
            .fence()
            .map_or_else(|| "none".to_owned(), |f| f.to_string())
    ));
    let mut lost_reported = false;
    loop {
        let line = tokio::select! {
            line = stdin.next_line() => line,
            () = guard.lost(), if !lost_reported => {
                lost_reported = true;
                say("lost");
                continue;
            }
        };
        let line = match line {
            Ok(Some(line)) => line,
            // End of stdin: release and leave.
            Ok(None) | Err(_) => return release(guard).await,
        };
        let mut words = line.split_whitespace();
        match words.next() {
            Some("release") => return release(guard).await,
            Some("exit") => {
                // Leave without releasing, as a crashed process would.
                std::mem::forget(guard);
                say("exiting");
                return Ok(());
            }
            Some("status") => say(&format!(
                "status held={} remaining_ms={}",
                guard.is_held(),
                guard.remaining().as_millis()
            )),
            Some("extend") => {
                let ms = words
                    .next()
                    .and_then(|w| w.parse::<u64>().ok())
                    .unwrap_or(0);
                match guard.extend(Duration::from_millis(ms)).await {
                    Ok(()) => say("extended ok"),
                    Err(e) => say(&format!("extended err={}", variant(&e))),
                }
            }
            _ => say(&format!("unknown command {line:?}")),
        }
    }
}

async fn release(guard: LockGuard) -> Result<(), Failure> {
    match guard.release().await {
        Ok(()) => say("released ok"),
        Err(e) => say(&format!("released err={}", variant(&e))),
    }
    Ok(())
}
