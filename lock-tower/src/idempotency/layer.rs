//! [`IdempotencyLayer`]: the layer and its options.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use lock_core::{DEFAULT_RESULT_TTL, Locker, MAX_RESULT_TTL};
use tower_layer::Layer;

use super::service::{IdempotencyService, Labels};
use crate::extract::KeyExtractor;

/// Runs each request with an `Idempotency-Key` at most once per key within the TTL, and
/// answers every retry with the first response. See the [module docs](crate::idempotency).
///
/// Cheap to clone.
///
/// ```
/// use std::time::Duration;
/// use lock_tower::IdempotencyLayer;
///
/// let layer = IdempotencyLayer::new(lock_core::Locker::memory())
///     .header("x-idempotency-key")
///     .ttl(Duration::from_secs(3600))
///     .wait(Duration::from_secs(5))
///     .max_body(64 * 1024)
///     .require_key();
/// # drop(layer);
/// ```
#[must_use]
#[derive(Clone)]
pub struct IdempotencyLayer {
    pub(crate) shared: Arc<Config>,
}

/// The options every service of a layer shares.
pub(crate) struct Config {
    pub(crate) locker: Locker,
    /// `Err(name)` when `header(name)` was not a valid header name.
    pub(crate) header: Result<HeaderName, String>,
    pub(crate) ttl: Duration,
    pub(crate) require_key: bool,
    pub(crate) wait: Option<Duration>,
    pub(crate) scope: Scope,
    pub(crate) max_body: usize,
    pub(crate) key_prefix: String,
    pub(crate) detach: bool,
    /// The class of its locks and answers, and its locker's backend (metrics' labels).
    pub(crate) labels: Labels,
}

impl Clone for Config {
    fn clone(&self) -> Self {
        Config {
            locker: self.locker.clone(),
            header: self.header.clone(),
            ttl: self.ttl,
            require_key: self.require_key,
            wait: self.wait,
            scope: self.scope.clone(),
            max_body: self.max_body,
            key_prefix: self.key_prefix.clone(),
            detach: self.detach,
            labels: self.labels,
        }
    }
}

/// Whose records a request may meet (see [`IdempotencyLayer::scope`]).
#[derive(Clone)]
pub(crate) enum Scope {
    /// The default: the caller's credentials (see [`caller_principal`]).
    Caller,
    /// One scope for every caller ([`IdempotencyLayer::shared_records`]).
    Shared,
    /// A principal taken by the user's extractor ([`IdempotencyLayer::scope`]).
    Custom(Arc<dyn KeyExtractor>),
}

/// The default principal of a request: `authorization sha256:<hex>` of its `Authorization`
/// header (every line, in order), else `cookie sha256:<hex>` of its `Cookie` header (its
/// lines joined with `; `: HTTP/2 sends each cookie as a line of its own, RFC 9113 8.2.3, and
/// HTTP/1.1 sends them in one, so one cookie set is one caller however it came), else empty
/// (the anonymous scope, which requests without either share). Hashed, so no credential
/// reaches a record key, a log or the backend.
pub(crate) fn caller_principal(headers: &http::HeaderMap) -> Vec<u8> {
    use sha2::{Digest, Sha256};
    for (name, label) in [
        (http::header::AUTHORIZATION, "authorization"),
        (http::header::COOKIE, "cookie"),
    ] {
        let mut values = headers.get_all(&name).iter().peekable();
        if values.peek().is_none() {
            continue;
        }
        let lines: Vec<&[u8]> = values.map(|v| v.as_bytes()).collect();
        let joined;
        let lines = if name == http::header::COOKIE {
            joined = lines.join(&b"; "[..]);
            vec![joined.as_slice()]
        } else {
            lines
        };
        let mut hash = Sha256::new();
        for line in lines {
            // Length-prefixed: two lines never hash like one.
            hash.update((line.len() as u64).to_be_bytes());
            hash.update(line);
        }
        let mut out = String::with_capacity(label.len() + 72);
        out.push_str(label);
        out.push_str(" sha256:");
        crate::key::push_hex(&mut out, &hash.finalize());
        return out.into_bytes();
    }
    Vec::new()
}

