//! axum: PathParam under Router::route_layer, Router::layer and MethodRouter::layer; the
//! FencingToken extractor; a layer put before routing.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::{get, post};
use http::{Request, StatusCode};
use lock_core::Locker;
use lock_tower::extract::PathParam;
use lock_tower::{FencingToken, LockLayer};
use tower::{Layer, ServiceBuilder, ServiceExt};

use crate::common::{json, text};

fn layer(locker: &Locker) -> LockLayer<PathParam> {
    LockLayer::new(locker.clone(), PathParam::new("sku"))
        .key_prefix("inventory:")
        .reject_when_busy()
}

async fn reserve() -> &'static str {
    "reserved"
}

async fn status(app: &Router, method: &str, uri: &str) -> StatusCode {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .body(Body::empty())
        .unwrap();
    app.clone().oneshot(req).await.unwrap().status()
}

/// With the key of SKU 42 held elsewhere: 42 is refused, 43 served, unknown paths still 404.
async fn assert_locks_per_sku(app: Router, locker: &Locker) {
    let held = locker.lock("inventory:42").await.unwrap();
    assert_eq!(
        status(&app, "POST", "/inventory/42/reserve").await,
        StatusCode::CONFLICT
    );
    assert_eq!(
        status(&app, "POST", "/inventory/43/reserve").await,
        StatusCode::OK
    );
    assert_eq!(status(&app, "GET", "/nowhere").await, StatusCode::NOT_FOUND);
    // A route without the parameter passes through unlocked.
    assert_eq!(status(&app, "GET", "/health").await, StatusCode::OK);
    held.release().await.unwrap();
    assert_eq!(
        status(&app, "POST", "/inventory/42/reserve").await,
        StatusCode::OK
    );
}

#[tokio::test]
async fn path_param_with_route_layer() {
    let locker = Locker::memory();
    let app = Router::new()
        .route("/inventory/{sku}/reserve", post(reserve))
        .route("/health", get(|| async { "ok" }))
        .route_layer(layer(&locker));
    assert_locks_per_sku(app, &locker).await;
}

#[tokio::test]
async fn path_param_with_router_layer() {
    let locker = Locker::memory();
    let app = Router::new()
        .route("/inventory/{sku}/reserve", post(reserve))
        .route("/health", get(|| async { "ok" }))
        .layer(layer(&locker));
    assert_locks_per_sku(app, &locker).await;
}

#[tokio::test]
async fn path_param_with_method_router_layer_and_service_builder() {
    let locker = Locker::memory();
    let app = Router::new()
        .route(
            "/inventory/{sku}/reserve",
            post(reserve).layer(ServiceBuilder::new().layer(layer(&locker))),
        )
        .route("/health", get(|| async { "ok" }));
    assert_locks_per_sku(app, &locker).await;
}

#[tokio::test]
async fn path_param_in_a_nested_router() {
    let locker = Locker::memory();
    let inner = Router::new()
        .route("/{sku}/reserve", post(reserve))
        .route_layer(layer(&locker));
    let app = Router::new()
        .nest("/inventory", inner)
        .route("/health", get(|| async { "ok" }));
    assert_locks_per_sku(app, &locker).await;
}

/// Wrapped around the whole router, the layer runs before routing: no parameters. It answers
/// 500 instead of silently letting every request through unlocked.
#[tokio::test]
async fn path_param_before_routing_is_a_500_not_a_silent_pass() {
    let locker = Locker::memory();
    let router = Router::new().route("/inventory/{sku}/reserve", post(reserve));
    let app = layer(&locker).layer(router);
    let req = Request::post("/inventory/42/reserve")
        .body(Body::empty())
        .unwrap();
    let response = app.oneshot(req).await.unwrap();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        json(response.into_body()).await["type"],
        "urn:lock-tower:misconfigured"
    );
}

