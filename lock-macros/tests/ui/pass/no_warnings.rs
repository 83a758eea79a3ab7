//! The expansion adds no warning of its own: a crate that denies every warning compiles, with
//! bodies on one line (the function's braces are not left around a block of their own, which
//! `unused_braces` reports) as well as longer ones.
#![deny(warnings)]

use lock_core::{LockError, Locker, distributed_lock};

#[distributed_lock(key = "k:{id}", locker = locker)]
async fn one_line(locker: &Locker, id: u32) -> Result<u32, LockError> { Ok(id) }

#[distributed_lock(key = "k:{id}", locker = locker, idempotent)]
async fn one_line_idempotent(locker: &Locker, id: u32) -> Result<u32, LockError> { Ok(id) }

#[distributed_lock(key = "k:{id}", locker = locker, no_wait)]
async fn several_statements(locker: &Locker, id: u32) -> Result<u32, LockError> {
    let doubled = id * 2;
    Ok(doubled)
}

struct Shop {
    locker: Locker,
}

impl Shop {
    #[distributed_lock(key = "sku:{sku}", locker = self.locker)]
    async fn one_line_method(&self, sku: &str) -> Result<usize, LockError> { Ok(sku.len()) }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let locker = Locker::memory();
        assert_eq!(one_line(&locker, 1).await.unwrap(), 1);
        assert_eq!(one_line_idempotent(&locker, 2).await.unwrap(), 2);
        assert_eq!(several_statements(&locker, 3).await.unwrap(), 6);
        let shop = Shop { locker };
        assert_eq!(shop.one_line_method("abc").await.unwrap(), 3);
    });
}
