//! Looking at locks without taking them, for the people on call: who holds a lock and since
//! when ([`Locker::inspect`]), the held locks under a pattern ([`Locker::list`]), and freeing
//! a lock whose holder is stuck ([`Locker::force_unlock`]). Never a token: a lock's state
//! names its holder by the identity its locker was given ([`LockerBuilder::holder`]).
//!
//! [`LockerBuilder::holder`]: crate::LockerBuilder::holder

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::LockError;
use crate::backend::{Backend, BoxFuture};
use crate::key::{LockKey, MAX_KEY_LEN, display_key};
use crate::locker::Locker;

/// The longest holder identity accepted, in bytes.
pub const MAX_HOLDER_LEN: usize = 256;

/// What an inspection sees of one lock, without taking it: whether it is held, for how much
/// longer, by whom and since when, the last fence drawn for it, and how many wait in the
/// backend. Never the holder's token.
///
/// ```
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// let locker = lock_core::Locker::memory();
/// let guard = locker.lock("order:42").fenced().await?;
/// let state = locker.inspect("order:42").await?;
/// assert!(state.held);
/// assert_eq!(state.fence, guard.fence());
/// assert_eq!(state.holder.as_deref(), Some(locker.holder()));
/// guard.release().await?;
/// assert!(!locker.inspect("order:42").await?.held);
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockState {
    /// The lock's key, as the caller named it (a key longer than the backend's names keep, or
    /// holding a brace, is found by [`Locker::list`] under its own name too).
    pub key: String,
    /// Whether someone holds it now.
    pub held: bool,
    /// How long the holder's lease still runs (renewals move it on), when held. On etcd, in
    /// whole seconds, from the holder's etcd lease; on ZooKeeper, which counts no lease down,
    /// the lease the holder took the lock with (see each backend's docs).
    pub remaining: Option<Duration>,
    /// The last fence drawn for the key (by any holder, this one or an earlier one), when a
    /// fenced lock was ever taken and the backend keeps its counter; the next one is larger.
    /// On etcd and ZooKeeper, the holder entry's revision, while held (nothing keeps it once
    /// the lock is free).
    pub fence: Option<u64>,
    /// Who holds it: the identity of the holder's locker ([`crate::LockerBuilder::holder`]),
    /// when held and recorded (a lock taken by an older version of this crate has none).
    pub holder: Option<String>,
    /// How long the current holder has held it (since its acquire, or the hand-over that gave
    /// it the lock; renewals do not restart it), when held and recorded. On Redis: the
    /// server's `TIME` now, less the time the taker's clock read at the acquire (Redis's own
    /// for a hand-over): a skew between the holder's host clock and the server's shifts it
    /// (keep clocks in sync, as fencing already asks).
    pub held_for: Option<Duration>,
    /// How many wait for it in the backend: one per waiting locker (the first of its local
    /// waiters) in the default mode, one per waiter in fair mode. Waiters of a backend
    /// without a queue are not counted.
    pub waiters: usize,
    /// When the current holder took it (its acquire, or the hand-over that gave it the lock),
    /// when held and recorded: on Redis the instant stamped in the lock's value (the taker's
    /// clock, the server's for a hand-over, to the millisecond). Unlike
    /// [`held_for`](Self::held_for) it reads the same at every look at one holding: two states
    /// with the same `since` and fence show one holding, a new acquire by the same holder has
    /// another `since` ([`Locker::force_unlock_seen`] removes a lock only if it is still the
    /// holding seen).
    pub since: Option<std::time::SystemTime>,
}

impl LockState {
    /// The state of `key` nobody holds, nobody waits for and never fenced: the start of the
    /// answer a backend builds (the fields are public; the struct may gain fields).
    ///
    /// ```
    /// let mut state = lock_core::LockState::free("order:42");
    /// assert!(!state.held && state.holder.is_none() && state.waiters == 0);
    /// state.held = true;
    /// ```
    pub fn free(key: impl Into<String>) -> Self {
        LockState {
            key: key.into(),
            held: false,
            remaining: None,
            fence: None,
            holder: None,
            held_for: None,
            waiters: 0,
            since: None,
        }
    }
}

