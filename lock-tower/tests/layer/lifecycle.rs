//! When the lock ends: dropped futures, timeouts above, response bodies, lease loss; and what the
//! handler sees while it holds it (fencing token, lock info).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use lock_core::{LockError, LockInfo, Locker, MemoryBackend};
use lock_tower::extract::HeaderKey;
use lock_tower::{FencingToken, LeaseLostError, LockLayer};
use tokio::sync::Notify;
use tower::{Layer, ServiceBuilder, ServiceExt};

use crate::common::{KEY, Stuck, assert_released, json, request, streaming, text, within};

#[tokio::test]
async fn dropping_the_response_future_releases_the_lock() {
    let locker = Locker::memory();
    let stuck = Stuck::default();
    let layer = LockLayer::new(locker.clone(), HeaderKey::new(KEY));
    let metrics = layer.metrics();
    let svc = layer.layer(stuck.service());

    let mut pending = Box::pin(svc.oneshot(request(Some("d"))));
    within("the handler was not called", async {
        tokio::select! {
            _ = &mut pending => panic!("the stuck handler answered"),
            () = stuck.entered.notified() => {}
        }
    })
    .await;
    assert!(
        locker.try_lock("d").await.is_err(),
        "the handler ran without the lock"
    );
    drop(pending); // the client went away
    assert!(stuck.was_dropped());
    assert_eq!(metrics.snapshot().in_flight, 0);
    assert_released(&locker, "d").await;
}

#[tokio::test]
async fn a_timeout_layer_above_releases_the_lock() {
    let locker = Locker::memory();
    let stuck = Stuck::default();
    let svc = ServiceBuilder::new()
        .timeout(Duration::from_millis(50))
        .layer(LockLayer::new(locker.clone(), HeaderKey::new(KEY)))
        .service(stuck.service());
    let error = svc.oneshot(request(Some("t"))).await.unwrap_err();
    assert!(error.is::<tower::timeout::error::Elapsed>(), "{error}");
    assert!(stuck.was_dropped());
    assert_released(&locker, "t").await;
}

#[tokio::test]
async fn by_default_the_lock_ends_with_the_response_future_not_the_body() {
    let locker = Locker::memory();
    let (inner, mut senders) = streaming();
    let svc = LockLayer::new(locker.clone(), HeaderKey::new(KEY)).layer(inner);
    let response = svc.oneshot(request(Some("b"))).await.unwrap();
    assert!(!response.body().holds_lock());
    // Released before the response was handed on, while the body has not even started.
    locker.try_lock("b").await.unwrap().release().await.unwrap();
    drop(senders.recv().await.unwrap());
    assert_eq!(text(response.into_body()).await, "");
}

#[tokio::test]
async fn hold_until_body_end_keeps_the_lock_while_the_body_streams() {
    let locker = Locker::memory();
    let (inner, mut senders) = streaming();
    let layer = LockLayer::new(locker.clone(), HeaderKey::new(KEY)).hold_until_body_end();
    let metrics = layer.metrics();
    let svc = layer.layer(inner);

    let response = svc.oneshot(request(Some("s"))).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.body().holds_lock());
    let tx = senders.recv().await.unwrap();
    let mut body = response.into_body();
    assert!(matches!(
        locker.try_lock("s").await,
        Err(LockError::Busy { .. })
    ));

    tx.send(Bytes::from_static(b"part 1")).await.unwrap();
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "part 1");
    assert!(matches!(
        locker.try_lock("s").await,
        Err(LockError::Busy { .. })
    ));
    assert_eq!(metrics.snapshot().in_flight, 1);

    drop(tx); // the body ends
    assert!(body.frame().await.is_none());
    assert!(!body.holds_lock());
    assert_eq!(metrics.snapshot().in_flight, 0);
    assert_released(&locker, "s").await;
}

#[tokio::test]
async fn a_dropped_held_body_releases_the_lock() {
    let locker = Locker::memory();
    let (inner, mut senders) = streaming();
    let svc = LockLayer::new(locker.clone(), HeaderKey::new(KEY))
        .hold_until_body_end()
        .layer(inner);
    let response = svc.oneshot(request(Some("x"))).await.unwrap();
    let _tx = senders.recv().await.unwrap(); // the body never ends on its own
    assert!(locker.try_lock("x").await.is_err());
    drop(response); // the client went away mid-body
    assert_released(&locker, "x").await;
}

