//! IdempotencyLayer over real axum servers on loopback: the memory backend, and Redis for the
//! cross-process cases.

// Test helpers outside `#[test]` functions fail the test by panicking, by design.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

mod behaviour;
mod fingerprint;
mod redis;
mod streaming;
mod unprocessed;
