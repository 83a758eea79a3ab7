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
fn reserve(id: u64) -> Result<(), AppError> {
    Ok(())
}

struct Service;

impl Service {
    #[distributed_lock(key = "order:{id}")]
    pub fn method(&self, id: u64) -> Result<(), AppError> {
        Ok(())
    }
}

fn main() {
    // The item is still emitted: callers keep compiling.
    let _ = reserve(1);
    let _ = Service.method(1);
}
