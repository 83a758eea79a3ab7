//! Where the lock key of a request comes from: the [`KeyExtractor`] trait and the built-ins.
//!
//! | extractor                    | key                                   | missing when          |
//! |------------------------------|---------------------------------------|-----------------------|
//! | [`HeaderKey::new("idempotency-key")`](HeaderKey) | the header's value    | no header, or empty   |
//! | [`QueryParam::new("user")`](QueryParam)          | the decoded parameter | absent, or empty      |
//! | `PathParam::new("sku")` (feature `axum`)         | the route parameter   | the route has none    |
//! | [`MethodAndPath`]            | `"POST /orders/42"`                   | never                 |
//! | any `Fn(&Parts) -> Option<String>` (or [`key_fn`]) | what it returns | it returns `None`     |
//!
//! An extractor returns raw bytes; the layer then makes them a safe key (see
//! [`LockLayer`](crate::LockLayer): length bound, hashing of long or odd values, the prefix).
//! A value that is present but empty counts as missing.
//!
//! ```
//! use http::request::Parts;
//! use lock_tower::extract::{HeaderKey, KeyExtractor, key_fn};
//!
//! let (mut parts, ()) = http::Request::post("/orders")
//!     .header("Idempotency-Key", "abc-123")
//!     .header("x-tenant", "acme")
//!     .body(())
//!     .unwrap()
//!     .into_parts();
//!
//! let by_header = HeaderKey::new("idempotency-key");
//! let raw = by_header.extract(&mut parts).unwrap().unwrap();
//! assert_eq!(raw.as_bytes(), b"abc-123");
//!
//! let by_tenant = key_fn(|parts: &Parts| {
//!     let tenant = parts.headers.get("x-tenant")?.to_str().ok()?;
//!     Some(format!("tenant:{tenant}"))
//! });
//! assert_eq!(by_tenant.extract(&mut parts).unwrap().unwrap().as_bytes(), b"tenant:acme");
//! ```

use std::borrow::Cow;
use std::fmt;

use http::request::Parts;

mod header;
mod path;
mod query;

pub use header::HeaderKey;
pub use path::MethodAndPath;
#[cfg(feature = "axum")]
pub use path::PathParam;
pub use query::QueryParam;

/// Takes the lock key from a request.
///
/// `Ok(Some(raw))`: lock on `raw` (after the layer made it a safe key). `Ok(None)`: the request
/// names no key; it passes through unlocked, or gets 400 when the layer
/// [requires a key](crate::LockLayer::require_key). `Err(rejection)`: the request is answered
/// with the rejection (400 for [`KeyRejection::invalid`], 500 for
/// [`KeyRejection::misconfigured`]) and never reaches the service.
///
/// It runs in `Service::call`, before any waiting, and takes `&mut Parts` like axum's
/// `FromRequestParts`, so it may read (or take) extensions set by layers outside it.
///
/// ```
/// use http::request::Parts;
/// use lock_tower::extract::{KeyExtractor, KeyRejection, RawKey};
///
/// /// Locks per account, from an `x-account` header that must be digits.
/// struct Account;
///
/// impl KeyExtractor for Account {
///     fn extract<'a>(&self, parts: &'a mut Parts) -> Result<Option<RawKey<'a>>, KeyRejection> {
///         let Some(value) = parts.headers.get("x-account") else { return Ok(None) };
///         if !value.as_bytes().iter().all(u8::is_ascii_digit) {
///             return Err(KeyRejection::invalid("x-account must be digits"));
///         }
///         Ok(Some(RawKey::from(value.as_bytes())))
///     }
/// }
///
/// let (mut parts, ()) = http::Request::get("/").header("x-account", "12a").body(()).unwrap().into_parts();
/// assert!(Account.extract(&mut parts).is_err());
/// ```
pub trait KeyExtractor: Send + Sync + 'static {
    /// The raw key of this request, `None` when it has none, or why it cannot be served.
    ///
    /// # Errors
    /// A [`KeyRejection`] the layer answers instead of calling the service.
    ///
    /// ```
    /// use lock_tower::extract::{KeyExtractor, MethodAndPath};
    /// let (mut parts, ()) = http::Request::delete("/carts/7").body(()).unwrap().into_parts();
    /// let raw = MethodAndPath.extract(&mut parts).unwrap().unwrap();
    /// assert_eq!(raw.as_bytes(), b"DELETE /carts/7");
    /// ```
    fn extract<'a>(&self, parts: &'a mut Parts) -> Result<Option<RawKey<'a>>, KeyRejection>;
}

/// Any closure `Fn(&Parts) -> Option<String>` is an extractor. Annotate the argument
/// (`|parts: &Parts| ...`) or wrap the closure in [`key_fn`] so its type is inferred.
///
/// ```
/// use http::request::Parts;
/// use lock_tower::extract::KeyExtractor;
///
/// let by_host = |parts: &Parts| parts.uri.host().map(str::to_owned);
/// let (mut parts, ()) = http::Request::get("http://shop.example/").body(()).unwrap().into_parts();
/// assert_eq!(by_host.extract(&mut parts).unwrap().unwrap().as_bytes(), b"shop.example");
/// ```
impl<F> KeyExtractor for F
where
    F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
{
    fn extract<'a>(&self, parts: &'a mut Parts) -> Result<Option<RawKey<'a>>, KeyRejection> {
        Ok(self(parts).map(RawKey::from))
    }
}

