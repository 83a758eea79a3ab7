#![allow(unused)]

use lock_core::{LockError, distributed_lock};

#[derive(Debug)]
struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError(e)
    }
}

#[distributed_lock(key = "a", idempotent = "7 days please")]
async fn bad_duration() -> Result<u32, AppError> {
    Ok(1)
}

#[distributed_lock(key = "a", idempotent = "0s")]
async fn zero() -> Result<u32, AppError> {
    Ok(1)
}

#[distributed_lock(key = "a", idempotent = "400d")]
async fn too_long() -> Result<u32, AppError> {
    Ok(1)
}

#[distributed_lock(key = "a", idempotent = 7)]
async fn not_a_string() -> Result<u32, AppError> {
    Ok(1)
}

#[distributed_lock(key = "a", idempotent, idempotent = "1h")]
async fn twice() -> Result<u32, AppError> {
    Ok(1)
}

#[distributed_lock(key = "a", idempotency)]
async fn misspelled() -> Result<u32, AppError> {
    Ok(1)
}

fn main() {}
