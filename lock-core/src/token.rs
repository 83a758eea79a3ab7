//! Owner tokens: 128 random bits per acquisition, never printed.

use std::fmt;

const HEX: &[u8; 16] = b"0123456789abcdef";

/// The proof of ownership of one acquisition: 128 random bits as 32 lowercase hex digits.
/// (A UUID v4 would carry only 122 random bits.)
///
/// Where the bits come from depends on who else can see the lock (`Token::new`): tokens of a
/// backend shared between processes come straight from the operating system's CSPRNG, so a
/// forked child can never draw its parent's next token; the in-process memory backend draws from
/// `rand`'s thread-local CSPRNG, which costs no system call (a fork copies that backend too, so
/// parent and child never contend on one lock).
///
/// `Debug` prints `Token(<redacted>)` so tokens never reach logs.
///
/// A [`Backend`](crate::backend::Backend) stores it with the lock and compares it on release
/// and renewal; it must never log it.
///
/// ```
/// let token = lock_core::backend::Token::generate();
/// assert_eq!(token.as_str().len(), 32);
/// assert_eq!(format!("{token:?}"), "Token(<redacted>)");
/// assert_ne!(token, lock_core::backend::Token::generate());
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Token(String);

impl Token {
    /// A new token; `shared` when other processes see the lock (every backend but memory).
    pub(crate) fn new(shared: bool) -> Self {
        let bytes = if shared { os_random() } else { rand::random() };
        // The digits written into a fixed buffer, then checked as UTF-8 once (ASCII: it always
        // is): a `push` per digit checks capacity and encodes a `char` 32 times.
        let mut hex = [0u8; 32];
        for (pair, b) in hex.chunks_exact_mut(2).zip(bytes) {
            pair[0] = HEX[usize::from(b >> 4)];
            pair[1] = HEX[usize::from(b & 0x0f)];
        }
        Token(String::from_utf8(hex.to_vec()).unwrap_or_default())
    }

    /// A new token from the operating system's generator (as every backend shared between
    /// processes gets).
    ///
    /// ```
    /// let token = lock_core::backend::Token::generate();
    /// assert!(token.as_str().bytes().all(|b| b.is_ascii_hexdigit()));
    /// ```
    pub fn generate() -> Self {
        Token::new(true)
    }

    /// The hex digits (also used to draw other random names, a waiter's ticket, the same way).
    ///
    /// ```
    /// assert_eq!(lock_core::backend::Token::generate().as_str().len(), 32);
    /// ```
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// How many tokens' worth of operating-system random bytes one system call fetches.
const BATCH: usize = 16;

/// Random bytes fetched from the operating system ahead of use, per thread, with the process
/// that fetched them: bytes are handed out once each, and never in another process.
struct Reserve {
    bytes: [u8; 16 * BATCH],
    /// Bytes before `next` were handed out already.
    next: usize,
    pid: u32,
}

thread_local! {
    static RESERVE: std::cell::RefCell<Reserve> = const {
        std::cell::RefCell::new(Reserve { bytes: [0; 16 * BATCH], next: 16 * BATCH, pid: 0 })
    };
}

/// 128 bits from the operating system (`getrandom(2)` on Linux), fresh in every process: the
/// kernel's generator is not copied by `fork`, unlike any userspace generator's state. The bytes
/// are fetched `BATCH` tokens at a time (one system call, not one per lock) and kept per thread
/// with the id of the process that fetched them; a forked child (a new process id) never uses
/// its parent's reserve, it fetches its own, so parent and child never draw the same token.
fn os_random() -> [u8; 16] {
    let pid = std::process::id();
    let reserved = RESERVE.with(|cell| {
        let r = &mut *cell.borrow_mut();
        if r.pid != pid || r.next >= r.bytes.len() {
            if getrandom::fill(&mut r.bytes).is_err() {
                r.next = r.bytes.len();
                return None;
            }
            r.next = 0;
            r.pid = pid;
        }
        let mut bytes = [0u8; 16];
        let taken = &mut r.bytes[r.next..r.next + 16];
        bytes.copy_from_slice(taken);
        // Handed out once: wiped from the reserve.
        taken.fill(0);
        r.next += 16;
        Some(bytes)
    });
    if let Some(bytes) = reserved {
        return bytes;
    }
    let mut bytes = [0u8; 16];
    // The OS refused (no such call in a sandbox): the userspace generator, made distinct per
    // process by the process id, so a parent and its forked child still draw different tokens.
    let drawn: [u8; 16] = rand::random();
    let pid = std::process::id().to_le_bytes();
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = drawn[i] ^ pid[i % pid.len()].rotate_left(u32::try_from(i).unwrap_or(0));
    }
    bytes
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
        for shared in [false, true] {
            let a = Token::new(shared);
            let b = Token::new(shared);
            assert_ne!(a, b);
            assert_eq!(a.as_str().len(), 32);
            assert!(a.as_str().bytes().all(|c| c.is_ascii_hexdigit()));
            assert_eq!(format!("{a:?}"), "Token(<redacted>)");
        }
        // Across several reserves (and threads), no token comes twice.
        let mut seen = std::collections::HashSet::new();
        for _ in 0..(3 * BATCH + 1) {
            assert!(seen.insert(Token::new(true)));
        }
        let other = std::thread::spawn(|| (0..BATCH).map(|_| Token::new(true)).collect::<Vec<_>>());
        for t in other.join().unwrap_or_default() {
            assert!(seen.insert(t));
        }
    }
}
