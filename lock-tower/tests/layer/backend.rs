//! A lock backend that fails: a real redis-server, killed. 503 when failing closed; the
//! request runs unlocked when failing open.

use std::process::Stdio;
use std::time::Duration;

use http::StatusCode;
use lock_core::{Locker, RedisBackend};
use lock_tower::LockLayer;
use lock_tower::extract::HeaderKey;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tower::{Layer, ServiceExt};

use crate::common::{KEY, echo_lock_key, json, request, text};

/// A redis-server of our own on a free loopback port; killed on drop.
struct RedisServer {
    child: Child,
    url: String,
}

impl RedisServer {
    async fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--loglevel", "notice"])
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("redis-server must be installed (apt install redis-server)");
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let ready = tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if line.contains("Ready to accept connections") {
                    return true;
                }
            }
            false
        })
        .await;
        assert_eq!(ready, Ok(true), "redis-server did not start on port {port}");
        // Keep draining its output so it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        RedisServer {
            child,
            url: format!("redis://127.0.0.1:{port}/"),
        }
    }

    async fn kill(mut self) {
        self.child.kill().await.unwrap();
    }
}

#[tokio::test]
async fn backend_down_answers_503_or_fails_open() {
    let redis = RedisServer::start().await;
    let backend = RedisBackend::builder(&redis.url)
        .connect_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    let locker = Locker::builder(backend).build();
    let closed = LockLayer::new(locker.clone(), HeaderKey::new(KEY)).wait(Duration::from_secs(2));
    let open = closed.clone().fail_open();
    let closed_metrics = closed.metrics();
    let closed = closed.layer(echo_lock_key());
    let open = open.layer(echo_lock_key());

    // Up: locked as usual.
    let response = closed.clone().oneshot(request(Some("r"))).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(text(response.into_body()).await, "r");

    redis.kill().await;

    let response = closed.oneshot(request(Some("r"))).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "1");
    let body = json(response.into_body()).await;
    assert_eq!(body["type"], "urn:lock-tower:lock-unavailable");
    assert!(
        !body.to_string().contains("127.0.0.1"),
        "backend details leaked: {body}"
    );

    // Failing open: the handler runs, without a lock. Clones of a layer share their metrics.
    let response = open.oneshot(request(Some("r"))).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(text(response.into_body()).await, "-");
    let m = closed_metrics.snapshot();
    assert_eq!(
        (m.rejected_unavailable, m.failed_open, m.requests_locked),
        (1, 1, 1)
    );
}
