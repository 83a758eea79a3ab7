//! The idempotency result store: a record per key (the request's fingerprint and its result,
//! with a TTL) beside the key's lock, written only while that lock is held.
//!
//! Mutual exclusion says "one at a time"; idempotency says "at most once per key, and every
//! retry gets the first answer". The first request takes the key's lock, runs, and stores its
//! result with [`LockGuard::store_result`]: one atomic step that checks the lock is still
//! ours, so a holder that lost its lease never writes a stale result. Later requests read
//! [`Locker::idempotency_state`]: the stored result, or "in flight" while the first still
//! holds the lock, or nothing.
//!
//! At most once needs one more step: before the work runs, the holder writes a "started"
//! mark with [`LockGuard::mark_started`] (owner-checked like the result, same TTL). The result
//! replaces the mark. A later request that finds the mark without a result
//! ([`IdempotencyState::Started`]) never runs the work again: the first one may have done it
//! and died, or lost its lock, or failed to store its result, and nobody can tell which. A
//! crash between the mark and the result leaves the key "outcome unknown"
//! ([`LockError::OutcomeUnknown`]) for the record's TTL: that is the price of never running
//! twice. Work that ends in an error it wants retried removes its mark with
//! [`LockGuard::clear_started`] (still under the lock) before releasing.
//!
//! The record lives under the locker's prefix in the lock's hash slot (on Redis a hash
//! `P{T}S:result` with fields `fingerprint` and `result`, or `fingerprint` and `started` for
//! a mark, beside the lock `P{T}S`), and expires after its TTL. Like the locks, records live in the server's memory: a Redis restart
//! without persistence, a `FLUSHALL` or an eviction loses them, and the next request with the
//! same key runs again.

use std::time::Duration;

use crate::LockError;
use crate::guard::LockGuard;
use crate::key::LockKey;
use crate::locker::Locker;

/// How long a stored result is kept when the caller has no other policy: 24 hours (what
/// Stripe keeps idempotency keys for).
///
/// ```
/// assert_eq!(lock_core::DEFAULT_RESULT_TTL.as_secs(), 24 * 3600);
/// ```
pub const DEFAULT_RESULT_TTL: Duration = Duration::from_secs(24 * 3600);

/// The longest TTL a result may be stored for: 365 days. Longer ones are
/// [`LockError::InvalidConfig`].
///
/// ```
/// assert!(lock_core::MAX_RESULT_TTL > lock_core::DEFAULT_RESULT_TTL);
/// ```
pub const MAX_RESULT_TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// The largest result that can be stored, in bytes: 1 MiB. A larger one is
/// [`LockError::RecordTooLarge`] and nothing is written.
///
/// ```
/// assert_eq!(lock_core::MAX_RESULT_LEN, 1024 * 1024);
/// ```
pub const MAX_RESULT_LEN: usize = 1024 * 1024;

/// The longest fingerprint that can be stored with a result, in bytes (a hex SHA-256 takes
/// 64). A longer one is [`LockError::RecordTooLarge`].
///
/// ```
/// assert!(lock_core::MAX_FINGERPRINT_LEN >= 64);
/// ```
pub const MAX_FINGERPRINT_LEN: usize = 1024;

/// What the backend knows of an idempotency key, from [`Locker::idempotency_state`].
///
/// ```
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use lock_core::{IdempotencyState, Locker};
///
/// let locker = Locker::memory();
/// match locker.idempotency_state("charge:7").await? {
///     IdempotencyState::Absent => { /* first request: lock the key, run, store_result */ }
///     IdempotencyState::InFlight => { /* the first request still runs: 409, or wait */ }
///     IdempotencyState::Completed(record) => { /* replay record.result */ drop(record) }
///     IdempotencyState::Started { .. } => { /* it started and recorded nothing: unknown */ }
///     _ => {}
/// }
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum IdempotencyState {
    /// No result is stored and nobody holds the key's lock.
    Absent,
    /// No result is stored yet, and the key's lock is held: the first request is running (or
    /// has failed without storing, and its lock has not been released or expired yet).
    InFlight,
    /// A result is stored; its lock may or may not be held still.
    Completed(IdempotencyRecord),
    /// A "started" mark is stored ([`LockGuard::mark_started`]) without a result, and nobody
    /// holds the key's lock: a request began its work and ended without recording an outcome
    /// (it died, lost its lock, or could not store its result). The outcome is unknown; the
    /// work must not run again under this key until the mark expires (see
    /// [`LockError::OutcomeUnknown`]). While the key's lock is held the state is
    /// [`InFlight`](Self::InFlight), mark or not.
    #[non_exhaustive]
    Started {
        /// The fingerprint written with the mark: another fingerprint is another request
        /// under the same key.
        fingerprint: String,
        /// How long the mark is still kept; `Duration::MAX` without expiry.
        expires_in: Duration,
    },
}

