//! [`Rejection`]: why a request was answered by the layer instead of the service, and the
//! `application/problem+json` (RFC 9457) answer it gets by default.
//!
//! | rejection                    | status | `Retry-After` |
//! |------------------------------|--------|---------------|
//! | [`Rejection::Busy`]          | 409    | the holder's remaining lease when known, else 1 |
//! | [`Rejection::Timeout`]       | 409    | 1             |
//! | [`Rejection::Unavailable`]   | 503    | 1             |
//! | [`Rejection::LeaseLost`]     | 503    | 1             |
//! | [`Rejection::MissingKey`]    | 400    |               |
//! | [`Rejection::InvalidKey`]    | 400    |               |
//! | [`Rejection::Misconfigured`] | 500    |               |
//!
//! Bodies never contain the key (it comes from the client), tokens, or backend error text
//! (addresses, credentials); those go to the log. Replace them with
//! [`LockLayer::on_rejection`](crate::LockLayer::on_rejection).
//!
//! ```
//! use std::time::Duration;
//! use lock_tower::Rejection;
//!
//! let busy = Rejection::Busy { key: "order:1".into(), retry_after: Some(Duration::from_millis(2500)) };
//! let response = busy.to_response();
//! assert_eq!(response.status(), 409);
//! assert_eq!(response.headers()["retry-after"], "3");
//! assert_eq!(response.headers()["content-type"], "application/problem+json");
//! assert!(response.body().contains(r#""status":409"#));
//! ```

use std::borrow::Cow;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use http::{Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use lock_core::LockError;

use crate::BodyError;
use crate::extract::KeyRejection;

/// The media type of the default rejection bodies.
///
/// ```
/// let response = lock_tower::Rejection::MissingKey.to_response();
/// assert_eq!(response.headers()["content-type"], lock_tower::rejection::PROBLEM_JSON);
/// ```
pub const PROBLEM_JSON: &str = "application/problem+json";

/// A custom rejection handler, boxed (see [`LockLayer::on_rejection`](crate::LockLayer::on_rejection)).
pub(crate) type Handler =
    Arc<dyn Fn(&Rejection) -> Response<UnsyncBoxBody<Bytes, BodyError>> + Send + Sync>;

/// Why the layer answered a request itself instead of (or instead of finishing) calling the
/// service.
///
/// Keys here are lock keys as the layer built them (prefix included, untrusted values bounded
/// and hashed where needed), not raw request bytes.
///
/// ```
/// use lock_tower::Rejection;
///
/// let r = Rejection::MissingKey;
/// assert_eq!(r.status(), http::StatusCode::BAD_REQUEST);
/// assert_eq!(r.retry_after(), None);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Rejection {
    /// The key was locked and the layer does not wait ([`reject_when_busy`](crate::LockLayer::reject_when_busy)). 409.
    Busy {
        /// The lock key.
        key: String,
        /// How long the holder's lease still runs, when the backend said (an upper bound on
        /// the wait: a renewing holder usually finishes sooner).
        retry_after: Option<Duration>,
    },
    /// The key stayed locked for the whole wait. 409.
    Timeout {
        /// The lock key.
        key: String,
        /// How long the request waited.
        waited: Duration,
    },
    /// The lock backend failed (unreachable, timed out, bad answer) and the layer fails
    /// closed: the service was not called. 503.
    Unavailable {
        /// The lock key.
        key: String,
        /// The backend error (logged; never put in the default body).
        error: LockError,
    },
    /// The lease was lost while the request ran (expired, deleted, taken over). The service's
    /// future was dropped, or its response discarded, because it might have run alongside
    /// another holder. 503: the outcome is unknown to the client.
    LeaseLost {
        /// The lock key.
        key: String,
    },
    /// The request names no key and the layer [requires one](crate::LockLayer::require_key). 400.
    MissingKey,
    /// The extractor refused the request's key. 400.
    InvalidKey {
        /// Why (from the extractor; shown in the default body).
        reason: Cow<'static, str>,
    },
    /// The layer cannot work as configured: an extractor that cannot run here, or a locker
    /// whose configuration is invalid. Never passed through, even when failing open. 500.
    Misconfigured {
        /// What is wrong (logged; never put in the default body).
        reason: String,
    },
}

