//! Same key: one at a time. Different keys: at once. Release before the response.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use lock_core::Locker;
use lock_tower::LockLayer;
use lock_tower::extract::HeaderKey;
use tokio::sync::Barrier;
use tower::{ServiceBuilder, ServiceExt};

use crate::common::{KEY, Probe, request, until_waiters};

/// 30 requests on one key: every handler runs alone. The first one stays inside until all
/// others are queued behind it, so the test fails if they are not held back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_requests_never_overlap() {
    const N: usize = 30;
    let locker = Locker::memory();
    let probe = Arc::new(Probe::default());
    let layer = LockLayer::new(locker.clone(), HeaderKey::new(KEY)).wait(Duration::from_secs(30));
    let metrics = layer.metrics();
    let svc = ServiceBuilder::new().layer(layer).service_fn({
        let probe = probe.clone();
        let locker = locker.clone();
        move |_req: Request<String>| {
            let probe = probe.clone();
            let locker = locker.clone();
            async move {
                let _inside = probe.enter();
                if probe.calls() == 1 {
                    // Everyone else must be waiting for the lock, not in here.
                    until_waiters(&locker, N - 1).await;
                }
                for _ in 0..10 {
                    tokio::task::yield_now().await;
                }
                Ok::<_, Infallible>(Response::new(String::new()))
            }
        }
    });

    let tasks: Vec<_> = (0..N)
        .map(|_| tokio::spawn(svc.clone().oneshot(request(Some("hot")))))
        .collect();
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap().status(), StatusCode::OK);
    }
    assert_eq!(probe.calls(), N);
    assert_eq!(probe.max_inside(), 1, "two requests for one key overlapped");
    let m = metrics.snapshot();
    assert_eq!(m.requests_locked, N as u64);
    assert_eq!(m.in_flight, 0);
    assert_eq!(m.rejections(), 0);
}

/// Two keys: both handlers are inside at once (each waits at a barrier for the other; if the
/// layer serialized them, neither would ever pass it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_keys_run_at_the_same_time() {
    let barrier = Arc::new(Barrier::new(2));
    let svc = ServiceBuilder::new()
        .layer(LockLayer::new(Locker::memory(), HeaderKey::new(KEY)))
        .service_fn(move |_req: Request<String>| {
            let barrier = barrier.clone();
            async move {
                barrier.wait().await;
                Ok::<_, Infallible>(Response::new(String::new()))
            }
        });
    let a = tokio::spawn(svc.clone().oneshot(request(Some("a"))));
    let b = tokio::spawn(svc.clone().oneshot(request(Some("b"))));
    let both = tokio::time::timeout(Duration::from_secs(10), async {
        (a.await.unwrap().unwrap(), b.await.unwrap().unwrap())
    })
    .await
    .expect("handlers for different keys did not run at the same time");
    assert_eq!(both.0.status(), StatusCode::OK);
    assert_eq!(both.1.status(), StatusCode::OK);
}

/// The lock is released before the response is handed on: back-to-back requests on one key
/// from one client never find the key busy, even in reject mode.
#[tokio::test]
async fn next_request_after_a_response_finds_the_key_free() {
    let locker = Locker::memory();
    let svc = ServiceBuilder::new()
        .layer(LockLayer::new(locker.clone(), HeaderKey::new(KEY)).reject_when_busy())
        .service_fn(|_req: Request<String>| async {
            Ok::<_, Infallible>(Response::new(String::new()))
        });
    for _ in 0..100 {
        let response = svc.clone().oneshot(request(Some("seq"))).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        // Nothing left behind either (released now, not in the background).
        locker
            .try_lock("seq")
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
}

/// A waiting request runs once the holder releases, rather than being rejected.
#[tokio::test]
async fn waiting_request_runs_after_the_holder_releases() {
    let locker = Locker::memory();
    let probe = Arc::new(Probe::default());
    let layer = LockLayer::new(locker.clone(), HeaderKey::new(KEY)).wait(Duration::from_secs(30));
    let metrics = layer.metrics();
    let svc = ServiceBuilder::new().layer(layer).service_fn({
        let probe = probe.clone();
        move |_req: Request<String>| {
            let probe = probe.clone();
            async move {
                let _inside = probe.enter();
                Ok::<_, Infallible>(Response::new(String::new()))
            }
        }
    });
    // A request on a free key does not count as a wait.
    let free = svc.clone().oneshot(request(Some("free"))).await.unwrap();
    assert_eq!(free.status(), StatusCode::OK);
    assert_eq!(metrics.snapshot().waits, 0);
    let held = locker.lock("w").await.unwrap();
    let waiting = tokio::spawn(svc.oneshot(request(Some("w"))));
    until_waiters(&locker, 1).await;
    assert_eq!(probe.calls(), 1, "the handler ran while the key was held");
    held.release().await.unwrap();
    assert_eq!(waiting.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(probe.calls(), 2);
    let now = metrics.snapshot();
    assert_eq!((now.requests_locked, now.waits), (2, 1));
}

/// The layer and its service are what axum, hyper and `ServiceBuilder` ask for.
#[test]
fn layer_and_service_are_clone_send_sync() {
    fn check<T: Clone + Send + Sync + 'static>() {}
    check::<LockLayer<HeaderKey>>();
    check::<lock_tower::LockService<axum::routing::Route, HeaderKey>>();
    check::<
        lock_tower::LockService<axum::routing::Route, fn(&http::request::Parts) -> Option<String>>,
    >();
}