/// What a backend answered to a mark write
/// ([`Backend::mark_started`](crate::backend::Backend::mark_started)).
///
/// ```
/// use lock_core::backend::Marked;
/// assert_ne!(Marked::Written, Marked::NotOurs);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Marked {
    /// The mark is written.
    Written,
    /// The lock was not ours: nothing written.
    NotOurs,
    /// A mark was there already (nothing written): its fingerprint and remaining TTL.
    Started {
        /// The fingerprint written with the mark.
        fingerprint: String,
        /// How long the mark is still kept; `Duration::MAX` without expiry.
        expires_in: Duration,
    },
    /// A result was there already (nothing written).
    Completed,
}

/// A stored result, as [`LockGuard::store_result`] wrote it.
///
/// ```
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use std::time::Duration;
/// use lock_core::{IdempotencyState, Locker};
///
/// let locker = Locker::memory();
/// let guard = locker.lock("charge:7").await?;
/// guard.store_result("sha256:ab12", b"receipt 9", Duration::from_secs(60)).await?;
/// guard.release().await?;
/// let IdempotencyState::Completed(record) = locker.idempotency_state("charge:7").await? else {
///     unreachable!("stored just above")
/// };
/// assert_eq!(record.fingerprint, "sha256:ab12");
/// assert_eq!(record.result, b"receipt 9");
/// assert!(record.expires_in <= Duration::from_secs(60));
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
/// ```
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct IdempotencyRecord {
    /// The fingerprint of the request that produced the result, as given to `store_result`:
    /// compare it with the retry's to tell a replay from a different request under the same key.
    pub fingerprint: String,
    /// The stored bytes, exactly as given.
    pub result: Vec<u8>,
    /// How long the record is still kept (a `Retry-After`/`Expires` hint); `Duration::MAX`
    /// when the backend keeps it without expiry (an operator removed the TTL by hand).
    pub expires_in: Duration,
}

impl std::fmt::Debug for IdempotencyRecord {
    /// Shows the fingerprint, the result's length and the expiry, not the result itself (it
    /// may be large, and may hold data that does not belong in logs).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyRecord")
            .field("fingerprint", &crate::key::display_key(&self.fingerprint))
            .field("result_len", &self.result.len())
            .field("expires_in", &self.expires_in)
            .finish()
    }
}

impl Locker {
    /// What the backend knows of `key` under this locker's prefix: `Completed` with the record
    /// when a result is stored, else `InFlight` when the key's lock is held (the first request
    /// is running), else `Absent`. One atomic read: one script call, one round trip on Redis.
    ///
    /// The answer may be stale by the time it arrives: a request that finds `Absent` takes the
    /// key's lock and asks again under it before it runs (another request may have completed
    /// in between).
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] for a bad key, [`LockError::InvalidConfig`] for a locker built
    /// with an out-of-range option (or a Redis user lacking a permission),
    /// [`LockError::Backend`] when the backend fails.
    ///
    /// ```
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// use std::time::Duration;
    /// use lock_core::{IdempotencyState, Locker};
    ///
    /// let locker = Locker::memory();
    /// assert_eq!(locker.idempotency_state("pay:1").await?, IdempotencyState::Absent);
    /// let guard = locker.lock("pay:1").await?;
    /// assert_eq!(locker.idempotency_state("pay:1").await?, IdempotencyState::InFlight);
    /// guard.store_result("fp", b"ok", Duration::from_secs(60)).await?;
    /// assert!(matches!(locker.idempotency_state("pay:1").await?, IdempotencyState::Completed(_)));
    /// # Ok(()) }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
    /// ```
    pub async fn idempotency_state(
        &self,
        key: impl AsRef<str>,
    ) -> Result<IdempotencyState, LockError> {
        if let Some(e) = &self.inner.config.error {
            return Err(e.clone());
        }
        let key = LockKey::new(&self.inner.config.prefix, key.as_ref())?;
        self.inner.call().idempotency_state(&key).await
    }
}

