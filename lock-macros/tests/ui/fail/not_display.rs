#![allow(unused)]

use lock_core::{LockError, Locker, distributed_lock};

#[derive(Debug)]
struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError(e)
    }
}

struct Order {
    id: u64,
    tags: Vec<String>,
}

#[distributed_lock(key = "order:{order.tags}")]
async fn tags(order: &Order) -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "order:{order.missing}")]
async fn no_such_field(order: &Order) -> Result<(), AppError> {
    Ok(())
}

fn main() {}
