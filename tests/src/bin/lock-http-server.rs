//! `lock-http-server`: an axum app whose routes run under `lock_tower::LockLayer` on Redis,
//! served on loopback, for the cross-process HTTP test (`tests/tower_http.rs`). Several of
//! these processes share one Redis; a test drives them with a real HTTP client.
//!
//! ```text
//! lock-http-server --url redis://127.0.0.1:PORT/ [--work-us N] [--no-lock]
//!                  [--lease-ms N] [--hold-ms N] [--wait-ms N]
//! stdout, once serving:  listening 127.0.0.1:<port>
//! POST /counter/{key}      under LockLayer(PathParam "key", prefix "counter:", wait 2 s, fenced)
//! POST /counter-now/{key}  under LockLayer(same lock names, reject_when_busy, fenced)
//! GET  /metrics            both layers' counters: `locked=N busy=N timeout=N unavailable=N lease_lost=N other=N`
//! POST /pay                under IdempotencyLayer(wait --wait-ms, default 10 s), for
//!                          `tests/idempotency_http.rs`
//! ```
//!
//! `POST /pay` (key from `Idempotency-Key`) counts its runs in Redis, where every process sees
//! them: `INCR pay:<key>:runs` when it starts (the test's "handler started" marker), then it
//! holds for `--hold-ms` (default 0; a long hold lets a test kill the process mid-handler),
//! then `INCR pay:<key>:done` and answers 201 with `x-run: <run>` and `x-served-by: <pid>` and
//! a body naming the request body, the key, the run, the process and the time, so two runs
//! never give the same answer. `--lease-ms` sets the locker's lease (default lock-core's 30 s;
//! the watchdog renews it while the process lives).
//!
//! Both POST routes take the same lock (`counter:<key>`), so a waiting request and a rejecting
//! one contend with each other. The handler is a deliberately non-atomic critical section on
//! Redis, where every process sees the same state:
//!
//! - `INCR app:<key>:inside`; a result above 1 means another section of the key is running:
//!   `INCR app:overlaps`. `DECR app:<key>:inside` on the way out.
//! - Fencing: a Lua compare-and-set stores the request's token in `app:<key>:fence` only when it
//!   is strictly above the one stored; otherwise `INCR app:fence_violations`.
//! - `GET app:<key>:count`, yield and sleep `--work-us` (default 2000), `SET app:<key>:count`
//!   to the value read plus one: a lost update unless sections of a key never overlap.
//!
//! It answers 200 with the fencing token as the body, or 500 with the reason when Redis fails
//! or a fenced route has no token. `--no-lock` serves `/counter/{key}` without any layer (the
//! control case: the same checks must then catch overlaps). The process exits when its stdin
//! ends, so it never outlives the test that spawned it.

#![forbid(unsafe_code)]
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "the server talks to the test that spawned it through stdout lines"
)]

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use lock_core::{Locker, RedisBackend};
use lock_tower::extract::PathParam;
use lock_tower::{FencingToken, IdempotencyLayer, LockLayer, LockLayerMetrics};
use redis::aio::MultiplexedConnection;
use redis::{AsyncCommands, Script};
use tokio::io::AsyncReadExt;

use lock_testkit::process::say;
use lock_tests::probe::CHECK_FENCE;

struct Args {
    url: String,
    work: Duration,
    locked: bool,
    lease: Option<Duration>,
    hold: Duration,
    wait: Duration,
}

fn millis(args: &mut impl Iterator<Item = String>, flag: &str) -> Result<Duration, String> {
    args.next()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{flag} needs a number of milliseconds"))
}

fn parse_args() -> Result<Args, String> {
    let mut url = None;
    let mut work = Duration::from_micros(2000);
    let mut locked = true;
    let mut lease = None;
    let mut hold = Duration::ZERO;
    let mut wait = Duration::from_secs(10);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--url" => url = args.next(),
            "--work-us" => {
                let us = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("--work-us needs a number of microseconds")?;
                work = Duration::from_micros(us);
            }
            "--no-lock" => locked = false,
            "--lease-ms" => lease = Some(millis(&mut args, "--lease-ms")?),
            "--hold-ms" => hold = millis(&mut args, "--hold-ms")?,
            "--wait-ms" => wait = millis(&mut args, "--wait-ms")?,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Args {
        url: url.ok_or("usage: lock-http-server --url URL [--work-us N] [--no-lock] [--lease-ms N] [--hold-ms N] [--wait-ms N]")?,
        work,
        locked,
        lease,
        hold,
        wait,
    })
}

struct App {
    conn: MultiplexedConnection,
    check_fence: Script,
    work: Duration,
    locked: bool,
    hold: Duration,
    metrics: Vec<LockLayerMetrics>,
}

type Failure = (StatusCode, String);

fn redis_failure(what: &str, e: &redis::RedisError) -> Failure {
    (StatusCode::INTERNAL_SERVER_ERROR, format!("{what}: {e}"))
}

