#![allow(unused)]

use lock_core::{LockError, distributed_lock};

#[derive(Debug)]
struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError(e)
    }
}

/// Neither `Serialize` nor `Deserialize`: an idempotent function cannot store it.
#[derive(Debug)]
struct Receipt {
    id: u64,
}

#[distributed_lock(key = "charge:{id}", idempotent)]
async fn charge(id: u64) -> Result<Receipt, AppError> {
    Ok(Receipt { id })
}

fn main() {}
