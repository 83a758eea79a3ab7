//! An async free function on the process-wide locker: key from parameters and their fields.

use lock_core::{LockError, Locker, current_lock, distributed_lock};

#[derive(Debug)]
enum ShopError {
    Lock(LockError),
    OutOfStock,
}

impl From<LockError> for ShopError {
    fn from(e: LockError) -> Self {
        ShopError::Lock(e)
    }
}

struct Warehouse {
    id: u32,
    region: Region,
}

struct Region {
    code: &'static str,
}

#[distributed_lock(key = "inventory:{sku}:{warehouse.region.code}:{warehouse.id}", wait = "2s")]
async fn reserve(sku: &str, warehouse: &Warehouse, qty: u32) -> Result<String, ShopError> {
    if qty > 10 {
        return Err(ShopError::OutOfStock);
    }
    Ok(current_lock().map(|l| l.key().to_owned()).unwrap_or_default())
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    lock_core::set_global(Locker::memory());
    let warehouse = Warehouse { id: 7, region: Region { code: "eu" } };
    let key = rt.block_on(reserve("sku-1", &warehouse, 1)).unwrap();
    assert_eq!(key, "inventory:sku-1:eu:7");
    assert!(matches!(rt.block_on(reserve("sku-1", &warehouse, 11)), Err(ShopError::OutOfStock)));
}