/// The critical section: overlap probe, fence check, non-atomic increment.
async fn bump(
    State(app): State<Arc<App>>,
    Path(key): Path<String>,
    token: Option<FencingToken>,
) -> Result<String, Failure> {
    let mut conn = app.conn.clone();
    let inside_key = format!("app:{key}:inside");
    let inside: i64 = conn
        .incr(&inside_key, 1)
        .await
        .map_err(|e| redis_failure("INCR inside", &e))?;
    if inside > 1 {
        let _: i64 = conn
            .incr("app:overlaps", 1)
            .await
            .map_err(|e| redis_failure("INCR overlaps", &e))?;
    }
    let token = match (token, app.locked) {
        (Some(token), _) => {
            let _: i64 = app
                .check_fence
                .key(format!("app:{key}:fence"))
                .key("app:fence_violations")
                .arg(token.get())
                .invoke_async(&mut conn)
                .await
                .map_err(|e| redis_failure("fence check", &e))?;
            token.get().to_string()
        }
        (None, true) => {
            return Err((
                StatusCode::INTERNAL_SERVER_ERROR,
                "a fenced route ran without a fencing token".to_owned(),
            ));
        }
        (None, false) => "none".to_owned(),
    };
    let count_key = format!("app:{key}:count");
    let value: Option<u64> = conn
        .get(&count_key)
        .await
        .map_err(|e| redis_failure("GET count", &e))?;
    // The window in which a second section of the same key would lose this update.
    tokio::task::yield_now().await;
    tokio::time::sleep(app.work).await;
    let () = conn
        .set(&count_key, value.unwrap_or(0) + 1)
        .await
        .map_err(|e| redis_failure("SET count", &e))?;
    let _: i64 = conn
        .decr(&inside_key, 1)
        .await
        .map_err(|e| redis_failure("DECR inside", &e))?;
    Ok(token)
}

/// `POST /pay` behind `IdempotencyLayer`: counts its runs per key in Redis, holds, answers 201
/// with an answer no other run gives.
async fn pay(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: String,
) -> Result<(StatusCode, [(&'static str, String); 2], String), Failure> {
    let key = headers
        .get("idempotency-key")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    let mut conn = app.conn.clone();
    let run: i64 = conn
        .incr(format!("pay:{key}:runs"), 1)
        .await
        .map_err(|e| redis_failure("INCR runs", &e))?;
    tokio::time::sleep(app.hold).await;
    let _: i64 = conn
        .incr(format!("pay:{key}:done"), 1)
        .await
        .map_err(|e| redis_failure("INCR done", &e))?;
    let pid = std::process::id();
    let at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    Ok((
        StatusCode::CREATED,
        [("x-run", run.to_string()), ("x-served-by", pid.to_string())],
        format!("paid {body:?} key={key} run={run} pid={pid} at={at}"),
    ))
}

async fn metrics(State(app): State<Arc<App>>) -> String {
    let (mut locked, mut busy, mut timeout, mut unavailable, mut lease_lost, mut other) =
        (0, 0, 0, 0, 0, 0);
    for m in &app.metrics {
        let s = m.snapshot();
        locked += s.requests_locked;
        busy += s.rejected_busy;
        timeout += s.rejected_timeout;
        unavailable += s.rejected_unavailable;
        lease_lost += s.rejected_lease_lost;
        other += s.rejected_bad_key + s.rejected_misconfigured + s.passed_through + s.failed_open;
    }
    format!(
        "locked={locked} busy={busy} timeout={timeout} unavailable={unavailable} lease_lost={lease_lost} other={other}"
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    match serve().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            say(&format!("error {message}"));
            eprintln!("lock-http-server: {message}");
            ExitCode::from(2)
        }
    }
}

async fn serve() -> Result<(), String> {
    let args = parse_args()?;
    let locker = match args.lease {
        None => Locker::redis(&args.url).await,
        Some(lease) => RedisBackend::connect(&args.url)
            .await
            .map(|backend| Locker::builder(backend).lease(lease).build()),
    }
    .map_err(|e| format!("lock backend: {e}"))?;
    let idempotent = IdempotencyLayer::new(locker.clone()).wait(args.wait);
    let conn = redis::Client::open(args.url.as_str())
        .map_err(|e| format!("redis url: {e}"))?
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("redis connection: {e}"))?;
    let waiting = LockLayer::new(locker.clone(), PathParam::new("key"))
        .key_prefix("counter:")
        .wait(Duration::from_secs(2))
        .fenced();
    let rejecting = LockLayer::new(locker, PathParam::new("key"))
        .key_prefix("counter:")
        .reject_when_busy()
        .fenced();
    let app = Arc::new(App {
        conn,
        check_fence: Script::new(CHECK_FENCE),
        work: args.work,
        locked: args.locked,
        hold: args.hold,
        metrics: vec![waiting.metrics(), rejecting.metrics()],
    });
    let router = if args.locked {
        Router::new()
            .route("/counter/{key}", post(bump).layer(waiting))
            .route("/counter-now/{key}", post(bump).layer(rejecting))
    } else {
        Router::new().route("/counter/{key}", post(bump))
    };
    let router = router
        .route("/metrics", get(metrics))
        .route("/pay", post(pay).layer(idempotent))
        .with_state(app);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("bind: {e}"))?;
    let addr = listener.local_addr().map_err(|e| format!("bind: {e}"))?;
    say(&format!("listening {addr}"));
    // Serve until stdin ends (the test dropped its end, or died).
    let stdin_closed = async {
        let mut stdin = tokio::io::stdin();
        let mut buf = [0u8; 64];
        while matches!(stdin.read(&mut buf).await, Ok(n) if n > 0) {}
    };
    tokio::select! {
        served = axum::serve(listener, router) => served.map_err(|e| format!("serve: {e}")),
        () = stdin_closed => Ok(()),
    }
}
