//! [`IdempotencyLayer`]: at most once per `Idempotency-Key`, and every retry gets the first
//! answer (the IETF HTTPAPI draft "The Idempotency-Key HTTP Header Field", as Stripe does it),
//! across processes, built on the lock.
//!
//! ```
//! # #[cfg(feature = "axum")] {
//! use axum::{Router, routing::post};
//! use lock_tower::IdempotencyLayer;
//!
//! async fn charge() -> &'static str { "charged" }
//!
//! let locker = lock_core::Locker::memory(); // Locker::redis(url) for many processes
//! let app: Router = Router::new()
//!     .route("/payments", post(charge))
//!     .layer(IdempotencyLayer::new(locker.clone())); // Idempotency-Key, records kept 24 h
//! # drop(app);
//! # }
//! ```
//!
//! For a request carrying the key header (the key is scoped by method, path and the optional
//! [principal](IdempotencyLayer::scope), then bounded and hashed like
//! [`LockLayer`](crate::LockLayer)'s keys):
//!
//! - its body is read (up to [`max_body`](IdempotencyLayer::max_body), else 413) and its
//!   fingerprint taken: SHA-256 of method, path and query, and body;
//! - a stored record with the same fingerprint: the stored response (status, end-to-end headers,
//!   body, byte for byte) with `Idempotent-Replayed: true`; the handler does not run. Another
//!   fingerprint: 422;
//! - the first request still running: 409 with `Retry-After`, or with
//!   [`wait`](IdempotencyLayer::wait), wait for it and replay its answer;
//! - otherwise the request takes the key's lock, looks again (another may have finished), runs
//!   the handler, and stores its response with [`lock_core::LockGuard::store_result`] (only
//!   while the lock is ours: a lost lease answers 503, not the handler's success). 5xx answers
//!   are not stored, so a retry runs again. A response too large to store
//!   ([`lock_core::MAX_RESULT_LEN`]) is answered to its client and recorded as "ran, not
//!   stored": duplicates within the TTL get 409 `idempotency-response-not-stored`, never a
//!   second run. A client that goes away drops the request: the lock is released (its lease
//!   as backstop) and nothing is stored.
//!
//! Requests without the header pass through ([`require_key`](IdempotencyLayer::require_key):
//! 400). Every rejection is an [`IdempotencyRejection`] answered as `application/problem+json`.
//!
//! The request body type must be buildable from `Bytes` (axum's `Body`, `Full<Bytes>`,
//! not `String`): the layer reads it and hands the handler the same bytes. Responses are
//! buffered to be stored.

mod future;
mod layer;
mod record;
mod rejection;
mod service;

pub use future::IdempotencyFuture;
pub use layer::IdempotencyLayer;
pub use rejection::IdempotencyRejection;
pub use service::IdempotencyService;
