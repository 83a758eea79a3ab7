// Idempotent functions: the default TTL, and one given with `no_wait` on an explicit locker.

/// Charges an order once.
#[distributed_lock(key = "charge:{order.id}", idempotent)]
pub async fn charge(order: &Order) -> Result<Receipt, PayError> {
    Ok(pay(order).await?)
}

/// Sends a payout once a week at most, refusing duplicates while the first runs.
#[distributed_lock(key = "payout:{id}", locker = self.locker, no_wait, idempotent = "7d")]
pub async fn payout(&self, id: u64) -> Result<u64, PayError> {
    Ok(id)
}
