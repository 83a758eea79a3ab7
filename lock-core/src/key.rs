//! Lock names: validation and the backend key layout.
//!
//! A lock named `K` under prefix `P` uses these backend names, all in one cluster hash slot:
//!
//! | what               | name                 |
//! |--------------------|----------------------|
//! | the lock           | `P{T}S`              |
//! | fence counter      | `P{T}S:fence`        |
//! | release channel    | `P{T}S:released`     |
//! | waiter queue       | `P{T}S:queue`        |
//! | waiter entries     | `P{T}S:waiters`      |
//! | idempotency record | `P{T}S:result`       |
//!
//! The queue lists the tickets of waiting lockers (default mode: one per locker; fair mode:
//! one per waiter), oldest first; a release hands the lock to the oldest live one. Queue and
//! entries expire on their own (twice a ticket's 3 s lifetime) when nobody waits any more.
//! Versions of lock-core from before the handover wrote bare expiry times in the entries; the
//! scripts here still read those, but older versions cannot read the new entries: do not run
//! both against one Redis while waiters queue.
//!
//! where the hash tag `T` is `K` itself when `K` holds no brace (so `lock:{order:42}`), and
//! otherwise `#` plus 16 hex digits of SHA-256(K), with `S = K`. A plain key's `S` is empty and
//! never holds a brace, a hashed key's `S` always does, so two different keys never share a name.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::LockError;

/// The longest lock key accepted, in bytes. Longer keys get [`LockError::InvalidKey`]; hash
/// untrusted long values before using them as keys (lock-tower does).
pub const MAX_KEY_LEN: usize = 1024;

/// The longest prefix accepted, in bytes.
pub const MAX_PREFIX_LEN: usize = 256;

/// The prefix used when none is configured.
pub const DEFAULT_PREFIX: &str = "lock:";

/// How many characters of a key an error message shows.
const DISPLAY_LEN: usize = 128;

/// One validated lock name with its backend names: what the engine hands a
/// [`Backend`](crate::backend::Backend). Cheap to clone (shared).
///
/// [`name`](Self::name) is the store's name of the lock (prefix, hash tag and key, so every
/// name of one lock falls in one Redis Cluster slot); a backend of another store may use it
/// as a path or a key prefix. It never holds a token.
///
/// ```
/// use lock_core::backend::LockKey;
/// let key = LockKey::new("shop:", "order:42").unwrap();
/// assert_eq!(key.user(), "order:42");
/// assert_eq!(key.name(), "shop:{order:42}");
/// assert!(LockKey::new("shop:", "").is_err());
/// ```
#[derive(Debug, Clone)]
pub struct LockKey(Arc<KeyNames>);

/// Every name a lock cycle needs, in one allocation: `buf` is
/// `NAME:queueNAME:releasedNAME:fenceNAME:waiters`, the user's key a slice of `NAME` (the hash
/// tag of a plain key, the tail of a hashed one). A release names four of them: made once
/// here, not formatted again for each call.
#[derive(Debug)]
pub(crate) struct KeyNames {
    buf: String,
    /// `NAME` is `buf[..name_len]`.
    name_len: usize,
    /// The user's key is `buf[user_start..user_start + user_len]`.
    user_start: usize,
    user_len: usize,
}

const QUEUE_SUFFIX: &str = ":queue";
const CHANNEL_SUFFIX: &str = ":released";
const FENCE_SUFFIX: &str = ":fence";
const WAITERS_SUFFIX: &str = ":waiters";

