#![allow(unused)]

use lock_core::{LockError, Locker, distributed_lock};

#[derive(Debug)]
struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError(e)
    }
}

#[distributed_lock(key = "a", wait = "2s", no_wait)]
async fn wait_first() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "a", no_wait, wait = "2s")]
async fn no_wait_first() -> Result<(), AppError> {
    Ok(())
}

fn main() {}
