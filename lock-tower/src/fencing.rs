//! [`FencingToken`]: the fencing token of a request's lock, as a request extension.

/// The fencing token of the lock a request runs under, inserted as a request extension when
/// the layer is [`fenced`](crate::LockLayer::fenced).
///
/// Tokens of one key strictly increase across holders, processes and restarts of the client.
/// Pass it to the storage you write to and have it refuse writes carrying a token lower than
/// the highest it has seen: a request that lost its lock (a long pause, a partition) can then
/// no longer overwrite the work of the next holder.
///
/// With the `axum` feature it is an extractor: `FencingToken` (500 when the request has none:
/// the route is not under a fenced layer) or `Option<FencingToken>`.
///
/// ```
/// # async fn demo() {
/// use lock_tower::{FencingToken, LockLayer, extract::MethodAndPath};
/// use tower::ServiceExt;
///
/// let svc = tower::ServiceBuilder::new()
///     .layer(LockLayer::new(lock_core::Locker::memory(), MethodAndPath).fenced())
///     .service_fn(|req: http::Request<String>| async move {
///         let token = req.extensions().get::<FencingToken>().copied();
///         Ok::<_, std::convert::Infallible>(http::Response::new(format!("{token:?}")))
///     });
/// let response = svc.oneshot(http::Request::new(String::new())).await.unwrap();
/// # let _ = response;
/// # }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub u64);

impl FencingToken {
    /// The token's value.
    ///
    /// ```
    /// assert_eq!(lock_tower::FencingToken(7).get(), 7);
    /// ```
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl std::fmt::Display for FencingToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(feature = "axum")]
mod axum_impls {
    use axum::extract::{FromRequestParts, OptionalFromRequestParts};
    use axum::response::{IntoResponse, Response};
    use http::StatusCode;
    use http::request::Parts;

    use super::FencingToken;

    /// Rejection of the [`FencingToken`] extractor: the request carries no token, because its
    /// route is not under a [`fenced`](crate::LockLayer::fenced) lock layer or it passed through
    /// unlocked. Answers 500 (a server configuration problem); extract
    /// `Option<FencingToken>` to handle it yourself.
    ///
    /// ```
    /// use axum::response::IntoResponse;
    /// let response = lock_tower::MissingFencingToken.into_response();
    /// assert_eq!(response.status(), 500);
    /// ```
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct MissingFencingToken;

    impl std::fmt::Display for MissingFencingToken {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("the request has no fencing token: it is not under a fenced LockLayer")
        }
    }

    impl std::error::Error for MissingFencingToken {}

    impl IntoResponse for MissingFencingToken {
        fn into_response(self) -> Response {
            tracing::error!("{self}");
            (StatusCode::INTERNAL_SERVER_ERROR, "Internal server error").into_response()
        }
    }

    impl<S: Send + Sync> FromRequestParts<S> for FencingToken {
        type Rejection = MissingFencingToken;

        async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
            parts
                .extensions
                .get::<FencingToken>()
                .copied()
                .ok_or(MissingFencingToken)
        }
    }

    impl<S: Send + Sync> OptionalFromRequestParts<S> for FencingToken {
        type Rejection = std::convert::Infallible;

        async fn from_request_parts(
            parts: &mut Parts,
            _: &S,
        ) -> Result<Option<Self>, Self::Rejection> {
            Ok(parts.extensions.get::<FencingToken>().copied())
        }
    }
}

#[cfg(feature = "axum")]
pub use axum_impls::MissingFencingToken;
