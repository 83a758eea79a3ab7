//! `lock-http-server`: an axum app whose routes run under `lock_tower::LockLayer` on Redis,
//! served on loopback, for the cross-process HTTP test (`tests/tower_http.rs`). Several of
//! these processes share one Redis; a test drives them with a real HTTP client.
//!
//! ```text
//! lock-http-server --url redis://127.0.0.1:PORT/ [--work-us N] [--no-lock]
//! stdout, once serving:  listening 127.0.0.1:<port>
//! POST /counter/{key}      under LockLayer(PathParam "key", prefix "counter:", wait 2 s, fenced)
//! POST /counter-now/{key}  under LockLayer(same lock names, reject_when_busy, fenced)
//! GET  /metrics            both layers' counters: `locked=N busy=N timeout=N unavailable=N lease_lost=N other=N`
//! ```
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
use axum::http::StatusCode;
use axum::routing::{get, post};
use lock_core::Locker;
use lock_tower::extract::PathParam;
use lock_tower::{FencingToken, LockLayer, LockLayerMetrics};
use redis::aio::MultiplexedConnection;
use redis::{AsyncCommands, Script};
use tokio::io::AsyncReadExt;

use lock_testkit::process::say;
use lock_tests::probe::CHECK_FENCE;

struct Args {
    url: String,
    work: Duration,
    locked: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut url = None;
    let mut work = Duration::from_micros(2000);
    let mut locked = true;
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
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Args {
        url: url.ok_or("usage: lock-http-server --url URL [--work-us N] [--no-lock]")?,
        work,
        locked,
    })
}

struct App {
    conn: MultiplexedConnection,
    check_fence: Script,
    work: Duration,
    locked: bool,
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
    let locker = Locker::redis(&args.url)
        .await
        .map_err(|e| format!("lock backend: {e}"))?;
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
        metrics: vec![waiting.metrics(), rejecting.metrics()],
    });
    let router = if args.locked {
        Router::new()
            .route("/counter/{key}", post(bump).layer(waiting))
            .route("/counter-now/{key}", post(bump).layer(rejecting))
    } else {
        Router::new().route("/counter/{key}", post(bump))
    };
    let router = router.route("/metrics", get(metrics)).with_state(app);
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
