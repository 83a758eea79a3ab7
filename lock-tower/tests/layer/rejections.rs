//! 409 busy and wait timeout, missing and invalid keys, custom answers, misconfiguration.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use lock_core::{Locker, MemoryBackend};
use lock_tower::extract::HeaderKey;
use lock_tower::{LockLayer, Rejection};
use tower::{Layer, ServiceBuilder, ServiceExt};

use crate::common::{KEY, Probe, TestService, echo_lock_key, json, request, text};

fn counting(probe: &Arc<Probe>) -> impl TestService {
    let probe = probe.clone();
    tower::service_fn(move |_req: Request<String>| {
        let probe = probe.clone();
        async move {
            let _inside = probe.enter();
            Ok::<_, Infallible>(Response::new(String::from("ran")))
        }
    })
}

fn retry_after(response: &Response<impl Sized>) -> u64 {
    response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn busy_key_in_reject_mode_answers_409_with_retry_after() {
    let locker = Locker::builder(MemoryBackend::new())
        .lease(Duration::from_secs(5))
        .build();
    let probe = Arc::new(Probe::default());
    let layer = LockLayer::new(locker.clone(), HeaderKey::new(KEY))
        .key_prefix("k:")
        .reject_when_busy();
    let metrics = layer.metrics();
    let svc = layer.layer(counting(&probe));
    let _held = locker.lock("k:secret-value").await.unwrap();

    let response = svc.oneshot(request(Some("secret-value"))).await.unwrap();
    assert_eq!(response.status(), StatusCode::CONFLICT);
    let secs = retry_after(&response);
    assert!(
        (1..=5).contains(&secs),
        "Retry-After {secs} is not the holder's remaining lease"
    );
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    assert_eq!(response.headers()["cache-control"], "no-store");
    let body = text(response.into_body()).await;
    assert!(
        !body.contains("secret-value"),
        "the body echoes the key: {body}"
    );
    let problem: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(problem["type"], "urn:lock-tower:busy");
    assert_eq!(problem["status"], 409);
    assert!(problem["title"].is_string() && problem["detail"].is_string());
    assert_eq!(probe.calls(), 0);
    assert_eq!(metrics.snapshot().rejected_busy, 1);
}

#[tokio::test]
async fn wait_timeout_answers_409() {
    let locker = Locker::memory();
    let probe = Arc::new(Probe::default());
    let layer = LockLayer::new(locker.clone(), HeaderKey::new(KEY)).wait(Duration::from_millis(50));
    let metrics = layer.metrics();
    let svc = layer.layer(counting(&probe));
    let _held = locker.lock("t").await.unwrap();

    let response = svc.oneshot(request(Some("t"))).await.unwrap();
    assert_eq!(response.status(), StatusCode::CONFLICT);
    assert_eq!(retry_after(&response), 1);
    let problem = json(response.into_body()).await;
    assert_eq!(problem["type"], "urn:lock-tower:wait-timeout");
    assert_eq!(probe.calls(), 0);
    assert_eq!(metrics.snapshot().rejected_timeout, 1);
    // The timed-out waiter left lock-core's queue.
    assert_eq!(locker.stats().waiters, 0);
}

#[tokio::test]
async fn missing_or_empty_key_passes_through_unlocked() {
    let layer = LockLayer::new(Locker::memory(), HeaderKey::new(KEY));
    let metrics = layer.metrics();
    let svc = layer.layer(echo_lock_key());
    for req in [request(None), request(Some(""))] {
        let response = svc.clone().oneshot(req).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            text(response.into_body()).await,
            "-",
            "the request was locked"
        );
    }
    let m = metrics.snapshot();
    assert_eq!((m.passed_through, m.requests_locked), (2, 0));
}

#[tokio::test]
async fn require_key_answers_400_without_a_key() {
    let probe = Arc::new(Probe::default());
    let layer = LockLayer::new(Locker::memory(), HeaderKey::new(KEY)).require_key();
    let metrics = layer.metrics();
    let svc = layer.layer(counting(&probe));
    for req in [request(None), request(Some(""))] {
        let response = svc.clone().oneshot(req).await.unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        assert!(response.headers().get("retry-after").is_none());
        let problem = json(response.into_body()).await;
        assert_eq!(problem["type"], "urn:lock-tower:missing-key");
        assert_eq!(problem["status"], 400);
    }
    let ok = svc.oneshot(request(Some("k"))).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(probe.calls(), 1);
    assert_eq!(metrics.snapshot().rejected_bad_key, 2);
}

