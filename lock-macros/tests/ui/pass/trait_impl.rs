//! Trait impls with native `async fn`, including a trait that requires `Send` futures.

use std::future::Future;

use lock_core::{LockError, Locker, distributed_lock};

#[derive(Debug)]
struct StoreError(LockError);

impl From<LockError> for StoreError {
    fn from(e: LockError) -> Self {
        StoreError(e)
    }
}

trait Store {
    async fn put(&self, key: &str, value: u32) -> Result<u32, StoreError>;
}

trait SendStore {
    fn take(&self, key: &str) -> impl Future<Output = Result<u32, StoreError>> + Send;
}

struct Memory {
    locker: Locker,
}

impl Store for Memory {
    #[distributed_lock(key = "store:{key}", locker = self.locker)]
    async fn put(&self, key: &str, value: u32) -> Result<u32, StoreError> {
        Ok(value)
    }
}

impl SendStore for Memory {
    #[distributed_lock(key = "store:{key}", locker = self.locker, no_wait)]
    async fn take(&self, key: &str) -> Result<u32, StoreError> {
        tokio::task::yield_now().await;
        Ok(key.len() as u32)
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let store = std::sync::Arc::new(Memory { locker: Locker::memory() });
    assert_eq!(rt.block_on(store.put("a", 1)).unwrap(), 1);
    let spawned = store.clone();
    // `tokio::spawn` needs the future to be `Send`.
    let taken = rt.block_on(rt.spawn(async move { spawned.take("abc").await })).unwrap();
    assert_eq!(taken.unwrap(), 3);
}