/// Makes a closure an extractor with its argument type inferred.
///
/// ```
/// use lock_tower::{LockLayer, extract::key_fn};
///
/// let locker = lock_core::Locker::memory();
/// let layer = LockLayer::new(locker, key_fn(|parts| {
///     parts.headers.get("x-user")?.to_str().ok().map(|user| format!("user:{user}"))
/// }));
/// # drop(layer);
/// ```
pub fn key_fn<F>(f: F) -> F
where
    F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
{
    f
}

/// The raw key bytes an extractor found, borrowed from the request where possible.
///
/// These bytes are untrusted. The layer turns them into the lock key: kept as they are when
/// short, valid UTF-8 and free of control characters, otherwise replaced by their SHA-256.
///
/// ```
/// use lock_tower::extract::RawKey;
///
/// assert_eq!(RawKey::from("order:1").as_bytes(), b"order:1");
/// assert_eq!(RawKey::from(vec![0xff, 0x00]).as_bytes(), &[0xff, 0x00]);
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct RawKey<'a>(Cow<'a, [u8]>);

impl RawKey<'_> {
    /// The bytes.
    ///
    /// ```
    /// assert_eq!(lock_tower::extract::RawKey::from(String::from("k")).as_bytes(), b"k");
    /// ```
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for RawKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Untrusted bytes: show them escaped and bounded.
        let shown = &self.0[..self.0.len().min(64)];
        write!(f, "RawKey({:?}", String::from_utf8_lossy(shown))?;
        if self.0.len() > shown.len() {
            write!(f, "... ({} bytes)", self.0.len())?;
        }
        f.write_str(")")
    }
}

impl<'a> From<&'a [u8]> for RawKey<'a> {
    fn from(bytes: &'a [u8]) -> Self {
        RawKey(Cow::Borrowed(bytes))
    }
}

impl<'a> From<&'a str> for RawKey<'a> {
    fn from(s: &'a str) -> Self {
        RawKey(Cow::Borrowed(s.as_bytes()))
    }
}

impl From<Vec<u8>> for RawKey<'_> {
    fn from(bytes: Vec<u8>) -> Self {
        RawKey(Cow::Owned(bytes))
    }
}

impl From<String> for RawKey<'_> {
    fn from(s: String) -> Self {
        RawKey(Cow::Owned(s.into_bytes()))
    }
}

impl<'a> From<Cow<'a, [u8]>> for RawKey<'a> {
    fn from(bytes: Cow<'a, [u8]>) -> Self {
        RawKey(bytes)
    }
}

impl<'a> From<Cow<'a, str>> for RawKey<'a> {
    fn from(s: Cow<'a, str>) -> Self {
        match s {
            Cow::Borrowed(s) => RawKey::from(s),
            Cow::Owned(s) => RawKey::from(s),
        }
    }
}

/// Why an extractor refused a request: a bad key from the client (400) or a layer that cannot
/// work where it was put (500).
///
/// The reason is shown to the client in the problem body for `invalid` (never for
/// `misconfigured`, which is logged instead): do not put raw request bytes in it.
///
/// ```
/// use http::StatusCode;
/// use lock_tower::extract::KeyRejection;
///
/// assert_eq!(KeyRejection::invalid("two keys").status(), StatusCode::BAD_REQUEST);
/// assert_eq!(KeyRejection::misconfigured("no params").status(), StatusCode::INTERNAL_SERVER_ERROR);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRejection {
    misconfigured: bool,
    reason: Cow<'static, str>,
}

impl KeyRejection {
    /// The request's key is not acceptable: answered with 400 Bad Request.
    ///
    /// ```
    /// let r = lock_tower::extract::KeyRejection::invalid("the key header appears twice");
    /// assert_eq!(r.reason(), "the key header appears twice");
    /// ```
    pub fn invalid(reason: impl Into<Cow<'static, str>>) -> Self {
        KeyRejection {
            misconfigured: false,
            reason: reason.into(),
        }
    }

    /// The extractor cannot work in this stack (for example, route parameters are not
    /// available): answered with 500 Internal Server Error, the reason logged.
    ///
    /// ```
    /// let r = lock_tower::extract::KeyRejection::misconfigured("no route parameters here");
    /// assert!(r.is_misconfigured());
    /// ```
    pub fn misconfigured(reason: impl Into<Cow<'static, str>>) -> Self {
        KeyRejection {
            misconfigured: true,
            reason: reason.into(),
        }
    }

    /// Why.
    ///
    /// ```
    /// assert_eq!(lock_tower::extract::KeyRejection::invalid("x").reason(), "x");
    /// ```
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// Whether this is a server-side problem rather than the client's.
    ///
    /// ```
    /// assert!(!lock_tower::extract::KeyRejection::invalid("x").is_misconfigured());
    /// ```
    pub fn is_misconfigured(&self) -> bool {
        self.misconfigured
    }

    /// 400 for an invalid key, 500 for a misconfigured extractor.
    ///
    /// ```
    /// let r = lock_tower::extract::KeyRejection::invalid("x");
    /// assert_eq!(r.status(), http::StatusCode::BAD_REQUEST);
    /// ```
    pub fn status(&self) -> http::StatusCode {
        if self.misconfigured {
            http::StatusCode::INTERNAL_SERVER_ERROR
        } else {
            http::StatusCode::BAD_REQUEST
        }
    }
}

impl fmt::Display for KeyRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for KeyRejection {}
