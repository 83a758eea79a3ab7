//! `hold_until_body_end` over a real hyper HTTP/1 server: a release that finds the lock taken
//! must reach the client as an incomplete response, whether the response declared its length
//! (a `Content-Length`, or an exact size hint: hyper then stops polling the body once it has
//! written that many bytes) or not (chunked). Found by review: with a declared length the body's
//! end was never polled, and the client got a complete 200.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Empty, Full};
use lock_core::{Locker, MemoryBackend};
use lock_tower::LockLayer;
use lock_tower::extract::HeaderKey;
use tokio::sync::{mpsc, oneshot};
use tower::{Layer, ServiceExt};

use crate::common::ChannelBody;
use crate::http::{client, serve_hyper};

/// A streamed body that may know its length up front (an exact size hint) but, like most
/// streams, learns it has ended only when its source closes.
struct Channel(ChannelBody, Option<u64>);

impl Body for Channel {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Pin::new(&mut self.0).poll_frame(cx)
    }

    fn size_hint(&self) -> SizeHint {
        self.1.map_or_else(SizeHint::default, SizeHint::with_exact)
    }
}

/// How the response tells its length.
#[derive(Debug, Clone, Copy)]
enum Length {
    Header,
    Hint,
    Chunked,
}

/// One request over a hyper server whose handler streams 10 bytes in two frames; `lose` deletes
/// the key behind the holder's back and has another locker take it before the last frame.
/// Returns the status and the body as the client read it.
async fn exchange(length: Length, lose: bool) -> (StatusCode, Result<Bytes, String>) {
    let backend = MemoryBackend::new();
    // The default 30 s lease: no renewal notices the loss while the body streams.
    let locker = Locker::builder(backend.clone()).build();
    let other = Locker::builder(backend.clone()).build();
    let (senders_tx, mut senders) = mpsc::unbounded_channel::<mpsc::Sender<Bytes>>();
    let svc = LockLayer::new(locker, HeaderKey::new("x-key"))
        .hold_until_body_end()
        .layer(tower::service_fn(
            move |_req: Request<hyper::body::Incoming>| {
                let senders_tx = senders_tx.clone();
                async move {
                    let (tx, rx) = mpsc::channel(4);
                    senders_tx.send(tx).unwrap();
                    let hint = matches!(length, Length::Hint).then_some(10);
                    let mut response = Response::new(Channel(ChannelBody(rx), hint));
                    if matches!(length, Length::Header) {
                        response.headers_mut().insert(
                            http::header::CONTENT_LENGTH,
                            http::HeaderValue::from_static("10"),
                        );
                    }
                    Ok::<_, Infallible>(response)
                }
            },
        ));
    let (addr, server) = serve_hyper(svc).await;
    let client = client();
    let request = Request::get(format!("http://{addr}/"))
        .header("x-key", "k")
        .body(Empty::new())
        .unwrap();
    let response = tokio::spawn(client.request(request));
    let tx = senders.recv().await.unwrap();
    tx.send(Bytes::from_static(b"01234")).await.unwrap();
    let taken = if lose {
        assert!(backend.force_delete("k"));
        Some(other.try_lock("k").await.unwrap())
    } else {
        None
    };
    tx.send(Bytes::from_static(b"56789")).await.unwrap();
    let response = response.await.unwrap().unwrap();
    let status = response.status();
    drop(tx); // the body ends
    let body = tokio::time::timeout(Duration::from_secs(10), response.into_body().collect())
        .await
        .expect("the body never ended")
        .map(|c| c.to_bytes())
        .map_err(|e| e.to_string());
    if let Some(taken) = taken {
        assert!(taken.is_held(), "the other owner's lock was touched");
    }
    server.abort();
    (status, body)
}

#[tokio::test]
async fn a_held_body_whose_release_finds_the_lock_taken_never_reaches_the_client_complete() {
    for length in [Length::Header, Length::Hint, Length::Chunked] {
        let (status, body) = exchange(length, true).await;
        assert!(
            body.is_err(),
            "{length:?}: the client got a complete {status} though the release found the lock taken: {body:?}"
        );
    }
}

#[tokio::test]
async fn a_held_body_whose_lock_was_kept_reaches_the_client_whole() {
    for length in [Length::Header, Length::Hint, Length::Chunked] {
        let (status, body) = exchange(length, false).await;
        assert_eq!(status, StatusCode::OK, "{length:?}");
        assert_eq!(body.as_deref(), Ok(&b"0123456789"[..]), "{length:?}");
    }
}

/// Frames from a list, ending after the last (an exact size hint when given).
struct Frames(VecDeque<Frame<Bytes>>, Option<u64>);

impl Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.pop_front().map(Ok))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        self.1.map_or_else(SizeHint::default, SizeHint::with_exact)
    }
}