/// One page of [`Backend::list_page`]: the held locks found, and where the next page starts
/// (`None`: this was the last).
///
/// ```
/// let page = lock_core::backend::ListPage::new(vec![lock_core::LockState::free("a")], None);
/// assert_eq!(page.locks.len(), 1);
/// assert!(page.next.is_none());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListPage {
    /// The held locks of this page whose keys match the pattern.
    pub locks: Vec<LockState>,
    /// The cursor of the next page, opaque to the caller; `None` at the end.
    pub next: Option<String>,
}

impl ListPage {
    /// A page of `locks`, followed by the page at `next` (`None`: the last page).
    ///
    /// ```
    /// let page = lock_core::backend::ListPage::new(Vec::new(), Some("17".to_owned()));
    /// assert_eq!(page.next.as_deref(), Some("17"));
    /// ```
    pub fn new(locks: Vec<LockState>, next: Option<String>) -> Self {
        ListPage { locks, next }
    }
}

/// What [`Locker::force_unlock_seen`] did.
///
/// ```
/// let answer = lock_core::Unlocked::NotHeld;
/// assert!(!matches!(answer, lock_core::Unlocked::Removed(_)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unlocked {
    /// The holding seen was removed: its state just before.
    Removed(LockState),
    /// Nobody held the lock: nothing touched.
    NotHeld,
    /// Another holding holds the lock now (its state): nothing touched.
    ChangedHands(LockState),
}

/// Whether `now` (the backend's state of a lock) is the holding `seen` showed: the same
/// `since` and the same last fence (for backends comparing in memory).
pub(crate) fn same_holding(seen: &LockState, now: &LockState) -> bool {
    seen.held && now.held && seen.since == now.since && seen.fence == now.fence
}

/// A pattern on lock keys (as callers name them, without the prefix), in the glob syntax of
/// Redis's `SCAN MATCH`: `*` matches any run of characters, `?` one character, `\` makes the
/// next character literal. `order:*` matches every key that starts with `order:`.
///
/// ```
/// let pattern = lock_core::backend::KeyPattern::new("order:*").unwrap();
/// assert!(pattern.matches("order:42"));
/// assert!(!pattern.matches("stock:7"));
/// assert!(lock_core::backend::KeyPattern::new("a\\*").unwrap().matches("a*"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPattern {
    glob: String,
}

impl KeyPattern {
    /// The pattern `glob` (at most [`MAX_KEY_LEN`] bytes, no control characters).
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] for an empty, too long or unprintable pattern.
    ///
    /// ```
    /// assert!(lock_core::backend::KeyPattern::new("").is_err());
    /// ```
    pub fn new(glob: &str) -> Result<Self, LockError> {
        let reason = if glob.is_empty() {
            Some("the pattern is empty (use \"*\" for every key)".to_owned())
        } else if glob.len() > MAX_KEY_LEN {
            Some(format!(
                "the pattern is {} bytes, more than the {MAX_KEY_LEN} allowed",
                glob.len()
            ))
        } else if glob.chars().any(char::is_control) {
            Some("the pattern holds a control character".to_owned())
        } else {
            None
        };
        match reason {
            Some(reason) => Err(LockError::InvalidKey {
                key: display_key(glob),
                reason,
            }),
            None => Ok(KeyPattern {
                glob: glob.to_owned(),
            }),
        }
    }

    /// The pattern as given.
    ///
    /// ```
    /// assert_eq!(lock_core::backend::KeyPattern::new("job:*").unwrap().as_str(), "job:*");
    /// ```
    pub fn as_str(&self) -> &str {
        &self.glob
    }

    /// Whether `key` (a key as callers name it) matches.
    ///
    /// ```
    /// let any = lock_core::backend::KeyPattern::new("job:?").unwrap();
    /// assert!(any.matches("job:1") && !any.matches("job:12"));
    /// ```
    pub fn matches(&self, key: &str) -> bool {
        glob_matches(self.glob.as_bytes(), key.as_bytes())
    }
}