/// The handler finishes while the lease is still ours by the local clock, but the server lost
/// the key meanwhile (an operator's `DEL`, eviction, `FLUSHALL`) and another holder took it
/// before any renewal noticed: the release finds the lock not ours, and the response is
/// discarded for a 503 (found by an audit: it was passed on as a 200).
#[tokio::test]
async fn a_response_whose_release_finds_the_lock_taken_is_discarded() {
    let backend = MemoryBackend::new();
    // The default 30 s lease: no renewal comes during the test.
    let locker = Locker::builder(backend.clone()).build();
    let other = Locker::builder(backend.clone()).build();
    let (entered, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let layer = LockLayer::new(locker, HeaderKey::new(KEY));
    let metrics = layer.metrics();
    let svc = layer.layer(tower::service_fn({
        let (entered, go) = (entered.clone(), go.clone());
        move |_req: Request<String>| {
            let (entered, go) = (entered.clone(), go.clone());
            async move {
                entered.notify_one();
                go.notified().await;
                Ok::<_, Infallible>(Response::new(String::from("done")))
            }
        }
    }));
    let response = tokio::spawn(svc.oneshot(request(Some("r"))));
    within("the handler was not called", entered.notified()).await;
    assert!(backend.force_delete("r"), "the lock was not in the backend");
    let taken = other.try_lock("r").await.unwrap();
    go.notify_one();
    let response = within("no answer", response).await.unwrap().unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        json(response.into_body()).await["type"],
        "urn:lock-tower:lease-lost"
    );
    let m = metrics.snapshot();
    assert_eq!((m.rejected_lease_lost, m.leases_lost), (1, 1));
    assert!(taken.is_held(), "the other holder's lock was touched");
    taken.release().await.unwrap();
}

/// With `hold_until_body_end`, the same at the body's end: the release finds the lock taken,
/// and the body ends with a `LeaseLostError` instead of completing (found by an audit: it
/// ended cleanly).
#[tokio::test]
async fn a_held_body_whose_release_finds_the_lock_taken_ends_with_an_error() {
    let backend = MemoryBackend::new();
    let locker = Locker::builder(backend.clone()).build();
    let other = Locker::builder(backend.clone()).build();
    let (inner, mut senders) = streaming();
    let svc = LockLayer::new(locker, HeaderKey::new(KEY))
        .hold_until_body_end()
        .layer(inner);
    let response = svc.oneshot(request(Some("h"))).await.unwrap();
    let tx = senders.recv().await.unwrap();
    let mut body = response.into_body();
    tx.send(Bytes::from_static(b"part 1")).await.unwrap();
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "part 1");
    assert!(backend.force_delete("h"), "the lock was not in the backend");
    let taken = other.try_lock("h").await.unwrap();
    drop(tx); // the body ends
    let end = body.frame().await;
    assert!(
        matches!(&end, Some(Err(e)) if e.is::<LeaseLostError>()),
        "the body ended as if its lock had been ours: {end:?}"
    );
    assert!(body.frame().await.is_none());
    assert!(taken.is_held(), "the other holder's lock was touched");
    taken.release().await.unwrap();
}

/// An empty body needs no holding: the lock is released before the response, as usual.
#[tokio::test]
async fn hold_until_body_end_with_an_empty_body_releases_at_once() {
    let locker = Locker::memory();
    let svc = LockLayer::new(locker.clone(), HeaderKey::new(KEY))
        .hold_until_body_end()
        .layer(tower::service_fn(|_req: Request<String>| async {
            Ok::<_, Infallible>(Response::new(String::new()))
        }));
    let response = svc.oneshot(request(Some("e"))).await.unwrap();
    assert!(!response.body().holds_lock());
    assert!(locker.try_lock("e").await.is_ok());
}

