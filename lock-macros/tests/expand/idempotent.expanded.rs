/// Charges an order once.
pub async fn charge(order: &Order) -> Result<Receipt, PayError> {
    let __lock_key = ::std::format!("charge:{}", order.id);
    ::lock_core::__private::run_idempotent(
            ::lock_core::__private::global()
                .map(|__lock_locker| __lock_locker.lock(__lock_key))
                .map(|__lock_request| __lock_request.class("charge:{order.id}")),
            ::lock_core::__private::stored()
                .called_by({
                    let __lock_here = || ();
                    ::lock_core::__private::function_path(&__lock_here)
                }),
            ::lock_core::DEFAULT_RESULT_TTL,
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
                    let __lock_fake_return: Result<Receipt, PayError> = loop {};
                    return __lock_fake_return;
                }
                Ok(pay(order).await?)
            },
            ::core::convert::From::from,
        )
        .await
}
/// Sends a payout once a week at most, refusing duplicates while the first runs.
pub async fn payout(&self, id: u64) -> Result<u64, PayError> {
    let __lock_key = ::std::format!("payout:{}", id);
    ::lock_core::__private::run_idempotent(
            ::core::result::Result::Ok::<
                _,
                ::lock_core::LockError,
            >({
                    let __lock_locker: &::lock_core::Locker = &(self.locker);
                    __lock_locker.lock(__lock_key)
                })
                .map(|__lock_request| __lock_request.class("payout:{id}").no_wait()),
            ::lock_core::__private::stored()
                .called_by({
                    let __lock_here = || ();
                    ::lock_core::__private::function_path(&__lock_here)
                }),
            ::lock_core::__private::Duration::from_millis(604800000),
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
                    let __lock_fake_return: Result<u64, PayError> = loop {};
                    return __lock_fake_return;
                }
                Ok(id)
            },
            ::core::convert::From::from,
        )
        .await
}
