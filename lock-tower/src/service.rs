//! [`LockService`]: the service made by [`LockLayer`](crate::LockLayer).

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use lock_core::Locker;
use tower_service::Service;

use crate::body::ResponseBody;
use crate::extract::KeyExtractor;
use crate::future::ResponseFuture;
use crate::key::{LogKey, normalize};
use crate::layer::{Options, Wait};
use crate::metrics::Counter;
use crate::rejection::{Handler, Rejection};
use crate::{BodyError, LockLayerMetrics};

/// Runs each request under the lock on the key its extractor finds; made by
/// [`LockLayer`](crate::LockLayer).
///
/// `poll_ready` is the inner service's. `call` extracts the key; the waiting happens in the
/// returned [`ResponseFuture`], which calls the inner service (the clone that was made ready)
/// once the lock is held. Rejections are responses: the error type is the inner service's,
/// untouched, so axum needs no `HandleErrorLayer`.
///
/// ```
/// # async fn demo() {
/// use tower::{Layer, ServiceExt};
/// use lock_tower::{LockLayer, extract::HeaderKey};
///
/// let inner = tower::service_fn(|_req: http::Request<String>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(String::from("done")))
/// });
/// let svc = LockLayer::new(lock_core::Locker::memory(), HeaderKey::new("x-key")).layer(inner);
/// let request = http::Request::builder().header("x-key", "a").body(String::new()).unwrap();
/// let response = svc.oneshot(request).await.unwrap();
/// assert_eq!(response.status(), 200);
/// # }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
/// ```
pub struct LockService<S, K> {
    inner: S,
    extractor: Arc<K>,
    shared: Arc<Shared>,
}

/// What every service of one layer shares.
pub(crate) struct Shared {
    pub(crate) locker: Locker,
    pub(crate) options: Options,
    pub(crate) on_rejection: Option<Handler>,
    pub(crate) metrics: LockLayerMetrics,
}

impl Shared {
    /// Counts and logs a rejection, and builds its response.
    pub(crate) fn reject<B>(&self, rejection: &Rejection) -> Response<ResponseBody<B>> {
        let key = rejection.key().unwrap_or("");
        let counter = match rejection {
            Rejection::Busy { .. } => {
                tracing::debug!(key = %LogKey(key), "lock busy: request rejected (409)");
                Counter::RejectedBusy
            }
            Rejection::Timeout { waited, .. } => {
                tracing::debug!(key = %LogKey(key), waited_ms = waited.as_millis(), "lock wait timed out: request rejected (409)");
                Counter::RejectedTimeout
            }
            Rejection::Unavailable { error, .. } => {
                tracing::warn!(key = %LogKey(key), %error, "lock backend failed: request rejected (503, failing closed)");
                Counter::RejectedUnavailable
            }
            Rejection::LeaseLost { .. } => {
                tracing::warn!(key = %LogKey(key), "lock lease lost while the request ran: request cancelled (503)");
                Counter::RejectedLeaseLost
            }
            Rejection::MissingKey => {
                tracing::debug!("request names no lock key: rejected (400)");
                Counter::RejectedBadKey
            }
            Rejection::InvalidKey { reason } => {
                tracing::debug!(%reason, "invalid lock key: request rejected (400)");
                Counter::RejectedBadKey
            }
            Rejection::Misconfigured { reason } => {
                tracing::error!(%reason, "lock layer misconfigured: request rejected (500)");
                Counter::RejectedMisconfigured
            }
        };
        self.metrics.incr(counter);
        match &self.on_rejection {
            Some(handler) => handler(rejection).map(ResponseBody::custom),
            None => rejection
                .to_response()
                .map(|json| ResponseBody::full(Bytes::from(json))),
        }
    }
}

impl<S, K> LockService<S, K> {
    pub(crate) fn from_parts(inner: S, extractor: Arc<K>, shared: Arc<Shared>) -> Self {
        LockService {
            inner,
            extractor,
            shared,
        }
    }

    /// The inner service.
    ///
    /// ```
    /// use tower::Layer;
    /// use lock_tower::{LockLayer, extract::MethodAndPath};
    /// let svc = LockLayer::new(lock_core::Locker::memory(), MethodAndPath).layer(7_u8);
    /// assert_eq!(*svc.get_ref(), 7);
    /// ```
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    ///
    /// ```
    /// use tower::Layer;
    /// use lock_tower::{LockLayer, extract::MethodAndPath};
    /// let mut svc = LockLayer::new(lock_core::Locker::memory(), MethodAndPath).layer(7_u8);
    /// *svc.get_mut() = 8;
    /// assert_eq!(*svc.get_ref(), 8);
    /// ```
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, taken out.
    ///
    /// ```
    /// use tower::Layer;
    /// use lock_tower::{LockLayer, extract::MethodAndPath};
    /// let svc = LockLayer::new(lock_core::Locker::memory(), MethodAndPath).layer(7_u8);
    /// assert_eq!(svc.into_inner(), 7);
    /// ```
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The counters of the layer that made this service.
    ///
    /// ```
    /// use tower::Layer;
    /// use lock_tower::{LockLayer, extract::MethodAndPath};
    /// let svc = LockLayer::new(lock_core::Locker::memory(), MethodAndPath).layer(());
    /// assert_eq!(svc.metrics().snapshot().in_flight, 0);
    /// ```
    pub fn metrics(&self) -> LockLayerMetrics {
        self.shared.metrics.clone()
    }
}

impl<S, K, ReqB, ResB> Service<Request<ReqB>> for LockService<S, K>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    K: KeyExtractor,
    ResB: Body<Data = Bytes>,
    ResB::Error: Into<BodyError>,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        let shared = &self.shared;
        let options = &shared.options;
        let (mut parts, body) = request.into_parts();
        let key = self.extractor.extract(&mut parts).map(|raw| {
            raw.and_then(|raw| normalize(&options.key_prefix, raw.as_bytes(), options.max_key_len))
        });
        let request = Request::from_parts(parts, body);
        let key = match key {
            Ok(Some(key)) => key,
            Ok(None) if options.require_key => {
                return ResponseFuture::rejected(shared.clone(), Rejection::MissingKey);
            }
            Ok(None) => {
                shared.metrics.incr(Counter::PassedThrough);
                return ResponseFuture::unlocked(shared.clone(), self.inner.call(request));
            }
            Err(rejection) => return ResponseFuture::rejected(shared.clone(), rejection.into()),
        };
        let mut lock = shared.locker.lock(&key).class(shared.metrics.class);
        lock = match options.wait {
            Wait::LockerDefault => lock,
            Wait::For(wait) => lock.wait(wait),
            Wait::Reject => lock.no_wait(),
        };
        if let Some(lease) = options.lease {
            lock = lock.lease(lease);
        }
        if options.fenced {
            lock = lock.fenced();
        }
        // The service made ready by poll_ready goes into the future; a fresh clone takes its
        // place here (and will be made ready by the next poll_ready).
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::acquiring(shared.clone(), lock, ready, request, &key)
    }
}

impl<S: Clone, K> Clone for LockService<S, K> {
    fn clone(&self) -> Self {
        LockService {
            inner: self.inner.clone(),
            extractor: self.extractor.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug, K: fmt::Debug> fmt::Debug for LockService<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockService")
            .field("inner", &self.inner)
            .field("extractor", &self.extractor)
            .field("options", &self.shared.options)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("locker", &self.locker)
            .field("options", &self.options)
            .field("on_rejection", &self.on_rejection.is_some())
            .finish_non_exhaustive()
    }
}
