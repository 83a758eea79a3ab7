//! Waiting for a condition nothing signals (server-side state, another process), within a
//! bound: a condition that never comes fails the test, it does not hang it.

use std::time::{Duration, Instant};

/// Polls `check` every 5 ms until it is true.
///
/// # Panics
/// When it is still false after `bound` (the message says `what`).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::time::Duration;
/// let mut polls = 0;
/// lock_testkit::eventually("three polls", Duration::from_secs(5), async || {
///     polls += 1;
///     polls == 3
/// })
/// .await;
/// # }
/// ```
pub async fn eventually(what: &str, bound: Duration, mut check: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < bound, "{what}: not true within {bound:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Polls `check` every 10 ms until it returns `Ok`, and returns that value: like
/// [`eventually`], for the kit's own waits, whose panic says why the condition was still
/// false the last time (which node, which state).
///
/// # Panics
/// When it still returns `Err` after `bound` (the message says `what` and the last error).
pub(crate) async fn eventually_ok<T>(
    what: &str,
    bound: Duration,
    mut check: impl AsyncFnMut() -> Result<T, String>,
) -> T {
    let start = Instant::now();
    loop {
        match check().await {
            Ok(value) => return value,
            Err(why) => assert!(
                start.elapsed() < bound,
                "{what}: not true within {bound:?}; the last check said: {why}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