/// Trailers after the bytes a response declared (an exact size hint, `Full::with_trailers`;
/// or a `Content-Length`) still come: the frame that completes the length waits for the
/// release, and what follows it passes. Found by review: the hold ended the body there.
#[tokio::test]
async fn trailers_after_a_declared_length_still_come_when_the_lock_is_held_to_the_end() {
    for header in [false, true] {
        let svc = LockLayer::new(Locker::memory(), HeaderKey::new("x-key"))
            .hold_until_body_end()
            .layer(tower::service_fn(move |_req: Request<String>| async move {
                let mut trailers = HeaderMap::new();
                trailers.insert("x-checksum", "abc".parse().unwrap());
                let response = if header {
                    let frames = [
                        Frame::data(Bytes::from_static(b"hel")),
                        Frame::data(Bytes::from_static(b"lo")),
                        Frame::trailers(trailers),
                    ];
                    let mut r = Response::new(Frames(frames.into(), None).boxed_unsync());
                    r.headers_mut()
                        .insert(http::header::CONTENT_LENGTH, "5".parse().unwrap());
                    r
                } else {
                    let body = Full::new(Bytes::from_static(b"hello"))
                        .with_trailers(async move { Some(Ok::<_, Infallible>(trailers)) });
                    Response::new(body.boxed_unsync())
                };
                Ok::<_, Infallible>(response)
            }));
        let request = Request::get("/")
            .header("x-key", "k")
            .body(String::new())
            .unwrap();
        let response = svc.oneshot(request).await.unwrap();
        assert!(response.body().holds_lock(), "header {header}");
        let collected = response.into_body().collect().await.unwrap();
        let trailers = collected.trailers().cloned();
        assert_eq!(collected.to_bytes(), "hello", "header {header}");
        assert!(
            trailers.is_some_and(|t| t.contains_key("x-checksum")),
            "header {header}: the trailers were dropped"
        );
    }
}

/// A HEAD request whose release finds the lock taken: the server never sends (nor polls) a
/// HEAD response's body, so holding the lock until the body ends would release it unseen, and
/// the client would get a complete 200. The lock is released before the response instead,
/// and the answer is 503, over hyper and behind an axum router (which strips HEAD bodies
/// outside the route's layers). Found by review.
#[tokio::test]
async fn a_head_request_whose_release_finds_the_lock_taken_is_answered_503() {
    // hyper
    let backend = MemoryBackend::new();
    let other = Locker::builder(backend.clone()).build();
    let (entered_tx, mut entered) = mpsc::unbounded_channel::<oneshot::Sender<()>>();
    let svc = LockLayer::new(
        Locker::builder(backend.clone()).build(),
        HeaderKey::new("x-key"),
    )
    .hold_until_body_end()
    .layer(tower::service_fn(
        move |_req: Request<hyper::body::Incoming>| {
            let entered_tx = entered_tx.clone();
            async move {
                let (go_tx, go) = oneshot::channel();
                entered_tx.send(go_tx).unwrap();
                let _ = go.await;
                let mut response = Response::new(Full::new(Bytes::from_static(b"0123456789")));
                response.headers_mut().insert(
                    http::header::CONTENT_LENGTH,
                    http::HeaderValue::from_static("10"),
                );
                Ok::<_, Infallible>(response)
            }
        },
    ));
    let (addr, server) = serve_hyper(svc).await;
    let request = Request::head(format!("http://{addr}/"))
        .header("x-key", "k")
        .body(Empty::new())
        .unwrap();
    let response = tokio::spawn(client().request(request));
    let go = entered.recv().await.unwrap();
    assert!(backend.force_delete("k"));
    let taken = other.try_lock("k").await.unwrap();
    go.send(()).unwrap();
    let response = response.await.unwrap().unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE, "hyper");
    assert!(taken.is_held(), "the other owner's lock was touched");
    server.abort();

    // axum: a GET route answering HEAD.
    let backend = MemoryBackend::new();
    let other = Locker::builder(backend.clone()).build();
    let (entered_tx, mut entered) = mpsc::unbounded_channel::<oneshot::Sender<()>>();
    let app = axum::Router::new()
        .route(
            "/",
            axum::routing::get(move || {
                let entered_tx = entered_tx.clone();
                async move {
                    let (go_tx, go) = oneshot::channel();
                    entered_tx.send(go_tx).unwrap();
                    let _ = go.await;
                    "0123456789"
                }
            }),
        )
        .layer(
            LockLayer::new(
                Locker::builder(backend.clone()).build(),
                HeaderKey::new("x-key"),
            )
            .hold_until_body_end(),
        );
    let request = Request::builder()
        .method(Method::HEAD)
        .uri("/")
        .header("x-key", "k")
        .body(axum::body::Body::empty())
        .unwrap();
    let response = tokio::spawn(app.oneshot(request));
    let go = entered.recv().await.unwrap();
    assert!(backend.force_delete("k"));
    let taken = other.try_lock("k").await.unwrap();
    go.send(()).unwrap();
    let response = response.await.unwrap().unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE, "axum");
    assert!(taken.is_held(), "the other owner's lock was touched");
}
