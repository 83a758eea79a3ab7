//! `hold_until_body_end` over a real hyper HTTP/1 server: a release that finds the lock taken
//! must reach the client as an incomplete response, whether the response declared its length
//! (a `Content-Length`, or an exact size hint: hyper then stops polling the body once it has
//! written that many bytes) or not (chunked). Found by review: with a declared length the body's
//! end was never polled, and the client got a complete 200.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Empty};
use lock_core::{Locker, MemoryBackend};
use lock_tower::LockLayer;
use lock_tower::extract::HeaderKey;
use tokio::sync::mpsc;
use tower::Layer;

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
