//! Checks that only make sense on Redis: URLs, ACL, connection failures, several OS processes.

use std::time::{Duration, Instant};

use lock_core::{LockError, Locker, RedisBackend};
use lock_testkit::RedisServer;

use crate::fixture::{SOON, lock_name, soon};
use lock_testkit::{AclUser, ChildOutput, ChildProcess};
use lock_tests::worker::{WorkerArgs, WorkerSummary};

const WORKER: &str = env!("CARGO_BIN_EXE_lock-worker");

/// A server that is down at connect gives `LockError::Backend` (retryable), promptly and
/// without a panic; after a restart on the same port, connecting works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_at_connect_is_a_backend_error() {
    let mut server = RedisServer::start();
    server.stop();
    match soon("connect to a stopped server", Locker::redis(&server.url())).await {
        Err(e @ LockError::Backend { .. }) => {
            assert!(e.is_retryable());
            let LockError::Backend { operation, .. } = &e else {
                unreachable!()
            };
            assert_eq!(*operation, "connect");
        }
        other => panic!("expected Backend, got {other:?}"),
    }
    let quick = RedisBackend::builder(&server.url())
        .connect_timeout(Duration::from_millis(200))
        .connect();
    assert!(matches!(
        soon("connect with a short timeout", quick).await,
        Err(LockError::Backend { .. })
    ));
    server.restart();
    let locker = Locker::redis(&server.url())
        .await
        .expect("connects after restart");
    locker
        .lock("up")
        .await
        .expect("lock")
        .release()
        .await
        .expect("release");
}

/// Malformed URLs and zero timeouts are `InvalidConfig`, not a panic or a Backend error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_url_is_invalid_config() {
    for url in [
        "",
        "not a url",
        "http://127.0.0.1:6379/",
        "redis://127.0.0.1:notaport/",
        "redis://127.0.0.1:6379/notadb",
    ] {
        match soon(url, Locker::redis(url)).await {
            Err(LockError::InvalidConfig { what, .. }) => {
                assert!(what.contains("URL"), "{url:?}: {what}");
            }
            other => panic!("{url:?}: expected InvalidConfig, got {other:?}"),
        }
    }
    let server = RedisServer::start();
    let zero = RedisBackend::builder(&server.url())
        .response_timeout(Duration::ZERO)
        .connect()
        .await;
    assert!(matches!(zero, Err(LockError::InvalidConfig { .. })));
}

/// An ACL user and password in the URL work, with the user's keys and channels restricted
/// to `lock:*` (so the lock touches nothing outside its prefix); a waiter is handed the lock
/// through the restricted release channel. A wrong password or none is a `Backend` error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_user_and_password_in_the_url() {
    let app = AclUser::new("app", "s3cret").rules(["~lock:*", "&lock:*", "+@all"]);
    let server = RedisServer::builder()
        .requirepass("adminpw")
        .user(&app)
        .start();
    let url = server.url_for(&app);
    let a = Locker::redis(&url).await.expect("the ACL user connects");
    let b = Locker::redis(&url).await.expect("the ACL user connects");
    let guard = a
        .lock("acl:1")
        .fenced()
        .await
        .expect("lock as the ACL user");
    assert!(guard.fence().is_some());
    assert!(server.exists("lock:{acl:1}").await);
    server.reset_stats().await;
    let waiter = tokio::spawn(async move { b.lock("acl:1").wait(SOON).await });
    // No signal says "the waiter subscribed": watch the server until it did (bounded).
    let deadline = Instant::now() + SOON;
    while server
        .commandstats()
        .await
        .get("ssubscribe")
        .copied()
        .unwrap_or(0)
        == 0
    {
        assert!(Instant::now() < deadline, "the waiter never subscribed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    guard.release().await.expect("release");
    let handed = soon("hand-over", waiter)
        .await
        .expect("waiter task")
        .expect("the waiter gets the lock after the release");
    handed.release().await.expect("release");
    for bad in [server.url_as("app", "wrong"), server.url()] {
        match soon("bad credentials", Locker::redis(&bad)).await {
            Err(LockError::Backend { .. }) => {}
            other => panic!("{bad}: expected Backend, got {other:?}"),
        }
    }
}

/// `redis+unix://` URLs work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_socket_url_works() {
    let server = RedisServer::builder().unixsocket().start();
    let url = server.unix_url().expect("unix socket");
    let locker = Locker::redis(&url)
        .await
        .expect("connect over the unix socket");
    let guard = locker.lock("unix").await.expect("lock");
    assert!(server.exists("lock:{unix}").await);
    guard.release().await.expect("release");
    assert!(!server.exists("lock:{unix}").await);
}

