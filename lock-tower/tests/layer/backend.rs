//! A lock backend that fails: a real redis-server, killed. 503 when failing closed; the
//! request runs unlocked when failing open.

use std::time::Duration;

use http::StatusCode;
use lock_core::{Locker, RedisBackend};
use lock_testkit::RedisServer;
use lock_tower::LockLayer;
use lock_tower::extract::HeaderKey;
use tower::{Layer, ServiceExt};

use crate::common::{KEY, echo_lock_key, json, request, text};

#[tokio::test]
async fn backend_down_answers_503_or_fails_open() {
    let mut redis = RedisServer::start();
    let backend = RedisBackend::builder(&redis.url())
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

    redis.stop();

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