/// A locker whose leases are short, on a backend the test can tamper with.
fn short_lease_locker() -> (Locker, MemoryBackend) {
    let backend = MemoryBackend::new();
    let locker = Locker::builder(backend.clone())
        .lease(Duration::from_millis(90))
        .build();
    (locker, backend)
}

/// The lease is lost while the handler runs (an operator deletes the key; the watchdog's next
/// renewal finds it gone): the handler's future is dropped and the answer is 503.
#[tokio::test]
async fn lease_lost_mid_request_cancels_it_with_503() {
    let (locker, backend) = short_lease_locker();
    let stuck = Stuck::default();
    let layer = LockLayer::new(locker.clone(), HeaderKey::new(KEY));
    let metrics = layer.metrics();
    let svc = layer.layer(stuck.service());

    let response = tokio::spawn(svc.oneshot(request(Some("l"))));
    within("the handler was not called", stuck.entered.notified()).await;
    assert!(backend.force_delete("l"), "the lock was not in the backend");
    let response = within("the request was not cancelled", response)
        .await
        .unwrap()
        .unwrap();

    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "1");
    assert!(
        stuck.was_dropped(),
        "the handler kept running without the lock"
    );
    assert_eq!(
        json(response.into_body()).await["type"],
        "urn:lock-tower:lease-lost"
    );
    let m = metrics.snapshot();
    assert_eq!(
        (m.rejected_lease_lost, m.leases_lost, m.in_flight),
        (1, 1, 0)
    );
}

/// The service answers, but only after a pause longer than its lease (a GC pause, a blocked
/// thread: simulated by blocking this single-threaded runtime, so no renewal can run). Its
/// work was not protected to the end: the response is discarded for a 503.
#[tokio::test]
async fn a_response_finished_after_the_lease_ran_out_is_discarded() {
    let locker = Locker::builder(MemoryBackend::new())
        .lease(Duration::from_millis(20))
        .build();
    let layer = LockLayer::new(locker.clone(), HeaderKey::new(KEY));
    let metrics = layer.metrics();
    let svc = layer.layer(tower::service_fn(|_req: Request<String>| async {
        std::thread::sleep(Duration::from_millis(60));
        Ok::<_, Infallible>(Response::new(String::from("done late")))
    }));
    let response = svc.oneshot(request(Some("g"))).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        json(response.into_body()).await["type"],
        "urn:lock-tower:lease-lost"
    );
    let m = metrics.snapshot();
    assert_eq!(
        (m.rejected_lease_lost, m.leases_lost, m.in_flight),
        (1, 1, 0)
    );
}

/// The service's response becomes ready past the lock's local deadline while the backend
/// still keeps the key for it (the drift window: 1 % + 2 ms of the lease, here 196-200 ms): the
/// response is discarded (503 lease-lost), also when the lock would be held until the body's
/// end (whose release would otherwise only fail the body after a 200 went out). The time passes
/// inside the service's one poll, so only the layer's look at the deadline once the service
/// answered can tell (found by a mutation audit: without it, 200 with `hold_until_body_end`).
#[tokio::test(start_paused = true)]
async fn a_response_ready_past_the_local_deadline_is_discarded_though_the_server_kept_the_key() {
    for held_body in [false, true] {
        let locker = Locker::builder(MemoryBackend::new())
            .lease(Duration::from_millis(200))
            .watchdog(false)
            .build();
        let mut layer = LockLayer::new(locker.clone(), HeaderKey::new(KEY));
        if held_body {
            layer = layer.hold_until_body_end();
        }
        let metrics = layer.metrics();
        let svc = layer.layer(tower::service_fn(|_req: Request<String>| {
            std::future::poll_fn(|cx| {
                // Paused time moves at the first poll of `advance`: 198 ms go by in this poll.
                let mut advance = std::pin::pin!(tokio::time::advance(Duration::from_millis(198)));
                let _ = std::future::Future::poll(advance.as_mut(), cx);
                std::task::Poll::Ready(Ok::<_, Infallible>(Response::new(String::from("late"))))
            })
        }));
        let response = svc.oneshot(request(Some("w"))).await.unwrap();
        assert_eq!(
            response.status(),
            StatusCode::SERVICE_UNAVAILABLE,
            "hold_until_body_end: {held_body}"
        );
        assert_eq!(
            json(response.into_body()).await["type"],
            "urn:lock-tower:lease-lost"
        );
        let m = metrics.snapshot();
        assert_eq!((m.rejected_lease_lost, m.in_flight), (1, 0));
        assert!(
            locker.try_lock("w").await.is_ok(),
            "the key was released for the next request"
        );
    }
}

