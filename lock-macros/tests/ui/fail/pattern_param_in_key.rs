#![allow(unused)]

use lock_core::{LockError, Locker, distributed_lock};

#[derive(Debug)]
struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError(e)
    }
}

#[distributed_lock(key = "grid:{x}:{y}")]
async fn tuple_pattern((x, y): (u32, u32)) -> Result<(), AppError> {
    Ok(())
}

struct Point {
    x: i32,
}

#[distributed_lock(key = "grid:{x}")]
async fn struct_pattern(Point { x }: Point) -> Result<(), AppError> {
    Ok(())
}

fn main() {}