/// The default request body limit: 1 MiB.
pub(crate) const DEFAULT_MAX_BODY: usize = 1024 * 1024;

impl IdempotencyLayer {
    /// A layer keeping its records in `locker`'s backend (memory for one process, Redis for
    /// many).
    ///
    /// Defaults: key from the `Idempotency-Key` header; records kept
    /// [`DEFAULT_RESULT_TTL`] (24 h); requests without a key pass through; a duplicate of a
    /// request still running gets 409 at once; records scoped to the caller (see
    /// [`scope`](Self::scope)), one per caller and key value, with method and path in its
    /// fingerprint; request bodies up to 1 MiB.
    ///
    /// ```
    /// let layer = lock_tower::IdempotencyLayer::new(lock_core::Locker::memory());
    /// # drop(layer);
    /// ```
    pub fn new(locker: Locker) -> Self {
        let labels = Labels {
            class: "idempotency",
            backend: locker.backend().kind(),
        };
        IdempotencyLayer {
            shared: Arc::new(Config {
                labels,
                locker,
                header: Ok(HeaderName::from_static("idempotency-key")),
                ttl: DEFAULT_RESULT_TTL,
                require_key: false,
                wait: None,
                scope: Scope::Caller,
                max_body: DEFAULT_MAX_BODY,
                key_prefix: String::from("idempotency:"),
                detach: false,
            }),
        }
    }

    fn with(mut self, f: impl FnOnce(&mut Config)) -> Self {
        f(Arc::make_mut(&mut self.shared));
        self
    }

    /// Names this layer's locks and answers in metrics and spans (the `class` label of
    /// lock-core's metrics and of `lock_idempotency_requests_total`, feature `metrics`): a
    /// fixed name for the route or the resource, never a key. Default `"idempotency"`.
    ///
    /// ```
    /// let layer = lock_tower::IdempotencyLayer::new(lock_core::Locker::memory()).class("payments");
    /// # drop(layer);
    /// ```
    pub fn class(self, class: &'static str) -> Self {
        self.with(|c| c.labels.class = class)
    }

