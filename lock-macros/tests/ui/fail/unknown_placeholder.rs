#![allow(unused)]

use lock_core::{LockError, Locker, distributed_lock};

#[derive(Debug)]
struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError(e)
    }
}

#[distributed_lock(key = "inventory:{skuu}", locker = locker)]
async fn typo(locker: &Locker, sku: &str) -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "user:{user_id}")]
async fn not_a_parameter(id: u64) -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "shard:{self.shard}")]
async fn no_receiver(id: u64) -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "job:{id}")]
async fn no_parameters() -> Result<(), AppError> {
    Ok(())
}

fn main() {}
