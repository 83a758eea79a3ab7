//! Issue 29, item 15: what a layer over a whole router stores for requests that never reached
//! a handler, and which key header values name the same key.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::Body;
use axum::extract::Path;
use axum::routing::post;
use http::{Request, StatusCode};
use lock_core::{Locker, MemoryBackend};
use lock_tower::IdempotencyLayer;
use tower::ServiceExt;

/// `POST /orders/{id}` (an extractor: the id is a number, the body UTF-8) behind a layer on
/// the whole router; the handler answers the status its body names, counting its runs.
fn app() -> (Router, MemoryBackend, Arc<AtomicUsize>) {
    let backend = MemoryBackend::new();
    let locker = Locker::builder(backend.clone()).build();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let handler = move |Path(id): Path<u64>, body: String| {
        let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            let status = body.parse().map_or(StatusCode::CREATED, |s| {
                StatusCode::from_u16(s).unwrap_or(StatusCode::CREATED)
            });
            (status, format!("order {id}, run {n}"))
        }
    };
    let app = Router::new()
        .route("/orders/{id}", post(handler))
        .layer(IdempotencyLayer::new(locker));
    (app, backend, runs)
}

fn request(method: &str, path: &str, key: &str, body: impl Into<Body>) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(path)
        .header("idempotency-key", key)
        .body(body.into())
        .unwrap()
}

/// Responses to requests that failed before they were processed (the router's 404 and 405,
/// an extractor's 400) are not stored: a layer over a whole router would keep one for 24 h
/// for every key anyone sends to any path. Before: each was stored and replayed.
#[tokio::test]
async fn answers_to_requests_that_reached_no_handler_are_not_stored() {
    let (app, backend, runs) = app();
    let cases = [
        (request("POST", "/nowhere", "k1", "x"), 404),
        (request("GET", "/orders/1", "k2", ""), 405),
        (request("POST", "/orders/one", "k3", "x"), 400),
        (request("POST", "/orders/1", "k4", vec![0xff_u8, 0xfe]), 400),
    ];
    for (i, (req, status)) in cases.into_iter().enumerate() {
        let answer = app.clone().oneshot(req).await.unwrap();
        assert_eq!(answer.status(), status, "case {i}");
        assert!(!answer.headers().contains_key("idempotent-replayed"));
        assert_eq!(backend.record_count(), 0, "case {i}: stored");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "no handler ran");
}

/// The handler's own 4xx answers: 409 or 422 are its verdict, stored and replayed; its 404 or
/// 400 cannot be told from the router's, so they are not stored and a retry runs again.
#[tokio::test]
async fn a_handlers_verdict_is_stored_and_its_400_or_404_is_not() {
    for (status, stored) in [(409, true), (422, true), (404, false), (400, false)] {
        let (app, backend, runs) = app();
        let post = || request("POST", "/orders/1", "k", status.to_string());
        let first = app.clone().oneshot(post()).await.unwrap();
        assert_eq!(first.status(), status);
        let retry = app.oneshot(post()).await.unwrap();
        assert_eq!(retry.status(), status);
        assert_eq!(
            retry.headers().contains_key("idempotent-replayed"),
            stored,
            "{status}"
        );
        assert_eq!(backend.record_count(), usize::from(stored), "{status}");
        let expected_runs = if stored { 1 } else { 2 };
        assert_eq!(runs.load(Ordering::SeqCst), expected_runs, "{status}");
    }
}

/// `POST {path}` with the key header `key` and the body `pay`.
async fn pay(app: &Router, path: &str, key: &str) -> axum::response::Response {
    app.clone()
        .oneshot(request("POST", path, key, "pay"))
        .await
        .unwrap()
}

/// The IETF draft's sf-string (`"abc"`) and the bare value (`abc`) are one key: a retry is
/// replayed whichever way it is written. Before: two keys, and the handler ran twice.
#[tokio::test]
async fn a_quoted_key_and_the_bare_key_are_one_key() {
    let (app, _, runs) = app();
    // Escapes are undone: `"a\"b"` is the key `a"b`.
    for (path, keys) in [
        ("/orders/1", [r#""abc""#, "abc", r#""abc""#]),
        ("/orders/2", [r#""a\"b""#, r#"a"b"#, r#""a\"b""#]),
    ] {
        for (i, key) in keys.into_iter().enumerate() {
            let answer = pay(&app, path, key).await;
            assert_eq!(answer.status(), 201, "{key}");
            let replayed = answer.headers().contains_key("idempotent-replayed");
            assert_eq!(replayed, i > 0, "{key}");
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A malformed sf-string is 400 `invalid-key`, and nothing runs.
#[tokio::test]
async fn a_malformed_quoted_key_is_400() {
    let (app, backend, runs) = app();
    for key in [r#""abc"#, r#""""#, r#""a\b""#, r#""abc"x"#, r#""abc";p=1"#] {
        let answer = pay(&app, "/orders/1", key).await;
        assert_eq!(answer.status(), 400, "{key}");
        let body = http_body_util::BodyExt::collect(answer.into_body())
            .await
            .unwrap()
            .to_bytes();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["type"], "urn:lock-tower:invalid-key", "{key}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(backend.record_count(), 0);
}

/// Answers that say the request was not processed and ask the client to retry it (421
/// Misdirected Request and 425 Too Early, which user agents retry on their own, with the same
/// key), or to send it again with a header the fingerprint does not cover (411 Length
/// Required, 417 Expectation Failed, 428 Precondition Required) are not stored: a replay
/// would answer every such retry with the same refusal until the record expires. Review of
/// issue 29, item 15: they were stored and replayed.
#[tokio::test]
async fn refusals_that_ask_for_a_retry_are_not_stored() {
    for status in [411, 417, 421, 425, 428] {
        let (app, backend, runs) = app();
        let post = || request("POST", "/orders/1", "k", status.to_string());
        assert_eq!(app.clone().oneshot(post()).await.unwrap().status(), status);
        let retry = app.oneshot(post()).await.unwrap();
        assert!(
            !retry.headers().contains_key("idempotent-replayed"),
            "{status} replayed"
        );
        assert_eq!(backend.record_count(), 0, "{status} stored");
        assert_eq!(runs.load(Ordering::SeqCst), 2, "{status}");
    }
}

/// A 307 or 308 redirect says "send this request there": the client sends it again, method,
/// body and headers (the key too) kept, to another path. Not stored, so that request runs
/// there; stored, it was a key reused for another request (422), and the request never ran.
/// (A 301, 302 or 303 may follow work done, as after a form post: those are stored.) Review
/// of issue 29, item 15.
#[tokio::test]
async fn a_redirect_that_keeps_the_method_is_not_stored() {
    for status in [
        StatusCode::TEMPORARY_REDIRECT,
        StatusCode::PERMANENT_REDIRECT,
    ] {
        let backend = MemoryBackend::new();
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = runs.clone();
        let app = Router::new()
            .route(
                "/v1/orders",
                post(move || async move { (status, [("location", "/v2/orders")]) }),
            )
            .route(
                "/v2/orders",
                post(move |body: String| {
                    counted.fetch_add(1, Ordering::SeqCst);
                    async move { (StatusCode::CREATED, body) }
                }),
            )
            .layer(IdempotencyLayer::new(
                Locker::builder(backend.clone()).build(),
            ));
        let moved = pay(&app, "/v1/orders", "k").await;
        assert_eq!(moved.status(), status);
        let followed = pay(&app, "/v2/orders", "k").await;
        assert_eq!(followed.status(), StatusCode::CREATED, "{status} then");
        assert_eq!(backend.record_count(), 1, "only the 201");
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}
