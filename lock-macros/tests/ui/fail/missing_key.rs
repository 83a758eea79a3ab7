#![allow(unused)]

use lock_core::{LockError, Locker, distributed_lock};

#[derive(Debug)]
struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError(e)
    }
}

#[distributed_lock]
async fn bare() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(wait = "1s", fenced)]
async fn options_but_no_key() -> Result<(), AppError> {
    Ok(())
}

fn main() {}
