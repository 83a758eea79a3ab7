//! [`LockLayer`]: the layer and its options.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use http_body::Body;
use http_body_util::BodyExt;
use lock_core::Locker;
use tower_layer::Layer;

use crate::key::DEFAULT_MAX_KEY_LEN;
use crate::rejection::{Handler, Rejection};
use crate::service::{LockService, Shared};
use crate::{BodyError, LockLayerMetrics};

/// Serializes requests by a key taken from each request: while one request holds the lock on
/// a key, others with the same key wait (or get 409), in this process and in every other
/// process on the same lock backend.
///
/// The key comes from a [`KeyExtractor`](crate::extract::KeyExtractor), is made safe (see
/// [`max_key_len`](Self::max_key_len)) and put after [`key_prefix`](Self::key_prefix). The
/// lock is held from before the service is called until its response future finishes (or,
/// with [`hold_until_body_end`](Self::hold_until_body_end), until the response body ends), and
/// released before the response is handed on, so a client that sends its next request after
/// reading the answer never finds its own previous request still holding the key.
///
/// Cheap to clone; clones share their [metrics](Self::metrics).
///
/// ```
/// use std::time::Duration;
/// use lock_tower::{LockLayer, extract::HeaderKey};
///
/// let locker = lock_core::Locker::memory(); // or Locker::redis(url).await? for many processes
/// let layer = LockLayer::new(locker, HeaderKey::new("idempotency-key"))
///     .key_prefix("payments:")
///     .wait(Duration::from_secs(2))
///     .require_key()
///     .fenced();
/// # drop(layer);
/// ```
#[must_use]
pub struct LockLayer<K> {
    locker: Locker,
    extractor: Arc<K>,
    options: Options,
    on_rejection: Option<Handler>,
    metrics: LockLayerMetrics,
}

/// How long a request waits for a busy key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// The locker's default wait (bounded).
    LockerDefault,
    For(Duration),
    /// One attempt: 409 at once when busy.
    Reject,
}

#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub(crate) wait: Wait,
    pub(crate) lease: Option<Duration>,
    pub(crate) fenced: bool,
    pub(crate) fail_open: bool,
    pub(crate) require_key: bool,
    pub(crate) hold_until_body_end: bool,
    pub(crate) key_prefix: String,
    pub(crate) max_key_len: usize,
}

impl<K> LockLayer<K> {
    /// A layer taking locks from `locker` on the key `extractor` finds in each request.
    ///
    /// Defaults: wait up to the locker's default wait; the locker's lease; no fencing; fail
    /// closed; requests without a key pass through unlocked; no key prefix; values over 256
    /// bytes hashed; the lock is released when the response future finishes.
    ///
    /// ```
    /// use lock_tower::{LockLayer, extract::MethodAndPath};
    /// let layer = LockLayer::new(lock_core::Locker::memory(), MethodAndPath);
    /// # drop(layer);
    /// ```
    pub fn new(locker: Locker, extractor: K) -> Self {
        let mut metrics = LockLayerMetrics::default();
        metrics.backend = locker.backend().kind();
        LockLayer {
            locker,
            extractor: Arc::new(extractor),
            options: Options {
                wait: Wait::LockerDefault,
                lease: None,
                fenced: false,
                fail_open: false,
                require_key: false,
                hold_until_body_end: false,
                key_prefix: String::new(),
                max_key_len: DEFAULT_MAX_KEY_LEN,
            },
            on_rejection: None,
            metrics,
        }
    }

    /// Waits up to `wait` for a busy key, then answers 409 with `Retry-After`. Without this,
    /// the locker's default wait applies (bounded, 10 s unless the locker says otherwise).
    /// Waiting happens in the response future, queued in arrival order per key and process,
    /// woken by the release notification (no polling).
    ///
    /// ```
    /// use std::time::Duration;
    /// use lock_tower::{LockLayer, extract::MethodAndPath};
    /// let layer = LockLayer::new(lock_core::Locker::memory(), MethodAndPath).wait(Duration::from_secs(2));
    /// # drop(layer);
    /// ```
    pub fn wait(mut self, wait: Duration) -> Self {
        self.options.wait = Wait::For(wait);
        self
    }

    /// Names the locks this layer takes, in metrics and spans (the `class` label of lock-core's
    /// metrics and of `lock_layer_requests_total`, feature `metrics`): a fixed name for the
    /// route or the resource, such as `"checkout"`, never a key. Default `"default"`.
    ///
    /// ```
    /// use lock_tower::{LockLayer, extract::MethodAndPath};
    /// let layer = LockLayer::new(lock_core::Locker::memory(), MethodAndPath).class("checkout");
    /// # drop(layer);
    /// ```
    pub fn class(mut self, class: &'static str) -> Self {
        self.metrics.class = class;
        self
    }

