//! [`HeaderKey`]: the key is a request header's value.

use http::HeaderName;
use http::header::InvalidHeaderName;
use http::request::Parts;

use super::{KeyExtractor, KeyRejection, RawKey};

/// The key is the value of one request header, for example `Idempotency-Key`.
///
/// No header, or an empty one, means no key. A header sent more than once is refused with
/// 400 (which of the values would be the key is ambiguous). The bytes may be anything HTTP
/// allows, including non-UTF-8: the layer hashes what it cannot use as it is.
///
/// ```
/// use lock_tower::extract::{HeaderKey, KeyExtractor};
///
/// let key = HeaderKey::new("Idempotency-Key"); // header names are case-insensitive
/// let (mut parts, ()) = http::Request::post("/payments")
///     .header("idempotency-key", "7f1c")
///     .body(())
///     .unwrap()
///     .into_parts();
/// assert_eq!(key.extract(&mut parts).unwrap().unwrap().as_bytes(), b"7f1c");
/// ```
#[derive(Debug, Clone)]
pub struct HeaderKey {
    /// `None` when built from an invalid name: every request then gets a 500 that says so.
    name: Option<HeaderName>,
}

impl HeaderKey {
    /// The key is the value of the header called `name` (any case).
    ///
    /// An invalid header name does not panic: every request is then answered with 500 and the
    /// problem is logged. Use [`try_new`](Self::try_new) to find out at start-up.
    ///
    /// ```
    /// let key = lock_tower::extract::HeaderKey::new("idempotency-key");
    /// assert_eq!(key.name().map(|n| n.as_str()), Some("idempotency-key"));
    /// ```
    pub fn new(name: impl AsRef<str>) -> Self {
        HeaderKey {
            name: HeaderName::from_bytes(name.as_ref().as_bytes()).ok(),
        }
    }

    /// Like [`new`](Self::new), but says when `name` is not a valid header name.
    ///
    /// # Errors
    /// [`InvalidHeaderName`] for names with spaces, colons, non-ASCII and the like.
    ///
    /// ```
    /// use lock_tower::extract::HeaderKey;
    /// assert!(HeaderKey::try_new("x-request-key").is_ok());
    /// assert!(HeaderKey::try_new("bad name").is_err());
    /// ```
    pub fn try_new(name: impl AsRef<str>) -> Result<Self, InvalidHeaderName> {
        Ok(HeaderKey {
            name: Some(HeaderName::from_bytes(name.as_ref().as_bytes())?),
        })
    }

    /// The key is the value of the header `name`.
    ///
    /// ```
    /// use lock_tower::extract::HeaderKey;
    /// const KEY: HeaderKey = HeaderKey::from_name(http::HeaderName::from_static("idempotency-key"));
    /// # drop(KEY);
    /// ```
    pub const fn from_name(name: HeaderName) -> Self {
        HeaderKey { name: Some(name) }
    }

    /// The header name, `None` when [`new`](Self::new) was given an invalid one.
    ///
    /// ```
    /// assert!(lock_tower::extract::HeaderKey::new("not valid").name().is_none());
    /// ```
    pub fn name(&self) -> Option<&HeaderName> {
        self.name.as_ref()
    }
}

impl From<HeaderName> for HeaderKey {
    fn from(name: HeaderName) -> Self {
        HeaderKey::from_name(name)
    }
}

impl KeyExtractor for HeaderKey {
    fn extract<'a>(&self, parts: &'a mut Parts) -> Result<Option<RawKey<'a>>, KeyRejection> {
        let Some(name) = &self.name else {
            return Err(KeyRejection::misconfigured(
                "HeaderKey was given an invalid header name; use HeaderKey::try_new to check it at start-up",
            ));
        };
        let mut values = parts.headers.get_all(name).iter();
        let Some(value) = values.next() else {
            return Ok(None);
        };
        if values.next().is_some() {
            return Err(KeyRejection::invalid(
                "the lock key header was sent more than once; send it once",
            ));
        }
        Ok(Some(RawKey::from(value.as_bytes())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(headers: &[(&str, &[u8])]) -> Parts {
        let mut builder = http::Request::get("/");
        for (name, value) in headers {
            builder = builder.header(*name, http::HeaderValue::from_bytes(value).unwrap());
        }
        builder.body(()).unwrap().into_parts().0
    }

    #[test]
    fn finds_missing_repeated_and_binary_values() {
        let key = HeaderKey::new("Idempotency-Key");
        assert_eq!(key.extract(&mut parts(&[])).unwrap(), None);
        let mut p = parts(&[("idempotency-key", b"\xff\xfe")]);
        assert_eq!(
            key.extract(&mut p).unwrap().unwrap().as_bytes(),
            b"\xff\xfe"
        );
        let mut p = parts(&[("idempotency-key", b"a"), ("idempotency-key", b"b")]);
        let err = key.extract(&mut p).unwrap_err();
        assert!(!err.is_misconfigured());
    }

    #[test]
    fn invalid_name_is_a_misconfiguration_not_a_panic() {
        let key = HeaderKey::new("bad name\n");
        let err = key.extract(&mut parts(&[])).unwrap_err();
        assert!(err.is_misconfigured());
    }
}