/// `*`, `?` and `\` over bytes, iteratively (a `*` backtracks to its last position only: no
/// exponential blow-up on patterns like `*a*a*a*b`).
fn glob_matches(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, t));
                p += 1;
                continue;
            }
            Some(b'?') => {
                p += 1;
                t += 1;
                continue;
            }
            Some(b'\\') if pattern.get(p + 1) == text.get(t) && p + 1 < pattern.len() => {
                p += 2;
                t += 1;
                continue;
            }
            Some(&c) if c != b'\\' && c == text[t] => {
                p += 1;
                t += 1;
                continue;
            }
            _ => {}
        }
        match star {
            Some((sp, st)) => {
                p = sp + 1;
                t = st + 1;
                star = Some((sp, st + 1));
            }
            None => return false,
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// Checks a holder identity: 1 to [`MAX_HOLDER_LEN`] bytes, nothing that changes how a log or
/// a terminal shows it ([`unsafe_to_show`]).
pub(crate) fn validate_holder(holder: &str) -> Result<(), LockError> {
    if holder.is_empty() || holder.len() > MAX_HOLDER_LEN {
        return Err(LockError::config(format!(
            "holder identity of {} bytes: give 1 to {MAX_HOLDER_LEN}",
            holder.len()
        )));
    }
    if holder.chars().any(unsafe_to_show) {
        return Err(LockError::config(
            "holder identity holds a control, line-separator or bidirectional-text character (it is shown in logs and terminals)",
        ));
    }
    Ok(())
}

/// A control character, a line or paragraph separator, or a bidirectional-text control: each
/// would change what a log line or a terminal shows around it.
fn unsafe_to_show(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{2028}' | '\u{2029}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'
        )
}

/// A holder read back from a store (another process, or anyone with write access, wrote it),
/// made safe to show: cut to [`MAX_HOLDER_LEN`] bytes, each character [`unsafe_to_show`]
/// replaced by `?`.
pub(crate) fn shown_holder(holder: &str) -> String {
    let mut shown = String::with_capacity(holder.len().min(MAX_HOLDER_LEN));
    for c in holder.chars() {
        let c = if unsafe_to_show(c) { '?' } else { c };
        if shown.len() + c.len_utf8() > MAX_HOLDER_LEN {
            break;
        }
        shown.push(c);
    }
    shown
}

/// The default holder identity of locker number `id`: `host/pid N/locker M`.
pub(crate) fn default_holder(id: u64) -> String {
    static HOST: OnceLock<String> = OnceLock::new();
    let host = HOST.get_or_init(|| {
        let named = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .or_else(|_| std::fs::read_to_string("/etc/hostname"))
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .or_else(|| std::env::var("COMPUTERNAME").ok());
        let host: String = named
            .as_deref()
            .unwrap_or("")
            .trim()
            .chars()
            .filter(|c| !c.is_control())
            .take(128)
            .collect();
        if host.is_empty() {
            "unknown-host".to_owned()
        } else {
            host
        }
    });
    format!("{host}/pid {}/locker {id}", std::process::id())
}

impl Locker {
    /// The identity this locker records with each lock it takes ([`LockState::holder`]).
    ///
    /// ```
    /// let locker = lock_core::Locker::builder(lock_core::MemoryBackend::new())
    ///     .holder("checkout-7f9c/pid 4211")
    ///     .build();
    /// assert_eq!(locker.holder(), "checkout-7f9c/pid 4211");
    /// assert!(lock_core::Locker::memory().holder().contains("/pid "));
    /// ```
    pub fn holder(&self) -> &str {
        &self.inner.config.holder
    }

    /// The state of lock `key` (under this locker's prefix), without taking it: held or not,
    /// the lease left, the last fence, the holder and for how long, the waiters. One read
    /// (one round trip on Redis; on Redlock one per server, at once, judged over the
    /// majority, as `RedlockBackend` describes).
    ///
    /// # Errors
    /// [`LockError::InvalidKey`], [`LockError::Backend`] when the backend cannot answer, and
    /// [`LockError::InvalidConfig`] on a backend that cannot inspect.
    ///
    /// ```
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let locker = lock_core::Locker::memory();
    /// let state = locker.inspect("order:42").await?;
    /// assert!(!state.held && state.holder.is_none());
    /// # Ok(()) }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
    /// ```
    pub async fn inspect(&self, key: impl AsRef<str>) -> Result<LockState, LockError> {
        let key = LockKey::new(&self.inner.config.prefix, key.as_ref())?;
        self.inner.backend.inspect(&key).await
    }

