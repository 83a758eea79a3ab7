//! The HTTP routes of [`Shop`]: where the locks go, and the handlers.

use axum::Json;
use axum::Router;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, any_service, get, post};
use lock_tower::extract::PathParam;
use lock_tower::{IdempotencyLayer, LockLayer};
use tower::ServiceExt;

use crate::app::Shop;
use crate::checkout::{CheckoutRequest, MAX_AMOUNT_CENTS};
use crate::inventory::{MAX_QUANTITY, ReserveError, ReserveRequest};
use crate::lottery::{EntryAnswer, EntryRequest, LotteryError};
use crate::problem::{ALREADY_ENTERED, Problem, SOLD_OUT};

/// The reservation route.
const RESERVE: &str = "/inventory/{sku}/reserve";

/// The header that carries a client's idempotency key on `POST /lottery/{draw}/entries` and
/// `POST /checkout`.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The longest SKU, draw or user name accepted.
pub const MAX_ID_LEN: usize = 64;

/// The longest `Idempotency-Key` accepted.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;

impl Shop {
    /// The axum app:
    /// - `POST /inventory/{sku}/reserve`, body `{"user": "...", "quantity": n}`, serialized per
    ///   SKU; waits for the lock, or answers a lock-busy 409 at once with `Prefer: wait=0`;
    /// - `GET /inventory/{sku}`;
    /// - `POST /lottery/{draw}/entries`, body `{"user": "..."}`, header `Idempotency-Key`;
    /// - `GET /lottery/{draw}`;
    /// - `POST /checkout`, body `{"order", "user", "amount_cents"}`, header `Idempotency-Key`:
    ///   charges the order once per key;
    /// - `GET /payments/{order}`: every charge made for the order.
    /// - `GET /metrics`: the locks' metrics in Prometheus text.
    ///
    /// ```
    /// let app = lock_examples::Shop::memory(Default::default()).router();
    /// # drop(app);
    /// ```
    pub fn router(&self) -> Router {
        Router::new()
            .route(RESERVE, self.reserve_route())
            .route("/inventory/{sku}", get(stock))
            .route("/lottery/{draw}/entries", self.idempotent(post(enter)))
            .route("/lottery/{draw}", get(draw))
            .route("/checkout", self.idempotent(post(checkout)))
            .route("/payments/{order}", get(payments))
            .route("/metrics", get(metrics_text))
            .with_state(self.clone())
    }

    /// `POST /inventory/{sku}/reserve`, locked per SKU by lock-tower's [`LockLayer`] keyed by
    /// the `sku` path parameter (lock key `inventory:{sku}`, see [`lock_key`](crate::inventory::lock_key)).
    ///
    /// A layer has one busy policy, and this route offers two, so it is built twice: one copy
    /// waits for the lock (up to [`inventory_wait`](crate::ShopConfig::inventory_wait)), its twin rejects at once with
    /// a lock-busy 409; `Prefer: wait=0` picks the twin. The layers sit after routing (on the
    /// route), where `PathParam` can see `{sku}`.
    fn reserve_route(&self) -> MethodRouter<Shop> {
        if !self.config().locking {
            return post(reserve);
        }
        let waiting: MethodRouter = post(reserve)
            .route_layer(self.sku_lock().wait(self.config().inventory_wait))
            .with_state(self.clone());
        let eager: MethodRouter = post(reserve)
            .route_layer(self.sku_lock().reject_when_busy())
            .with_state(self.clone());
        let by_preference = tower::service_fn(move |request: Request| {
            let route = if prefers_no_wait(request.headers()) {
                eager.clone()
            } else {
                waiting.clone()
            };
            route.oneshot(request)
        });
        any_service(by_preference)
    }

