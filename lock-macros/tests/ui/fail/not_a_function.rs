#![allow(unused)]

use lock_core::{LockError, Locker, distributed_lock};

#[derive(Debug)]
struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError(e)
    }
}

#[distributed_lock(key = "k")]
struct Service;

trait Store {
    #[distributed_lock(key = "k")]
    async fn put(&self) -> Result<(), AppError>;
}

fn main() {}