    /// Removes lock `key` whoever holds it, in one atomic step, and returns its state just
    /// before (`None` when nobody held it). For operators freeing a lock whose holder is
    /// stuck: the waiters are woken at once (the oldest queued one is handed the lock, as a
    /// release would); the next fence is larger than every one before, so the old holder's
    /// fenced writes are refused; the old holder learns at its next renewal (`lost()`
    /// resolves, `run` is cancelled, its release says [`LockError::LeaseLost`]). When the old
    /// holder is a task of this locker, the locker's local hand-off stops at once: a lock it
    /// held before the call ended is passed to another of its tasks (or taken parked) again
    /// only once the backend vouched for it anew, so the holder's release asks the backend. Each
    /// removal is logged at `warn` level, target `lock_core::audit`, with the key and the holder
    /// removed. On Redlock the step is atomic on each server and removes only the
    /// acquisition a majority of them hold; Redlock keeps no fence, so the old holder is not
    /// fenced off until it learns.
    ///
    /// # Errors
    /// As [`inspect`](Self::inspect).
    ///
    /// ```
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let (locker, operator) = (lock_core::Locker::memory(), lock_core::Locker::memory());
    /// # let backend = locker.backend();
    /// # let operator = lock_core::Locker::builder(backend).build();
    /// let stuck = locker.lock("report").await?;
    /// let removed = operator.force_unlock("report").await?.expect("it was held");
    /// assert_eq!(removed.holder.as_deref(), Some(locker.holder()));
    /// assert!(matches!(stuck.release().await, Err(lock_core::LockError::LeaseLost { .. })));
    /// # Ok(()) }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
    /// ```
    pub async fn force_unlock(&self, key: impl AsRef<str>) -> Result<Option<LockState>, LockError> {
        let key = LockKey::new(&self.inner.config.prefix, key.as_ref())?;
        let removed = {
            let _ended = ForceEnded(&self.inner);
            self.inner.backend.force_unlock(&key).await?
        };
        if let Some(state) = &removed {
            tracing::warn!(
                target: "lock_core::audit",
                key = %key.display(),
                holder = state.holder.as_deref().unwrap_or("(unrecorded)"),
                held_for_ms = state.held_for.map(|d| d.as_millis()),
                fence = state.fence,
                by = %self.holder(),
                "force_unlock removed a held lock"
            );
        }
        Ok(removed)
    }

    /// Removes lock `seen.key` as [`force_unlock`](Self::force_unlock) does, in one atomic
    /// step, but only if it is still the holding `seen` shows (a state from
    /// [`inspect`](Self::inspect) or [`list`](Self::list)): the same [`LockState::since`] and
    /// the same last fence. A lock that changed hands since (another holder, or a new acquire
    /// by the same one) is left alone and answered as [`Unlocked::ChangedHands`]: an operator
    /// who confirmed one holding never removes another. Each removal is logged as
    /// `force_unlock`'s.
    ///
    /// A holding whose `since` is not recorded (a lock taken by an older version of this
    /// crate) is told from another only by its fence. A `seen` that is not held removes
    /// nothing.
    ///
    /// # Errors
    /// As [`inspect`](Self::inspect); [`LockError::InvalidConfig`] on a backend that cannot
    /// compare (use `inspect` and [`force_unlock`](Self::force_unlock) there, knowing the
    /// lock may change hands between the two).
    ///
    /// ```
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// use lock_core::Unlocked;
    /// let locker = lock_core::Locker::memory();
    /// let stuck = locker.lock("report").await?;
    /// let seen = locker.inspect("report").await?;
    /// // Released and taken again by the same holder: not the holding seen.
    /// stuck.release().await?;
    /// let again = locker.lock("report").await?;
    /// assert!(matches!(locker.force_unlock_seen(&seen).await?, Unlocked::ChangedHands(_)));
    /// assert!(again.is_held());
    /// let seen = locker.inspect("report").await?;
    /// assert!(matches!(locker.force_unlock_seen(&seen).await?, Unlocked::Removed(_)));
    /// assert!(matches!(locker.force_unlock_seen(&seen).await?, Unlocked::NotHeld));
    /// # drop(again); Ok(()) }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
    /// ```
    pub async fn force_unlock_seen(&self, seen: &LockState) -> Result<Unlocked, LockError> {
        let key = LockKey::new(&self.inner.config.prefix, &seen.key)?;
        if !seen.held {
            // A free lock seen is no holding to remove, whatever holds it now.
            let now = self.inner.backend.inspect(&key).await?;
            return Ok(if now.held {
                Unlocked::ChangedHands(now)
            } else {
                Unlocked::NotHeld
            });
        }
        let answer = {
            let _ended = ForceEnded(&self.inner);
            self.inner.backend.force_unlock_seen(&key, seen).await?
        };
        if let Unlocked::Removed(state) = &answer {
            tracing::warn!(
                target: "lock_core::audit",
                key = %key.display(),
                holder = state.holder.as_deref().unwrap_or("(unrecorded)"),
                held_for_ms = state.held_for.map(|d| d.as_millis()),
                fence = state.fence,
                by = %self.holder(),
                "force_unlock removed a held lock"
            );
        }
        Ok(answer)
    }