/// Lost while the held body streams: the body ends with an error instead of looking complete.
#[tokio::test]
async fn lease_lost_while_the_body_streams_ends_it_with_an_error() {
    let (locker, backend) = short_lease_locker();
    let (inner, mut senders) = streaming();
    let layer = LockLayer::new(locker.clone(), HeaderKey::new(KEY))
        .key_prefix("p:")
        .hold_until_body_end();
    let metrics = layer.metrics();
    let svc = layer.layer(inner);

    let response = svc.oneshot(request(Some("m"))).await.unwrap();
    let _tx = senders.recv().await.unwrap();
    let mut body = response.into_body();
    assert!(backend.force_delete("p:m"));
    let error = within("the body did not fail", body.frame())
        .await
        .unwrap()
        .unwrap_err();
    let lost = error
        .downcast_ref::<LeaseLostError>()
        .expect("a LeaseLostError");
    assert_eq!(lost.key(), "p:m");
    assert!(body.frame().await.is_none());
    assert_eq!(metrics.snapshot().leases_lost, 1);
}

#[tokio::test]
async fn fenced_requests_see_increasing_tokens_and_their_lock() {
    let locker = Locker::memory();
    let svc = LockLayer::new(locker.clone(), HeaderKey::new(KEY))
        .key_prefix("f:")
        .fenced()
        .layer(tower::service_fn(|req: Request<String>| async move {
            let info = req.extensions().get::<LockInfo>().unwrap();
            assert!(info.is_held());
            assert_eq!(info.key(), "f:one");
            let token = req.extensions().get::<FencingToken>().unwrap();
            assert_eq!(info.fence(), Some(token.get()));
            Ok::<_, Infallible>(Response::new(token.to_string()))
        }));
    let mut last = 0;
    for _ in 0..3 {
        let response = svc.clone().oneshot(request(Some("one"))).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let token: u64 = text(response.into_body()).await.parse().unwrap();
        assert!(token > last, "fencing tokens went {last} -> {token}");
        last = token;
    }
}

#[tokio::test]
async fn unfenced_requests_carry_no_token() {
    let svc = LockLayer::new(Locker::memory(), HeaderKey::new(KEY)).layer(tower::service_fn(
        |req: Request<String>| async move {
            let token = req.extensions().get::<FencingToken>().copied();
            let locked = req.extensions().get::<LockInfo>().is_some();
            Ok::<_, Infallible>(Response::new(format!("{token:?} {locked}")))
        },
    ));
    let response = svc.oneshot(request(Some("u"))).await.unwrap();
    assert_eq!(text(response.into_body()).await, "None true");
}

#[tokio::test]
async fn the_handler_runs_inside_the_locks_scope() {
    let locker = Locker::memory();
    let inner_locker = locker.clone();
    let svc = LockLayer::new(locker.clone(), HeaderKey::new(KEY))
        .key_prefix("s:")
        .fenced()
        .layer(tower::service_fn(move |_req: Request<String>| {
            let locker = inner_locker.clone();
            async move {
                let current = lock_core::current_lock().expect("inside the lock's scope");
                assert_eq!(current.key(), "s:one");
                assert_eq!(lock_core::current_fence(), current.fence());
                // The same key again, as a #[distributed_lock] fn called by the handler would:
                // reentrant, not a wait on ourselves.
                let again = locker.try_lock("s:one").await.expect("reentrant");
                assert!(again.is_reentrant());
                // Other keys are ordinary locks.
                let other = locker.try_lock("s:two").await.expect("free");
                assert!(!other.is_reentrant());
                Ok::<_, Infallible>(Response::new(String::new()))
            }
        }));
    let response = svc.oneshot(request(Some("one"))).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(lock_core::current_lock().is_none());
    let _free = locker.try_lock("s:one").await.unwrap();
}
