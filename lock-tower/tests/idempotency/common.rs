//! A counting handler served by axum on loopback, and a client that records whole answers.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use bytes::Bytes;
use http::{HeaderValue, Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use lock_tower::IdempotencyLayer;

/// What the handler does, chosen by the test.
#[derive(Clone, Default)]
pub(crate) struct Handler {
    pub(crate) calls: Arc<AtomicUsize>,
    pub(crate) delay: Duration,
    /// Answer 500 on the calls whose number (1-based) is listed.
    pub(crate) fail_on: Vec<usize>,
    /// Answer a body of this many bytes instead of the usual one.
    pub(crate) big: Option<usize>,
    /// Answer this status (with a small body) instead of 201.
    pub(crate) status: Option<u16>,
    /// Answer 200 with a body that fails while it is read.
    pub(crate) broken_body: bool,
}

/// A response body whose first frame is an error.
struct BrokenBody;

impl http_body::Body for BrokenBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        std::task::Poll::Ready(Some(Err(std::io::Error::other("broken body"))))
    }
}

impl Handler {
    pub(crate) fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

pub(crate) async fn charge(
    State(h): State<Handler>,
    headers: HeaderMap,
    body: String,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let n = h.calls.fetch_add(1, Ordering::SeqCst) + 1;
    tokio::time::sleep(h.delay).await;
    if h.fail_on.contains(&n) {
        return (StatusCode::INTERNAL_SERVER_ERROR, "try again").into_response();
    }
    if let Some(status) = h.status {
        return (StatusCode::from_u16(status).unwrap(), "status").into_response();
    }
    if h.broken_body {
        return axum::response::Response::new(axum::body::Body::new(BrokenBody));
    }
    if let Some(len) = h.big {
        return vec![b'x'; len].into_response();
    }
    let tenant = headers
        .get("x-tenant")
        .map_or("-", |v| v.to_str().unwrap_or("?"))
        .to_owned();
    (
        StatusCode::CREATED,
        [("x-charge", n.to_string()), ("set-cookie", "a=1".into())],
        format!("charge #{n} tenant {tenant} for {body}"),
    )
        .into_response()
}

/// Serves `POST /payments` (and `/refunds`) behind `layer` on a loopback port.
pub(crate) async fn serve(layer: IdempotencyLayer, handler: Handler) -> SocketAddr {
    let app = Router::new()
        .route("/payments", post(charge))
        .route("/refunds", post(charge))
        .layer(layer)
        .with_state(handler);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// A whole answer: status, headers (without `date`, which hyper sets per response), body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, Vec<u8>)>,
    pub(crate) body: Bytes,
}

impl Answer {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| std::str::from_utf8(v).unwrap())
    }

    pub(crate) fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }

    /// The answer as the first one was: without the replay header.
    pub(crate) fn without_replay(&self) -> Answer {
        let mut a = self.clone();
        a.headers.retain(|(n, _)| n != "idempotent-replayed");
        a
    }

    pub(crate) fn problem_type(&self) -> String {
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json")
        );
        let json: serde_json::Value = serde_json::from_slice(&self.body).unwrap();
        json["type"].as_str().unwrap().to_owned()
    }
}

pub(crate) struct Call<'a> {
    pub(crate) path: &'a str,
    pub(crate) key: Option<&'a [u8]>,
    pub(crate) body: &'a str,
    pub(crate) tenant: Option<&'a str>,
}

impl<'a> Call<'a> {
    pub(crate) fn new(key: &'a str, body: &'a str) -> Self {
        Call {
            path: "/payments",
            key: Some(key.as_bytes()),
            body,
            tenant: None,
        }
    }
}

pub(crate) async fn send(addr: SocketAddr, call: &Call<'_>) -> Answer {
    send_with(addr, call, &[]).await
}

