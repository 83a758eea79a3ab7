//! Attributes, doc comments, visibility and inner attributes are kept.
#![deny(missing_docs)]

use lock_core::{LockError, Locker, distributed_lock};

/// The error.
#[derive(Debug)]
pub struct AppError(pub LockError);

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError(e)
    }
}

/// Documented and public: `missing_docs` would fail if the doc comment were dropped.
#[distributed_lock(key = "doc:{id}", locker = locker)]
#[must_use = "the result says whether it ran"]
#[inline]
pub async fn documented(locker: &Locker, id: u32) -> Result<u32, AppError> {
    #![allow(clippy::let_and_return)]
    let out = id;
    Ok(out)
}

pub(crate) mod inner {
    use super::*;

    /// Visible in the crate.
    #[distributed_lock(key = "doc", locker = locker)]
    pub(crate) async unsafe fn unsafe_fn(locker: &Locker) -> Result<(), AppError> {
        Ok(())
    }
}

#[cfg(any())]
#[distributed_lock(key = "never:{compiled}")]
async fn configured_out() -> Result<(), AppError> {
    Ok(())
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let locker = Locker::memory();
    assert_eq!(rt.block_on(documented(&locker, 1)).unwrap(), 1);
    // SAFETY: nothing unsafe happens in the body.
    rt.block_on(unsafe { inner::unsafe_fn(&locker) }).unwrap();
}