    /// `route` behind lock-tower's [`IdempotencyLayer`]: the first request with an
    /// `Idempotency-Key` runs under the key's lock and its response is stored; every retry
    /// with that key (and the same method, path and body) gets the stored response byte for
    /// byte, with `Idempotent-Replayed: true`, and the handler does not run again. A retry
    /// sent while the first still runs waits for it (up to
    /// [`inventory_wait`](crate::ShopConfig::inventory_wait)), then gets the same replay. Records
    /// live next to the locks (memory, or Redis across processes) for 24 h.
    ///
    /// The handlers still insist on a well-formed key themselves: without one the layer lets
    /// the request through, and the handler answers 400.
    fn idempotent(&self, route: MethodRouter<Shop>) -> MethodRouter<Shop> {
        if !self.config().locking {
            return route;
        }
        route.route_layer(
            IdempotencyLayer::new(self.locker().clone()).wait(self.config().inventory_wait),
        )
    }

    /// The SKU lock: one `inventory:{sku}` lock per SKU, across every process on the backend.
    fn sku_lock(&self) -> LockLayer<PathParam> {
        LockLayer::new(self.locker().clone(), PathParam::new("sku"))
            .key_prefix("inventory:")
            .class(crate::metrics::SKU_CLASS)
    }
}

/// Whether the client asked not to wait for a busy lock: `Prefer: wait=0` (RFC 7240).
///
/// ```
/// use axum::http::{HeaderMap, HeaderValue};
/// let mut headers = HeaderMap::new();
/// assert!(!lock_examples::routes::prefers_no_wait(&headers));
/// headers.insert("prefer", HeaderValue::from_static("respond-async, wait=0"));
/// assert!(lock_examples::routes::prefers_no_wait(&headers));
/// ```
pub fn prefers_no_wait(headers: &HeaderMap) -> bool {
    headers
        .get_all("prefer")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split([',', ';']))
        .filter_map(|pref| pref.split_once('='))
        .any(|(name, value)| {
            name.trim().eq_ignore_ascii_case("wait")
                && value.trim().trim_matches('"').parse::<u64>() == Ok(0)
        })
}

/// Whether `id` is an acceptable SKU, draw or user name: 1 to [`MAX_ID_LEN`] characters of
/// `A-Z a-z 0-9 . _ -`.
///
/// ```
/// assert!(lock_examples::routes::valid_id("sku-42"));
/// assert!(!lock_examples::routes::valid_id("a:b"));
/// assert!(!lock_examples::routes::valid_id(""));
/// ```
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn check_id(what: &str, id: &str) -> Result<(), Problem> {
    if valid_id(id) {
        Ok(())
    } else {
        Err(Problem::invalid(format!(
            "{what} must be 1 to {MAX_ID_LEN} characters of A-Z a-z 0-9 . _ -"
        )))
    }
}

async fn reserve(
    State(shop): State<Shop>,
    Path(sku): Path<String>,
    body: Result<Json<ReserveRequest>, JsonRejection>,
) -> Result<Response, Problem> {
    check_id("sku", &sku)?;
    let Json(request) = body.map_err(|e| Problem::invalid(e.body_text()))?;
    check_id("user", &request.user)?;
    if request.quantity == 0 || request.quantity > MAX_QUANTITY {
        return Err(Problem::invalid(format!(
            "quantity must be from 1 to {MAX_QUANTITY}"
        )));
    }
    match shop.inventory().reserve(&sku, &request).await {
        Ok(reservation) => Ok(Json(reservation).into_response()),
        Err(e @ ReserveError::SoldOut { .. }) => Err(Problem::new(
            StatusCode::CONFLICT,
            SOLD_OUT,
            "Sold out",
            e.to_string(),
        )),
        Err(e @ ReserveError::UnknownSku(_)) => Err(Problem::not_found(e.to_string())),
        Err(e) => Err(Problem::unavailable(e.to_string())),
    }
}

async fn stock(State(shop): State<Shop>, Path(sku): Path<String>) -> Result<Response, Problem> {
    check_id("sku", &sku)?;
    match shop.inventory().view(&sku).await {
        Ok(Some(view)) => Ok(Json(view).into_response()),
        Ok(None) => Err(Problem::not_found(format!("no SKU {sku:?} is on sale"))),
        Err(e) => Err(Problem::unavailable(e.to_string())),
    }
}

