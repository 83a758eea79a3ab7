//! Owner tokens: 128 random bits per acquisition, never printed.

use std::fmt;

use crate::LockError;

const HEX: &[u8; 16] = b"0123456789abcdef";

/// The proof of ownership of one acquisition: 128 bits from the operating system's CSPRNG
/// (`getrandom`), as 32 lowercase hex digits. (A UUID v4 would carry only 122 random bits.)
///
/// `Debug` prints `Token(<redacted>)` so tokens never reach logs.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct Token(String);

impl Token {
    pub(crate) fn random() -> Result<Self, LockError> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).map_err(|e| LockError::Backend {
            operation: "generate token",
            key: String::new(),
            source: std::sync::Arc::new(std::io::Error::other(e.to_string())),
        })?;
        let mut hex = String::with_capacity(32);
        for b in bytes {
            hex.push(char::from(HEX[usize::from(b >> 4)]));
            hex.push(char::from(HEX[usize::from(b & 0x0f)]));
        }
        Ok(Token(hex))
    }

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
        let a = Token::random().unwrap_or_else(|e| panic!("{e}"));
        let b = Token::random().unwrap_or_else(|e| panic!("{e}"));
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 32);
        assert!(a.as_str().bytes().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(format!("{a:?}"), "Token(<redacted>)");
    }
}
