//! The redis-server harness itself: the faults other tests rely on really happen.

#![allow(
    clippy::panic,
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::print_stdout,
    reason = "a test file: its helpers outside #[test] functions assert by panicking and report figures"
)]

use std::net::TcpStream;
use std::time::Duration;

use lock_tests::RedisServer;
use lock_tests::redis::{INSTALL_COMMAND, find_redis_server_in};
use lock_tests::worker::{WorkerArgs, WorkerProcess, WorkerSummary};

/// A server starts empty on a loopback port, answers, and is gone (process and directory)
/// after drop.
#[tokio::test]
async fn start_answers_and_drop_kills() {
    let server = RedisServer::start();
    assert!(server.url().starts_with("redis://127.0.0.1:"));
    assert_eq!(server.dbsize().await, 0);
    server.set("k", "v").await;
    assert_eq!(server.get("k").await.as_deref(), Some("v"));
    assert_eq!(server.pttl("k").await, -1);
    assert!(server.exists("k").await);
    assert_eq!(server.keys("*").await, vec!["k".to_owned()]);
    let stats = server.commandstats().await;
    assert_eq!(stats.get("set"), Some(&1));
    assert_eq!(server.del("k").await, 1);
    server.set("k2", "v").await;
    server.flushall().await;
    assert_eq!(server.dbsize().await, 0);
    let config: Vec<String> = server
        .query(redis::cmd("CONFIG").arg("GET").arg("save").clone())
        .await;
    assert_eq!(
        config,
        vec!["save".to_owned(), String::new()],
        "no RDB snapshots"
    );
    let aof: Vec<String> = server
        .query(redis::cmd("CONFIG").arg("GET").arg("appendonly").clone())
        .await;
    assert_eq!(aof[1], "no");
    let port = server.port();
    let dir = server.dir().to_path_buf();
    drop(server);
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "still listening after drop"
    );
    assert!(!dir.exists(), "temp dir left behind");
}

/// `stop` kills the server and keeps the port; `restart` brings it back on that port, empty.
#[tokio::test]
async fn stop_and_restart_on_the_same_port() {
    let mut server = RedisServer::start();
    let port = server.port();
    server.set("k", "v").await;
    server.stop();
    assert!(!server.is_running());
    assert!(server.try_client().await.is_err());
    server.restart();
    assert_eq!(server.port(), port);
    assert_eq!(server.get("k").await, None, "no persistence: back empty");
    server.set("k", "again").await;
    // Restart of a running server works too.
    server.restart();
    assert_eq!(server.dbsize().await, 0);
}

/// `pause` freezes the server (commands get no answer); `resume` thaws it.
#[tokio::test]
async fn pause_and_resume() {
    let mut server = RedisServer::start();
    let mut conn = server.client().await;
    server.pause();
    assert!(server.is_paused());
    let frozen = tokio::time::timeout(
        Duration::from_millis(300),
        redis::cmd("PING").query_async::<String>(&mut conn),
    )
    .await;
    assert!(frozen.is_err(), "a paused server must not answer");
    server.resume();
    let pong: String = tokio::time::timeout(
        Duration::from_secs(10),
        redis::cmd("PING").query_async(&mut server.client().await),
    )
    .await
    .expect("answers after resume")
    .expect("PING");
    assert_eq!(pong, "PONG");
    // Dropping a paused server still kills it.
    server.pause();
    let port = server.port();
    drop(server);
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
}

/// `client_kill_all` closes other clients' connections.
#[tokio::test]
async fn client_kill_all_drops_connections() {
    let server = RedisServer::start();
    let mut victim = server.client().await;
    let _: String = redis::cmd("PING")
        .query_async(&mut victim)
        .await
        .expect("PING");
    assert!(server.client_kill_all().await >= 1);
    let after = redis::cmd("PING").query_async::<String>(&mut victim).await;
    assert!(after.is_err(), "the killed connection still answers");
}

/// With `--requirepass` the helpers authenticate; an anonymous client is refused.
#[tokio::test]
async fn requirepass_is_used_by_the_helpers() {
    let server = RedisServer::start_with(["--requirepass", "pw"]);
    assert_eq!(server.password(), Some("pw"));
    server.set("k", "v").await;
    let anonymous = redis::Client::open(server.url()).expect("url");
    let mut conn = anonymous
        .get_multiplexed_async_connection()
        .await
        .expect("connects");
    let refused = redis::cmd("GET")
        .arg("k")
        .query_async::<Option<String>>(&mut conn)
        .await;
    assert!(refused.is_err(), "NOAUTH expected");
}

