#![allow(unused)]

use lock_core::{LockError, Locker, distributed_lock};

#[derive(Debug)]
struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError(e)
    }
}

#[distributed_lock(key = "order:{id}")]
async fn option(id: u64) -> Option<u64> {
    Some(id)
}

#[distributed_lock(key = "order:{id}")]
async fn plain(id: u64) -> u64 {
    id
}

#[distributed_lock(key = "order:{id}")]
async fn tuple(id: u64) -> (u64, Result<(), AppError>) {
    (id, Ok(()))
}

fn main() {}