impl Rejection {
    pub(crate) fn from_lock_error(error: LockError) -> Self {
        let key = error.key().unwrap_or_default().to_owned();
        match error {
            LockError::Busy { retry_after, .. } => Rejection::Busy { key, retry_after },
            LockError::Timeout { waited, .. } => Rejection::Timeout { key, waited },
            LockError::LeaseLost { .. } => Rejection::LeaseLost { key },
            LockError::InvalidKey { .. } | LockError::InvalidConfig { .. } => {
                Rejection::Misconfigured {
                    reason: error.to_string(),
                }
            }
            // Backend failures, and failures of kinds added later that say a retry may work.
            error if error.is_retryable() => Rejection::Unavailable { key, error },
            error => Rejection::Misconfigured {
                reason: error.to_string(),
            },
        }
    }

    /// The HTTP status of the default answer.
    ///
    /// ```
    /// let r = lock_tower::Rejection::LeaseLost { key: "k".into() };
    /// assert_eq!(r.status(), http::StatusCode::SERVICE_UNAVAILABLE);
    /// ```
    pub fn status(&self) -> StatusCode {
        match self {
            Rejection::Busy { .. } | Rejection::Timeout { .. } => StatusCode::CONFLICT,
            Rejection::Unavailable { .. } | Rejection::LeaseLost { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Rejection::MissingKey | Rejection::InvalidKey { .. } => StatusCode::BAD_REQUEST,
            Rejection::Misconfigured { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The `Retry-After` value in whole seconds (at least 1), for 409 and 503; `None` otherwise.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lock_tower::Rejection;
    /// let r = Rejection::Busy { key: "k".into(), retry_after: Some(Duration::from_millis(10)) };
    /// assert_eq!(r.retry_after(), Some(1));
    /// let r = Rejection::Timeout { key: "k".into(), waited: Duration::from_secs(2) };
    /// assert_eq!(r.retry_after(), Some(1));
    /// ```
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            Rejection::Busy {
                retry_after: Some(d),
                ..
            } => {
                let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
                Some(secs.max(1))
            }
            Rejection::Busy { .. }
            | Rejection::Timeout { .. }
            | Rejection::Unavailable { .. }
            | Rejection::LeaseLost { .. } => Some(1),
            _ => None,
        }
    }

    /// The lock key concerned, when there is one.
    ///
    /// ```
    /// let r = lock_tower::Rejection::LeaseLost { key: "sku:1".into() };
    /// assert_eq!(r.key(), Some("sku:1"));
    /// ```
    pub fn key(&self) -> Option<&str> {
        match self {
            Rejection::Busy { key, .. }
            | Rejection::Timeout { key, .. }
            | Rejection::Unavailable { key, .. }
            | Rejection::LeaseLost { key } => Some(key),
            _ => None,
        }
    }

    /// The lock-core error behind this rejection, when there is one kept.
    ///
    /// ```
    /// let r = lock_tower::Rejection::MissingKey;
    /// assert!(r.lock_error().is_none());
    /// ```
    pub fn lock_error(&self) -> Option<&LockError> {
        match self {
            Rejection::Unavailable { error, .. } => Some(error),
            _ => None,
        }
    }

    /// The problem `type` URI of the default body (stable; match on it in clients).
    ///
    /// ```
    /// assert_eq!(lock_tower::Rejection::MissingKey.problem_type(), "urn:lock-tower:missing-key");
    /// ```
    pub fn problem_type(&self) -> &'static str {
        match self {
            Rejection::Busy { .. } => problem_type::BUSY,
            Rejection::Timeout { .. } => problem_type::WAIT_TIMEOUT,
            Rejection::Unavailable { .. } => problem_type::LOCK_UNAVAILABLE,
            Rejection::LeaseLost { .. } => problem_type::LEASE_LOST,
            Rejection::MissingKey => problem_type::MISSING_KEY,
            Rejection::InvalidKey { .. } => problem_type::INVALID_KEY,
            Rejection::Misconfigured { .. } => problem_type::MISCONFIGURED,
        }
    }

    /// The problem `title` of the default body.
    ///
    /// ```
    /// assert_eq!(lock_tower::Rejection::MissingKey.title(), "Lock key required");
    /// ```
    pub fn title(&self) -> &'static str {
        match self {
            Rejection::Busy { .. } => "Resource is locked",
            Rejection::Timeout { .. } => "Timed out waiting for the resource lock",
            Rejection::Unavailable { .. } => "Lock service unavailable",
            Rejection::LeaseLost { .. } => "Resource lock lost during the request",
            Rejection::MissingKey => "Lock key required",
            Rejection::InvalidKey { .. } => "Invalid lock key",
            Rejection::Misconfigured { .. } => "Internal server error",
        }
    }

