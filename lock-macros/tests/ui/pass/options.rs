//! Every option and the duration bounds (which must match lock-core's constants).

use std::time::Duration;

use lock_core::{LockError, Locker, current_fence, current_lock, distributed_lock};

// The macro repeats lock-core's bounds; these fail to compile if lock-core's change.
const _: () = assert!(lock_core::MIN_LEASE.as_millis() == 10);
const _: () = assert!(lock_core::MAX_LEASE.as_secs() == 7 * 24 * 3600);
const _: () = assert!(lock_core::MAX_WAIT.as_secs() == 24 * 3600);

#[derive(Debug)]
struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError(e)
    }
}

#[distributed_lock(key = "a", locker = locker, lease = "10ms", wait = "0s")]
async fn shortest_lease(locker: &Locker) -> Result<Duration, AppError> {
    Ok(Duration::ZERO)
}

#[distributed_lock(key = "b", locker = locker, lease = "7d", wait = "24h")]
async fn longest_lease(locker: &Locker) -> Result<Duration, AppError> {
    Ok(current_lock().map(|l| l.remaining()).unwrap_or_default())
}

#[distributed_lock(key = "c", locker = locker, lease = "1m 30s", wait = "1h2m3s500ms")]
async fn combined(locker: &Locker) -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "d", locker = locker, no_wait, fenced, lease = "5s")]
async fn fenced_no_wait(locker: &Locker) -> Result<Option<u64>, AppError> {
    Ok(current_fence())
}

#[distributed_lock(locker = locker, key = "e", fenced,)]
async fn trailing_comma_any_order(locker: &Locker) -> Result<Option<u64>, AppError> {
    Ok(current_fence())
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let locker = Locker::memory();
    rt.block_on(async {
        shortest_lease(&locker).await.unwrap();
        // The watchdog keeps at most the 7-day lease.
        assert!(longest_lease(&locker).await.unwrap() > Duration::from_secs(6 * 24 * 3600));
        combined(&locker).await.unwrap();
        assert_eq!(fenced_no_wait(&locker).await.unwrap(), Some(1));
        assert_eq!(fenced_no_wait(&locker).await.unwrap(), Some(2));
        assert_eq!(trailing_comma_any_order(&locker).await.unwrap(), Some(1));
    });
}