    /// Takes the key from header `name` (any case; a `&str`, a `String` or an
    /// [`http::HeaderName`]) instead of `Idempotency-Key`.
    ///
    /// An invalid header name does not panic: every request is then answered with 500
    /// `misconfigured` before its handler runs, and the problem is logged (as
    /// [`HeaderKey::new`](crate::extract::HeaderKey::new) does).
    ///
    /// ```
    /// let layer = lock_tower::IdempotencyLayer::new(lock_core::Locker::memory())
    ///     .header("x-request-id");
    /// # drop(layer);
    /// let layer = lock_tower::IdempotencyLayer::new(lock_core::Locker::memory())
    ///     .header(http::HeaderName::from_static("x-request-id"));
    /// # drop(layer);
    /// ```
    pub fn header(self, name: impl AsRef<str>) -> Self {
        let name = name.as_ref();
        let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| name.to_owned());
        self.with(|c| c.header = header)
    }

    /// Keeps records for `ttl` instead of 24 h: more than zero, at most
    /// [`lock_core::MAX_RESULT_TTL`]. A TTL out of that range does not panic (a builder value
    /// never fails on a request path); it is logged and every request carrying a key answers
    /// 500 `misconfigured` before its handler runs, since its response could not be stored.
    /// Requests without a key pass through as usual.
    ///
    /// ```
    /// use std::time::Duration;
    /// let layer = lock_tower::IdempotencyLayer::new(lock_core::Locker::memory())
    ///     .ttl(Duration::from_secs(7 * 24 * 3600));
    /// # drop(layer);
    /// ```
    pub fn ttl(self, ttl: Duration) -> Self {
        let layer = self.with(|c| c.ttl = ttl);
        if let Err(reason) = layer.shared.check_ttl() {
            tracing::error!(%reason, "IdempotencyLayer misconfigured: keyed requests will answer 500");
        }
        layer
    }

    /// Answers 400 to requests without a key instead of passing them through.
    ///
    /// ```
    /// let layer = lock_tower::IdempotencyLayer::new(lock_core::Locker::memory()).require_key();
    /// # drop(layer);
    /// ```
    pub fn require_key(self) -> Self {
        self.with(|c| c.require_key = true)
    }

    /// A duplicate that arrives while the first request runs waits up to `wait` for it and
    /// gets its response, instead of 409 at once (409 still when the wait runs out).
    ///
    /// ```
    /// use std::time::Duration;
    /// let layer = lock_tower::IdempotencyLayer::new(lock_core::Locker::memory())
    ///     .wait(Duration::from_secs(10));
    /// # drop(layer);
    /// ```
    pub fn wait(self, wait: Duration) -> Self {
        self.with(|c| c.wait = Some(wait))
    }

    /// Scopes keys by a principal taken from each request (a tenant, a user, an API key
    /// set by an authentication layer outside this one), so two principals' keys never meet,
    /// instead of the default scope.
    /// A request whose extractor finds no principal is in the anonymous scope; an extractor
    /// error answers 400 (or 500 for a misconfiguration).
    ///
    /// By default records are scoped to the caller: to a SHA-256 of the request's
    /// `Authorization` header, or of its `Cookie` header when it has no `Authorization`. One
    /// client never gets another's stored response (its `Set-Cookie` and all) by sending the
    /// other's key and body: it runs its own request. Requests with neither header share one
    /// anonymous scope (they carry no credential to tell them apart): a service whose callers
    /// authenticate otherwise (an API-key header, mTLS, a session known to a layer outside)
    /// passes its own principal here. The default principal must stay the same across a
    /// client's retries: a token refreshed or a cookie changed between a request and its
    /// retry makes the retry another caller's request, which runs again; scope by the stable
    /// identity (a user id set by the authentication layer) where that happens.
    /// [`shared_records`](Self::shared_records) turns scoping off.
    ///
    /// ```
    /// use lock_tower::{IdempotencyLayer, extract::HeaderKey};
    /// let layer = IdempotencyLayer::new(lock_core::Locker::memory())
    ///     .scope(HeaderKey::new("x-tenant"));
    /// # drop(layer);
    /// ```
    pub fn scope(self, principal: impl KeyExtractor) -> Self {
        let principal: Arc<dyn KeyExtractor> = Arc::new(principal);
        self.with(|c| c.scope = Scope::Custom(principal))
    }

    /// One scope for every caller: a record is found by its key value alone, so a client that
    /// sends another client's key and body gets that client's stored response. For
    /// single-tenant services only (one caller, or callers that trust each other, such as the
    /// services of one system retrying each other's work), where a retry may come with other
    /// credentials than the first request. Overrides [`scope`](Self::scope), and is overridden
    /// by it: the last one called counts.
    ///
    /// ```
    /// let layer = lock_tower::IdempotencyLayer::new(lock_core::Locker::memory()).shared_records();
    /// # drop(layer);
    /// ```
    pub fn shared_records(self) -> Self {
        self.with(|c| c.scope = Scope::Shared)
    }

    /// Reads request bodies up to `max` bytes (default 1 MiB) to fingerprint them; larger
    /// ones answer 413 and never reach the handler.
    ///
    /// ```
    /// let layer = lock_tower::IdempotencyLayer::new(lock_core::Locker::memory()).max_body(4096);
    /// # drop(layer);
    /// ```
    pub fn max_body(self, max: usize) -> Self {
        self.with(|c| c.max_body = max)
    }

    /// Runs the handler (with the storing of its response and the release) in a task of its
    /// own, so that a client that goes away, or a timeout layer above that gives up, no longer
    /// stops it: it runs to its end, its response is stored, and the retry replays it instead
    /// of running the handler again. A response body longer than a record (see
    /// [`lock_core::MAX_RESULT_LEN`]) is read to its end too, by a task of its own, whether
    /// the client still listens or not. One thing still stops a detached handler: the loss of the
    /// key's lease (the lock deleted on the server, a partition longer than the lease). It is
    /// then cancelled at once, nothing is stored and the request gets 503 `lease-lost`, because
    /// past that point a retry could take the key and run the handler beside it.
    ///
    /// Off by default, because it changes what cancelling a request means for every layer
    /// above: a [`LockLayer`](crate::LockLayer) or a timeout outside this layer stops its work
    /// by dropping the request, and a detached handler outlives that drop (a `LockLayer`
    /// outside would release its key while the handler still runs). Use it when nothing above
    /// relies on cancelling the handler. Without it, a request dropped mid-handler cancels the
    /// handler, stores nothing, and releases the key's lock; its "started" mark stays, so the
    /// retry gets 409 outcome-unknown, never a second run.
    ///
    /// ```
    /// let layer = lock_tower::IdempotencyLayer::new(lock_core::Locker::memory()).detach_handler();
    /// # drop(layer);
    /// ```
    pub fn detach_handler(self) -> Self {
        self.with(|c| c.detach = true)
    }

    /// The locker the records and locks live in.
    ///
    /// ```
    /// let layer = lock_tower::IdempotencyLayer::new(lock_core::Locker::memory());
    /// assert_eq!(layer.locker().prefix(), "lock:");
    /// ```
    pub fn locker(&self) -> &Locker {
        &self.shared.locker
    }

    /// The lock (and record) key the layer uses for a request: `"idempotency:"`, then the
    /// principal (empty when none and for [`shared_records`](Self::shared_records); by default
    /// `authorization sha256:<hex>` or `cookie sha256:<hex>` of the request's credentials, see
    /// [`scope`](Self::scope)) and the key value, hashed
    /// (`#sha256:...`) when long or unusual, like [`LockLayer`](crate::LockLayer)'s keys.
    /// `None` for an empty key value. Method and path are not part of it: they are in the
    /// request's fingerprint, so one key sent with another method or path is a key reused for
    /// another request (422), as the IETF draft and Stripe answer it, never a second run.
    ///
    /// ```
    /// let layer = lock_tower::IdempotencyLayer::new(lock_core::Locker::memory());
    /// assert_eq!(layer.record_key(b"", b"k1").as_deref(), Some("idempotency:0: k1"));
    /// assert!(layer.record_key(b"", &[0xff; 5000]).unwrap().len() < 100);
    /// ```
    pub fn record_key(&self, principal: &[u8], key: &[u8]) -> Option<String> {
        self.shared.record_key(principal, key)
    }
}

