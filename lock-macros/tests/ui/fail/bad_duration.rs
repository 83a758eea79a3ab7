#![allow(unused)]

use lock_core::{LockError, Locker, distributed_lock};

#[derive(Debug)]
struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError(e)
    }
}

#[distributed_lock(key = "a", wait = "2 seconds please")]
async fn words() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "a", lease = "30")]
async fn no_unit() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "a", lease = "1.5s")]
async fn fraction() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "a", wait = "500us")]
async fn unknown_unit() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "a", wait = "")]
async fn empty() -> Result<(), AppError> {
    Ok(())
}

fn main() {}