impl LockKey {
    /// Validates `user` (not empty, at most [`MAX_KEY_LEN`] bytes) and names it under
    /// `prefix`: [`LockError::InvalidKey`] otherwise. The prefix is taken as given (a
    /// [`Locker`](crate::Locker) validates its own).
    ///
    /// ```
    /// let key = lock_core::backend::LockKey::new("lock:", "job").unwrap();
    /// assert_eq!(key.name(), "lock:{job}");
    /// ```
    pub fn new(prefix: &str, user: &str) -> Result<Self, LockError> {
        validate_key(user)?;
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let hashed = user.contains(['{', '}']);
        // prefix, braces, user, and for a hashed key '#' and 16 hex digits.
        let name_len = prefix.len() + 2 + user.len() + if hashed { 17 } else { 0 };
        let mut buf = String::with_capacity(
            4 * name_len
                + QUEUE_SUFFIX.len()
                + CHANNEL_SUFFIX.len()
                + FENCE_SUFFIX.len()
                + WAITERS_SUFFIX.len(),
        );
        buf.push_str(prefix);
        buf.push('{');
        let user_start = if hashed {
            let digest = Sha256::digest(user.as_bytes());
            buf.push('#');
            for byte in &digest[..8] {
                buf.push(char::from(HEX[usize::from(byte >> 4)]));
                buf.push(char::from(HEX[usize::from(byte & 0x0f)]));
            }
            buf.push('}');
            let start = buf.len();
            buf.push_str(user);
            start
        } else {
            let start = buf.len();
            buf.push_str(user);
            buf.push('}');
            start
        };
        debug_assert_eq!(buf.len(), name_len);
        for suffix in [QUEUE_SUFFIX, CHANNEL_SUFFIX, FENCE_SUFFIX, WAITERS_SUFFIX] {
            if suffix != QUEUE_SUFFIX {
                buf.extend_from_within(..name_len);
            }
            buf.push_str(suffix);
        }
        Ok(LockKey(Arc::new(KeyNames {
            buf,
            name_len,
            user_start,
            user_len: user.len(),
        })))
    }

    /// The key as the user gave it.
    ///
    /// ```
    /// let key = lock_core::backend::LockKey::new("lock:", "a{b}").unwrap();
    /// assert_eq!(key.user(), "a{b}");
    /// ```
    pub fn user(&self) -> &str {
        let n = &self.0;
        &n.buf[n.user_start..n.user_start + n.user_len]
    }

    /// The key as the user gave it, made safe for messages and logs (control characters
    /// escaped, long keys cut).
    ///
    /// ```
    /// let key = lock_core::backend::LockKey::new("lock:", "a\nb").unwrap();
    /// assert!(!key.display().contains('\n'));
    /// ```
    pub fn display(&self) -> String {
        display_key(self.user())
    }

    /// The backend name of the lock itself (`P{T}S`); the other names add a suffix to it.
    ///
    /// ```
    /// let key = lock_core::backend::LockKey::new("p:", "k").unwrap();
    /// assert_eq!(key.name(), "p:{k}");
    /// ```
    pub fn name(&self) -> &str {
        &self.0.buf[..self.0.name_len]
    }

    /// The lock whose backend name is `name` under `prefix`, or `None` when `name` is not a
    /// lock's name (another name of a lock: its fence counter, its queue; or a name this crate
    /// did not make): the inverse of [`name`](Self::name), for listings.
    ///
    /// ```
    /// use lock_core::backend::LockKey;
    /// let key = LockKey::new("lock:", "a{b}").unwrap();
    /// assert_eq!(LockKey::from_name("lock:", key.name()).unwrap().user(), "a{b}");
    /// assert_eq!(LockKey::from_name("lock:", "lock:{job}").unwrap().user(), "job");
    /// assert!(LockKey::from_name("lock:", "lock:{job}:fence").is_none());
    /// ```
    pub fn from_name(prefix: &str, name: &str) -> Option<LockKey> {
        let key = LockKey::new(prefix, user_of_name(prefix, name)?).ok()?;
        (key.name() == name).then_some(key)
    }

    /// Where `NAME:fence` starts in `buf` (after `NAME:queue` and `NAME:released`).
    fn fence_start(&self) -> usize {
        2 * self.0.name_len + QUEUE_SUFFIX.len() + CHANNEL_SUFFIX.len()
    }

    /// Where `NAME:waiters` starts in `buf`.
    fn waiters_start(&self) -> usize {
        self.fence_start() + self.0.name_len + FENCE_SUFFIX.len()
    }

    /// The backend name of the fencing counter.
    pub(crate) fn fence(&self) -> &str {
        &self.0.buf[self.fence_start()..self.waiters_start()]
    }

    /// The idempotency record stored for this key (a hash: `fingerprint`, `result`; with a TTL).
    pub(crate) fn result(&self) -> String {
        format!("{}:result", self.name())
    }

    #[cfg(any(feature = "redis", test))]
    /// The release notification channel.
    pub(crate) fn channel(&self) -> String {
        self.channel_name().to_owned()
    }

    #[cfg(any(feature = "redis", test))]
    /// The release notification channel, borrowed.
    pub(crate) fn channel_name(&self) -> &str {
        &self.0.buf[self.0.name_len + QUEUE_SUFFIX.len()..self.fence_start()]
    }

    #[cfg(feature = "redis")]
    /// The queue of waiter tickets (oldest first) a release hands the lock to.
    pub(crate) fn queue(&self) -> String {
        self.queue_name().to_owned()
    }

