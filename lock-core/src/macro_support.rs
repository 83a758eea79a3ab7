//! What the code `#[distributed_lock]` generates calls: the whole Ok/Err handling of a locked
//! call in one function, so an expansion stays a few lines (as tracing-attributes hands its
//! work to `Instrument`).

use std::future::Future;

use crate::{LockError, LockRequest};

/// Runs `body` under the lock `request` asks for; a [`LockError`] (no locker, busy, timeout,
/// lease lost...) becomes the function's error through `convert` (the generated code passes
/// `From::from`, written at the error type of the signature, so a missing `From<LockError>`
/// is reported there). The body never runs without the lock: an `Err` request returns at once.
///
/// ```
/// # async fn demo() {
/// use lock_core::{LockError, Locker};
/// let locker = Locker::memory();
/// let out: Result<u32, LockError> =
///     lock_core::__private::run_locked(Ok(locker.lock("k")), async { Ok(7) }, From::from).await;
/// assert_eq!(out.unwrap(), 7);
/// # }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
/// ```
pub fn run_locked<T, E, F>(
    request: Result<LockRequest, LockError>,
    body: F,
    convert: fn(LockError) -> E,
) -> impl Future<Output = Result<T, E>>
where
    F: Future<Output = Result<T, E>>,
{
    // Not an async fn: the body moves into `run` here, once (an async fn would keep it twice).
    let run = request.map(|request| request.run(body));
    async move {
        let outcome = match run {
            Ok(run) => run.await,
            Err(e) => Err(e),
        };
        match outcome {
            Ok(output) => output,
            Err(e) => Err(convert(e)),
        }
    }
}

#[cfg(feature = "idempotent")]
pub use idempotent::{Stored, function_path, run_idempotent, stored};

/// `#[distributed_lock(idempotent)]`: the body runs at most once per key within the TTL, and
/// its first `Ok` value, stored as JSON in the key's idempotency record, answers every later
/// call.
#[cfg(feature = "idempotent")]
mod idempotent {
    use std::future::Future;
    use std::time::Duration;

    use sha2::{Digest, Sha256};

    use crate::{IdempotencyRecord, IdempotencyState, LockError, LockRequest, MAX_FINGERPRINT_LEN};

    /// The result stored when the body ran but its value could not be stored (over
    /// [`MAX_RESULT_LEN`](crate::MAX_RESULT_LEN), or not serializable as JSON): not JSON, so
    /// it never collides with a stored value.
    const NOT_STORED: &[u8] = b"\0ran, result not stored";

    /// How an idempotent function's `Ok` value is stored: as JSON, under a fingerprint naming
    /// the function and its type. Made by [`stored`], where the `Serialize + DeserializeOwned`
    /// bound is checked (the generated code spans that call at `T`, so a type that cannot be
    /// stored is reported there), and named by [`called_by`](Stored::called_by);
    /// [`run_idempotent`] itself has no serde bound.
    ///
    /// ```
    /// let codec: lock_core::__private::Stored<u32> =
    ///     lock_core::__private::stored().called_by("shop::charge");
    /// # let _ = codec;
    /// ```
    pub struct Stored<T> {
        /// The bytes to store and the value to return: the body's value as a replay reads it
        /// back, so that every call gets the same value.
        encode: fn(T) -> serde_json::Result<(Vec<u8>, T)>,
        decode: fn(&[u8]) -> serde_json::Result<T>,
        type_name: fn() -> &'static str,
        /// The path of the function that stores (see [`function_path`]).
        function: &'static str,
    }

