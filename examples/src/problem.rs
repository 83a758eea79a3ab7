//! Error answers as `application/problem+json` (RFC 9457).
//!
//! Two different 409s come out of `POST /inventory/{sku}/reserve`, and clients must tell them
//! apart: [`SOLD_OUT`] means "there is nothing left, stop trying", while a lock 409
//! ([`LOCK_BUSY`], [`LOCK_WAIT_TIMEOUT`], answered by lock-tower's `LockLayer`) means "someone
//! else is buying this SKU right now, try again". The `type` member says which.

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use lock_core::LockError;
use serde::{Deserialize, Serialize};

/// The media type of every error body.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// `type` of the 409 answered when the stock cannot cover the request.
pub const SOLD_OUT: &str = "https://example.invalid/problems/sold-out";
/// `type` of the 409 answered when the lock is busy and the request does not wait
/// (lock-tower's, so the layer and the lottery speak the same language).
pub const LOCK_BUSY: &str = lock_tower::problem_type::BUSY;
/// `type` of the 409 answered when the lock stayed busy for the whole wait (lock-tower's).
pub const LOCK_WAIT_TIMEOUT: &str = lock_tower::problem_type::WAIT_TIMEOUT;
/// `type` of the 409 answered when the user already drew in this draw (with another key).
pub const ALREADY_ENTERED: &str = "https://example.invalid/problems/already-entered";
/// `type` of a 400: a malformed body, id or header.
pub const INVALID_REQUEST: &str = "https://example.invalid/problems/invalid-request";
/// `type` of a 404: no such SKU or draw.
pub const NOT_FOUND: &str = "https://example.invalid/problems/not-found";
/// `type` of a 503: the lock backend or the state store failed.
pub const UNAVAILABLE: &str = "https://example.invalid/problems/unavailable";

/// One problem+json body.
///
/// ```
/// use lock_examples::problem::{Problem, SOLD_OUT};
/// let p = Problem::new(axum::http::StatusCode::CONFLICT, SOLD_OUT, "Sold out", "0 left");
/// assert_eq!(p.status, 409);
/// assert!(p.is(SOLD_OUT));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    /// A URI naming the kind of problem; compare it, not the title.
    #[serde(rename = "type")]
    pub kind: String,
    /// A short human summary of the kind.
    pub title: String,
    /// The HTTP status.
    pub status: u16,
    /// What happened this time.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
    /// For a busy lock: when the current holder's lease ends, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// For a problem about a resource that has a JSON state (an existing lottery entry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub existing: Option<Box<serde_json::Value>>,
}

impl Problem {
    /// A problem with no extension members.
    ///
    /// ```
    /// use lock_examples::problem::{Problem, NOT_FOUND};
    /// let p = Problem::new(axum::http::StatusCode::NOT_FOUND, NOT_FOUND, "Not found", "no SKU x");
    /// assert_eq!(p.detail, "no SKU x");
    /// ```
    pub fn new(status: StatusCode, kind: &str, title: &str, detail: impl Into<String>) -> Problem {
        Problem {
            kind: kind.to_owned(),
            title: title.to_owned(),
            status: status.as_u16(),
            detail: detail.into(),
            retry_after_ms: None,
            existing: None,
        }
    }

    /// A 400 [`INVALID_REQUEST`].
    ///
    /// ```
    /// let p = lock_examples::problem::Problem::invalid("quantity must be at least 1");
    /// assert_eq!(p.status, 400);
    /// ```
    pub fn invalid(detail: impl Into<String>) -> Problem {
        Problem::new(
            StatusCode::BAD_REQUEST,
            INVALID_REQUEST,
            "Invalid request",
            detail,
        )
    }

    /// A 404 [`NOT_FOUND`].
    ///
    /// ```
    /// assert_eq!(lock_examples::problem::Problem::not_found("no such draw").status, 404);
    /// ```
    pub fn not_found(detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::NOT_FOUND, NOT_FOUND, "Not found", detail)
    }

    /// A 503 [`UNAVAILABLE`] (backend failures fail closed: nothing ran unlocked).
    ///
    /// ```
    /// assert_eq!(lock_examples::problem::Problem::unavailable("redis down").status, 503);
    /// ```
    pub fn unavailable(detail: impl Into<String>) -> Problem {
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            UNAVAILABLE,
            "Service unavailable",
            detail,
        )
    }

    /// The answer for a lock error, as lock-tower's layer answers it: busy is a 409
    /// [`LOCK_BUSY`], a wait that timed out a 409 [`LOCK_WAIT_TIMEOUT`] (the client may retry),
    /// everything else a 503.
    ///
    /// ```
    /// # async fn demo() {
    /// use lock_examples::problem::{Problem, LOCK_BUSY};
    /// let locker = lock_core::Locker::memory();
    /// let _held = locker.lock("inventory:sku-1").await.unwrap();
    /// let busy = locker.try_lock("inventory:sku-1").await.unwrap_err();
    /// assert!(Problem::from_lock_error(&busy).is(LOCK_BUSY));
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub fn from_lock_error(error: &LockError) -> Problem {
        match error {
            LockError::Busy { retry_after, .. } => {
                let mut p = Problem::new(
                    StatusCode::CONFLICT,
                    LOCK_BUSY,
                    "Resource is locked",
                    "Another request holds the lock on this resource. Retry after the Retry-After delay.",
                );
                p.retry_after_ms = retry_after.map(millis);
                p
            }
            LockError::Timeout { waited, .. } => Problem::new(
                StatusCode::CONFLICT,
                LOCK_WAIT_TIMEOUT,
                "Timed out waiting for the resource lock",
                format!(
                    "Another request held the lock on this resource for the whole wait of {} ms. Retry after the Retry-After delay.",
                    waited.as_millis()
                ),
            ),
            _ => Problem::unavailable(error.to_string()),
        }
    }

    /// Whether this is a lock conflict ([`LOCK_BUSY`] or [`LOCK_WAIT_TIMEOUT`]): retrying later
    /// may succeed.
    ///
    /// ```
    /// use lock_examples::problem::{Problem, SOLD_OUT};
    /// let busy = Problem::new(axum::http::StatusCode::CONFLICT, "urn:lock-tower:busy", "Resource is locked", "");
    /// assert!(busy.is_lock_conflict());
    /// let sold_out = Problem::new(axum::http::StatusCode::CONFLICT, SOLD_OUT, "Sold out", "");
    /// assert!(!sold_out.is_lock_conflict());
    /// ```
    pub fn is_lock_conflict(&self) -> bool {
        self.is(LOCK_BUSY) || self.is(LOCK_WAIT_TIMEOUT)
    }

    /// Whether this problem is of kind `kind`.
    ///
    /// ```
    /// use lock_examples::problem::{Problem, NOT_FOUND, SOLD_OUT};
    /// assert!(!Problem::not_found("x").is(SOLD_OUT));
    /// ```
    pub fn is(&self, kind: &str) -> bool {
        self.kind == kind
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let retry_after = self
            .retry_after_ms
            .map(|ms| ms.div_ceil(1000).max(1))
            .or_else(|| self.is_lock_conflict().then_some(1));
        let body = match serde_json::to_vec(&self) {
            Ok(body) => body,
            Err(_) => return status.into_response(),
        };
        let mut response = (status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(seconds) = retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}