async fn enter(
    State(shop): State<Shop>,
    Path(draw): Path<String>,
    headers: HeaderMap,
    body: Result<Json<EntryRequest>, JsonRejection>,
) -> Result<Response, Problem> {
    check_id("draw", &draw)?;
    idempotency_key(&headers)?;
    let Json(request) = body.map_err(|e| Problem::invalid(e.body_text()))?;
    check_id("user", &request.user)?;
    match shop.lottery().enter(&draw, &request.user).await {
        Ok(EntryAnswer::Entered(entry)) => Ok((StatusCode::CREATED, Json(entry)).into_response()),
        Ok(EntryAnswer::AlreadyEntered(entry)) => {
            let mut problem = Problem::new(
                StatusCode::CONFLICT,
                ALREADY_ENTERED,
                "Already entered",
                format!("{} already drew in {draw}", entry.user),
            );
            problem.existing = serde_json::to_value(&entry).ok().map(Box::new);
            Err(problem)
        }
        Err(e @ LotteryError::UnknownDraw(_)) => Err(Problem::not_found(e.to_string())),
        Err(LotteryError::Lock(e)) => Err(Problem::from_lock_error(&e)),
        Err(e) => Err(Problem::unavailable(e.to_string())),
    }
}

fn idempotency_key(headers: &HeaderMap) -> Result<&str, Problem> {
    let value = headers
        .get(IDEMPOTENCY_KEY)
        .ok_or_else(|| Problem::invalid("the Idempotency-Key header is required"))?;
    let key = value.to_str().unwrap_or_default();
    let visible = key.bytes().all(|b| b.is_ascii_graphic());
    if key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY_LEN || !visible {
        return Err(Problem::invalid(format!(
            "Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY_LEN} visible ASCII characters"
        )));
    }
    Ok(key)
}

async fn draw(State(shop): State<Shop>, Path(draw): Path<String>) -> Result<Response, Problem> {
    check_id("draw", &draw)?;
    match shop.lottery().view(&draw).await {
        Ok(Some(view)) => Ok(Json(view).into_response()),
        Ok(None) => Err(Problem::not_found(format!("no draw {draw:?} is open"))),
        Err(e) => Err(Problem::unavailable(e.to_string())),
    }
}

/// `POST /checkout`: charges the order (a new payment on every run of this handler; the route's
/// `IdempotencyLayer` makes sure it runs once per `Idempotency-Key`).
async fn checkout(
    State(shop): State<Shop>,
    headers: HeaderMap,
    body: Result<Json<CheckoutRequest>, JsonRejection>,
) -> Result<Response, Problem> {
    idempotency_key(&headers)?;
    let Json(request) = body.map_err(|e| Problem::invalid(e.body_text()))?;
    check_id("order", &request.order)?;
    check_id("user", &request.user)?;
    if request.amount_cents == 0 || request.amount_cents > MAX_AMOUNT_CENTS {
        return Err(Problem::invalid(format!(
            "amount_cents must be from 1 to {MAX_AMOUNT_CENTS}"
        )));
    }
    match shop.payments().charge(&request).await {
        Ok(payment) => Ok((StatusCode::CREATED, Json(payment)).into_response()),
        Err(e) => Err(Problem::unavailable(e.to_string())),
    }
}

async fn payments(
    State(shop): State<Shop>,
    Path(order): Path<String>,
) -> Result<Response, Problem> {
    check_id("order", &order)?;
    match shop.payments().charges(&order).await {
        Ok(charges) => Ok(Json(charges).into_response()),
        Err(e) => Err(Problem::unavailable(e.to_string())),
    }
}

/// `GET /metrics`: the locks' metrics in Prometheus text (see [`crate::metrics`]).
async fn metrics_text() -> axum::response::Response {
    use axum::response::IntoResponse;
    match crate::metrics::render() {
        Some(text) => (
            [(
                axum::http::header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        None => axum::http::StatusCode::NOT_FOUND.into_response(),
    }
}