    impl<T> std::fmt::Debug for Stored<T> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Stored")
                .field("function", &self.function)
                .field("type", &(self.type_name)())
                .finish()
        }
    }

    /// The codec of `T`; see [`Stored`].
    ///
    /// ```
    /// let codec = lock_core::__private::stored::<Vec<String>>();
    /// # let _ = codec;
    /// ```
    pub fn stored<T: serde::Serialize + serde::de::DeserializeOwned>() -> Stored<T> {
        Stored {
            encode: |value| {
                // Refused unless JSON gives the value back as it is: stored, it would be
                // replayed as another value, or not be read back at all. `faithful` finds
                // what JSON loses silently on the way out (non-finite floats, `Some` around a
                // null); reading the bytes back as `T` and writing that again finds what a
                // type's serde attributes lose on the way back (an untagged enum read as
                // another variant, a field skipped when empty and required when read).
                fn refuse(why: impl std::fmt::Display) -> serde_json::Error {
                    <serde_json::Error as serde::ser::Error>::custom(why)
                }
                crate::faithful::faithful(&value).map_err(refuse)?;
                let bytes = serde_json::to_vec(&value)?;
                let back: T = serde_json::from_slice(&bytes)
                    .map_err(|e| refuse(format!("it does not read back as the same type: {e}")))?;
                // As a value, not as bytes: a map or a set read back iterates in another
                // order. The same length too: entries written twice under one key are one
                // entry read back, and the value of a map would not tell it.
                let again = serde_json::to_vec(&back)?;
                if again != bytes
                    && (again.len() != bytes.len() || !crate::faithful::same_value(&value, &back)?)
                {
                    return Err(refuse("it reads back as another value"));
                }
                // JSON cannot tell a set from a list whose order is its meaning (one that
                // `T`'s `Deserialize` sorts), nor two untagged variants written alike: the
                // first call gets what every replay gets, the value read back.
                Ok((bytes, back))
            },
            decode: |bytes| serde_json::from_slice(bytes),
            type_name: std::any::type_name::<T>,
            function: "",
        }
    }

    impl<T> Stored<T> {
        /// The codec of the function at `function`, its path as [`function_path`] gives it:
        /// its records are replayed to it only, and another function under the same key gets
        /// [`LockError::IdempotencyKeyReused`].
        ///
        /// ```
        /// let codec = lock_core::__private::stored::<u8>().called_by("shop::billing::charge");
        /// # let _ = codec;
        /// ```
        pub fn called_by(mut self, function: &'static str) -> Self {
            self.function = function;
            self
        }

        /// `json2:<function> -> <type of T>`, or `json2:sha256:<hex>` of what follows `json2:`
        /// when that is longer than a fingerprint may be. Paths and type names are what rustc
        /// prints: the same in every process built from the same code, different for another
        /// function or type under one key.
        fn fingerprint(&self) -> String {
            let named = format!("{} -> {}", self.function, (self.type_name)());
            hashed_if_long("json2:", &named)
        }

        /// The fingerprint of records written before the function was named (`json:<type>`):
        /// still replayed, to any function returning `T`, until they expire.
        fn unnamed_fingerprint(&self) -> String {
            hashed_if_long("json:", (self.type_name)())
        }

        /// The stored value; `IdempotencyKeyReused` when the record is another function's (or
        /// of another type), `InvalidConfig` when it holds the "ran, result not stored" marker
        /// or does not deserialize.
        fn replay(&self, key: &str, record: &IdempotencyRecord) -> Result<T, LockError> {
            let ours = self.fingerprint();
            if record.fingerprint != ours && record.fingerprint != self.unnamed_fingerprint() {
                return Err(LockError::IdempotencyKeyReused {
                    key: key.to_owned(),
                    stored: record.fingerprint.clone(),
                    caller: ours,
                    expires_in: record.expires_in,
                });
            }
            if record.result == NOT_STORED {
                return Err(LockError::InvalidConfig {
                    what: format!(
                        "the body of idempotent key {key:?} ran but its result was not stored (larger than MAX_RESULT_LEN, or not kept as it is by JSON): it does not run again until the record expires in {:?}",
                        record.expires_in,
                    ),
                });
            }
            (self.decode)(&record.result).map_err(|e| LockError::InvalidConfig {
                what: format!(
                    "the idempotency record of key {key:?} does not deserialize into `{}` ({e}): the type changed since the record was stored; it expires in {:?}",
                    (self.type_name)(),
                    record.expires_in,
                ),
            })
        }
    }

    /// The path of the function whose body made `here`, a closure: its type name without the
    /// closures it sits in, nor the function's own generic arguments. rustc names the
    /// instance, `Self` included: `shop::charge`; `shop::Payments::close` and
    /// `shop::Refunds::close`, associated functions of one name on two types;
    /// `<shop::Payments as shop::Close>::all` and `<shop::Refunds as shop::Close>::all`, a
    /// trait's provided method taken by two types; `shop::outer::step`, a function declared
    /// inside another. `module_path!()` and the function's name tell none of these apart. A
    /// generic function (`impl Trait` parameters included) is one function whatever its
    /// arguments: `shop::fetch`, not `shop::fetch<alloc::string::String>`.
    ///
    /// ```
    /// trait Close {
    ///     async fn all(_: impl std::fmt::Display) -> &'static str {
    ///         lock_core::__private::function_path(&|| ())
    ///     }
    /// }
    /// struct Payments;
    /// impl Close for Payments {}
    /// # let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// let path = rt.block_on(Payments::all(7));
    /// assert!(path.starts_with('<') && path.contains("Payments as ") && path.ends_with(">::all"));
    /// ```
    pub fn function_path<F>(_here: &F) -> &'static str {
        let mut path = std::any::type_name::<F>();
        while let Some(outer) = path.strip_suffix("::{{closure}}") {
            path = outer;
        }
        // The function's own generic arguments: from the `<` that opens the last `>`.
        if path.ends_with('>') {
            let mut depth = 0_usize;
            for (at, byte) in path.bytes().enumerate().rev() {
                match byte {
                    b'>' => depth += 1,
                    b'<' if depth == 1 => return &path[..at],
                    b'<' => depth = depth.saturating_sub(1),
                    _ => {}
                }
            }
        }
        path
    }

    /// `prefix` and `name`, or `prefix`, `sha256:` and the hex digest of `name` when that is
    /// longer than [`MAX_FINGERPRINT_LEN`].
    fn hashed_if_long(prefix: &str, name: &str) -> String {
        let fingerprint = format!("{prefix}{name}");
        if fingerprint.len() <= MAX_FINGERPRINT_LEN {
            return fingerprint;
        }
        let digest = Sha256::digest(name.as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        format!("{prefix}sha256:{hex}")
    }

    /// Runs `body` at most once per key within `ttl`: a stored result is returned without
    /// running it; otherwise `body` runs under the lock `request` asks for (waiting as it is
    /// configured) and its `Ok` value is stored before the lock is released. A call that
    /// waited for the first one finds the result stored when it gets the lock and returns it.
    /// An `Err` from `body` is returned and not stored: its "started" mark is removed, and a
    /// later call runs again.
    ///
    /// At most once: before `body` runs, a durable "started" mark is written under the lock
    /// ([`LockGuard::mark_started`](crate::LockGuard::mark_started)); if it cannot be written,
    /// `body` does not run (the error is returned). A call that finds the mark without a
    /// result (the first call's process died, lost its lock, or could not store its value)
    /// gets [`LockError::OutcomeUnknown`] and never runs `body` again until the mark expires
    /// with the TTL.
    ///
    /// Errors, through `convert` (`From::from` at the signature's error type):
    /// - as [`run_locked`](super::run_locked)'s (no locker, `Busy` for a `no_wait` call while
    ///   the first still runs, `Timeout`, `LeaseLost`...), and `Backend` from reading the record;
    /// - [`LockError::IdempotencyKeyReused`] when the stored record (or "started" mark) is
    ///   another function's (or of another type): the body does not run;
    /// - [`LockError::InvalidConfig`] when the stored record does not deserialize into `T`, or
    ///   when the `Ok` value cannot be serialized; never a panic;
    /// - [`LockError::OutcomeUnknown`] when an earlier call started and recorded no value
    ///   (see above); the errors of writing the mark (`LeaseLost`, `Backend`): the body did
    ///   not run;
    /// - the errors of [`LockGuard::store_result`](crate::LockGuard::store_result): `LeaseLost`
    ///   (the lock was lost before the value was stored), `RecordTooLarge`, `Backend`. The
    ///   body has run then, but its value is not reported as a success.
    ///
    /// A body that ran but whose `Ok` value cannot be stored (`RecordTooLarge`: over
    /// [`MAX_RESULT_LEN`](crate::MAX_RESULT_LEN); `InvalidConfig`: not serializable as JSON,
    /// or not given back by JSON as it is: a float that is not finite, `Some(x)` where `x`
    /// is written as `null`, such as `Some(())`, which would be replayed as `None`, or a value
    /// that does not read back as the same `T` and the same JSON value, such as an untagged
    /// enum read as another variant; maps and sets compare by content, in any order)
    /// returns that error, and a "ran, result not stored" marker is stored in its place:
    /// every later call within the TTL gets [`LockError::InvalidConfig`] ("result was not
    /// stored") and the body does not run again.
    ///
    /// A stored value is returned as JSON gives it back, to the first call too: every call
    /// gets the same value, and what `T`'s serde attributes drop or change on the way (a
    /// `#[serde(skip)]` field, an untagged enum read as another variant written alike, a list
    /// that its `Deserialize` sorts) is dropped or changed for the first call as well.
    ///
    /// Cancellation: `body` usually borrows the function's parameters (`&self`, references),
    /// so it is not `'static` and cannot be spawned; it runs inside the caller's future.
    /// Dropping that future while the body runs (a `select!`, a timeout, a dropped request)
    /// cancels the body where it stands: nothing is stored, the lock is released, and its
    /// mark stays: later calls get [`LockError::OutcomeUnknown`] until the TTL ends (the body
    /// may have done part of its work). Spawn the call (with owned arguments) where it may be
    /// cancelled and a stored value matters.
    ///
    /// ```
    /// # async fn demo() {
    /// use lock_core::{LockError, Locker, __private::{run_idempotent, stored}};
    /// let locker = Locker::memory();
    /// let ttl = lock_core::DEFAULT_RESULT_TTL;
    /// let codec = || stored().called_by("shop::demo");
    /// let first: Result<u32, LockError> =
    ///     run_idempotent(Ok(locker.lock("k")), codec(), ttl, async { Ok(7) }, From::from).await;
    /// let again: Result<u32, LockError> =
    ///     run_idempotent(Ok(locker.lock("k")), codec(), ttl, async { Ok(8) }, From::from).await;
    /// assert_eq!((first.unwrap(), again.unwrap()), (7, 7));
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub fn run_idempotent<T, E, F>(
        request: Result<LockRequest, LockError>,
        stored: Stored<T>,
        ttl: Duration,
        body: F,
        convert: fn(LockError) -> E,
    ) -> impl Future<Output = Result<T, E>>
    where
        F: Future<Output = Result<T, E>>,
    {
        // On the heap once, as in `LockRequest::run`: the future then holds a pointer, not the
        // body beside the futures it is moved into.
        let body = Box::pin(body);
        async move {
            let outcome = match request {
                Ok(request) => once(request, &stored, ttl, body).await,
                Err(e) => Err(e),
            };
            match outcome {
                Ok(output) => output,
                Err(e) => Err(convert(e)),
            }
        }
    }

    async fn once<T, E, F>(
        request: LockRequest,
        stored: &Stored<T>,
        ttl: Duration,
        body: F,
    ) -> Result<Result<T, E>, LockError>
    where
        F: Future<Output = Result<T, E>>,
    {
        let locker = request.locker().clone();
        let key = request.key().to_owned();
        let fingerprint = stored.fingerprint();
        // A replay costs this one read and takes no lock.
        match locker.idempotency_state(&key).await? {
            IdempotencyState::Completed(record) => return stored.replay(&key, &record).map(Ok),
            IdempotencyState::Started {
                fingerprint: theirs,
                expires_in,
            } => return Err(unknown(&key, fingerprint, theirs, expires_in)),
            _ => {}
        }
        let guard = request.await?;
        // Read again under the lock: a duplicate that waited for the first call finds its result.
        if let IdempotencyState::Completed(record) = locker.idempotency_state(&key).await? {
            let replay = stored.replay(&key, &record);
            release(guard, &key).await;
            return replay.map(Ok);
        }
        // The durable "started" mark, before the body: if it cannot be written the body does
        // not run; a mark already there (a call that started and recorded nothing) means the
        // outcome is unknown, and the body never runs again under this key within the TTL.
        if let Err(e) = guard.mark_started(&fingerprint, ttl).await {
            release(guard, &key).await;
            return Err(match e {
                LockError::OutcomeUnknown {
                    fingerprint: theirs,
                    expires_in,
                    ..
                } => unknown(&key, fingerprint, theirs, expires_in),
                e => e,
            });
        }
        // A reentrant run inside the guard's scope: the body is dropped at once if the lease is
        // lost (run's watch), and the guard stays ours to store the result with.
        let output = guard.scope(locker.lock(&key).run(body)).await?;
        let value = match output {
            Ok(value) => value,
            Err(e) => {
                // `Err` is not stored: take the mark back so a later call runs again (if that
                // fails, the key reads "outcome unknown" until its TTL ends).
                if let Err(error) = guard.clear_started().await {
                    tracing::warn!(key, %error, "removing the mark after an Err failed: later calls get OutcomeUnknown until it expires");
                }
                release(guard, &key).await;
                return Ok(Err(e));
            }
        };
        let error = match (stored.encode)(value) {
            Ok((bytes, value)) => match guard.store_result(&fingerprint, &bytes, ttl).await {
                Ok(()) => {
                    // Stored in one step that checked the lock was ours: the body ran under it
                    // from start to end (a lost lease never comes back), so a failed release
                    // changes nothing.
                    release(guard, &key).await;
                    return Ok(Ok(value));
                }
                Err(e @ LockError::RecordTooLarge { .. }) => e,
                // Dropping the guard on an error releases the lock in the background.
                Err(e) => return Err(e),
            },
            Err(e) => LockError::InvalidConfig {
                what: format!(
                    "the result of idempotent key {key:?} could not be stored as JSON ({e}); the body ran, so later calls get an error (result not stored) until the record expires"
                ),
            },
        };
        // The body ran: record that, so a later call does not run it again.
        if let Err(e) = guard.store_result(&fingerprint, NOT_STORED, ttl).await {
            tracing::warn!(key, error = %e, "recording an idempotent result as not stored failed; later calls get OutcomeUnknown (its mark stays) until it expires");
        }
        release(guard, &key).await;
        Err(error)
    }

    /// The error for a key whose mark (fingerprint `theirs`) has no result: `OutcomeUnknown`,
    /// or `IdempotencyKeyReused` when the mark is another function's (as `replay` answers a
    /// record).
    fn unknown(key: &str, ours: String, theirs: String, expires_in: Duration) -> LockError {
        if theirs != ours {
            return LockError::IdempotencyKeyReused {
                key: key.to_owned(),
                stored: theirs,
                caller: ours,
                expires_in,
            };
        }
        LockError::OutcomeUnknown {
            key: key.to_owned(),
            fingerprint: theirs,
            expires_in,
        }
    }

    async fn release(guard: crate::LockGuard, key: &str) {
        if let Err(e) = guard.release().await {
            tracing::debug!(key, error = %e, "release after an idempotent call failed; the lease will expire");
        }
    }

    #[cfg(test)]
    mod tests {
        use super::function_path;

        struct Generic<T>(T);

        impl<T> Generic<T> {
            fn path<U>(_: U) -> &'static str {
                function_path(&|| ())
            }
        }

        fn generic<T>(_: T) -> &'static str {
            let outer = || function_path(&|| ());
            outer()
        }

        /// The function's own generic arguments go, nested ones included; its `Self` type's
        /// stay: they name another type.
        #[test]
        fn function_paths_drop_the_functions_generics_only() {
            let here = module_path!();
            let map = generic(std::collections::HashMap::<String, Vec<(u8, Option<u8>)>>::new());
            assert_eq!(map, format!("{here}::generic"));
            assert_eq!(generic(0_u8), map);
            let method = Generic::<Vec<u8>>::path(std::collections::HashMap::<u8, u8>::new());
            assert_eq!(
                method,
                format!("{here}::Generic<alloc::vec::Vec<u8>>::path")
            );
            assert_ne!(Generic::<u8>::path(0_u8), method);
        }
    }
}
