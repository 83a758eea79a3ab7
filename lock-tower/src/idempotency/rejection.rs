//! [`IdempotencyRejection`]: why a request was answered by the idempotency layer itself.

use std::borrow::Cow;

use http::header::{CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};

use crate::rejection::problem_json;

/// Why [`IdempotencyLayer`](crate::IdempotencyLayer) answered a request itself, with the
/// `application/problem+json` (RFC 9457) answer it gets, like [`Rejection`](crate::Rejection)'s.
///
/// | rejection        | status | `Retry-After` | problem `type`                                |
/// |------------------|--------|---------------|-----------------------------------------------|
/// | `MissingKey`     | 400    |               | `urn:lock-tower:idempotency-key-missing`      |
/// | `InvalidKey`     | 400    |               | `urn:lock-tower:invalid-key`                  |
/// | `BodyUnreadable` | 400    |               | `urn:lock-tower:body-unreadable`              |
/// | `InFlight`       | 409    | 1             | `urn:lock-tower:idempotency-in-flight`        |
/// | `NotStored`      | 409    |               | `urn:lock-tower:idempotency-response-not-stored` |
/// | `OutcomeUnknown` | 409    |               | `urn:lock-tower:idempotency-outcome-unknown`  |
/// | `BodyTooLarge`   | 413    |               | `urn:lock-tower:payload-too-large`            |
/// | `Mismatch`       | 422    |               | `urn:lock-tower:idempotency-key-reused`       |
/// | `Unavailable`    | 503    | 1             | `urn:lock-tower:lock-unavailable`             |
/// | `LeaseLost`      | 503    | 1             | `urn:lock-tower:lease-lost`                   |
/// | `Misconfigured`  | 500    |               | `urn:lock-tower:misconfigured`                |
///
/// Bodies never contain the key, the stored response or backend error text.
///
/// ```
/// use lock_tower::IdempotencyRejection;
///
/// let response = IdempotencyRejection::Mismatch.to_response();
/// assert_eq!(response.status(), 422);
/// assert_eq!(response.headers()["content-type"], "application/problem+json");
/// assert!(response.body().contains("urn:lock-tower:idempotency-key-reused"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum IdempotencyRejection {
    /// No `Idempotency-Key` and the layer [requires one](crate::IdempotencyLayer::require_key). 400.
    MissingKey,
    /// The key header is repeated (two keys are not one), or the
    /// [scope](crate::IdempotencyLayer::scope) extractor refused the request. 400.
    InvalidKey {
        /// Why (from the extractor; shown in the body).
        reason: Cow<'static, str>,
    },
    /// The request body could not be read. 400.
    BodyUnreadable,
    /// The first request with this key is still running (and the layer does not
    /// [wait](crate::IdempotencyLayer::wait), or waited in vain). 409.
    InFlight,
    /// The first request with this key ran, but its response was too large to store: it is
    /// not run again within the TTL, and cannot be replayed. 409.
    NotStored {
        /// The status the first request answered.
        status: StatusCode,
    },
    /// A request with this key started its handler (its "started" mark is stored) and no
    /// response was recorded: the server died, lost the key's lock, or could not store the
    /// response while or after the handler ran. The handler may have done its work, partly or
    /// wholly; it is not run again under this key within the TTL. 409, and no `Retry-After`:
    /// retrying the same key gets the same answer (a 5xx would invite automatic retries that
    /// cannot help). The client should check the state of the resource, then send a new
    /// request with a new key if it is still needed.
    OutcomeUnknown,
    /// The request body is larger than the [limit](crate::IdempotencyLayer::max_body). 413.
    BodyTooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// The key was used before with another request (method, route, path, query or body differ). 422.
    Mismatch,
    /// The lock backend failed; the handler was not run, or its result could not be stored. 503.
    Unavailable,
    /// The lock's lease was lost while the handler ran, so its response was not stored and is
    /// not reported as success. 503.
    LeaseLost,
    /// The layer cannot work as configured, or a stored record is unreadable. 500.
    Misconfigured {
        /// What is wrong (logged; not in the body).
        reason: String,
    },
}

impl IdempotencyRejection {
    /// The HTTP status.
    ///
    /// ```
    /// assert_eq!(lock_tower::IdempotencyRejection::InFlight.status(), 409);
    /// ```
    pub fn status(&self) -> StatusCode {
        match self {
            Self::MissingKey | Self::InvalidKey { .. } | Self::BodyUnreadable => {
                StatusCode::BAD_REQUEST
            }
            Self::InFlight | Self::NotStored { .. } | Self::OutcomeUnknown => StatusCode::CONFLICT,
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Mismatch => StatusCode::UNPROCESSABLE_ENTITY,
            Self::Unavailable | Self::LeaseLost => StatusCode::SERVICE_UNAVAILABLE,
            Self::Misconfigured { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The `Retry-After` seconds, where a retry may succeed soon.
    ///
    /// ```
    /// assert_eq!(lock_tower::IdempotencyRejection::InFlight.retry_after(), Some(1));
    /// assert_eq!(lock_tower::IdempotencyRejection::Mismatch.retry_after(), None);
    /// ```
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            Self::InFlight | Self::Unavailable | Self::LeaseLost => Some(1),
            _ => None,
        }
    }

    /// The problem `type` URI (stable; match on it in clients).
    ///
    /// ```
    /// let r = lock_tower::IdempotencyRejection::MissingKey;
    /// assert_eq!(r.problem_type(), "urn:lock-tower:idempotency-key-missing");
    /// ```
    pub fn problem_type(&self) -> &'static str {
        match self {
            Self::MissingKey => "urn:lock-tower:idempotency-key-missing",
            Self::InvalidKey { .. } => crate::problem_type::INVALID_KEY,
            Self::BodyUnreadable => "urn:lock-tower:body-unreadable",
            Self::InFlight => "urn:lock-tower:idempotency-in-flight",
            Self::NotStored { .. } => "urn:lock-tower:idempotency-response-not-stored",
            Self::OutcomeUnknown => "urn:lock-tower:idempotency-outcome-unknown",
            Self::BodyTooLarge { .. } => "urn:lock-tower:payload-too-large",
            Self::Mismatch => "urn:lock-tower:idempotency-key-reused",
            Self::Unavailable => crate::problem_type::LOCK_UNAVAILABLE,
            Self::LeaseLost => crate::problem_type::LEASE_LOST,
            Self::Misconfigured { .. } => crate::problem_type::MISCONFIGURED,
        }
    }

