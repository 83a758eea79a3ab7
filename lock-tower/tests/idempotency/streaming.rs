//! Response bodies longer than a record holds, and the key header: several keys in it, another
//! name for it.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use lock_core::{Locker, MAX_RESULT_LEN};
use lock_tower::IdempotencyLayer;
use tower::ServiceExt;

const LIMIT: usize = MAX_RESULT_LEN;

/// A body of given chunks, optionally with an exact size hint (of what is left) or a
/// custom one, and optional trailers.
struct Chunks {
    left: VecDeque<Bytes>,
    hint: Hint,
    trailers: Option<HeaderMap>,
    produced: Arc<AtomicUsize>,
}

#[derive(Clone, Copy)]
enum Hint {
    None,
    Exact,
    Upper(u64),
}

impl Chunks {
    fn new(sizes: &[usize], hint: Hint) -> Self {
        let mut n = 0u8;
        let left = sizes
            .iter()
            .map(|&s| {
                let c: Vec<u8> = (0..s)
                    .map(|_| {
                        n = n.wrapping_add(1);
                        n
                    })
                    .collect();
                Bytes::from(c)
            })
            .collect();
        Chunks {
            left,
            hint,
            trailers: None,
            produced: Arc::default(),
        }
    }
    fn all(&self) -> Bytes {
        Bytes::from(
            self.left
                .iter()
                .flat_map(|c| c.to_vec())
                .collect::<Vec<u8>>(),
        )
    }
}

impl Body for Chunks {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Some(c) = self.left.pop_front() {
            self.produced.fetch_add(1, Ordering::SeqCst);
            return Poll::Ready(Some(Ok(Frame::data(c))));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.left.is_empty() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        let left: u64 = self.left.iter().map(|c| c.len() as u64).sum();
        match self.hint {
            Hint::None => SizeHint::default(),
            Hint::Exact => SizeHint::with_exact(left),
            Hint::Upper(u) => {
                let mut h = SizeHint::new();
                h.set_upper(u);
                h
            }
        }
    }
}

fn post(key_lines: &[&str]) -> Request<axum::body::Body> {
    let mut b = Request::post("/x");
    for k in key_lines {
        b = b.header("idempotency-key", *k);
    }
    b.body(axum::body::Body::empty()).unwrap()
}

/// A router whose handler answers the body `make()` builds, counting calls.
fn app(
    layer: IdempotencyLayer,
    make: impl Fn() -> axum::response::Response + Clone + Send + Sync + 'static,
) -> (axum::Router, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let handler = move || {
        let c = c.clone();
        let make = make.clone();
        async move {
            c.fetch_add(1, Ordering::SeqCst);
            make()
        }
    };
    let app = axum::Router::new()
        .route("/x", axum::routing::post(handler))
        .layer(layer);
    (app, calls)
}

fn ok_text() -> axum::response::Response {
    axum::response::Response::new(axum::body::Body::from("ok"))
}

/// RFC 9110 5.3: `k: a` + `k: b` is the same as `k: a, b` (an intermediary may join them),
/// and under the IETF draft (the key is one sf-string, RFC 8941) neither is a key: both are
/// 400, and nothing runs. A comma inside a quoted key is part of that one key.
#[tokio::test]
async fn a_key_line_listing_two_keys_is_400_like_two_lines() {
    let (app, calls) = app(IdempotencyLayer::new(Locker::memory()), ok_text);
    let two_lines = app.clone().oneshot(post(&["a", "b"])).await.unwrap();
    assert_eq!(two_lines.status(), 400);
    let one_line = app.clone().oneshot(post(&["a, b"])).await.unwrap();
    assert_eq!(
        one_line.status(),
        400,
        "the merged form of the same two keys ran the handler ({} calls)",
        calls.load(Ordering::SeqCst)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    let quoted = app.oneshot(post(&["\"a, b\""])).await.unwrap();
    assert_eq!(quoted.status(), 200, "one quoted key with a comma in it");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A streamed body (no size hint) whose response says `Content-Length: 2 MiB` goes out at
/// once: nothing of it is read for a record it cannot fit in.
#[tokio::test]
async fn a_content_length_over_the_limit_streams_at_once() {
    let (feed, body) = fed_body(1);
    let make = move || {
        let mut r = axum::response::Response::new(body());
        r.headers_mut().insert(
            http::header::CONTENT_LENGTH,
            HeaderValue::from(2 * LIMIT as u64),
        );
        r
    };
    let (app, _) = app(IdempotencyLayer::new(Locker::memory()), make);
    let answered = tokio::time::timeout(Duration::from_secs(2), app.oneshot(post(&["k"]))).await;
    drop(feed);
    assert!(
        answered.is_ok(),
        "Content-Length says 2 MiB, yet the response is held back until 1 MiB is read"
    );
}

/// A body whose hint says "at most u64::MAX" (valid, if useless): once its head is read, the
/// size hint of what goes out (head + rest) saturates instead of overflowing (hyper asks every
/// response body for it).
#[tokio::test]
async fn a_huge_size_hint_upper_bound_does_not_overflow() {
    let make = || {
        axum::response::Response::new(axum::body::Body::new(Chunks::new(
            &[LIMIT + 1, 10],
            Hint::Upper(u64::MAX),
        )))
    };
    let (app, _) = app(IdempotencyLayer::new(Locker::memory()), make);
    let response = app.oneshot(post(&["k"])).await.unwrap();
    let hint =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| response.body().size_hint()));
    assert!(hint.is_ok(), "size_hint panicked");
}