    /// The held locks whose keys match `pattern` ([`KeyPattern`]: `order:*`) under this
    /// locker's prefix, as a stream, page by page: the backend is read one page at a time
    /// as the stream is polled (Redis: `SCAN` on every primary, never `KEYS`; Redlock: on
    /// N − majority + 1 of its servers, each lock once), so memory stays
    /// bounded whatever the number of keys. A lock taken or released while the listing runs
    /// may or may not be in it; a failover or a resharding while it runs may leave locks out
    /// (list again). An invalid pattern is the stream's only item, an error; so is a
    /// listing through a `RedisBackend` connected to one node of a Redis Cluster
    /// ([`LockError::InvalidConfig`]: that node's `SCAN` would miss the other shards' locks).
    ///
    /// ```
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let locker = lock_core::Locker::memory();
    /// let _a = locker.lock("order:1").await?;
    /// let _b = locker.lock("stock:1").await?;
    /// let mut held = locker.list("order:*");
    /// let mut keys = Vec::new();
    /// while let Some(state) = held.next().await {
    ///     keys.push(state?.key);
    /// }
    /// assert_eq!(keys, ["order:1"]);
    /// # Ok(()) }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
    /// ```
    pub fn list(&self, pattern: impl AsRef<str>) -> HeldLocks {
        let state = match KeyPattern::new(pattern.as_ref()) {
            Ok(pattern) => Listing::Page {
                backend: self.inner.backend.clone(),
                prefix: Arc::from(self.inner.config.prefix.as_str()),
                pattern: Arc::new(pattern),
                cursor: None,
            },
            Err(e) => Listing::Failed(Some(e)),
        };
        HeldLocks {
            ready: VecDeque::new(),
            state,
        }
    }
}

/// The stream [`Locker::list`] returns: the held locks under a pattern, read from the backend a
/// page at a time. Use [`next`](Self::next), or it as a `futures_core::Stream`.
///
/// ```
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// let locker = lock_core::Locker::memory();
/// let mut held = locker.list("*");
/// assert!(held.next().await.is_none());
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
/// ```
#[must_use = "a listing reads nothing until it is polled"]
pub struct HeldLocks {
    ready: VecDeque<LockState>,
    state: Listing,
}

enum Listing {
    /// The next page is to be read from `cursor` (`None`: the first).
    Page {
        backend: Arc<dyn Backend>,
        prefix: Arc<str>,
        pattern: Arc<KeyPattern>,
        cursor: Option<String>,
    },
    /// A page is being read; the rest follows from its answer.
    Reading {
        backend: Arc<dyn Backend>,
        prefix: Arc<str>,
        pattern: Arc<KeyPattern>,
        read: BoxFuture<'static, Result<crate::backend::ListPage, LockError>>,
    },
    /// An error to report, then the end.
    Failed(Option<LockError>),
    Done,
}

impl std::fmt::Debug for HeldLocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldLocks")
            .field("ready", &self.ready.len())
            .finish_non_exhaustive()
    }
}

impl HeldLocks {
    /// The next held lock, `None` at the end. A failed page read is reported once, and ends
    /// the stream.
    ///
    /// ```
    /// # async fn demo() {
    /// let mut held = lock_core::Locker::memory().list("");
    /// assert!(held.next().await.expect("the error").is_err());
    /// assert!(held.next().await.is_none());
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub async fn next(&mut self) -> Option<Result<LockState, LockError>> {
        std::future::poll_fn(|cx| self.poll_item(cx)).await
    }

