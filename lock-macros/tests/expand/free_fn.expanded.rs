/// Reserves stock.
pub async fn reserve(
    sku: &str,
    warehouse: &Warehouse,
    qty: u32,
) -> Result<u32, ShopError> {
    let __lock_key = ::std::format!("inventory:{}:{}", sku, warehouse.id);
    ::lock_core::__private::run_locked(
            ::lock_core::__private::global()
                .map(|__lock_locker| __lock_locker.lock(__lock_key))
                .map(|__lock_request| {
                    __lock_request
                        .class("inventory:{sku}:{warehouse.id}")
                        .wait(::lock_core::__private::Duration::from_millis(2000))
                }),
            async move {
                #[allow(
                    unknown_lints,
                    unreachable_code,
                    clippy::diverging_sub_expression,
                    clippy::empty_loop,
                    clippy::let_unit_value,
                    clippy::let_with_type_underscore,
                    clippy::needless_return,
                    clippy::unreachable
                )]
                if false {
                    let __lock_fake_return: Result<u32, ShopError> = loop {};
                    return __lock_fake_return;
                }
                let left = stock(sku)
                    .await?
                    .checked_sub(qty)
                    .ok_or(ShopError::OutOfStock)?;
                Ok(left)
            },
            ::core::convert::From::from,
        )
        .await
}