/// With `detach_handler` the handler runs to its end whether the client listens or not, and so
/// does a body longer than a record: a task reads it to its end after the client went away
/// (the record says it ran: a retry gets 409).
#[tokio::test]
async fn a_detached_handlers_long_body_is_read_to_its_end_when_the_client_leaves() {
    let produced = Arc::new(AtomicUsize::new(0));
    let p = produced.clone();
    let make = move || {
        let mut body = Chunks::new(&[64 * 1024; 40], Hint::None);
        body.produced = p.clone();
        axum::response::Response::new(axum::body::Body::new(body))
    };
    let (app, _) = app(
        IdempotencyLayer::new(Locker::memory()).detach_handler(),
        make,
    );
    let response = app.clone().oneshot(post(&["k"])).await.unwrap();
    drop(response); // the client went away after the head
    assert_eq!(
        app.oneshot(post(&["k"])).await.unwrap().status(),
        409,
        "recorded as ran"
    );
    let drained = async || produced.load(Ordering::SeqCst) == 40;
    lock_testkit::eventually(
        "the detached handler's body read to its end",
        Duration::from_secs(10),
        drained,
    )
    .await;
}

/// Header names are case-insensitive: two lines spelled differently are still two keys.
#[tokio::test]
async fn a_key_repeated_in_any_case_is_400_and_runs_nothing() {
    let (app, calls) = app(IdempotencyLayer::new(Locker::memory()), ok_text);
    let r = Request::post("/x")
        .header("Idempotency-Key", "a")
        .header("IDEMPOTENCY-KEY", "a")
        .body(axum::body::Body::empty())
        .unwrap();
    assert_eq!(app.clone().oneshot(r).await.unwrap().status(), 400);
    // An empty first line and a real second one is still two lines.
    assert_eq!(app.oneshot(post(&["", "a"])).await.unwrap().status(), 400);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// Byte-exact bodies over real HTTP/1 (hyper checks Content-Length against the body) at the
/// edges: limit-1, limit, limit+1, odd chunk sizes, exact and unknown hints, empty head.
#[tokio::test]
async fn bodies_at_the_limits_edges_are_byte_exact_over_hyper() {
    let cases: Vec<(Vec<usize>, Hint)> = vec![
        (vec![LIMIT - 1], Hint::None),
        (vec![LIMIT], Hint::None),
        (vec![LIMIT], Hint::Exact),
        (vec![LIMIT + 1], Hint::None),
        (vec![LIMIT + 1], Hint::Exact), // head empty: size hint says over
        (vec![LIMIT, 1], Hint::None),
        (vec![LIMIT, 1], Hint::Exact),
        (vec![LIMIT, 0, 1], Hint::Exact),
        (vec![7777; LIMIT / 7777 + 3], Hint::None),
        (vec![7777; LIMIT / 7777 + 3], Hint::Exact),
        (vec![1, LIMIT, 1, 1], Hint::Exact),
    ];
    for (i, (sizes, hint)) in cases.into_iter().enumerate() {
        let expected = Chunks::new(&sizes, hint).all();
        let s = sizes.clone();
        let make =
            move || axum::response::Response::new(axum::body::Body::new(Chunks::new(&s, hint)));
        let (app, calls) = app(IdempotencyLayer::new(Locker::memory()), make);
        let (client, addr) = over_http1(app).await;
        let req = || {
            Request::post(format!("http://{addr}/x"))
                .header("idempotency-key", "k")
                .body(Full::new(Bytes::new()))
                .unwrap()
        };
        let r = client.request(req()).await.unwrap();
        assert_eq!(r.status(), 200, "case {i}");
        let cl = r.headers().get("content-length").cloned();
        let body = r.into_body().collect().await.unwrap().to_bytes();
        assert!(
            body == expected,
            "case {i}: {} bytes vs {}",
            body.len(),
            expected.len()
        );
        if matches!(hint, Hint::Exact) {
            assert_eq!(
                cl.unwrap().to_str().unwrap(),
                expected.len().to_string(),
                "case {i}"
            );
        }
        let again = client.request(req()).await.unwrap();
        let want = if expected.len() < LIMIT - 1024 {
            200
        } else {
            409
        };
        assert_eq!(again.status(), want, "case {i}");
        assert_eq!(calls.load(Ordering::SeqCst), 1, "case {i}");
    }
}

/// Trailers of a body over the limit are passed on after the rest.
#[tokio::test]
async fn trailers_after_an_over_limit_body_pass_through() {
    let make = || {
        let mut b = Chunks::new(&[LIMIT, 5], Hint::None);
        let mut t = HeaderMap::new();
        t.insert("x-sum", HeaderValue::from_static("1"));
        b.trailers = Some(t);
        axum::response::Response::new(axum::body::Body::new(b))
    };
    let (app, _) = app(IdempotencyLayer::new(Locker::memory()), make);
    let r = app.oneshot(post(&["k"])).await.unwrap();
    let collected = r.into_body().collect().await.unwrap();
    assert!(
        collected
            .trailers()
            .is_some_and(|t| t.contains_key("x-sum"))
    );
    assert_eq!(collected.to_bytes().len(), LIMIT + 5);
}

/// 7 bytes (3 + 4), then trailers (`grpc-status: 0`, `x-sum: 1`, `x-sum: 2`) that its
/// `Trailer` header names.
fn with_trailers() -> axum::response::Response {
    let mut b = Chunks::new(&[3, 4], Hint::None);
    let mut t = HeaderMap::new();
    t.insert("grpc-status", HeaderValue::from_static("0"));
    t.append("x-sum", HeaderValue::from_static("1"));
    t.append("x-sum", HeaderValue::from_static("2"));
    b.trailers = Some(t);
    let mut r = axum::response::Response::new(axum::body::Body::new(b));
    r.headers_mut()
        .insert("trailer", HeaderValue::from_static("grpc-status, x-sum"));
    r
}

/// Trailers of a body short enough to store (gRPC's `grpc-status`) reach the first client and
/// every replay. Issue 29, item 12: the body was buffered for its record and re-sent without
/// them, to the first client too, while a longer body kept them.
#[tokio::test]
async fn trailers_of_a_stored_body_reach_the_first_client_and_every_replay() {
    let (app, calls) = app(IdempotencyLayer::new(Locker::memory()), with_trailers);
    let expected = Chunks::new(&[3, 4], Hint::None).all();
    for replayed in [false, true] {
        let r = app.clone().oneshot(post(&["k"])).await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers().contains_key("idempotent-replayed"), replayed);
        let collected = r.into_body().collect().await.unwrap();
        let trailers = collected.trailers().cloned().unwrap_or_default();
        assert_eq!(
            trailers.get("grpc-status").unwrap(),
            "0",
            "replayed: {replayed}"
        );
        let sums: Vec<_> = trailers.get_all("x-sum").iter().collect();
        assert_eq!(sums, ["1", "2"], "replayed: {replayed}");
        assert_eq!(collected.to_bytes(), expected);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A gRPC answer (HTTP 200) whose `grpc-status` is `code`: a trailer after a short body, or
/// a header with no body (gRPC's trailers-only form).
fn grpc(code: &'static str, trailers_only: bool) -> axum::response::Response {
    let mut status = HeaderMap::new();
    status.insert("grpc-status", HeaderValue::from_static(code));
    let mut b = Chunks::new(if trailers_only { &[] } else { &[5] }, Hint::None);
    let mut r = axum::response::Response::new(axum::body::Body::empty());
    if trailers_only {
        r.headers_mut().extend(status);
    } else {
        b.trailers = Some(status);
        r.headers_mut()
            .insert("trailer", HeaderValue::from_static("grpc-status"));
    }
    *r.body_mut() = axum::body::Body::new(b);
    r
}

/// A gRPC error is an HTTP 200 whose trailer (or header) says what HTTP would say with its
/// status: `UNAVAILABLE` (14) is a 503, `INTERNAL` (13) a 500, `UNIMPLEMENTED` (12) the
/// router's "no such method", `RESOURCE_EXHAUSTED` (8) a 429. Those are not stored, as their
/// HTTP statuses are not: a retry runs again. `OK` and a verdict such as `ALREADY_EXISTS` (6,
/// a 409) are stored and replayed. Review of issue 29, item 12: once its trailers were kept,
/// an `UNAVAILABLE` was stored and replayed to every retry for 24 h.
#[tokio::test]
async fn a_grpc_error_in_a_trailer_or_header_is_not_stored() {
    for trailers_only in [false, true] {
        for (code, stored) in [
            ("14", false),
            ("13", false),
            ("12", false),
            ("8", false),
            ("0", true),
            ("6", true),
        ] {
            let (app, calls) = app(IdempotencyLayer::new(Locker::memory()), move || {
                grpc(code, trailers_only)
            });
            for _ in 0..2 {
                let r = app.clone().oneshot(post(&["k"])).await.unwrap();
                let in_headers = r.headers().get("grpc-status").cloned();
                let collected = r.into_body().collect().await.unwrap();
                let got = in_headers.or_else(|| collected.trailers()?.get("grpc-status").cloned());
                assert_eq!(got.unwrap(), code);
            }
            let runs = if stored { 1 } else { 2 };
            assert_eq!(
                calls.load(Ordering::SeqCst),
                runs,
                "grpc-status {code}, trailers only: {trailers_only}"
            );
        }
    }
}

type Http1Client = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Full<Bytes>,
>;

/// Serves `app` over HTTP/1.1 (axum on hyper) on a loopback port: a client, and the address.
async fn over_http1(app: axum::Router) -> (Http1Client, std::net::SocketAddr) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    (client, addr)
}

/// Over HTTP/1.1 a stored body's trailers go out after it, chunked, first and on replay:
/// its length is not declared (a `Content-Length` leaves trailers no place) and its `Trailer`
/// header, which names them and without which hyper sends none, is stored with it (RFC 9110
/// 6.6.2: an end-to-end field).
#[tokio::test]
async fn trailers_of_a_stored_body_cross_http1() {
    let (app, calls) = app(IdempotencyLayer::new(Locker::memory()), with_trailers);
    let (client, addr) = over_http1(app).await;
    for replayed in [false, true] {
        let request = Request::post(format!("http://{addr}/x"))
            .header("idempotency-key", "k")
            .header("te", "trailers")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let r = client.request(request).await.unwrap();
        assert_eq!(r.headers().contains_key("idempotent-replayed"), replayed);
        let collected = r.into_body().collect().await.unwrap();
        let status = collected.trailers().and_then(|t| t.get("grpc-status"));
        assert_eq!(status.unwrap(), "0", "replayed: {replayed}");
        assert_eq!(collected.to_bytes().len(), 7);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A response body the test feeds chunk by chunk (no size hint); it ends when its sender is
/// dropped.
struct Feed(tokio::sync::mpsc::Receiver<Bytes>);

impl Body for Feed {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.0.poll_recv(cx).map(|c| c.map(|c| Ok(Frame::data(c))))
    }
}

/// The sender of a [`Feed`], and a maker of the one response body it feeds (for a handler
/// that runs once).
fn fed_body(
    capacity: usize,
) -> (
    tokio::sync::mpsc::Sender<Bytes>,
    impl Fn() -> axum::body::Body + Clone + Send + Sync + 'static,
) {
    let (feed, fed) = tokio::sync::mpsc::channel(capacity);
    let fed = Arc::new(std::sync::Mutex::new(Some(fed)));
    let body = move || {
        let fed = fed.lock().unwrap().take().expect("the handler runs once");
        axum::body::Body::new(Feed(fed))
    };
    (feed, body)
}

/// A response body longer than a record holds (a large download, an endless stream) is read
/// only up to `MAX_RESULT_LEN`: the response goes out while the handler still streams it, in
/// order, and the key is recorded "ran, not stored" at once (a duplicate gets 409, never a
/// second run). Before, the layer read the whole body first: this response never went out,
/// and memory grew with the stream.
#[tokio::test]
async fn a_response_longer_than_a_record_streams_on_and_is_never_buffered_whole() {
    let (feed, body) = fed_body(4);
    let make = move || axum::response::Response::new(body());
    let (app, calls) = app(IdempotencyLayer::new(Locker::memory()), make);
    let request = || post(&["k"]);
    const CHUNK: usize = 64 * 1024;
    let chunk = |i: usize| Bytes::from(vec![(i % 251) as u8; CHUNK]);
    // One chunk more than a record holds, and the stream stays open.
    let over = LIMIT / CHUNK + 1;
    let first = tokio::spawn(app.clone().oneshot(request()));
    for i in 0..over {
        feed.send(chunk(i)).await.unwrap();
    }
    let response = tokio::time::timeout(Duration::from_secs(10), first)
        .await
        .expect("the response goes out while its body still streams")
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), 200);
    let again = app.clone().oneshot(request()).await.unwrap();
    assert_eq!(again.status(), 409, "a duplicate while the first streams");
    let more = over + 3;
    for i in over..more {
        feed.send(chunk(i)).await.unwrap();
    }
    drop(feed);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body.len(), more * CHUNK);
    for (i, part) in body.chunks(CHUNK).enumerate() {
        assert!(
            part.iter().all(|b| *b == (i % 251) as u8),
            "chunk {i} out of order"
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let after = app.oneshot(request()).await.unwrap();
    assert_eq!(after.status(), 409, "a retry after the stream ended");
}

/// `.header(name)` takes the key from another header, named by a `&str` (or a `HeaderName`):
/// its retries are replayed, and the default header is no longer read. A name that is not a
/// header name answers 500 `misconfigured` without running the handler, never a panic.
#[tokio::test]
async fn the_key_header_can_be_renamed_and_a_bad_name_is_500() {
    let renamed = IdempotencyLayer::new(Locker::memory()).header("X-Request-Id");
    let (router, calls) = app(renamed, ok_text);
    let keyed = || {
        Request::post("/x")
            .header("x-request-id", "r1")
            .body(axum::body::Body::empty())
            .unwrap()
    };
    assert_eq!(router.clone().oneshot(keyed()).await.unwrap().status(), 200);
    let retry = router.clone().oneshot(keyed()).await.unwrap();
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    // The default header is just another header now: both requests run.
    assert_eq!(
        router.clone().oneshot(post(&["k"])).await.unwrap().status(),
        200
    );
    assert_eq!(router.oneshot(post(&["k"])).await.unwrap().status(), 200);
    assert_eq!(calls.load(Ordering::SeqCst), 3);

    let bad = IdempotencyLayer::new(Locker::memory()).header("bad name");
    let (router, calls) = app(bad, ok_text);
    let answer = router.oneshot(post(&["k"])).await.unwrap();
    assert_eq!(answer.status(), 500);
    let body = answer.into_body().collect().await.unwrap().to_bytes();
    assert!(
        String::from_utf8_lossy(&body).contains("urn:lock-tower:misconfigured"),
        "{body:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// With a renamed key header, `require_key`'s 400 names that header (a client told to send
/// `Idempotency-Key` would be turned away again), and the layer's `Debug` shows the name and
/// settings, never the records its locker stores.
#[tokio::test]
async fn a_renamed_key_header_is_named_in_the_400_and_debug_shows_no_records() {
    let layer = IdempotencyLayer::new(Locker::memory())
        .header("X-Request-Id")
        .require_key();
    let (router, calls) = app(layer.clone(), ok_text);
    let answer = router.clone().oneshot(post(&["k1"])).await.unwrap();
    assert_eq!(answer.status(), 400);
    let body = answer.into_body().collect().await.unwrap().to_bytes();
    let body = String::from_utf8_lossy(&body);
    assert!(
        body.contains("urn:lock-tower:idempotency-key-missing"),
        "{body}"
    );
    assert!(body.contains("x-request-id"), "{body}");
    assert!(!body.contains("Idempotency-Key"), "{body}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    let keyed = Request::post("/x")
        .header("x-request-id", "secret-key-7")
        .body(axum::body::Body::empty())
        .unwrap();
    assert_eq!(router.oneshot(keyed).await.unwrap().status(), 200);
    let shown = format!("{layer:?}");
    assert!(shown.contains("header: \"x-request-id\""), "{shown}");
    assert!(!shown.contains("secret-key-7"), "{shown}");
    assert!(!shown.contains("fingerprint"), "{shown}");
}