    /// The problem `detail` of the default body: what happened and what to do, without the
    /// key, tokens or backend errors.
    ///
    /// ```
    /// let detail = lock_tower::Rejection::MissingKey.detail();
    /// assert!(detail.contains("key"));
    /// ```
    pub fn detail(&self) -> Cow<'static, str> {
        match self {
            Rejection::Busy { .. } => Cow::Borrowed(
                "Another request holds the lock on this resource. Retry after the Retry-After delay.",
            ),
            Rejection::Timeout { waited, .. } => Cow::Owned(format!(
                "Another request held the lock on this resource for the whole wait of {} ms. Retry after the Retry-After delay.",
                waited.as_millis()
            )),
            Rejection::Unavailable { .. } => Cow::Borrowed(
                "The lock service is unavailable, so the request was not run. Retry later.",
            ),
            Rejection::LeaseLost { .. } => Cow::Borrowed(
                "The lock on this resource was lost while the request ran, so it was cancelled; it may have been partly applied. Check the resource before retrying.",
            ),
            Rejection::MissingKey => Cow::Borrowed(
                "This request must name the resource to lock (its lock key), and it names none.",
            ),
            Rejection::InvalidKey { reason } => Cow::Owned(format!(
                "The request's lock key is not acceptable: {reason}."
            )),
            Rejection::Misconfigured { .. } => {
                Cow::Borrowed("The server could not take the lock for this request.")
            }
        }
    }

    /// The default body: an RFC 9457 problem object with `type`, `title`, `status`, `detail`.
    ///
    /// ```
    /// let json = lock_tower::Rejection::MissingKey.problem_json();
    /// assert!(json.starts_with(r#"{"type":"urn:lock-tower:missing-key","#));
    /// ```
    pub fn problem_json(&self) -> String {
        problem_json(
            self.problem_type(),
            self.title(),
            self.status(),
            &self.detail(),
        )
    }

    /// The default answer: status, `Content-Type: application/problem+json`,
    /// `Cache-Control: no-store`, `Retry-After` where it applies, and the problem body.
    /// Start from it in a custom handler to change one thing.
    ///
    /// ```
    /// let response = lock_tower::Rejection::MissingKey.to_response();
    /// assert_eq!(response.status(), 400);
    /// assert!(response.headers().get("retry-after").is_none());
    /// ```
    pub fn to_response(&self) -> Response<String> {
        let mut response = Response::new(self.problem_json());
        *response.status_mut() = self.status();
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if let Some(secs) = self.retry_after() {
            headers.insert(RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

impl From<KeyRejection> for Rejection {
    fn from(r: KeyRejection) -> Self {
        if r.is_misconfigured() {
            Rejection::Misconfigured {
                reason: r.reason().to_owned(),
            }
        } else {
            Rejection::InvalidKey {
                reason: Cow::Owned(r.reason().to_owned()),
            }
        }
    }
}

/// Appends `s` as a JSON string literal.
/// An RFC 9457 problem object: `type`, `title`, `status`, `detail`, shared by every rejection
/// of the crate's layers.
pub(crate) fn problem_json(
    problem_type: &str,
    title: &str,
    status: StatusCode,
    detail: &str,
) -> String {
    let mut out = String::with_capacity(256);
    out.push_str("{\"type\":");
    json_string(&mut out, problem_type);
    out.push_str(",\"title\":");
    json_string(&mut out, title);
    let _ = write!(out, ",\"status\":{},\"detail\":", status.as_u16());
    json_string(&mut out, detail);
    out.push('}');
    out
}

pub(crate) fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() || c == '\u{2028}' || c == '\u{2029}' => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_strings_are_escaped() {
        let mut out = String::new();
        json_string(&mut out, "a\"b\\c\n\u{1}\u{2028}é");
        assert_eq!(out, r#""a\"b\\c\u000a\u0001\u2028é""#);
    }

    #[tokio::test]
    async fn lock_errors_map_to_statuses() {
        // Lock errors are made by lock-core's operations only (its variants are
        // non-exhaustive): provoke each one.
        let status = |e: LockError| Rejection::from_lock_error(e).status();
        let backend = lock_core::MemoryBackend::new();
        let locker = lock_core::Locker::builder(backend.clone()).build();
        let held = locker.lock("k").await.unwrap();
        let busy = locker.try_lock("k").await.unwrap_err();
        assert!(matches!(busy, LockError::Busy { .. }));
        assert_eq!(status(busy), StatusCode::CONFLICT);
        let bad_config = lock_core::Locker::builder(backend.clone())
            .lease(Duration::ZERO)
            .try_build()
            .unwrap_err();
        assert!(matches!(bad_config, LockError::InvalidConfig { .. }));
        assert_eq!(status(bad_config), StatusCode::INTERNAL_SERVER_ERROR);
        // No test of this crate sets the process-wide locker.
        let no_global = lock_core::global().unwrap_err();
        assert!(matches!(no_global, LockError::NoGlobalLocker));
        assert_eq!(status(no_global), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(backend.force_delete("k"));
        let lost = held.release().await.unwrap_err();
        assert!(matches!(lost, LockError::LeaseLost { .. }));
        assert_eq!(status(lost), StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn retry_after_rounds_up_and_is_at_least_one() {
        let busy = |d| Rejection::Busy {
            key: "k".into(),
            retry_after: Some(d),
        };
        assert_eq!(busy(Duration::ZERO).retry_after(), Some(1));
        assert_eq!(busy(Duration::from_secs(2)).retry_after(), Some(2));
        assert_eq!(busy(Duration::from_millis(2001)).retry_after(), Some(3));
    }
}

/// The `type` URIs of the layer's `application/problem+json` answers, for clients and tests that
/// tell the layer's 409s and 503s apart from the application's own.
///
/// ```
/// use lock_tower::{Rejection, problem_type};
/// assert_eq!(Rejection::MissingKey.problem_type(), problem_type::MISSING_KEY);
/// ```
pub mod problem_type {
    /// 409: the key is locked and the layer does not wait (`reject_when_busy`).
    pub const BUSY: &str = "urn:lock-tower:busy";
    /// 409: the key stayed locked for the whole wait.
    pub const WAIT_TIMEOUT: &str = "urn:lock-tower:wait-timeout";
    /// 503: the lock backend failed (fail closed).
    pub const LOCK_UNAVAILABLE: &str = "urn:lock-tower:lock-unavailable";
    /// 503: the lease was lost while the request ran; its work was cancelled.
    pub const LEASE_LOST: &str = "urn:lock-tower:lease-lost";
    /// 400: the request carries no key and the layer requires one.
    pub const MISSING_KEY: &str = "urn:lock-tower:missing-key";
    /// 400: the key in the request is not acceptable.
    pub const INVALID_KEY: &str = "urn:lock-tower:invalid-key";
    /// 500: the layer is set up wrongly (for example a path parameter read before routing).
    pub const MISCONFIGURED: &str = "urn:lock-tower:misconfigured";
}
