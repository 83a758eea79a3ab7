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
//! For a request carrying the key header (the key is scoped by the caller, by default a hash of
//! its `Authorization` or `Cookie` header, or by the [principal](IdempotencyLayer::scope) you
//! choose, or [not at all](IdempotencyLayer::shared_records), then bounded and hashed like
//! [`LockLayer`](crate::LockLayer)'s keys: one key sent with another method or path is a key
//! reused, 422):
//!
//! - its body is read (up to [`max_body`](IdempotencyLayer::max_body), else 413) and its
//!   fingerprint taken: SHA-256 of method, route, path and query, and body;
//! - a stored record with the same fingerprint: the stored response (status, end-to-end headers,
//!   body, byte for byte, and its trailers, such as gRPC's `grpc-status`) with
//!   `Idempotent-Replayed: true`; the handler does not run. Another
//!   fingerprint: 422;
//! - the first request still running: 409 with `Retry-After`, or with
//!   [`wait`](IdempotencyLayer::wait), wait for it and replay its answer;
//! - otherwise the request takes the key's lock, looks again (another may have finished),
//!   writes the key's durable "started" mark ([`lock_core::LockGuard::mark_started`]; if it
//!   cannot be written the handler does not run: 503, safe to retry), runs the handler, and
//!   stores its response with [`lock_core::LockGuard::store_result`] in the mark's place (only
//!   while the lock is ours: a lost lease answers 503, not the handler's success). 5xx, 401,
//!   408 and 429 answers are not stored (they say "not now", not "this request's answer"),
//!   nor 400, 404, 405, 413, 414, 415 and 431 (a request that failed before it was processed:
//!   an extractor's rejection, no such route or method; a layer over a whole router would
//!   otherwise keep one for every key anyone sends), nor 411, 417, 421, 425 and 428 (send it
//!   again, elsewhere, later or with another header), nor 307 and 308 (the same request,
//!   key included, goes to another path: stored, it would be a key reused), nor a gRPC error whose `grpc-status`
//!   (a trailer, or a header) maps to one of those (`UNAVAILABLE`, `INTERNAL`,
//!   `UNIMPLEMENTED`, `RESOURCE_EXHAUSTED`...): the mark is taken back under the lock, so a
//!   retry runs again; other 4xx answers (402, 403, 409, 422...) are the handler's verdict and
//!   are replayed.
//! - a request that finds the mark without a response (the server died, lost the key's lease,
//!   or could not store the response, after the handler started) gets 409
//!   `idempotency-outcome-unknown` (422 for another fingerprint), never a second run, until
//!   the mark expires with the record's TTL: the handler may have done its work, and only the
//!   client can check. A crash mid-handler leaves its key so for the TTL: that is the price of
//!   at most once. A response
//!   too large to store ([`lock_core::MAX_RESULT_LEN`]), or whose body fails while it is
//!   read, is recorded as "ran, not stored": duplicates within the TTL get 409
//!   `idempotency-response-not-stored`, never a second run. The body is read before the
//!   response goes out, but never more than that limit of it: a longer one (or one whose
//!   `Content-Length` or size hint says so) is recorded "not stored" at once and streams to
//!   the client, the part already read first, so a large download or an endless stream behind
//!   a key costs at most 1 MiB of memory (with `detach_handler`, a task reads it to its end
//!   even if the client goes away).
//! - a request dropped mid-handler (the client went away, a timeout layer above gave up)
//!   cancels the handler, stores nothing and releases the key's lock, so layers above keep
//!   their meaning (a `LockLayer` outside never sees its handler outlive its lock); its mark
//!   stays, so the retry gets 409 outcome-unknown (the handler may have done part of its
//!   work). With [`detach_handler`](IdempotencyLayer::detach_handler), the
//!   handler, the storing of its response and the release run in a task of their own
//!   (`tokio::spawn`): the handler runs to its end, its response is stored, and the retry
//!   replays it (or gets 409 while it still runs, or with `wait` waits for it). Only the loss
//!   of the key's lease stops it, detached or not: the handler is cancelled, nothing is stored,
//!   the request gets 503 `lease-lost`, and its retry 409 outcome-unknown. Hence the
//!   bounds: the inner service, its future, its error and both body types are
//!   `Send + 'static`, as axum's and hyper's are, and the layer runs inside a Tokio runtime.
//!
//! A [`ttl`](IdempotencyLayer::ttl) out of range never panics: every request carrying a key
//! answers 500 `misconfigured` before its handler runs.
//!
//! The key header is the IETF draft's sf-string (`Idempotency-Key: "abc"`, escapes `\"` and
//! `\\`) or a bare value (`abc`): both are the key `abc`. A malformed sf-string (no closing
//! quote, another escape, anything after the closing quote, `""`) is 400 `invalid-key`.
//!
//! Requests without the header pass through ([`require_key`](IdempotencyLayer::require_key):
//! 400); a request with several keys (the header twice, or one value listing two, `a, b`)
//! gets 400 `invalid-key`: two keys are not one. Every rejection is an
//! [`IdempotencyRejection`] answered as `application/problem+json`.
//!
//! The request body type must be buildable from `Bytes` (axum's `Body`, `Full<Bytes>`,
//! not `String`): the layer reads it and hands the handler the same bytes. Response bodies are
//! read (up to [`lock_core::MAX_RESULT_LEN`]) to be stored before the response goes out.

mod future;
mod key_header;
mod layer;
mod record;
mod rejection;
mod service;

pub use future::IdempotencyFuture;
pub use layer::IdempotencyLayer;
pub use rejection::IdempotencyRejection;
pub use service::IdempotencyService;
