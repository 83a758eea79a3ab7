#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod body;
pub mod extract;
mod fencing;
mod future;
mod hold;
pub mod idempotency;
mod key;
mod layer;
mod metrics;
pub mod rejection;
mod service;
mod uri;

pub use body::{BodyError, LeaseLostError, ResponseBody};
#[cfg(feature = "axum")]
pub use extract::PathParam;
pub use extract::{
    HeaderKey, KeyExtractor, KeyRejection, MethodAndPath, QueryParam, RawKey, key_fn,
};
pub use fencing::FencingToken;
#[cfg(feature = "axum")]
pub use fencing::MissingFencingToken;
pub use future::ResponseFuture;
pub use idempotency::{
    IdempotencyFuture, IdempotencyLayer, IdempotencyRejection, IdempotencyService,
};
pub use layer::LockLayer;
pub use metrics::{LockLayerMetrics, MetricsSnapshot};
pub use rejection::{Rejection, problem_type};
pub use service::LockService;