impl LockGuard {
    /// Stores `result`, with the `fingerprint` of the request that produced it, as the
    /// idempotency record of this lock's key, kept for `ttl` (see [`DEFAULT_RESULT_TTL`]). One
    /// atomic step that checks the lock is still ours: a holder that lost its lease never
    /// writes (nor overwrites) a record. A record already stored for the key is replaced. A
    /// [reentrant](Self::is_reentrant) guard writes for the outer lock it shares.
    ///
    /// Storing does not release the lock: release it (or drop the guard) afterwards.
    ///
    /// # Errors
    /// [`LockError::LeaseLost`] when the lock is no longer ours (expired, deleted, taken by
    /// another owner): nothing was written. [`LockError::RecordTooLarge`] for a result above
    /// [`MAX_RESULT_LEN`] or a fingerprint above [`MAX_FINGERPRINT_LEN`],
    /// [`LockError::InvalidConfig`] for a zero TTL or one above [`MAX_RESULT_TTL`]: nothing was
    /// written and the lock is still held. [`LockError::Backend`] when the backend did not
    /// answer: the record may or may not have been written.
    ///
    /// ```
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// use lock_core::{DEFAULT_RESULT_TTL, LockError, Locker, MAX_RESULT_LEN};
    ///
    /// let locker = Locker::memory();
    /// let guard = locker.lock("charge:order-42").await?;
    /// let too_big = vec![0u8; MAX_RESULT_LEN + 1];
    /// let refused = guard.store_result("fp", &too_big, DEFAULT_RESULT_TTL).await;
    /// assert!(matches!(refused, Err(LockError::RecordTooLarge { .. })));
    /// guard.store_result("fp", br#"{"receipt":9}"#, DEFAULT_RESULT_TTL).await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
    /// ```
    pub async fn store_result(
        &self,
        fingerprint: &str,
        result: &[u8],
        ttl: Duration,
    ) -> Result<(), LockError> {
        let held = self.held();
        validate_record(held.key.user(), fingerprint, result, ttl)?;
        if !self.is_held() {
            return Err(held.lease_lost());
        }
        // While the write is in flight the lock is not passed to another task of this locker
        // (local hand-off, same token): a store cancelled half-way could otherwise land under
        // the next holder, after it found no record.
        let _serial = held.renewing().lock().await;
        let ours = held
            .locker
            .call()
            .store_result(&held.key, &held.token, fingerprint, result, ttl)
            .await?;
        if ours {
            // The result replaced the mark.
            self.set_marked(false);
            Ok(())
        } else {
            held.mark_lost("storing an idempotency result found the lock no longer ours");
            Err(held.lease_lost())
        }
    }
}

