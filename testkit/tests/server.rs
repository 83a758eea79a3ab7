//! The server harness itself: the faults other tests rely on really happen.

#![allow(
    clippy::panic,
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::print_stdout,
    reason = "a test file: its helpers outside #[test] functions assert by panicking and report figures"
)]

use std::net::TcpStream;
use std::time::Duration;

use lock_testkit::server::{INSTALL_COMMAND, find_redis_server_in};
use lock_testkit::{AclUser, RedisServer};

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

/// The cluster-mode node computes hash slots (lock-tests' conformance slot checks use it).
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

/// ACL users: the helpers log in as admin, the user only reaches its keys.
#[tokio::test]
async fn acl_user_is_restricted_to_its_keys() {
    let user = AclUser::new("app", "pw").rules(["~app:*", "+@all"]);
    let server = RedisServer::builder()
        .requirepass("admin")
        .user(&user)
        .start();
    let client = redis::Client::open(server.url_for(&user)).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let ok: redis::RedisResult<()> = redis::cmd("SET")
        .arg("app:1")
        .arg("x")
        .query_async(&mut conn)
        .await;
    assert!(ok.is_ok());
    let refused: redis::RedisResult<()> = redis::cmd("SET")
        .arg("other")
        .arg("x")
        .query_async(&mut conn)
        .await;
    assert!(refused.is_err());
    assert_eq!(server.get("app:1").await.as_deref(), Some("x"));
}
