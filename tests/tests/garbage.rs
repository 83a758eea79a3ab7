//! Answers that are not what a lock expects, from a real redis-server whose keys hold what
//! the lock did not put there, and from something that is not Redis at all on the port (a
//! wrong service, a proxy answering nonsense, a peer that never answers): every one is a typed
//! `LockError::Backend` within the configured bounds, never a panic, never a lock.

#![allow(
    clippy::panic,
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "a test file: its helpers assert by panicking"
)]

mod support;

use std::time::{Duration, Instant};

use lock_core::{LockError, Locker, RedisBackend};
use lock_testkit::RedisServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const TIMEOUT: Duration = Duration::from_millis(300);

/// A hang guard: the error must come within the connect and response bounds, with slack for a
/// loaded machine; never a speed claim.
const BOUND: Duration = Duration::from_secs(5);

/// A TCP peer on a free port that answers each read with `reply(n)` (the `n`th read) until it
/// returns `None`, then closes. Returns the `redis://` URL.
async fn peer(reply: fn(usize) -> Option<&'static [u8]>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let mut n = 0;
                while let Ok(read) = socket.read(&mut buf).await {
                    if read == 0 {
                        return;
                    }
                    match reply(n) {
                        Some(bytes) if !bytes.is_empty() => {
                            if socket.write_all(bytes).await.is_err() {
                                return;
                            }
                        }
                        // Silence: read on, answer nothing.
                        Some(_) => {}
                        None => return,
                    }
                    n += 1;
                }
            });
        }
    });
    format!("redis://127.0.0.1:{port}/")
}

async fn connect(url: &str) -> Result<RedisBackend, LockError> {
    RedisBackend::builder(url)
        .connect_timeout(TIMEOUT)
        .response_timeout(TIMEOUT)
        .connect()
        .await
}

#[track_caller]
fn assert_backend_error<T: std::fmt::Debug>(r: Result<T, LockError>, what: &str) {
    match r {
        Err(LockError::Backend { .. }) => {}
        other => panic!("{what}: expected LockError::Backend, got {other:?}"),
    }
}

#[tokio::test]
async fn a_wrong_service_on_the_port_is_a_backend_error() {
    let url = peer(|_| Some(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")).await;
    let started = Instant::now();
    assert_backend_error(connect(&url).await, "an HTTP server");
    assert!(started.elapsed() < BOUND, "{:?}", started.elapsed());
}

#[tokio::test]
async fn a_peer_answering_nonsense_to_every_command_is_a_backend_error() {
    // Every command gets an integer, whatever it asked.
    let url = peer(|_| Some(b":42\r\n")).await;
    let started = Instant::now();
    assert_backend_error(connect(&url).await, "integers for everything");
    assert!(started.elapsed() < BOUND, "{:?}", started.elapsed());
    // A reply that is not RESP at all.
    let url = peer(|_| Some(b"\x00\xff garbage \r\n")).await;
    assert_backend_error(connect(&url).await, "bytes that are not RESP");
}

#[tokio::test]
async fn a_peer_that_never_answers_is_a_backend_error_within_the_timeouts() {
    let url = peer(|_| Some(b"")).await;
    let started = Instant::now();
    assert_backend_error(connect(&url).await, "silence");
    assert!(started.elapsed() < BOUND, "{:?}", started.elapsed());
}

/// The lock's key (or its fence counter) holds what the lock did not put there, as another
/// program sharing the server could leave: the acquire fails with a typed error and takes
/// nothing; the key is left as it was.
#[tokio::test]
async fn keys_holding_foreign_data_fail_the_acquire_with_a_typed_error() {
    let server = RedisServer::start();
    let locker = Locker::redis(&server.url()).await.expect("connect");
    let () = server
        .query(
            redis::cmd("HSET")
                .arg("lock:{hash}")
                .arg("f")
                .arg("v")
                .clone(),
        )
        .await;
    assert_backend_error(
        locker.try_lock("hash").await,
        "a hash at the lock's key (try)",
    );
    assert_backend_error(
        locker.lock("hash").wait(Duration::from_millis(200)).await,
        "a hash at the lock's key (wait)",
    );
    assert_backend_error(
        locker.lock("hash").fenced().await,
        "a hash at the lock's key (fenced)",
    );
    let kind: String = server
        .query(redis::cmd("TYPE").arg("lock:{hash}").clone())
        .await;
    assert_eq!(kind, "hash", "the foreign key is left as it was");
    // A fence counter that is not a number.
    server.set("lock:{counter}:fence", "not a number").await;
    assert_backend_error(
        locker.lock("counter").fenced().await,
        "a fence counter that is not a number",
    );
    assert!(
        !server.exists("lock:{counter}").await,
        "no lock was taken by the failed fenced acquire"
    );
    // A counter past what the script counts on exactly (2^53): an error, never a fence drawn
    // twice or a counter written back lower (found by an outside audit: every acquire got
    // 2^53 and the counter went down to it).
    server.set("lock:{big}:fence", "9007199254740993").await;
    assert_backend_error(
        locker.lock("big").fenced().await,
        "a fence counter past 2^53",
    );
    assert!(!server.exists("lock:{big}").await, "no lock was taken");
    assert_eq!(
        server.get("lock:{big}:fence").await.as_deref(),
        Some("9007199254740993"),
        "the counter is left as it was"
    );
    // Up to 2^53 - 1 every fence is drawn, each above the last; then the counter is refused.
    server.set("lock:{edge}:fence", "9007199254740989").await;
    for expected in [9_007_199_254_740_990, 9_007_199_254_740_991] {
        let guard = locker.lock("edge").fenced().await.expect("below 2^53");
        assert_eq!(guard.fence(), Some(expected));
        guard.release().await.expect("release");
    }
    assert_backend_error(
        locker.lock("edge").fenced().await,
        "a fence counter at 2^53 - 1",
    );
    // The locker still works for other keys.
    locker
        .lock("fine")
        .await
        .expect("another key")
        .release()
        .await
        .expect("release");
}

/// A release whose queued waiter is fenced and whose fence counter is unusable (garbage at the
/// counter's key): the release goes through and says `Ok` (it deleted its own lock), the waiter
/// is left to take the lock itself and gets the typed error, and no lock is left behind. Found
/// by review: the hand-over's error failed the release (and every release batched with it,
/// whose keys were already deleted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_to_a_fenced_waiter_with_an_unusable_counter_fails_only_that_waiter() {
    let server = RedisServer::start();
    let holder = Locker::redis(&server.url()).await.expect("connect");
    let other = Locker::redis(&server.url()).await.expect("connect");
    let guard = holder.lock("bad").await.expect("acquire");
    let waiter = tokio::spawn({
        let other = other.clone();
        async move {
            other
                .lock("bad")
                .fenced()
                .wait(Duration::from_secs(2))
                .await
        }
    });
    support::until_queued(&server, "bad", 1).await;
    server.set("lock:{bad}:fence", "garbage").await;
    let released = guard.release().await;
    assert!(
        released.is_ok(),
        "the release itself went through: {released:?}"
    );
    assert_backend_error(waiter.await.expect("join"), "the fenced waiter");
    lock_testkit::eventually("no lock left behind", BOUND, async || {
        !server.exists("lock:{bad}").await
    })
    .await;
    assert_eq!(
        server.get("lock:{bad}:fence").await.as_deref(),
        Some("garbage"),
        "the counter is left as it was"
    );
}