/// Runs `processes` lock-worker processes with `args` started together; returns their
/// outputs and the wall time.
async fn run_workers(processes: usize, args: &WorkerArgs) -> (Vec<ChildOutput>, Duration) {
    let mut workers: Vec<_> = (0..processes)
        .map(|_| ChildProcess::spawn(WORKER, args.to_args()))
        .collect();
    for w in &mut workers {
        w.expect_line("ready", Duration::from_secs(30)).await;
    }
    let start = Instant::now();
    for w in &mut workers {
        w.send("go").await;
    }
    let mut outputs = Vec::new();
    for w in workers {
        outputs.push(w.finish(Duration::from_secs(120)).await);
    }
    (outputs, start.elapsed())
}

/// 4 OS processes x 250 iterations of a non-atomic GET/SET increment of one Redis counter,
/// each under a fenced lock on one key: the counter ends exact, and every process saw its
/// fencing token above the highest one stored before it (checked under the lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_process_stress_counter_ends_exact() {
    const PROCESSES: usize = 4;
    const ITERATIONS: u64 = 250;
    let server = RedisServer::start();
    let args = WorkerArgs::count(&server.url(), "mp-stress", ITERATIONS, "mp:counter")
        .fence_key("mp:fence-seen")
        .wait_go();
    let (outputs, elapsed) = run_workers(PROCESSES, &args).await;
    let mut max_fence = 0;
    for out in &outputs {
        assert!(
            out.status.success(),
            "worker failed: {:?}\nstdout: {:?}\nstderr: {}",
            out.status,
            out.lines,
            out.stderr
        );
        let s = WorkerSummary::find(&out.lines).expect("summary line");
        assert_eq!(s.increments, ITERATIONS);
        assert_eq!(s.fence_violations, 0, "fencing token went backwards");
        max_fence = max_fence.max(s.max_fence);
    }
    let total = PROCESSES as u64 * ITERATIONS;
    let last: u64 = server
        .get("mp:counter")
        .await
        .and_then(|v| v.parse().ok())
        .expect("counter");
    println!(
        "[redis] multi-process stress: {PROCESSES} processes x {ITERATIONS} iterations on one key = {total} locked read-modify-writes; final count {last}; highest fencing token {max_fence}; {elapsed:.2?}"
    );
    assert_eq!(last, total, "lost updates across processes");
    // The counter holds the last token drawn, the highest any process saw.
    assert_eq!(
        server
            .get(&format!("{}:fence", lock_name("lock:", "mp-stress")))
            .await,
        Some(max_fence.to_string())
    );
    assert!(!server.exists(&lock_name("lock:", "mp-stress")).await);
}

/// The control for the multi-process stress: the same workers without the lock lose
/// updates, so the test above can fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_process_without_lock_loses_updates() {
    const PROCESSES: usize = 4;
    const ITERATIONS: u64 = 200;
    let server = RedisServer::start();
    let args = WorkerArgs::count(&server.url(), "mp-control", ITERATIONS, "mp:control")
        .no_lock()
        .wait_go();
    let (outputs, _) = run_workers(PROCESSES, &args).await;
    for out in &outputs {
        assert!(out.status.success(), "{:?} {}", out.lines, out.stderr);
    }
    let total = PROCESSES as u64 * ITERATIONS;
    let last: u64 = server
        .get("mp:control")
        .await
        .and_then(|v| v.parse().ok())
        .expect("counter");
    println!(
        "[redis] multi-process control without lock: {PROCESSES} processes x {ITERATIONS} = {total}; final count {last} ({} updates lost)",
        total - last
    );
    assert!(last < total, "without a lock some updates must be lost");
}