    #[cfg(any(feature = "redis", test))]
    /// The queue of waiter tickets, borrowed.
    pub(crate) fn queue_name(&self) -> &str {
        &self.0.buf[..self.0.name_len + QUEUE_SUFFIX.len()]
    }

    #[cfg(any(feature = "redis", test))]
    /// The queued waiters' entries: expiry, attempt, handover lease, fencing, token.
    pub(crate) fn waiters(&self) -> &str {
        &self.0.buf[self.waiters_start()..]
    }
}

/// The user's key a lock name `name` under `prefix` would have, read off the name without
/// checking it (no hashing: [`LockKey::from_name`] checks); `None` when it has not the shape.
pub(crate) fn user_of_name<'a>(prefix: &str, name: &'a str) -> Option<&'a str> {
    let rest = name.strip_prefix(prefix)?.strip_prefix('{')?;
    // A hashed key: `#` and 16 hex digits, `}`, then the key itself, which holds a brace. A
    // plain key holds none (it ends at the name's only `}`), though it may start with `#`.
    if let Some(hashed) = rest.strip_prefix('#')
        && hashed.as_bytes().get(16) == Some(&b'}')
        && let Some(user) = hashed.get(17..).filter(|u| u.contains(['{', '}']))
    {
        return Some(user);
    }
    rest.strip_suffix('}')
}

fn validate_key(user: &str) -> Result<(), LockError> {
    if user.is_empty() {
        return Err(LockError::InvalidKey {
            key: String::new(),
            reason: "the key is empty; name the resource you protect, e.g. \"order:42\"".into(),
        });
    }
    if user.len() > MAX_KEY_LEN {
        return Err(LockError::InvalidKey {
            key: display_key(user),
            reason: format!(
                "the key is {} bytes, more than the {MAX_KEY_LEN} allowed; hash long or untrusted values first",
                user.len()
            ),
        });
    }
    Ok(())
}

pub(crate) fn validate_prefix(prefix: &str) -> Result<(), LockError> {
    if prefix.len() > MAX_PREFIX_LEN {
        return Err(LockError::config(format!(
            "the prefix is {} bytes, more than the {MAX_PREFIX_LEN} allowed",
            prefix.len()
        )));
    }
    if prefix.contains(['{', '}']) {
        return Err(LockError::config(format!(
            "the prefix {:?} contains a brace; braces would change the cluster hash slot of every lock (the crate places each lock's keys in one slot itself)",
            display_key(prefix)
        )));
    }
    Ok(())
}