/// Many servers started at once get distinct ports and all come up.
#[test]
fn parallel_starts_get_distinct_ports() {
    let handles: Vec<_> = (0..6)
        .map(|_| std::thread::spawn(RedisServer::start))
        .collect();
    let servers: Vec<RedisServer> = handles
        .into_iter()
        .map(|h| h.join().expect("start"))
        .collect();
    let mut ports: Vec<u16> = servers.iter().map(RedisServer::port).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), servers.len());
    for s in &servers {
        assert!(TcpStream::connect(("127.0.0.1", s.port())).is_ok());
    }
}

/// The cluster-mode node computes hash slots (the conformance suite's slot checks use it).
#[tokio::test]
async fn cluster_node_computes_keyslots() {
    let node = RedisServer::start_cluster_node();
    assert_eq!(node.keyslot("foo").await, 12182);
    assert_eq!(node.keyslot("{foo}:bar").await, 12182);
}

/// A missing redis-server fails loudly with the install command, never a skip.
#[test]
fn missing_redis_server_names_the_install_command() {
    let err = find_redis_server_in(
        Some("/nonexistent/bin".as_ref()),
        &["/nonexistent/redis-server".as_ref()],
    )
    .expect_err("nothing to find");
    assert!(err.contains(INSTALL_COMMAND), "{err}");
    let panic = std::panic::catch_unwind(|| {
        RedisServer::builder()
            .binary("/nonexistent/redis-server")
            .start()
    })
    .expect_err("start must panic");
    let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        message.contains("apt-get install -y redis-server"),
        "{message}"
    );
}

/// A server that refuses its arguments fails the test with its own message.
#[test]
#[should_panic(expected = "redis-server exited at start")]
fn bad_arguments_fail_with_the_server_log() {
    let _ = RedisServer::start_with(["--no-such-option", "1"]);
}

/// The worker's command line and summary line round-trip.
#[test]
fn worker_args_and_summary_round_trip() {
    let args = WorkerArgs::count("redis://127.0.0.1:1/", "k", 3, "c")
        .fence_key("f")
        .prefix("p:")
        .lease_ms(500)
        .work_us(10)
        .wait_go();
    assert_eq!(WorkerArgs::parse(args.to_args().into_iter()), Ok(args));
    let hold = WorkerArgs::hold("redis://127.0.0.1:1/", "k")
        .fenced()
        .no_watchdog();
    assert_eq!(WorkerArgs::parse(hold.to_args().into_iter()), Ok(hold));
    assert!(
        WorkerArgs::parse(
            ["count", "--url", "u", "--bogus"]
                .map(String::from)
                .into_iter()
        )
        .is_err()
    );
    let s = WorkerSummary {
        pid: 1,
        iterations: 2,
        increments: 2,
        max_fence: 5,
        fence_violations: 0,
        elapsed_ms: 9,
    };
    assert_eq!(WorkerSummary::parse(&s.to_line()), Some(s));
}

/// The worker's hold mode: a fenced lock held by another OS process excludes this one, a
/// crash (SIGKILL) leaves the lock to its lease, and `release` frees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_hold_mode() {
    const WORKER: &str = env!("CARGO_BIN_EXE_lock-worker");
    let server = RedisServer::start();
    let within = Duration::from_secs(30);
    let mut holder =
        WorkerProcess::spawn(WORKER, &WorkerArgs::hold(&server.url(), "held").fenced());
    let acquired = holder.expect_line("acquired", within).await;
    let fence: u64 = acquired
        .strip_prefix("acquired fence=")
        .and_then(|f| f.parse().ok())
        .unwrap_or_else(|| panic!("a fenced hold prints its token: {acquired}"));
    assert!(fence > 0, "{acquired}");
    let locker = lock_core::Locker::redis(&server.url())
        .await
        .expect("connect");
    assert!(locker.try_lock("held").await.is_err());
    holder.send("status").await;
    assert!(
        holder
            .expect_line("status held=true", within)
            .await
            .contains("remaining_ms=")
    );
    holder.send("release").await;
    holder.expect_line("released ok", within).await;
    let out = holder.finish(within).await;
    assert!(out.status.success(), "{}", out.stderr);
    assert!(!server.exists("lock:{held}").await);

    // Crash while holding: the key stays until its lease runs out.
    let mut crashed = WorkerProcess::spawn(
        WORKER,
        &WorkerArgs::hold(&server.url(), "crash").lease_ms(30_000),
    );
    crashed.expect_line("acquired", within).await;
    crashed.kill().await;
    let pttl = server.pttl("lock:{crash}").await;
    assert!(pttl > 0 && pttl <= 30_000, "{pttl}");

    // A busy acquire is reported as an error line and exit code 2.
    let busy = WorkerProcess::spawn(WORKER, &WorkerArgs::hold(&server.url(), "crash").wait_ms(0));
    let out = busy.finish(within).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        out.lines
            .iter()
            .any(|l| l.starts_with("error op=acquire kind=Busy")),
        "{:?}",
        out.lines
    );
}
