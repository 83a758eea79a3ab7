//! [`QueryParam`]: the key is a query string parameter.

use std::borrow::Cow;

use http::request::Parts;

use super::{KeyExtractor, KeyRejection, RawKey};

/// The key is the value of one query string parameter, decoded as
/// `application/x-www-form-urlencoded` (`%XX` escapes, `+` for space).
///
/// Absent, or present but empty (`?user=`), means no key. A parameter given more than once is
/// refused with 400. Decoded bytes that are not UTF-8 are fine: the layer hashes them.
///
/// ```
/// use lock_tower::extract::{KeyExtractor, QueryParam};
///
/// let key = QueryParam::new("user");
/// let (mut parts, ()) = http::Request::get("/draw?round=3&user=ann%20lee")
///     .body(())
///     .unwrap()
///     .into_parts();
/// assert_eq!(key.extract(&mut parts).unwrap().unwrap().as_bytes(), b"ann lee");
/// ```
#[derive(Debug, Clone)]
pub struct QueryParam {
    name: Cow<'static, str>,
}

impl QueryParam {
    /// The key is the value of the query parameter `name` (compared after decoding).
    ///
    /// ```
    /// let key = lock_tower::extract::QueryParam::new("user");
    /// assert_eq!(key.name(), "user");
    /// ```
    pub fn new(name: impl Into<Cow<'static, str>>) -> Self {
        QueryParam { name: name.into() }
    }

    /// The parameter name.
    ///
    /// ```
    /// assert_eq!(lock_tower::extract::QueryParam::new("id").name(), "id");
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl KeyExtractor for QueryParam {
    fn extract<'a>(&self, parts: &'a mut Parts) -> Result<Option<RawKey<'a>>, KeyRejection> {
        let Some(query) = parts.uri.query() else {
            return Ok(None);
        };
        let mut found = None;
        for pair in query.split('&') {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            if decode(name).as_ref() != self.name.as_bytes() {
                continue;
            }
            if found.is_some() {
                return Err(KeyRejection::invalid(
                    "the lock key query parameter was given more than once; give it once",
                ));
            }
            found = Some(decode(value));
        }
        Ok(found.map(RawKey::from))
    }
}

/// Decodes one form-urlencoded component; borrows when there is nothing to decode. A `%` not
/// followed by two hex digits is kept as it is (as browsers and the `url` crate do).
fn decode(s: &str) -> Cow<'_, [u8]> {
    let bytes = s.as_bytes();
    if !bytes.iter().any(|&b| b == b'%' || b == b'+') {
        return Cow::Borrowed(bytes);
    }
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'+' => out.push(b' '),
            b'%' => {
                let hi = bytes.get(i + 1).and_then(|&h| hex_value(h));
                let lo = bytes.get(i + 2).and_then(|&l| hex_value(l));
                if let (Some(hi), Some(lo)) = (hi, lo) {
                    out.push(hi << 4 | lo);
                    i += 3;
                    continue;
                }
                out.push(b'%');
            }
            _ => out.push(b),
        }
        i += 1;
    }
    Cow::Owned(out)
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extract(name: &str, uri: &str) -> Result<Option<Vec<u8>>, KeyRejection> {
        let (mut parts, ()) = http::Request::get(uri).body(()).unwrap().into_parts();
        QueryParam::new(name.to_owned())
            .extract(&mut parts)
            .map(|raw| raw.map(|r| r.as_bytes().to_vec()))
    }

    #[test]
    fn decodes_and_finds() {
        assert_eq!(
            extract("u", "/?u=a+b%2Fc").unwrap(),
            Some(b"a b/c".to_vec())
        );
        assert_eq!(extract("u", "/?x=1&u=%FF%00").unwrap(), Some(vec![0xff, 0]));
        assert_eq!(extract("u", "/?u=%zz%4").unwrap(), Some(b"%zz%4".to_vec()));
        assert_eq!(extract("a b", "/?a+b=1").unwrap(), Some(b"1".to_vec()));
        assert_eq!(extract("u", "/?u").unwrap(), Some(Vec::new()));
        assert_eq!(extract("u", "/?v=1").unwrap(), None);
        assert_eq!(extract("u", "/").unwrap(), None);
    }

    #[test]
    fn repeated_parameter_is_refused() {
        assert!(extract("u", "/?u=1&u=2").is_err());
    }
}
