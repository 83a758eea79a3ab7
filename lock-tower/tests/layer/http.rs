//! Over real sockets: an axum server and a plain hyper server on loopback, driven by hyper-util's
//! client.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::Path;
use axum::routing::post;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use lock_core::Locker;
use lock_tower::extract::{HeaderKey, PathParam};
use lock_tower::{FencingToken, LockLayer};
use tokio::net::TcpListener;
use tower::Layer;

use crate::common::Probe;

pub(crate) fn client() -> Client<HttpConnector, Empty<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Serves `svc` with a plain hyper HTTP/1 server (no axum) on a free loopback port.
pub(crate) async fn serve_hyper<S, B>(svc: S) -> (SocketAddr, tokio::task::JoinHandle<()>)
where
    S: tower::Service<Request<hyper::body::Incoming>, Response = Response<B>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let svc = TowerToHyperService::new(svc.clone());
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, server)
}

/// Per key: how many handlers are inside, the most ever, the last fencing token, the count.
#[derive(Default)]
struct Shop {
    keys: Mutex<HashMap<String, Arc<Probe>>>,
    last_token: Mutex<HashMap<String, u64>>,
}

/// 100 concurrent requests over 5 SKUs through a real axum server: per SKU, never two at once,
/// tokens strictly increasing in the order the sections ran; every response 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_server_serializes_per_key_over_http() {
    let locker = Locker::memory();
    let shop = Arc::new(Shop::default());
    let app =
        Router::new()
            .route(
                "/inventory/{sku}/reserve",
                post(
                    |Path(sku): Path<String>,
                     token: FencingToken,
                     shop: axum::Extension<Arc<Shop>>| async move {
                        let probe = shop
                            .keys
                            .lock()
                            .unwrap()
                            .entry(sku.clone())
                            .or_default()
                            .clone();
                        let _inside = probe.enter();
                        {
                            let mut last = shop.last_token.lock().unwrap();
                            let previous = last.insert(sku.clone(), token.get()).unwrap_or(0);
                            assert!(token.get() > previous, "token went backwards for {sku}");
                        }
                        for _ in 0..5 {
                            tokio::task::yield_now().await;
                        }
                        "reserved"
                    },
                ),
            )
            .route_layer(
                LockLayer::new(locker.clone(), PathParam::new("sku"))
                    .key_prefix("inventory:")
                    .wait(Duration::from_secs(30))
                    .fenced(),
            )
            .layer(axum::Extension(shop.clone()));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let client = client();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..100 {
        let client = client.clone();
        let req = Request::post(format!("http://{addr}/inventory/sku-{}/reserve", i % 5))
            .body(Empty::new())
            .unwrap();
        tasks.spawn(async move { client.request(req).await.unwrap().status() });
    }
    while let Some(status) = tasks.join_next().await {
        assert_eq!(status.unwrap(), StatusCode::OK);
    }
    let keys = shop.keys.lock().unwrap();
    assert_eq!(keys.len(), 5);
    for (sku, probe) in keys.iter() {
        assert_eq!(probe.calls(), 20, "{sku}");
        assert_eq!(probe.max_inside(), 1, "{sku} overlapped");
    }
    server.abort();
}

/// A plain hyper server (no axum): the layer over a `service_fn`, served through hyper-util's
/// `TowerToHyperService`. 409 with Retry-After and a problem body travel over the wire.
#[tokio::test]
async fn plain_hyper_service_over_http() {
    let locker = Locker::memory();
    let svc = LockLayer::new(locker.clone(), HeaderKey::new("idempotency-key"))
        .reject_when_busy()
        .layer(tower::service_fn(
            |_req: Request<hyper::body::Incoming>| async {
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"charged"))))
            },
        ));
    let (addr, server) = serve_hyper(svc).await;

    let client = client();
    let send = || {
        let req = Request::post(format!("http://{addr}/pay"))
            .header("idempotency-key", "abc")
            .body(Empty::new())
            .unwrap();
        client.request(req)
    };
    let held = locker.lock("abc").await.unwrap();
    let busy = send().await.unwrap();
    assert_eq!(busy.status(), StatusCode::CONFLICT);
    assert!(
        busy.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            >= 1
    );
    assert_eq!(busy.headers()["content-type"], "application/problem+json");
    let body = busy.into_body().collect().await.unwrap().to_bytes();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["status"], 409);
    held.release().await.unwrap();

    let ok = send().await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(
        ok.into_body().collect().await.unwrap().to_bytes(),
        "charged"
    );
    server.abort();
}
