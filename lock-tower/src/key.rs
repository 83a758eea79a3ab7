//! Turning untrusted bytes from a request into a bounded, printable lock key.
//!
//! A value is used as it is when it is valid UTF-8, has no control character, does not start
//! with `#` and fits in the length bound together with the prefix. Anything else is replaced
//! by `#sha256:` and the 64 hex digits of its SHA-256. A plain value never starts with `#`, so a
//! client cannot forge the hashed form of another value to share its lock.

use std::fmt;

use sha2::{Digest, Sha256};

/// The default bound on `key_prefix + value`, in bytes, above which the value is hashed.
pub(crate) const DEFAULT_MAX_KEY_LEN: usize = 256;

/// What a hashed value starts with.
const HASHED: &str = "#sha256:";

/// How many bytes of a key a log line shows.
const LOG_LEN: usize = 128;

/// The lock key for a raw value under `prefix`; `None` for an empty value (treated as missing).
pub(crate) fn normalize(prefix: &str, raw: &[u8], max_len: usize) -> Option<String> {
    if raw.is_empty() {
        return None;
    }
    let plain = std::str::from_utf8(raw).ok().filter(|s| {
        prefix.len().saturating_add(s.len()) <= max_len
            && !s.starts_with('#')
            && !s.chars().any(char::is_control)
    });
    let mut key = String::with_capacity(prefix.len() + plain.map_or(HASHED.len() + 64, str::len));
    key.push_str(prefix);
    match plain {
        Some(s) => key.push_str(s),
        None => {
            key.push_str(HASHED);
            push_hex(&mut key, &Sha256::digest(raw));
        }
    }
    Some(key)
}

/// Appends `bytes` to `out` in lower-case hex (digests in keys, fingerprints and principals).
pub(crate) fn push_hex(out: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for byte in bytes {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
}

/// A key as it may appear in logs: escaped (`Debug` of a string) and cut at [`LOG_LEN`] bytes.
pub(crate) struct LogKey<'a>(pub(crate) &'a str);

impl fmt::Debug for LogKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = self.0;
        if key.len() <= LOG_LEN {
            return write!(f, "{key:?}");
        }
        let mut end = LOG_LEN;
        while !key.is_char_boundary(end) {
            end -= 1;
        }
        write!(f, "{:?}... ({} bytes)", &key[..end], key.len())
    }
}

impl fmt::Display for LogKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(raw: &[u8]) -> String {
        normalize("p:", raw, DEFAULT_MAX_KEY_LEN).unwrap()
    }

    fn is_hashed(key: &str) -> bool {
        key.strip_prefix("p:#sha256:")
            .is_some_and(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
    }

    #[test]
    fn plain_values_are_kept() {
        assert_eq!(norm(b"order-42"), "p:order-42");
        assert_eq!(norm("sku é {x}".as_bytes()), "p:sku é {x}");
    }

    #[test]
    fn empty_is_missing() {
        assert_eq!(normalize("p:", b"", 10), None);
    }

    #[test]
    fn hostile_values_are_hashed() {
        for raw in [
            &b"\xff\xfe"[..],
            b"a\x00b",
            b"tab\there",
            b"line\nbreak",
            b"del\x7f",
            "c1\u{85}".as_bytes(),
            b"#sha256:0000",
        ] {
            let key = norm(raw);
            assert!(is_hashed(&key), "{raw:?} -> {key}");
        }
    }

    #[test]
    fn length_bound_includes_the_prefix() {
        let fits = "x".repeat(DEFAULT_MAX_KEY_LEN - 2);
        assert_eq!(norm(fits.as_bytes()), format!("p:{fits}"));
        let over = "x".repeat(DEFAULT_MAX_KEY_LEN - 1);
        assert!(is_hashed(&norm(over.as_bytes())));
        let huge = vec![b'a'; 1 << 20];
        assert!(is_hashed(&norm(&huge)));
    }

    #[test]
    fn hashing_is_deterministic_and_distinguishes_values() {
        assert_eq!(norm(b"\xff"), norm(b"\xff"));
        assert_ne!(norm(b"\xff"), norm(b"\xfe"));
        let a = "a".repeat(300);
        let b = format!("{}b", "a".repeat(299));
        assert_ne!(norm(a.as_bytes()), norm(b.as_bytes()));
    }

    /// Any bytes at all: a bounded, control-free key; the value itself exactly when it is
    /// plain; the same key for the same bytes.
    #[test]
    fn any_input_gives_a_bounded_printable_key() {
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..10_000 {
            let len = usize::try_from(next() % 600).unwrap();
            // Mostly ASCII letters, sometimes anything: both paths get exercised.
            let wild = next() % 4 == 0;
            let raw: Vec<u8> = (0..len)
                .map(|_| {
                    let r = next();
                    if wild { r as u8 } else { b'a' + (r % 26) as u8 }
                })
                .collect();
            let Some(key) = normalize("p:", &raw, DEFAULT_MAX_KEY_LEN) else {
                assert!(raw.is_empty());
                continue;
            };
            assert!(key.len() <= DEFAULT_MAX_KEY_LEN.max("p:".len() + 72));
            assert!(!key.chars().any(char::is_control), "{key:?}");
            let plain = std::str::from_utf8(&raw).is_ok_and(|s| {
                s.len() + 2 <= DEFAULT_MAX_KEY_LEN
                    && !s.starts_with('#')
                    && !s.chars().any(char::is_control)
            });
            assert_eq!(key.as_bytes() == [&b"p:"[..], &raw].concat(), plain);
            assert_eq!(is_hashed(&key), !plain);
            assert_eq!(
                normalize("p:", &raw, DEFAULT_MAX_KEY_LEN).as_deref(),
                Some(&*key)
            );
        }
    }

    #[test]
    fn log_key_is_escaped_and_bounded() {
        assert_eq!(format!("{}", LogKey("a\"b")), r#""a\"b""#);
        let long = "é".repeat(200);
        let shown = format!("{}", LogKey(&long));
        assert!(
            shown.len() < 200 && shown.ends_with("(400 bytes)"),
            "{shown}"
        );
    }
}