#[tokio::test]
async fn key_header_sent_twice_answers_400() {
    let probe = Arc::new(Probe::default());
    let svc = LockLayer::new(Locker::memory(), HeaderKey::new(KEY)).layer(counting(&probe));
    let req = Request::post("/")
        .header(KEY, "a")
        .header(KEY, "b")
        .body(String::new())
        .unwrap();
    let response = svc.oneshot(req).await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        json(response.into_body()).await["type"],
        "urn:lock-tower:invalid-key"
    );
    assert_eq!(probe.calls(), 0);
}

#[tokio::test]
async fn custom_rejection_handler_replaces_the_answer() {
    let locker = Locker::memory();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let layer = LockLayer::new(locker.clone(), HeaderKey::new(KEY))
        .reject_when_busy()
        .require_key()
        .on_rejection({
            let seen = seen.clone();
            move |rejection: &Rejection| {
                seen.lock().unwrap().push(rejection.problem_type());
                let mut response = rejection.to_response();
                if let Rejection::Busy { .. } = rejection {
                    *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                    *response.body_mut() = String::from("slow down");
                }
                response
            }
        });
    let metrics = layer.metrics();
    let svc = ServiceBuilder::new().layer(layer).service(echo_lock_key());
    let _held = locker.lock("c").await.unwrap();

    let busy = svc.clone().oneshot(request(Some("c"))).await.unwrap();
    assert_eq!(busy.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(
        retry_after(&busy) >= 1,
        "the default's Retry-After was kept"
    );
    assert_eq!(text(busy.into_body()).await, "slow down");
    let missing = svc.oneshot(request(None)).await.unwrap();
    assert_eq!(missing.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        *seen.lock().unwrap(),
        ["urn:lock-tower:busy", "urn:lock-tower:missing-key"]
    );
    // Counted like default rejections.
    assert_eq!(metrics.snapshot().rejections(), 2);
}

/// An invalid locker configuration is the server's fault: 500, never passed through, even when
/// failing open (that is for outages, and would silently disable locking here).
#[tokio::test]
async fn invalid_locker_config_answers_500_even_when_failing_open() {
    let locker = Locker::builder(MemoryBackend::new())
        .prefix("bad{prefix")
        .build();
    let probe = Arc::new(Probe::default());
    let layer = LockLayer::new(locker, HeaderKey::new(KEY)).fail_open();
    let metrics = layer.metrics();
    let svc = layer.layer(counting(&probe));
    let response = svc.oneshot(request(Some("k"))).await.unwrap();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let body = text(response.into_body()).await;
    assert!(
        !body.contains("prefix"),
        "configuration details leaked: {body}"
    );
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body).unwrap()["type"],
        "urn:lock-tower:misconfigured"
    );
    assert_eq!(probe.calls(), 0);
    let m = metrics.snapshot();
    assert_eq!((m.rejected_misconfigured, m.failed_open), (1, 0));
}

#[tokio::test]
async fn invalid_header_name_answers_500_instead_of_panicking() {
    let probe = Arc::new(Probe::default());
    let svc =
        LockLayer::new(Locker::memory(), HeaderKey::new("not a header\n")).layer(counting(&probe));
    let response = svc.oneshot(request(Some("k"))).await.unwrap();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(probe.calls(), 0);
}

/// The service's own errors are not rejections: they pass through untouched, and the lock is
/// released.
#[tokio::test]
async fn service_errors_pass_through_and_release_the_lock() {
    #[derive(Debug, PartialEq)]
    struct Boom;
    let locker = Locker::memory();
    let svc = LockLayer::new(locker.clone(), HeaderKey::new(KEY)).layer(tower::service_fn(
        |_req: Request<String>| async { Err::<Response<String>, _>(Boom) },
    ));
    let error = svc.oneshot(request(Some("e"))).await.unwrap_err();
    assert_eq!(error, Boom);
    assert!(locker.try_lock("e").await.is_ok());
}
