#![allow(unused)]

use lock_core::{LockError, Locker, distributed_lock};

#[derive(Debug)]
struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError(e)
    }
}

#[distributed_lock(key = "a", lease = "5ms")]
async fn lease_too_short() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "a", lease = "7d1ms")]
async fn lease_too_long() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "a", lease = "0s")]
async fn lease_zero() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "a", wait = "1d1s")]
async fn wait_too_long() -> Result<(), AppError> {
    Ok(())
}

fn main() {}
