//! Two servers sharing one real redis-server: one run per key, across processes' lockers.

use std::time::Duration;

use lock_core::{Locker, RedisBackend};
use lock_testkit::RedisServer;
use lock_tower::IdempotencyLayer;

use crate::common::{Call, Handler, a_lost_lease_cancels_the_handler, send, serve, summary};

async fn locker(redis: &RedisServer) -> Locker {
    let backend = RedisBackend::builder(&redis.url()).connect().await.unwrap();
    Locker::builder(backend).build()
}

#[tokio::test]
async fn two_servers_on_one_redis_run_each_key_once() {
    let redis = RedisServer::start();
    let handler = Handler {
        delay: Duration::from_millis(300),
        ..Handler::default()
    };
    let a = serve(IdempotencyLayer::new(locker(&redis).await), handler.clone()).await;
    let b = serve(
        IdempotencyLayer::new(locker(&redis).await).wait(Duration::from_secs(10)),
        handler.clone(),
    )
    .await;
    // Sequential retries, alternating servers.
    let first = send(a, &Call::new("seq", "1")).await;
    assert_eq!(first.status, 201);
    for i in 0..6 {
        let addr = if i % 2 == 0 { b } else { a };
        let replay = send(addr, &Call::new("seq", "1")).await;
        assert!(replay.replayed());
        assert_eq!(replay.without_replay(), first);
    }
    assert_eq!(handler.calls(), 1);
    // Concurrent duplicates: b waits and replays, a answers 409.
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let addr = if i % 2 == 0 { a } else { b };
            tokio::spawn(async move { send(addr, &Call::new("conc", "2")).await })
        })
        .collect();
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    assert_eq!(handler.calls(), 2);
    let ran = answers
        .iter()
        .find(|x| x.status == 201 && !x.replayed())
        .unwrap()
        .clone();
    for x in &answers {
        match x.status {
            409 => assert_eq!(x.problem_type(), "urn:lock-tower:idempotency-in-flight"),
            _ => assert_eq!(x.without_replay(), ran),
        }
    }
    let changed = send(b, &Call::new("conc", "changed")).await;
    assert_eq!(changed.status, 422);
}

#[tokio::test]
async fn redis_ttl_expiry_and_5xx() {
    let redis = RedisServer::start();
    let handler = Handler {
        fail_on: vec![1],
        ..Handler::default()
    };
    let layer = IdempotencyLayer::new(locker(&redis).await).ttl(Duration::from_secs(1));
    let addr = serve(layer, handler.clone()).await;
    assert_eq!(send(addr, &Call::new("k", "a")).await.status, 500);
    assert_eq!(send(addr, &Call::new("k", "a")).await.status, 201);
    assert!(send(addr, &Call::new("k", "a")).await.replayed());
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let again = send(addr, &Call::new("k", "a")).await;
    assert!(!again.replayed());
    assert_eq!(handler.calls(), 3);
}

#[tokio::test]
async fn a_lost_lease_cancels_the_handler_before_a_retry_runs() {
    let redis = RedisServer::start();
    let backend = RedisBackend::builder(&redis.url()).connect().await.unwrap();
    let locker = Locker::builder(backend)
        .lease(Duration::from_millis(600))
        .build();
    a_lost_lease_cancels_the_handler(locker, false, async |key| {
        assert_eq!(redis.del(&format!("lock:{{{key}}}")).await, 1);
    })
    .await;
}

/// Issue 29, item 9: Redis refuses the response's record (`maxmemory` reached, `noeviction`)
/// after the handler ran. The first request gets 503; its retry, once memory is freed, finds
/// the key's "started" mark without a result and gets 409 outcome-unknown: the handler never
/// runs a second time (before the mark, the retry ran it again).
#[tokio::test]
async fn a_refused_record_write_never_lets_a_retry_run_the_handler_again() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::ServiceExt as _;

    let server = Arc::new(RedisServer::start_with([
        "--maxmemory",
        "8mb",
        "--maxmemory-policy",
        "noeviction",
    ]));
    let locker = locker(&server).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let handler = {
        let (server, calls) = (server.clone(), calls.clone());
        move || async move {
            // The first run leaves the server over its limit: every write that adds memory
            // is refused then.
            if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                server.fill("filler", 16 << 20).await;
            }
            (http::StatusCode::CREATED, "charged")
        }
    };
    let app = axum::Router::new()
        .route("/pay", axum::routing::post(handler))
        .layer(IdempotencyLayer::new(locker));
    let request = || {
        http::Request::post("/pay")
            .header("idempotency-key", "k")
            .body(axum::body::Body::from("10 EUR"))
            .unwrap()
    };
    let (status, body, _) = summary(app.clone().oneshot(request()).await.unwrap()).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("urn:lock-tower:lock-unavailable"), "{body}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // Memory freed: the retry could write a record now, and must still not run the handler.
    assert_eq!(server.del("filler").await, 1);
    for _ in 0..2 {
        let (status, body, replayed) = summary(app.clone().oneshot(request()).await.unwrap()).await;
        assert_eq!((status, replayed), (409, false), "{body}");
        assert!(
            body.contains("urn:lock-tower:idempotency-outcome-unknown"),
            "{body}"
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the handler ran again");
    // Another request under the key is still a key reused.
    let other = http::Request::post("/pay")
        .header("idempotency-key", "k")
        .body(axum::body::Body::from("20 EUR"))
        .unwrap();
    assert_eq!(app.oneshot(other).await.unwrap().status(), 422);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}