impl LockGuard {
    /// Writes the durable "started" mark of this lock's key, with the request's `fingerprint`,
    /// kept for `ttl` (the record's TTL): call it under the lock, after reading
    /// [`Locker::idempotency_state`] and before the work runs. One atomic step that checks the
    /// lock is still ours and that the key has neither a mark nor a result; the result stored
    /// later with [`store_result`](Self::store_result) replaces the mark. Called again under
    /// the same acquisition (this guard, or a reentrant one inside it: a nested call) it
    /// answers as written; a mark left behind by a guard that ended without a result or a
    /// take-back (a reentrant one before this one, or an acquisition handed over locally) is
    /// an earlier request's ([`LockError::OutcomeUnknown`]).
    ///
    /// If this returns an error, do not run the work. A request that later finds the mark
    /// without a result never runs it again ([`IdempotencyState::Started`]).
    ///
    /// # Errors
    /// [`LockError::OutcomeUnknown`] when a mark is there already (an earlier request started
    /// and recorded no outcome; compare its `fingerprint` with yours: another one is another
    /// request under the same key). [`LockError::LeaseLost`] when the lock is no longer ours.
    /// [`LockError::InvalidConfig`] when a result is stored already (read the state under the
    /// lock first and replay it), or for a zero TTL or one above [`MAX_RESULT_TTL`];
    /// [`LockError::RecordTooLarge`] for a fingerprint above [`MAX_FINGERPRINT_LEN`].
    /// [`LockError::Backend`] when the backend did not answer: the mark may or may not have
    /// been written. An attempt to remove it again is made at once (owner-checked); if that
    /// fails too, the key reads as started (outcome unknown) until the TTL ends.
    ///
    /// ```
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// use lock_core::{DEFAULT_RESULT_TTL, IdempotencyState, LockError, Locker};
    ///
    /// let locker = Locker::memory();
    /// let guard = locker.lock("charge:7").await?;
    /// guard.mark_started("sha256:ab12", DEFAULT_RESULT_TTL).await?;
    /// // ... the work runs here; then its result cannot be stored (or the process dies) ...
    /// guard.release().await?;
    /// let state = locker.idempotency_state("charge:7").await?;
    /// assert!(matches!(state, IdempotencyState::Started { .. }));
    /// // A retry takes the lock, and the mark refuses to let it run again.
    /// let retry = locker.lock("charge:7").await?;
    /// let again = retry.mark_started("sha256:ab12", DEFAULT_RESULT_TTL).await;
    /// assert!(matches!(again, Err(LockError::OutcomeUnknown { .. })));
    /// # Ok(()) }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
    /// ```
    pub async fn mark_started(&self, fingerprint: &str, ttl: Duration) -> Result<(), LockError> {
        let held = self.held();
        validate_record(held.key.user(), fingerprint, b"", ttl)?;
        if !self.is_held() {
            return Err(held.lease_lost());
        }
        // As in `store_result`: no local hand-off while the write is in flight.
        let _serial = held.renewing().lock().await;
        let mark = held.mark_id();
        // From here until a result or a take-back, the mark may be there.
        self.set_marked(true);
        let marked = match held
            .locker
            .call()
            .mark_started(&held.key, &held.token, &mark, fingerprint, ttl)
            .await
        {
            Ok(marked) => marked,
            Err(error) => {
                // Maybe written, maybe not: the work will not run, so take the mark back if
                // it is there (only ours, only a mark). If that fails too, the key reads as
                // "started" until its TTL ends: never a second run.
                let cleared = held
                    .locker
                    .call()
                    .clear_started(&held.key, &held.token, &mark);
                match cleared.await {
                    Ok(true) => self.set_marked(false),
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(key = %held.key.display(), error = %e, "a mark write failed and its removal too: the key reads as started (outcome unknown) until its TTL ends")
                    }
                }
                return Err(error);
            }
        };
        if marked != Marked::Written {
            // Nothing written.
            self.set_marked(false);
        }
        match marked {
            Marked::Written => Ok(()),
            Marked::NotOurs => {
                held.mark_lost("writing an idempotency mark found the lock no longer ours");
                Err(held.lease_lost())
            }
            Marked::Started {
                fingerprint,
                expires_in,
            } => Err(LockError::OutcomeUnknown {
                key: held.key.user().to_owned(),
                fingerprint,
                expires_in,
            }),
            Marked::Completed => Err(LockError::config(format!(
                "mark_started: idempotency key {:?} has a stored result already: read idempotency_state under the lock and replay it",
                held.key.user()
            ))),
        }
    }

    /// Removes the "started" mark this guard wrote (see [`mark_started`](Self::mark_started))
    /// while the lock is ours, so that a later request may run the work again: for work that
    /// ended in an error that is not stored (the macro's `Err`, the layer's 5xx). Never removes
    /// a stored result, nor a mark written under another acquisition or left behind by an
    /// ended guard (an earlier request's, found by `mark_started` as
    /// [`LockError::OutcomeUnknown`]): removing no mark is not an error.
    ///
    /// Call it before releasing the lock. If it fails (the lock was lost, the backend did not
    /// answer), the mark stays and the key reads as started (outcome unknown) until its TTL
    /// ends.
    ///
    /// # Errors
    /// [`LockError::LeaseLost`] when the lock is no longer ours (nothing removed),
    /// [`LockError::Backend`] when the backend did not answer.
    ///
    /// ```
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// use lock_core::{DEFAULT_RESULT_TTL, IdempotencyState, Locker};
    ///
    /// let locker = Locker::memory();
    /// let guard = locker.lock("charge:8").await?;
    /// guard.mark_started("fp", DEFAULT_RESULT_TTL).await?;
    /// // ... the work fails before doing anything, and may be retried ...
    /// guard.clear_started().await?;
    /// guard.release().await?;
    /// assert_eq!(locker.idempotency_state("charge:8").await?, IdempotencyState::Absent);
    /// # Ok(()) }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
    /// ```
    pub async fn clear_started(&self) -> Result<(), LockError> {
        let held = self.held();
        if !self.is_held() {
            return Err(held.lease_lost());
        }
        let _serial = held.renewing().lock().await;
        if held
            .locker
            .call()
            .clear_started(&held.key, &held.token, &held.mark_id())
            .await?
        {
            self.set_marked(false);
            Ok(())
        } else {
            held.mark_lost("removing an idempotency mark found the lock no longer ours");
            Err(held.lease_lost())
        }
    }
}