impl Config {
    /// `Err` (why) when the TTL cannot be stored: every keyed request then answers 500
    /// before its handler runs.
    pub(crate) fn check_ttl(&self) -> Result<(), String> {
        if self.ttl.is_zero() || self.ttl > MAX_RESULT_TTL {
            return Err(format!(
                "IdempotencyLayer::ttl({:?}) is out of range: use more than zero and at most {MAX_RESULT_TTL:?}",
                self.ttl
            ));
        }
        Ok(())
    }

    pub(crate) fn record_key(&self, principal: &[u8], key: &[u8]) -> Option<String> {
        if key.is_empty() {
            return None;
        }
        // The principal is length-prefixed and the key is last: two different (principal,
        // key) pairs never make the same raw key.
        let mut raw = Vec::with_capacity(principal.len() + key.len() + 16);
        raw.extend_from_slice(principal.len().to_string().as_bytes());
        raw.push(b':');
        raw.extend_from_slice(principal);
        raw.push(b' ');
        raw.extend_from_slice(key);
        crate::key::normalize(&self.key_prefix, &raw, crate::key::DEFAULT_MAX_KEY_LEN)
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService::from_parts(inner, self.shared.clone())
    }
}

impl fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.shared, f)
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("locker", &self.locker)
            .field(
                "header",
                &match &self.header {
                    Ok(name) => name.as_str(),
                    Err(invalid) => invalid.as_str(),
                },
            )
            .field("ttl", &self.ttl)
            .field("require_key", &self.require_key)
            .field("wait", &self.wait)
            .field(
                "scope",
                &match self.scope {
                    Scope::Caller => "caller",
                    Scope::Shared => "shared",
                    Scope::Custom(_) => "custom",
                },
            )
            .field("max_body", &self.max_body)
            .finish()
    }
}
