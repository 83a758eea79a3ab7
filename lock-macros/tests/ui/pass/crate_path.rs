//! `crate = "..."` for a renamed or re-exported lock-core.

extern crate lock_core as locks;

mod platform {
    pub use lock_core as locking;
}

#[derive(Debug)]
struct AppError(locks::LockError);

impl From<locks::LockError> for AppError {
    fn from(e: locks::LockError) -> Self {
        AppError(e)
    }
}

#[locks::distributed_lock(key = "k:{id}", locker = locker, wait = "1s", crate = "locks")]
async fn renamed(locker: &locks::Locker, id: u32) -> Result<u32, AppError> {
    Ok(id)
}

#[platform::locking::distributed_lock(key = "k:{id}", crate = "crate::platform::locking")]
async fn re_exported(id: u32) -> Result<u32, AppError> {
    Ok(id)
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    locks::set_global(locks::Locker::memory());
    assert_eq!(rt.block_on(renamed(&locks::Locker::memory(), 1)).unwrap(), 1);
    assert_eq!(rt.block_on(re_exported(2)).unwrap(), 2);
}
