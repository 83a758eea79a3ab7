//! Keys from the request target: [`MethodAndPath`] and, with axum, [`PathParam`].

use http::request::Parts;

use super::{KeyExtractor, KeyRejection, RawKey};

/// The key is the method and the path, `"PUT /carts/7"` (the query string is left out): one
/// request at a time per resource and verb.
///
/// The path is the one the client sent (axum's `OriginalUri` under a `Router::nest`), with one
/// spelling per percent-encoded path: `/carts/%37` is `/carts/7`, as the route parameter is
/// `"7"` for both (escapes of `/`, `%`, `?`, `#`, control and non-ASCII bytes stay escapes,
/// their hex digits upper-cased).
///
/// ```
/// use lock_tower::extract::{KeyExtractor, MethodAndPath};
///
/// let (mut parts, ()) = http::Request::put("/carts/7?x=1").body(()).unwrap().into_parts();
/// assert_eq!(MethodAndPath.extract(&mut parts).unwrap().unwrap().as_bytes(), b"PUT /carts/7");
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct MethodAndPath;

impl KeyExtractor for MethodAndPath {
    fn extract<'a>(&self, parts: &'a mut Parts) -> Result<Option<RawKey<'a>>, KeyRejection> {
        let method = parts.method.as_str();
        let path = crate::uri::normalized_path(
            crate::uri::original_uri(parts).path(),
            crate::uri::Decode::Printable,
        );
        let mut key = String::with_capacity(method.len() + 1 + path.len());
        key.push_str(method);
        key.push(' ');
        key.push_str(&path);
        Ok(Some(RawKey::from(key)))
    }
}

#[cfg(feature = "axum")]
pub use self::axum_param::PathParam;

#[cfg(feature = "axum")]
mod axum_param {
    use std::borrow::Cow;
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    use axum::extract::rejection::RawPathParamsRejection;
    use axum::extract::{FromRequestParts, RawPathParams};
    use http::request::Parts;

    use crate::extract::{KeyExtractor, KeyRejection, RawKey};

    /// The key is an axum route parameter, `sku` in `/inventory/{sku}/reserve` (feature `axum`).
    ///
    /// Route parameters exist once axum has matched the route, so the layer must run after
    /// routing: [`Router::route_layer`](axum::Router::route_layer),
    /// [`Router::layer`](axum::Router::layer) (in axum 0.8 it wraps each route too; the
    /// fallback sees no parameter, so unmatched paths keep their 404) or
    /// [`MethodRouter::layer`](axum::routing::MethodRouter::layer) on one route all work. A
    /// layer wrapped around the whole `Router` from outside (`ServiceBuilder` ... `.service(router)`)
    /// runs before routing and finds no parameters at all: every request then gets 500 and the
    /// log says why, rather than silently going unlocked.
    ///
    /// A route without the parameter means no key (pass through, or 400 with `require_key`).
    /// A parameter that is not UTF-8 once percent-decoded is refused with 400.
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::{Router, routing::post};
    /// use lock_tower::{LockLayer, extract::PathParam};
    ///
    /// let locker = lock_core::Locker::memory();
    /// let app: Router = Router::new()
    ///     .route("/inventory/{sku}/reserve", post(|| async { "reserved" }))
    ///     .route_layer(
    ///         LockLayer::new(locker, PathParam::new("sku"))
    ///             .key_prefix("inventory:")
    ///             .wait(Duration::from_secs(2)),
    ///     );
    /// # drop(app);
    /// ```
    #[derive(Debug, Clone)]
    pub struct PathParam {
        name: Cow<'static, str>,
    }

    impl PathParam {
        /// The key is the route parameter `name`.
        ///
        /// ```
        /// let key = lock_tower::extract::PathParam::new("sku");
        /// assert_eq!(key.name(), "sku");
        /// ```
        pub fn new(name: impl Into<Cow<'static, str>>) -> Self {
            PathParam { name: name.into() }
        }

        /// The parameter name.
        ///
        /// ```
        /// assert_eq!(lock_tower::extract::PathParam::new("id").name(), "id");
        /// ```
        pub fn name(&self) -> &str {
            &self.name
        }
    }

    impl KeyExtractor for PathParam {
        fn extract<'a>(&self, parts: &'a mut Parts) -> Result<Option<RawKey<'a>>, KeyRejection> {
            // axum keeps route parameters in a private extension; RawPathParams is the public
            // way to read them. Its extraction never awaits anything, so one poll finishes it.
            let mut cx = Context::from_waker(Waker::noop());
            let extraction = pin!(<RawPathParams as FromRequestParts<()>>::from_request_parts(
                parts,
                &()
            ))
            .poll(&mut cx);
            match extraction {
                Poll::Ready(Ok(params)) => Ok(params
                    .iter()
                    .find(|(name, _)| *name == self.name)
                    .map(|(_, value)| RawKey::from(value.to_owned()))),
                Poll::Ready(Err(RawPathParamsRejection::InvalidUtf8InPathParam(_))) => {
                    Err(KeyRejection::invalid(
                        "a route parameter is not valid UTF-8 once percent-decoded",
                    ))
                }
                Poll::Ready(Err(RawPathParamsRejection::MissingPathParams(_))) => {
                    Err(KeyRejection::misconfigured(
                        "PathParam found no route parameters: the lock layer runs before axum's routing. \
                         Add it with Router::route_layer, Router::layer or MethodRouter::layer instead of around the whole Router",
                    ))
                }
                Poll::Ready(Err(_)) => Err(KeyRejection::misconfigured(
                    "axum could not read the route parameters",
                )),
                Poll::Pending => Err(KeyRejection::misconfigured(
                    "axum's RawPathParams extraction did not complete at once; this axum version is not supported by PathParam",
                )),
            }
        }
    }
}
