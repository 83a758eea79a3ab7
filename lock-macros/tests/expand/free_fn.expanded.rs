/// Reserves stock.
pub async fn reserve(
    sku: &str,
    warehouse: &Warehouse,
    qty: u32,
) -> Result<u32, ShopError> {
    let __lock_key = ::std::format!("inventory:{}:{}", sku, warehouse.id);
    let __lock_request = ::lock_core::__private::global()
        .map(|__lock_locker| __lock_locker.lock(__lock_key));
    let __lock_outcome = match __lock_request {
        ::core::result::Result::Ok(__lock_request) => {
            __lock_request
                .wait(::lock_core::__private::Duration::from_millis(2000))
                .run(async move {
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
                    {
                        let left = stock(sku)
                            .await?
                            .checked_sub(qty)
                            .ok_or(ShopError::OutOfStock)?;
                        Ok(left)
                    }
                })
                .await
        }
        ::core::result::Result::Err(__lock_error) => {
            ::core::result::Result::Err(__lock_error)
        }
    };
    match __lock_outcome {
        ::core::result::Result::Ok(__lock_output) => __lock_output,
        #[allow(clippy::useless_conversion)]
        ::core::result::Result::Err(lock_error) => {
            ::core::result::Result::Err(::core::convert::From::from(lock_error))
        }
    }
}
