//! lock-tower's tests: one binary, one module per theme.

// Test helpers outside `#[test]` functions fail the test by panicking, by design.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

mod axum_routes;
mod backend;
mod held_body_http;
mod hostile;
mod http;
mod lifecycle;
mod rejections;
mod serialize;
