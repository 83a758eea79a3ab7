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
