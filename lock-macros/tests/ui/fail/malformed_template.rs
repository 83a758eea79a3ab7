#![allow(unused)]

use lock_core::{LockError, Locker, distributed_lock};

#[derive(Debug)]
struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError(e)
    }
}

#[distributed_lock(key = "order:{id")]
async fn unclosed(id: u64) -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "order:id}")]
async fn unmatched(id: u64) -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "order:{}")]
async fn positional(id: u64) -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "order:{id:>8}")]
async fn format_spec(id: u64) -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "order:{id.to_string()}")]
async fn expression(id: u64) -> Result<(), AppError> {
    Ok(())
}

fn main() {}
