#![allow(unused)]

use lock_core::{LockError, Locker, distributed_lock};

#[derive(Debug)]
struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError(e)
    }
}

#[distributed_lock(key = "a", wait = 2)]
async fn number_for_duration() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "a", fenced = true)]
async fn flag_with_value() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "a", locker)]
async fn missing_value() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = inventory)]
async fn key_not_a_string() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "a", crate = "lock core")]
async fn bad_crate_path() -> Result<(), AppError> {
    Ok(())
}

fn main() {}
