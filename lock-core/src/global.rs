//! The process-wide default locker, used by `#[distributed_lock]` without `locker = ...`.

use crate::sync::RwLock;
use crate::{LockError, Locker};

static GLOBAL: RwLock<Option<Locker>> = RwLock::new(None);

/// Sets the process-wide default locker; returns the one it replaces, if any.
///
/// ```
/// let previous = lock_core::set_global(lock_core::Locker::memory());
/// # drop(previous);
/// assert!(lock_core::global().is_ok());
/// ```
pub fn set_global(locker: Locker) -> Option<Locker> {
    GLOBAL.write().replace(locker)
}

/// The process-wide default locker.
///
/// # Errors
/// [`LockError::NoGlobalLocker`] when none was set.
///
/// ```
/// lock_core::set_global(lock_core::Locker::memory());
/// let locker = lock_core::global().unwrap();
/// # drop(locker);
/// ```
pub fn global() -> Result<Locker, LockError> {
    GLOBAL.read().clone().ok_or(LockError::NoGlobalLocker)
}

/// Removes the process-wide default locker; returns it.
///
/// ```
/// lock_core::set_global(lock_core::Locker::memory());
/// assert!(lock_core::clear_global().is_some());
/// ```
pub fn clear_global() -> Option<Locker> {
    GLOBAL.write().take()
}
