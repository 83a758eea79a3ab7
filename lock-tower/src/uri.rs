//! The request's path as keys see it: the path the client sent (not what a nesting router left
//! of it), with one spelling per percent-encoded path.

use std::borrow::Cow;

use http::request::Parts;

/// The path the client sent: axum's `OriginalUri` when the request carries one (feature
/// `axum`; a `Router::nest` cuts its prefix, route parameters included, off `parts.uri` before
/// the nested router's layers run), else `parts.uri`'s. Two accounts' requests under
/// `/accounts/{id}` never share a `MethodAndPath` lock key, nor an idempotency fingerprint,
/// for want of their prefix.
pub(crate) fn original_uri(parts: &Parts) -> &http::Uri {
    #[cfg(feature = "axum")]
    if let Some(axum::extract::OriginalUri(uri)) = parts.extensions.get() {
        return uri;
    }
    &parts.uri
}

/// The route the request was routed to (axum's `MatchedPath`, feature `axum`): `/items/me`
/// and `/items/{id}` are two handlers even for one path spelled two ways (axum routes on the
/// path as sent: `/items/%6De` goes to `/items/{id}`).
pub(crate) fn matched_route(parts: &Parts) -> Option<&str> {
    #[cfg(feature = "axum")]
    if let Some(route) = parts.extensions.get::<axum::extract::MatchedPath>() {
        return Some(route.as_str());
    }
    let _ = parts;
    None
}

/// What [`normalized_path`] decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decode {
    /// The escapes of RFC 3986's unreserved characters (letters, digits, `-`, `.`, `_`, `~`),
    /// the only ones the RFC makes equal to their escapes (section 6.2.2.2). For idempotency
    /// fingerprints, which two different requests must never share: a space or a reserved
    /// character keeps its escape (a retry re-encoding one is told 422, never run twice).
    Unreserved,
    /// The escapes of every printable ASCII character but `/`, `%`, `?` and `#` (which would
    /// change what the path says), as a route parameter decodes them. For lock keys, where two
    /// spellings of one resource must meet and merging two paths only serializes more.
    Printable,
}

/// `path` with its percent-encoding normalized: the escapes `decode` names are decoded, and
/// the hex digits of every other escape are upper-cased. `/inventory/%34%32` and
/// `/inventory/42` are one path here, as they are one route parameter (`"42"`) to the handler:
/// a key taken from the path cannot be dodged by spelling the path another way.
///
/// (Raw bytes outside ASCII never reach a path: `http::Uri` refuses them.)
pub(crate) fn normalized_path(path: &str, decode: Decode) -> Cow<'_, str> {
    if !path.contains('%') {
        return Cow::Borrowed(path);
    }
    let bytes = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut i = 0;
    while i < bytes.len() {
        let escape = (bytes[i] == b'%')
            .then(|| Some((hex(*bytes.get(i + 1)?)?, hex(*bytes.get(i + 2)?)?)))
            .flatten();
        match escape {
            Some((high, low)) => {
                let c = char::from(high << 4 | low);
                let decoded = match decode {
                    Decode::Unreserved => {
                        c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '~')
                    }
                    Decode::Printable => {
                        c.is_ascii_graphic() && !matches!(c, '/' | '%' | '?' | '#') || c == ' '
                    }
                };
                if decoded {
                    out.push(c);
                } else {
                    out.push('%');
                    out.push(char::from(b"0123456789ABCDEF"[usize::from(high)]));
                    out.push(char::from(b"0123456789ABCDEF"[usize::from(low)]));
                }
                i += 3;
            }
            None => {
                // Not an escape: kept as it is (the path is ASCII, so byte = char).
                out.push(char::from(bytes[i]));
                i += 1;
            }
        }
    }
    Cow::Owned(out)
}

fn hex(digit: u8) -> Option<u8> {
    char::from(digit)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_decode_unreserved_characters_only() {
        for (path, normal) in [
            ("/inventory/%34%32/reserve", "/inventory/42/reserve"),
            ("/accounts/%61lice", "/accounts/alice"),
            ("/a%7e%2D%2e%5F", "/a~-._"),
            // A space, reserved characters: not the same path to the RFC; escapes kept.
            ("/x%200:", "/x%200:"),
            ("/a%3bb%3D%2B%40", "/a%3Bb%3D%2B%40"),
            ("/a%2fb", "/a%2Fb"),
        ] {
            assert_eq!(normalized_path(path, Decode::Unreserved), normal, "{path}");
        }
    }

    #[test]
    fn one_spelling_per_path() {
        for (path, normal) in [
            ("/inventory/42/reserve", "/inventory/42/reserve"),
            ("/inventory/%34%32/reserve", "/inventory/42/reserve"),
            ("/accounts/%61lice", "/accounts/alice"),
            ("/a%7e%7E~", "/a~~~"),
            ("/a%20b", "/a b"),
            // Escapes that would change the path's shape stay escapes, upper-cased.
            ("/a%2fb%2Fc", "/a%2Fb%2Fc"),
            ("/a%3fb%23c%25d", "/a%3Fb%23c%25d"),
            // Control and non-ASCII bytes stay escaped.
            ("/%0a%c3%a9", "/%0A%C3%A9"),
            // Not escapes: kept.
            ("/100%", "/100%"),
            ("/%zz%4", "/%zz%4"),
            ("/%2541", "/%2541"),
        ] {
            assert_eq!(normalized_path(path, Decode::Printable), normal, "{path}");
        }
    }

    #[test]
    fn a_path_without_escapes_is_borrowed() {
        for decode in [Decode::Unreserved, Decode::Printable] {
            assert!(matches!(
                normalized_path("/carts/7", decode),
                Cow::Borrowed(_)
            ));
        }
    }
}