/// A key made safe for messages and logs: control and other non-printable characters (line
/// breaks, escape sequences, bidirectional overrides...) and backslashes are escaped as Rust
/// escapes (`\n`, `\u{1b}`, `\\`), so a hostile key can neither forge log lines nor drive
/// a terminal, and is shown in at most `DISPLAY_LEN` bytes, cut on a character boundary,
/// followed by the key's full length when cut.
pub(crate) fn display_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len().min(DISPLAY_LEN));
    for c in key.chars() {
        let before = out.len();
        if c == '"' || c == '\'' {
            out.push(c);
        } else {
            out.extend(c.escape_debug());
        }
        if out.len() > DISPLAY_LEN {
            out.truncate(before);
            out.push_str(&format!("... ({} bytes)", key.len()));
            return out;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(user: &str) -> LockKey {
        LockKey::new("lock:", user).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn plain_key_is_its_own_hash_tag() {
        let k = names("order:42");
        assert_eq!(k.name(), "lock:{order:42}");
        assert_eq!(k.fence(), "lock:{order:42}:fence");
        assert_eq!(k.channel(), "lock:{order:42}:released");
        assert_eq!(k.result(), "lock:{order:42}:result");
        assert_eq!(k.queue_name(), "lock:{order:42}:queue");
        assert_eq!(k.channel_name(), "lock:{order:42}:released");
        assert_eq!(k.waiters(), "lock:{order:42}:waiters");
        assert_eq!(k.user(), "order:42");
    }

    #[test]
    fn names_read_back_as_their_keys_even_when_a_key_starts_with_a_hash_sign() {
        // A plain key may start with `#` (only a brace makes a key hashed): `list` reads every
        // held lock's key back from its name, and must not skip these.
        let hashed = names("x}");
        let tag = &hashed.name()["lock:{".len()..hashed.name().find('}').unwrap_or(0)];
        for user in [
            "#0",
            "#",
            "#0123456789abcdef",
            tag,
            "#0123456789abcdefX",
            "x}",
            "#{",
        ] {
            let key = names(user);
            let back = LockKey::from_name("lock:", key.name());
            assert_eq!(
                back.map(|k| k.user().to_owned()).as_deref(),
                Some(user),
                "{user}"
            );
            assert_eq!(user_of_name("lock:", key.name()), Some(user), "{user}");
        }
    }

    #[test]
    fn braces_are_hashed_into_the_tag() {
        let k = names("a}b{c");
        assert!(k.name().starts_with("lock:{#"));
        let tag_end = k.name().find('}').unwrap_or(0);
        assert_eq!(tag_end, "lock:{#".len() + 16);
        assert!(k.name().ends_with("a}b{c"));
        assert!(k.fence().starts_with(&k.name()[..=tag_end]));
        assert_eq!(k.user(), "a}b{c");
        assert_eq!(k.queue_name(), format!("{}:queue", k.name()));
        assert_eq!(k.channel_name(), format!("{}:released", k.name()));
        assert_eq!(k.fence(), format!("{}:fence", k.name()));
        assert_eq!(k.waiters(), format!("{}:waiters", k.name()));
        let empty_prefix = LockKey::new("", "é{x").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(empty_prefix.user(), "é{x");
        assert_eq!(
            empty_prefix.channel_name(),
            format!("{}:released", empty_prefix.name())
        );
    }

    #[test]
    fn distinct_keys_get_distinct_names() {
        let keys = ["a", "a:fence", "{a}", "a}", "}", "{", "a}:fence", "#0"];
        let mut all = std::collections::HashSet::new();
        for k in keys {
            let n = names(k);
            assert!(all.insert(n.name().to_owned()), "{k}");
            assert!(all.insert(n.fence().to_owned()), "{k}");
            assert!(all.insert(n.result()), "{k}");
        }
    }

    #[test]
    fn bad_keys_and_prefixes_are_refused() {
        assert!(matches!(
            LockKey::new("p", ""),
            Err(LockError::InvalidKey { .. })
        ));
        let long = "x".repeat(MAX_KEY_LEN + 1);
        assert!(matches!(
            LockKey::new("p", &long),
            Err(LockError::InvalidKey { .. })
        ));
        assert!(LockKey::new("p", &"x".repeat(MAX_KEY_LEN)).is_ok());
        assert!(validate_prefix("a{b").is_err());
        assert!(validate_prefix(&"p".repeat(MAX_PREFIX_LEN + 1)).is_err());
        assert!(validate_prefix("").is_ok());
    }

    #[test]
    fn display_key_escapes_control_characters() {
        assert_eq!(
            display_key("a\nb\r\tc\u{1b}[31m\u{0}\u{7f}"),
            "a\\nb\\r\\tc\\u{1b}[31m\\0\\u{7f}"
        );
        // A literal backslash-n in a key is not confused with an escaped line break.
        assert_eq!(display_key("a\\nb"), "a\\\\nb");
        // Unicode line separators and bidirectional overrides are escaped too.
        assert_eq!(
            display_key("x\u{2028}y\u{202e}z\u{85}"),
            "x\\u{2028}y\\u{202e}z\\u{85}"
        );
        // Printable text, quotes and non-ASCII letters are kept as they are.
        assert_eq!(display_key("order:\"42\"'é'"), "order:\"42\"'é'");
        let forged = display_key("k\n2024-01-01 INFO user=admin logged in");
        assert!(!forged.chars().any(char::is_control), "{forged}");
    }

    #[test]
    fn display_key_bounds_escaped_keys_and_cuts_on_an_escape_boundary() {
        let hostile = "\u{1b}".repeat(300);
        let d = display_key(&hostile);
        assert!(d.ends_with("... (300 bytes)"), "{d}");
        let shown = d.trim_end_matches("... (300 bytes)");
        assert!(shown.len() <= DISPLAY_LEN, "{}", shown.len());
        // Whole escapes only: never a dangling `\u{1` at the cut.
        assert_eq!(shown.len() % "\\u{1b}".len(), 0, "{shown}");
        assert!(!d.chars().any(char::is_control));
        // A short key with an escape that fits is shown whole.
        assert_eq!(display_key("a\nb"), "a\\nb");
    }

    #[test]
    fn display_key_cuts_on_char_boundary() {
        let s = "é".repeat(200);
        let d = display_key(&s);
        assert!(d.len() < s.len());
        assert!(d.ends_with("(400 bytes)"));
    }
}