    /// Does not wait: a busy key answers 409 at once, with `Retry-After` from the holder's
    /// remaining lease when the backend reports it.
    ///
    /// ```
    /// use lock_tower::{LockLayer, extract::MethodAndPath};
    /// let layer = LockLayer::new(lock_core::Locker::memory(), MethodAndPath).reject_when_busy();
    /// # drop(layer);
    /// ```
    pub fn reject_when_busy(mut self) -> Self {
        self.options.wait = Wait::Reject;
        self
    }

    /// The lease of each request's lock (default: the locker's). The watchdog renews it while
    /// the request runs, so it bounds how long a crashed process blocks the key, not how long
    /// a request may run.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lock_tower::{LockLayer, extract::MethodAndPath};
    /// let layer = LockLayer::new(lock_core::Locker::memory(), MethodAndPath).lease(Duration::from_secs(10));
    /// # drop(layer);
    /// ```
    pub fn lease(mut self, lease: Duration) -> Self {
        self.options.lease = Some(lease);
        self
    }

    /// Draws a fencing token with each lock and inserts it into the request as a
    /// [`FencingToken`](crate::FencingToken) extension.
    ///
    /// Each fenced key name keeps one small counter in the backend for good (in Redis, a key
    /// without a TTL: tokens must never go backwards). With keys taken from requests, a client
    /// that makes up key names makes up counters: fence only keys from a bounded set (check
    /// the SKU, the account, ... before this layer, or key by something your service issued).
    ///
    /// ```
    /// use lock_tower::{LockLayer, extract::MethodAndPath};
    /// let layer = LockLayer::new(lock_core::Locker::memory(), MethodAndPath).fenced();
    /// # drop(layer);
    /// ```
    pub fn fenced(mut self) -> Self {
        self.options.fenced = true;
        self
    }

    /// When the lock backend fails (unreachable, timing out), lets requests through unlocked
    /// and logs a warning, instead of answering 503. Choose it only where running a request
    /// twice at once is cheaper than not running it. A misconfiguration (500) never passes.
    ///
    /// ```
    /// use lock_tower::{LockLayer, extract::MethodAndPath};
    /// let layer = LockLayer::new(lock_core::Locker::memory(), MethodAndPath).fail_open();
    /// # drop(layer);
    /// ```
    pub fn fail_open(mut self) -> Self {
        self.options.fail_open = true;
        self
    }

    /// Answers 400 to requests without a key (no header, empty value...) instead of letting
    /// them through unlocked.
    ///
    /// ```
    /// use lock_tower::{LockLayer, extract::HeaderKey};
    /// let layer = LockLayer::new(lock_core::Locker::memory(), HeaderKey::new("idempotency-key")).require_key();
    /// # drop(layer);
    /// ```
    pub fn require_key(mut self) -> Self {
        self.options.require_key = true;
        self
    }

    /// Holds the lock until the response body has ended (or is dropped: the client went
    /// away), not just until the response head is ready. For handlers that stream their work.
    /// If the lease is lost while the body streams, the body ends with
    /// [`LeaseLostError`](crate::LeaseLostError); its last frame waits for the release's
    /// answer, so a release that finds the lock no longer ours ends it the same way. A
    /// response whose body is never sent (to a HEAD request; a 1xx, 204 or 304; an empty body)
    /// releases before it goes out, as without this option.
    ///
    /// ```
    /// use lock_tower::{LockLayer, extract::MethodAndPath};
    /// let layer = LockLayer::new(lock_core::Locker::memory(), MethodAndPath).hold_until_body_end();
    /// # drop(layer);
    /// ```
    pub fn hold_until_body_end(mut self) -> Self {
        self.options.hold_until_body_end = true;
        self
    }

