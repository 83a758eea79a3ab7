#![allow(unused)]

use lock_core::{LockError, Locker, distributed_lock};

#[derive(Debug)]
struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError(e)
    }
}

#[derive(Debug)]
struct PlainError;

#[distributed_lock(key = "order:{id}")]
async fn plain_error(id: u64) -> Result<(), PlainError> {
    Ok(())
}

fn main() {}
