#![allow(unused)]

use lock_core::{LockError, Locker, distributed_lock};

#[derive(Debug)]
struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError(e)
    }
}

#[distributed_lock(key = "a", wait = "1s", key = "b")]
async fn twice(id: u32) -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "a", fenced, fenced)]
async fn flag_twice() -> Result<(), AppError> {
    Ok(())
}

fn main() {}