    /// The problem `title`.
    ///
    /// ```
    /// assert_eq!(lock_tower::IdempotencyRejection::Mismatch.title(), "Idempotency key reused");
    /// ```
    pub fn title(&self) -> &'static str {
        match self {
            Self::MissingKey => "Idempotency key required",
            Self::InvalidKey { .. } => "Invalid idempotency key or scope",
            Self::BodyUnreadable => "Request body unreadable",
            Self::InFlight => "Request with this idempotency key in progress",
            Self::NotStored { .. } => "Response of this idempotency key not available",
            Self::OutcomeUnknown => "Outcome of this idempotency key unknown",
            Self::BodyTooLarge { .. } => "Request body too large",
            Self::Mismatch => "Idempotency key reused",
            Self::Unavailable => "Lock service unavailable",
            Self::LeaseLost => "Resource lock lost during the request",
            Self::Misconfigured { .. } => "Internal server error",
        }
    }

    /// The problem `detail`: what happened and what to do.
    ///
    /// ```
    /// assert!(lock_tower::IdempotencyRejection::MissingKey.detail().contains("Idempotency-Key"));
    /// ```
    pub fn detail(&self) -> Cow<'static, str> {
        Cow::Borrowed(match self {
            Self::MissingKey => {
                "This request must carry an Idempotency-Key header, and it carries none."
            }
            Self::InvalidKey { reason } => {
                return Cow::Owned(format!(
                    "The request's idempotency key or scope is not acceptable: {reason}."
                ));
            }
            Self::BodyUnreadable => "The request body could not be read.",
            Self::InFlight => {
                "A request with this idempotency key is still being processed. Retry after the Retry-After delay to get its response."
            }
            Self::NotStored { .. } => {
                "A request with this idempotency key was processed, but its response was too large to keep. It is not processed again; use a new key for a new request."
            }
            Self::OutcomeUnknown => {
                "A request with this idempotency key started, but its outcome was not recorded (the server failed while or after processing it). It may have been applied, wholly or in part, and it is not processed again under this key. Check the resource's state, then send a new request with a new key if it is still needed."
            }
            Self::BodyTooLarge { limit } => {
                return Cow::Owned(format!(
                    "The request body is larger than the {limit} bytes allowed."
                ));
            }
            Self::Mismatch => {
                "This idempotency key was used with a different request (method, path, query or body). Use a new key for a new request."
            }
            Self::Unavailable => {
                "The lock service is unavailable, so the request was not run or its result not kept. Retry later."
            }
            Self::LeaseLost => {
                "The lock on this key was lost while the request ran, so its result was not kept; it may have been partly applied. Check the resource before retrying."
            }
            Self::Misconfigured { .. } => "The server could not process this idempotent request.",
        })
    }

    /// The problem object: `type`, `title`, `status`, `detail`.
    ///
    /// ```
    /// let json = lock_tower::IdempotencyRejection::InFlight.problem_json();
    /// assert!(json.contains(r#""status":409"#));
    /// ```
    pub fn problem_json(&self) -> String {
        problem_json(
            self.problem_type(),
            self.title(),
            self.status(),
            &self.detail(),
        )
    }

    /// The answer: status, `Content-Type: application/problem+json`, `Cache-Control: no-store`,
    /// `Retry-After` where it applies, and the problem body.
    ///
    /// ```
    /// let response = lock_tower::IdempotencyRejection::InFlight.to_response();
    /// assert_eq!(response.headers()["retry-after"], "1");
    /// ```
    pub fn to_response(&self) -> Response<String> {
        self.respond(self.problem_json())
    }

    /// [`to_response`](Self::to_response) with another `detail` (the layer's own words for
    /// its configuration, such as the name of its key header).
    pub(crate) fn to_response_saying(&self, detail: &str) -> Response<String> {
        let body = problem_json(self.problem_type(), self.title(), self.status(), detail);
        self.respond(body)
    }

    fn respond(&self, body: String) -> Response<String> {
        let mut response = Response::new(body);
        *response.status_mut() = self.status();
        let headers = response.headers_mut();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if let Some(secs) = self.retry_after() {
            headers.insert(RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}
