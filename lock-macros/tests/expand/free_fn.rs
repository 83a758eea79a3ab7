// A free function on the process-wide locker, with a key built from two parameters.

/// Reserves stock.
#[distributed_lock(key = "inventory:{sku}:{warehouse.id}", wait = "2s")]
pub async fn reserve(sku: &str, warehouse: &Warehouse, qty: u32) -> Result<u32, ShopError> {
    let left = stock(sku).await?.checked_sub(qty).ok_or(ShopError::OutOfStock)?;
    Ok(left)
}