/// Checks a record before anything is sent.
fn validate_record(
    key: &str,
    fingerprint: &str,
    result: &[u8],
    ttl: Duration,
) -> Result<(), LockError> {
    if ttl.is_zero() || ttl > MAX_RESULT_TTL {
        return Err(LockError::config(format!(
            "result TTL {ttl:?} is out of range: use more than zero and at most {MAX_RESULT_TTL:?} (default {DEFAULT_RESULT_TTL:?})"
        )));
    }
    for (what, len, max) in [
        ("fingerprint", fingerprint.len(), MAX_FINGERPRINT_LEN),
        ("result", result.len(), MAX_RESULT_LEN),
    ] {
        if len > max {
            return Err(LockError::RecordTooLarge {
                key: key.to_owned(),
                what,
                len,
                max,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryBackend;

    #[test]
    fn bad_records_are_typed_errors() {
        let ok = Duration::from_secs(1);
        assert!(validate_record("k", "fp", b"r", ok).is_ok());
        assert!(validate_record("k", "", b"", MAX_RESULT_TTL).is_ok());
        for ttl in [
            Duration::ZERO,
            MAX_RESULT_TTL + Duration::from_nanos(1),
            Duration::MAX,
        ] {
            assert!(matches!(
                validate_record("k", "fp", b"r", ttl),
                Err(LockError::InvalidConfig { .. })
            ));
        }
        let big = vec![0; MAX_RESULT_LEN + 1];
        assert!(matches!(
            validate_record("k", "fp", &big, ok),
            Err(LockError::RecordTooLarge { what: "result", .. })
        ));
        assert!(validate_record("k", "fp", &big[1..], ok).is_ok());
        let fp = "f".repeat(MAX_FINGERPRINT_LEN + 1);
        assert!(matches!(
            validate_record("k", &fp, b"", ok),
            Err(LockError::RecordTooLarge {
                what: "fingerprint",
                ..
            })
        ));
    }

    #[test]
    fn debug_shows_no_result_bytes() {
        let record = IdempotencyRecord {
            fingerprint: "fp\n".into(),
            result: b"secret-card-number".to_vec(),
            expires_in: Duration::from_secs(1),
        };
        let shown = format!("{record:?}");
        assert!(!shown.contains("secret"), "{shown}");
        assert!(
            shown.contains("fp\\\\n") || shown.contains("fp\\n"),
            "{shown}"
        );
    }

    /// Expired records are swept as the table grows: memory does not grow with the number of
    /// distinct keys stored over time.
    #[tokio::test(start_paused = true)]
    async fn expired_records_are_swept() {
        let backend = MemoryBackend::new();
        let locker = Locker::builder(backend.clone()).watchdog(false).build();
        for i in 0..10_000 {
            let guard = locker
                .lock(format!("k{i}"))
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            guard
                .store_result("fp", b"r", Duration::from_millis(10))
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            guard.release().await.unwrap_or_else(|e| panic!("{e}"));
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        let live = backend.record_count();
        assert!(live < 3_000, "{live} records kept for 10 live ones");
        tokio::time::advance(Duration::from_secs(1)).await;
        backend.sweep();
        assert_eq!(backend.record_count(), 0);
    }
}
