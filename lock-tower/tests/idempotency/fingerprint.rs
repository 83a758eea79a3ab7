//! One record per key value (and principal): the fingerprint alone tells two requests under
//! one key apart, so it must never give two different requests the same bytes to hash, and
//! every field of a request (method, route, path, query, body, principal) must count.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lock_core::Locker;
use lock_tower::IdempotencyLayer;
use lock_tower::extract::HeaderKey;

use crate::common::summary;
use tower::{Layer as _, ServiceExt as _};

fn request(
    method: &str,
    uri: &str,
    key: &str,
    body: &'static str,
) -> http::Request<axum::body::Body> {
    http::Request::builder()
        .method(method)
        .uri(uri)
        .header("idempotency-key", key)
        .body(axum::body::Body::from(body))
        .unwrap()
}

/// [`summary`] of `service`'s answer to [`request`]`(method, uri, key, body)`.
async fn send<S, B>(
    service: S,
    (method, uri, key, body): (&str, &str, &str, &'static str),
) -> (u16, String, bool)
where
    S: tower::Service<http::Request<axum::body::Body>, Response = http::Response<B>>,
    S::Error: std::fmt::Debug,
    B: http_body::Body<Error: std::fmt::Debug>,
{
    summary(
        service
            .oneshot(request(method, uri, key, body))
            .await
            .unwrap(),
    )
    .await
}

/// A handler that counts its calls and names itself.
fn counting(name: &'static str, calls: &Arc<AtomicUsize>) -> axum::routing::MethodRouter {
    let calls = calls.clone();
    axum::routing::post(move |body: String| async move {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        (
            http::StatusCode::CREATED,
            format!("{name} #{n} for {body:?}"),
        )
    })
}

/// A request seen without a route (a layer outside a Router, a plain tower or hyper service, a
/// build without the `axum` feature) sharing a locker with a routed one: their fingerprints
/// never meet. Found by review: the fingerprint hashed `method \n [route \n] path?query \n
/// body`, with nothing to say whether the route was there, so an unrouted request whose body
/// began with "<path>\n" was answered with a routed request's record, or the other way round.
#[tokio::test]
async fn a_request_without_a_matched_route_never_shares_a_fingerprint_with_a_routed_one() {
    let locker = Locker::memory();
    let calls = Arc::new(AtomicUsize::new(0));
    // Service A: the layer inside the router (MatchedPath "/pay").
    let inside = axum::Router::new()
        .route("/pay", counting("A", &calls))
        .layer(IdempotencyLayer::new(locker.clone()));
    // Service B: the same locker, the layer outside its router (no MatchedPath yet).
    let outside = IdempotencyLayer::new(locker.clone())
        .layer(axum::Router::new().route("/pay", counting("B", &calls)));

    // B: POST /pay, body "/pay\n10 EUR": hashed "POST\n/pay\n/pay\n10 EUR" before.
    let b = send(outside, ("POST", "/pay", "k", "/pay\n10 EUR")).await;
    assert_eq!(b, (201, "B #1 for \"/pay\\n10 EUR\"".into(), false));
    // A: POST /pay, body "10 EUR": "POST\n" "/pay\n" "/pay" "\n" "10 EUR", the same bytes.
    let a = send(inside, ("POST", "/pay", "k", "10 EUR")).await;
    assert_eq!(
        (a.0, a.2),
        (422, false),
        "another request (another body, another service) answered with B's record: {a:?}"
    );
}

/// The same with a route parameter: `POST /items/42` (route `/items/{id}`) and an unrouted
/// `POST /items/{id}` with the body "/items/42\n10 EUR" are two requests (their record keys
/// differed while they held the path; now only the fingerprint tells them apart).
#[tokio::test]
async fn a_parametrized_route_never_shares_a_fingerprint_with_an_unrouted_request() {
    let locker = Locker::memory();
    let calls = Arc::new(AtomicUsize::new(0));
    let inside = axum::Router::new()
        .route("/items/{id}", counting("A", &calls))
        .layer(IdempotencyLayer::new(locker.clone()));
    let outside = IdempotencyLayer::new(locker.clone()).layer(axum::Router::new().fallback(
        axum::routing::post(|| async { (http::StatusCode::CREATED, "B: unrouted") }),
    ));
    let b = send(outside, ("POST", "/items/{id}", "k", "/items/42\n10 EUR")).await;
    assert_eq!(b, (201, "B: unrouted".into(), false));
    let a = send(inside, ("POST", "/items/42", "k", "10 EUR")).await;
    assert_eq!((a.0, a.2), (422, false), "{a:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// Another request (another method) under the key of one still running: 409 at once, or with
/// `.wait(d)` the wait ends in 422, never in the first request's answer; the handler runs once.
#[tokio::test]
async fn another_request_under_a_running_key_gets_409_or_422_after_waiting() {
    for wait in [false, true] {
        let calls = Arc::new(AtomicUsize::new(0));
        let (started_tx, started) = tokio::sync::mpsc::unbounded_channel::<()>();
        let go = Arc::new(tokio::sync::Notify::new());
        let handler = {
            let (calls, go) = (calls.clone(), go.clone());
            move || {
                let (calls, go, started_tx) = (calls.clone(), go.clone(), started_tx.clone());
                async move {
                    let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                    let _ = started_tx.send(());
                    go.notified().await;
                    (http::StatusCode::CREATED, format!("#{n}"))
                }
            }
        };
        let layer = IdempotencyLayer::new(Locker::memory());
        let layer = if wait {
            layer.wait(Duration::from_secs(10))
        } else {
            layer
        };
        let app = axum::Router::new()
            .route("/pay", axum::routing::post(handler.clone()).put(handler))
            .layer(layer);
        let first = tokio::spawn(app.clone().oneshot(request("POST", "/pay", "k", "x")));
        let mut started = started;
        started
            .recv()
            .await
            .expect("the first request's handler started");
        let put = tokio::spawn(app.clone().oneshot(request("PUT", "/pay", "k", "x")));
        if !wait {
            let put = summary(put.await.unwrap().unwrap()).await;
            assert_eq!((put.0, put.2), (409, false), "{put:?}");
            go.notify_one();
            let first = summary(first.await.unwrap().unwrap()).await;
            assert_eq!(first, (201, "#1".into(), false));
        } else {
            go.notify_one();
            let first = summary(first.await.unwrap().unwrap()).await;
            assert_eq!(first, (201, "#1".into(), false));
            let put = summary(put.await.unwrap().unwrap()).await;
            assert_eq!((put.0, put.2), (422, false), "{put:?}");
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1, "wait {wait}");
    }
}

/// The query and the principal count, and a key too long to keep as it is (hashed) keeps one
/// record like a short one: another query, path or route under it is 422, another principal
/// has a record of its own.
#[tokio::test]
async fn query_principal_and_long_keys_keep_requests_apart() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = axum::Router::new()
        .route("/pay", counting("P", &calls))
        .route("/refund", counting("R", &calls))
        .layer(IdempotencyLayer::new(Locker::memory()).scope(HeaderKey::new("x-tenant")));
    let long = "x".repeat(4000);
    let post = |uri: &str, key: &str, tenant: &str| {
        let mut r = request("POST", uri, key, "b");
        r.headers_mut().insert("x-tenant", tenant.parse().unwrap());
        app.clone().oneshot(r)
    };
    let first = summary(post("/pay?a=1", &long, "t1").await.unwrap()).await;
    assert_eq!(first.0, 201);
    let retry = summary(post("/pay?a=1", &long, "t1").await.unwrap()).await;
    assert!(retry.2, "{retry:?}");
    assert_eq!(
        summary(post("/pay?a=2", &long, "t1").await.unwrap())
            .await
            .0,
        422
    );
    assert_eq!(
        summary(post("/pay", &long, "t1").await.unwrap()).await.0,
        422
    );
    assert_eq!(
        summary(post("/refund?a=1", &long, "t1").await.unwrap())
            .await
            .0,
        422
    );
    // Another principal, the same key and path: its own record.
    assert_eq!(
        summary(post("/refund?a=1", &long, "t2").await.unwrap()).await,
        (201, "R #2 for \"b\"".into(), false)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}
