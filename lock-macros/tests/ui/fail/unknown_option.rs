#![allow(unused)]

use lock_core::{LockError, Locker, distributed_lock};

#[derive(Debug)]
struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError(e)
    }
}

#[distributed_lock(key = "k", locker = locker, timeout = "2s")]
async fn misnamed(locker: &Locker) -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", locker = locker, fencd)]
async fn misspelled(locker: &Locker) -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", locker = locker, retries = 3)]
async fn unrelated(locker: &Locker) -> Result<(), AppError> {
    Ok(())
}

fn main() {}
