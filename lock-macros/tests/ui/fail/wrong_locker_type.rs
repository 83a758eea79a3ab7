#![allow(unused)]

use lock_core::{LockError, Locker, distributed_lock};

#[derive(Debug)]
struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError(e)
    }
}

#[distributed_lock(key = "order:{id}", locker = url)]
async fn string_locker(url: &str, id: u64) -> Result<(), AppError> {
    Ok(())
}

fn main() {}
