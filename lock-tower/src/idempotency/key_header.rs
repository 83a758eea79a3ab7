//! The value of the key header. The IETF draft makes it an sf-string (RFC 8941 3.3.3:
//! `Idempotency-Key: "8e03978e"`); many clients send the bare value (`8e03978e`). Both name
//! the same key, so a retry is found whichever way its client writes it.

use std::borrow::Cow;

/// The key `value` names: the contents of an sf-string, its escapes (`\"`, `\\`) undone; or a
/// value that does not start with `"`, as it is. A malformed sf-string is an error saying why
/// (an unescaped key would be another key than the client meant).
pub(crate) fn parse(value: &[u8]) -> Result<Cow<'_, [u8]>, &'static str> {
    let trimmed = value.trim_ascii();
    let Some(rest) = trimmed.strip_prefix(b"\"") else {
        return Ok(Cow::Borrowed(value));
    };
    let mut key = Vec::with_capacity(rest.len());
    let mut bytes = rest.iter();
    while let Some(&byte) = bytes.next() {
        match byte {
            b'\\' => match bytes.next() {
                Some(&escaped @ (b'"' | b'\\')) => key.push(escaped),
                _ => return Err("a backslash in a quoted key escapes only `\"` and `\\`"),
            },
            b'"' if bytes.next().is_some() => {
                return Err("nothing may follow the closing quote of a quoted key");
            }
            b'"' if key.is_empty() => return Err("the quoted key is empty"),
            b'"' => return Ok(Cow::Owned(key)),
            0x20..=0x7e => key.push(byte),
            _ => return Err("a quoted key holds printable ASCII only"),
        }
    }
    Err("the quoted key has no closing quote")
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn an_sf_string_and_a_bare_value_name_the_same_key() {
        assert_eq!(parse(br#""abc""#).unwrap(), &b"abc"[..]);
        assert_eq!(parse(b"abc").unwrap(), &b"abc"[..]);
        assert_eq!(parse(br#" "abc" "#).unwrap(), &b"abc"[..]);
        assert_eq!(parse(br#""a\"b\\c""#).unwrap(), &br#"a"b\c"#[..]);
        assert_eq!(parse(br#""a, b""#).unwrap(), &b"a, b"[..]);
        // Bare values are taken as they are, quotes inside included.
        assert_eq!(parse(br#"a"b"#).unwrap(), &br#"a"b"#[..]);
    }

    #[test]
    fn malformed_sf_strings_are_errors() {
        for bad in [
            &br#""abc"#[..],
            br#"""#,
            br#""""#,
            br#""a\b""#,
            br#""abc\"#,
            br#""abc"x"#,
            br#""abc";p=1"#,
            b"\"a\tb\"",
            b"\"\xc3\xa9\"",
        ] {
            assert!(parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }
}