/// [`send`] with more request headers.
pub(crate) async fn send_with(
    addr: SocketAddr,
    call: &Call<'_>,
    headers: &[(&'static str, &str)],
) -> Answer {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(format!("http://{addr}{}", call.path))
        .body(Full::new(Bytes::copy_from_slice(call.body.as_bytes())))
        .unwrap();
    if let Some(key) = call.key {
        request
            .headers_mut()
            .insert("idempotency-key", HeaderValue::from_bytes(key).unwrap());
    }
    if let Some(tenant) = call.tenant {
        request
            .headers_mut()
            .insert("x-tenant", HeaderValue::from_str(tenant).unwrap());
    }
    for (name, value) in headers {
        request
            .headers_mut()
            .append(*name, HeaderValue::from_str(value).unwrap());
    }
    let response = client.request(request).await.unwrap();
    let status = response.status().as_u16();
    let mut headers: Vec<(String, Vec<u8>)> = response
        .headers()
        .iter()
        .filter(|(n, _)| n.as_str() != "date")
        .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
        .collect();
    headers.sort();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        headers,
        body,
    }
}

/// A request whose lease is lost while its handler runs (`lose` takes the lock out of the
/// backend, as an operator's `DEL` would): its handler is cancelled then, and it answers 503
/// lease-lost; the retry finds the key's "started" mark and gets 409 outcome-unknown.
/// `lose` gets the record's lock key (as `IdempotencyLayer::record_key` names it). With
/// `detach`, the handler runs in a task of its own (`detach_handler`), which a loss stops too.
pub(crate) async fn a_lost_lease_cancels_the_handler<F, Fut>(
    locker: lock_core::Locker,
    detach: bool,
    lose: F,
) where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::ServiceExt as _;

    /// Leaves the count when the handler ends, cancelled or not.
    struct Running(Arc<AtomicUsize>);
    impl Drop for Running {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }
    let (started, mut starts) = tokio::sync::mpsc::unbounded_channel();
    let running = Arc::new(AtomicUsize::new(0));
    let (most, calls) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let handler = {
        let (running, most, calls) = (running.clone(), most.clone(), calls.clone());
        move || async move {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            let _running = Running(running);
            most.fetch_max(now, Ordering::SeqCst);
            let call = calls.fetch_add(1, Ordering::SeqCst) + 1;
            started.send(()).unwrap();
            // The first call works long enough to see its lease lost; the retry at once.
            if call == 1 {
                tokio::time::sleep(Duration::from_secs(30)).await;
            }
            (http::StatusCode::CREATED, "charged")
        }
    };
    let layer = match detach {
        true => lock_tower::IdempotencyLayer::new(locker).detach_handler(),
        false => lock_tower::IdempotencyLayer::new(locker),
    };
    let key = layer.record_key(b"", b"k").unwrap();
    let app = axum::Router::new()
        .route("/pay", axum::routing::post(handler))
        .layer(layer);
    let request = || {
        http::Request::post("/pay")
            .header("idempotency-key", "k")
            .body(axum::body::Body::from("10 EUR"))
            .unwrap()
    };
    let first = tokio::spawn(app.clone().oneshot(request()));
    starts.recv().await.unwrap();
    lose(key).await;
    // Its watchdog finds the lock gone within a third of the lease.
    let first = tokio::time::timeout(Duration::from_secs(10), first)
        .await
        .expect("the first request answers once its lease is lost")
        .unwrap()
        .unwrap();
    assert_eq!(first.status(), 503);
    assert_eq!(
        running.load(Ordering::SeqCst),
        0,
        "the handler was cancelled"
    );
    // The key's "started" mark outlived its lock: the retry never runs the handler again, it
    // is told the outcome is unknown (issue 29, item 9).
    let (status, body, replayed) = summary(app.oneshot(request()).await.unwrap()).await;
    assert_eq!((status, replayed), (409, false), "{body}");
    assert!(
        body.contains("urn:lock-tower:idempotency-outcome-unknown"),
        "{body}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(most.load(Ordering::SeqCst), 1);
}

/// Status, body and whether it was replayed, of a response.
pub(crate) async fn summary(
    response: http::Response<impl http_body::Body<Error: std::fmt::Debug>>,
) -> (u16, String, bool) {
    let status = response.status().as_u16();
    let replayed = response.headers().contains_key("idempotent-replayed");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        String::from_utf8_lossy(&body).into_owned(),
        replayed,
    )
}
