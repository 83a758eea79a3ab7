//! Owner tokens: 128 random bits per acquisition, never printed.

use std::fmt;

const HEX: &[u8; 16] = b"0123456789abcdef";

/// The proof of ownership of one acquisition: 128 bits from `rand`'s thread-local CSPRNG
/// (ChaCha12, seeded and periodically reseeded from the operating system), as 32 lowercase hex
/// digits. (A UUID v4 would carry only 122 random bits; a syscall per token costs more than the
/// whole in-memory lock.)
///
/// `Debug` prints `Token(<redacted>)` so tokens never reach logs.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct Token(String);

impl Token {
    pub(crate) fn random() -> Self {
        let bytes: [u8; 16] = rand::random();
        let mut hex = String::with_capacity(32);
        for b in bytes {
            hex.push(char::from(HEX[usize::from(b >> 4)]));
            hex.push(char::from(HEX[usize::from(b & 0x0f)]));
        }
        Token(hex)
    }

    #[cfg(any(feature = "redis", test))]
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_unique_hex_and_redacted() {
        let a = Token::random();
        let b = Token::random();
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 32);
        assert!(a.as_str().bytes().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(format!("{a:?}"), "Token(<redacted>)");
    }
}