    /// Puts `prefix` before every key this layer takes, to keep apart keys of different
    /// routes or purposes (`"reserve:"`, `"draw:"`). The locker adds its own prefix too.
    ///
    /// ```
    /// use lock_tower::{LockLayer, extract::HeaderKey};
    /// let layer = LockLayer::new(lock_core::Locker::memory(), HeaderKey::new("x-order")).key_prefix("order:");
    /// # drop(layer);
    /// ```
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.options.key_prefix = prefix.into();
        self
    }

    /// The bound, in bytes, on prefix plus value above which the value is replaced by its
    /// SHA-256 (default 256; capped at lock-core's `MAX_KEY_LEN`). Values that are not UTF-8,
    /// contain control characters or start with `#` are hashed whatever their length, so keys
    /// stay bounded and printable whatever a client sends.
    ///
    /// ```
    /// use lock_tower::{LockLayer, extract::HeaderKey};
    /// let layer = LockLayer::new(lock_core::Locker::memory(), HeaderKey::new("x-key")).max_key_len(128);
    /// # drop(layer);
    /// ```
    pub fn max_key_len(mut self, max: usize) -> Self {
        self.options.max_key_len = max.min(lock_core::MAX_KEY_LEN);
        self
    }

    /// Answers rejections with `handler`'s response instead of the default problem+json one.
    /// The handler gets the [`Rejection`]; [`Rejection::to_response`] gives the default to
    /// start from. Its body may be any body with `Bytes` data (`String`, axum's `Body`...).
    ///
    /// ```
    /// use http::{Response, StatusCode};
    /// use lock_tower::{LockLayer, Rejection, extract::MethodAndPath};
    ///
    /// let layer = LockLayer::new(lock_core::Locker::memory(), MethodAndPath)
    ///     .on_rejection(|rejection: &Rejection| {
    ///         let mut response = Response::new(format!("try again ({})", rejection.title()));
    ///         if let Rejection::Busy { .. } = rejection {
    ///             *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    ///         }
    ///         response
    ///     });
    /// # drop(layer);
    /// ```
    pub fn on_rejection<F, B>(mut self, handler: F) -> Self
    where
        F: Fn(&Rejection) -> Response<B> + Send + Sync + 'static,
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BodyError>,
    {
        self.on_rejection = Some(Arc::new(move |rejection: &Rejection| {
            handler(rejection).map(|body| body.map_err(Into::into).boxed_unsync())
        }));
        self
    }

    /// The counters of this layer (shared with every service it makes and every clone).
    ///
    /// ```
    /// use lock_tower::{LockLayer, extract::MethodAndPath};
    /// let layer = LockLayer::new(lock_core::Locker::memory(), MethodAndPath);
    /// assert_eq!(layer.metrics().snapshot().requests_locked, 0);
    /// ```
    pub fn metrics(&self) -> LockLayerMetrics {
        self.metrics.clone()
    }

    /// The locker this layer takes locks from.
    ///
    /// ```
    /// use lock_tower::{LockLayer, extract::MethodAndPath};
    /// let layer = LockLayer::new(lock_core::Locker::memory(), MethodAndPath);
    /// assert_eq!(layer.locker().prefix(), "lock:");
    /// ```
    pub fn locker(&self) -> &Locker {
        &self.locker
    }

    /// The key extractor.
    ///
    /// ```
    /// use lock_tower::{LockLayer, extract::QueryParam};
    /// let layer = LockLayer::new(lock_core::Locker::memory(), QueryParam::new("user"));
    /// assert_eq!(layer.extractor().name(), "user");
    /// ```
    pub fn extractor(&self) -> &K {
        &self.extractor
    }

    /// The lock key this layer takes for a raw key value: the key prefix plus the value, or
    /// plus its hash when the value is long or unusual; `None` for an empty value. Lets tests
    /// and other code (another process, a batch job) lock the same key as the layer.
    ///
    /// ```
    /// use lock_tower::{LockLayer, extract::HeaderKey};
    /// let layer = LockLayer::new(lock_core::Locker::memory(), HeaderKey::new("x-sku")).key_prefix("reserve:");
    /// assert_eq!(layer.lock_key(b"42").as_deref(), Some("reserve:42"));
    /// assert!(layer.lock_key(b"\xff").unwrap().starts_with("reserve:#sha256:"));
    /// assert_eq!(layer.lock_key(b""), None);
    /// ```
    pub fn lock_key(&self, raw: &[u8]) -> Option<String> {
        crate::key::normalize(&self.options.key_prefix, raw, self.options.max_key_len)
    }
}

impl<S, K> Layer<S> for LockLayer<K> {
    type Service = LockService<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        LockService::from_parts(
            inner,
            self.extractor.clone(),
            Arc::new(Shared {
                locker: self.locker.clone(),
                options: self.options.clone(),
                on_rejection: self.on_rejection.clone(),
                metrics: self.metrics.clone(),
            }),
        )
    }
}

impl<K> Clone for LockLayer<K> {
    fn clone(&self) -> Self {
        LockLayer {
            locker: self.locker.clone(),
            extractor: self.extractor.clone(),
            options: self.options.clone(),
            on_rejection: self.on_rejection.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

impl<K: fmt::Debug> fmt::Debug for LockLayer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockLayer")
            .field("locker", &self.locker)
            .field("extractor", &self.extractor)
            .field("options", &self.options)
            .field("on_rejection", &self.on_rejection.is_some())
            .finish()
    }
}