#[tokio::test]
async fn a_non_utf8_route_parameter_is_a_400() {
    let locker = Locker::memory();
    let app = Router::new()
        .route("/inventory/{sku}/reserve", post(reserve))
        .route_layer(layer(&locker));
    assert_eq!(
        status(&app, "POST", "/inventory/%FF%FE/reserve").await,
        StatusCode::BAD_REQUEST
    );
}

#[tokio::test]
async fn fencing_token_extractor() {
    let locker = Locker::memory();
    let app = Router::new()
        .route(
            "/inventory/{sku}/reserve",
            post(|token: FencingToken| async move { token.to_string() }),
        )
        .route_layer(
            LockLayer::new(locker, PathParam::new("sku"))
                .wait(Duration::from_secs(5))
                .fenced(),
        )
        .route(
            "/optional",
            get(|token: Option<FencingToken>| async move { format!("{token:?}") }),
        )
        .route(
            "/required",
            get(|token: FencingToken| async move { token.to_string() }),
        );

    let call = |uri: &'static str, method: &'static str| {
        let app = app.clone();
        async move {
            let req = Request::builder()
                .method(method)
                .uri(uri)
                .body(Body::empty())
                .unwrap();
            let response = app.oneshot(req).await.unwrap();
            (response.status(), text(response.into_body()).await)
        }
    };
    let (s1, t1) = call("/inventory/7/reserve", "POST").await;
    let (s2, t2) = call("/inventory/7/reserve", "POST").await;
    assert_eq!((s1, s2), (StatusCode::OK, StatusCode::OK));
    assert!(t2.parse::<u64>().unwrap() > t1.parse::<u64>().unwrap());
    assert_eq!(
        call("/optional", "GET").await,
        (StatusCode::OK, "None".to_owned())
    );
    assert_eq!(
        call("/required", "GET").await.0,
        StatusCode::INTERNAL_SERVER_ERROR
    );
}

/// The lock key a route's handler ran under.
async fn lock_key(axum::Extension(info): axum::Extension<lock_core::LockInfo>) -> String {
    info.key().to_owned()
}

async fn key_of(app: &Router, uri: &str) -> String {
    let req = Request::post(uri).body(Body::empty()).unwrap();
    let response = app.clone().oneshot(req).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK, "{uri}");
    text(response.into_body()).await
}

/// `MethodAndPath` keys a path however the client percent-encoded it: `/inventory/%34%32` is
/// SKU `42` to the handler, and one lock with `/inventory/42`. Before, the raw path was the key,
/// and two reservations of one SKU ran at once.
#[tokio::test]
async fn method_and_path_has_one_key_per_path_however_it_is_encoded() {
    use lock_tower::extract::MethodAndPath;
    let app = Router::new()
        .route("/inventory/{sku}/reserve", post(lock_key))
        .layer(LockLayer::new(Locker::memory(), MethodAndPath));
    let plain = key_of(&app, "/inventory/42/reserve").await;
    assert_eq!(key_of(&app, "/inventory/%34%32/reserve").await, plain);
    assert_eq!(key_of(&app, "/inventory/4%32/reserve").await, plain);
    assert_ne!(key_of(&app, "/inventory/43/reserve").await, plain);
}

/// Under `Router::nest`, `MethodAndPath` keys the whole path the client sent: the nesting
/// router's prefix (route parameters included) is cut off the URI the layer sees, and two
/// shops' reservations of one SKU shared a lock before.
#[tokio::test]
async fn method_and_path_under_a_nest_keys_the_whole_path() {
    use lock_tower::extract::MethodAndPath;
    let shop = Router::new()
        .route("/inventory/{sku}/reserve", post(lock_key))
        .layer(LockLayer::new(Locker::memory(), MethodAndPath));
    let app = Router::new().nest("/shops/{shop}", shop);
    let a = key_of(&app, "/shops/a/inventory/42/reserve").await;
    assert_ne!(key_of(&app, "/shops/b/inventory/42/reserve").await, a);
    assert_eq!(key_of(&app, "/shops/%61/inventory/42/reserve").await, a);
}