    /// How many states were read from the backend and not yet yielded: at most one page (the
    /// memory a listing holds, whatever the number of keys).
    ///
    /// ```
    /// assert_eq!(lock_core::Locker::memory().list("*").buffered(), 0);
    /// ```
    pub fn buffered(&self) -> usize {
        self.ready.len()
    }

    fn poll_item(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<LockState, LockError>>> {
        loop {
            if let Some(state) = self.ready.pop_front() {
                return Poll::Ready(Some(Ok(state)));
            }
            match std::mem::replace(&mut self.state, Listing::Done) {
                Listing::Done => return Poll::Ready(None),
                Listing::Failed(e) => return Poll::Ready(e.map(Err)),
                Listing::Page {
                    backend,
                    prefix,
                    pattern,
                    cursor,
                } => {
                    let read = {
                        let (backend, prefix, pattern) =
                            (backend.clone(), prefix.clone(), pattern.clone());
                        Box::pin(async move {
                            backend
                                .list_page(&prefix, &pattern, cursor.as_deref())
                                .await
                        })
                    };
                    self.state = Listing::Reading {
                        backend,
                        prefix,
                        pattern,
                        read,
                    };
                }
                Listing::Reading {
                    backend,
                    prefix,
                    pattern,
                    mut read,
                } => match read.as_mut().poll(cx) {
                    Poll::Pending => {
                        self.state = Listing::Reading {
                            backend,
                            prefix,
                            pattern,
                            read,
                        };
                        return Poll::Pending;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Some(Err(e))),
                    Poll::Ready(Ok(page)) => {
                        self.ready.extend(page.locks);
                        self.state = match page.next {
                            Some(cursor) => Listing::Page {
                                backend,
                                prefix,
                                pattern,
                                cursor: Some(cursor),
                            },
                            None => Listing::Done,
                        };
                    }
                },
            }
        }
    }
}

/// Ends a `force_unlock` of the locker when dropped, whatever its outcome (answered, failed,
/// or dropped before the answer: the lock may be removed all the same): the locker's local
/// hand-off asks the backend again before it passes on a lock vouched for before (see
/// `LockerInner::forced`).
struct ForceEnded<'a>(&'a crate::locker::LockerInner);

impl Drop for ForceEnded<'_> {
    fn drop(&mut self) {
        self.0.force_ended();
    }
}

impl futures_core::Stream for HeldLocks {
    type Item = Result<LockState, LockError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_item(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_as_redis_scan_does() {
        let cases = [
            ("*", "", true),
            ("*", "anything", true),
            ("order:*", "order:", true),
            ("order:*", "order:42", true),
            ("order:*", "orders:42", false),
            ("*:42", "order:42", true),
            ("*:42", "order:421", false),
            ("a?c", "abc", true),
            ("a?c", "ac", false),
            ("a\\*", "a*", true),
            ("a\\*", "ab", false),
            ("a\\?", "a?", true),
            ("*a*a*a*b", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaac", false),
            ("*a*a*a*b", "xaxaxab", true),
            ("ünï*", "ünïcode", true),
            ("{x}", "{x}", true),
        ];
        for (glob, key, expected) in cases {
            let pattern = KeyPattern::new(glob).unwrap();
            assert_eq!(pattern.matches(key), expected, "{glob:?} on {key:?}");
        }
    }

    #[test]
    fn bad_patterns_and_holders_are_refused() {
        assert!(KeyPattern::new("").is_err());
        assert!(KeyPattern::new(&"a".repeat(MAX_KEY_LEN + 1)).is_err());
        assert!(KeyPattern::new("a\nb").is_err());
        assert!(validate_holder("").is_err());
        assert!(validate_holder(&"h".repeat(MAX_HOLDER_LEN + 1)).is_err());
        assert!(validate_holder("web-1\r\nforged log line").is_err());
        assert!(validate_holder("web-1\u{202E}gnp.exe").is_err());
        assert!(validate_holder("web-1\u{2028}next").is_err());
        assert_eq!(shown_holder("a\u{202E}b\nc"), "a?b?c");
        assert_eq!(shown_holder(&"é".repeat(200)).len(), MAX_HOLDER_LEN);
        assert!(validate_holder("checkout-7f9c/pid 4211").is_ok());
        let default = default_holder(3);
        assert!(validate_holder(&default).is_ok(), "{default}");
        assert!(default.ends_with(&format!("/pid {}/locker 3", std::process::id())));
    }
}
