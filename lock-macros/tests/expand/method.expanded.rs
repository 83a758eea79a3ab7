impl Lottery {
    async fn draw(&self, req: &DrawRequest) -> Result<Prize, LotteryError> {
        let __lock_key = ::std::format!("user:{}:draw:{}", req.user_id, self.draw_id);
        ::lock_core::__private::run_locked(
                ::core::result::Result::Ok::<
                    _,
                    ::lock_core::LockError,
                >({
                        let __lock_locker: &::lock_core::Locker = &(self.locker);
                        __lock_locker.lock(__lock_key)
                    })
                    .map(|__lock_request| {
                        __lock_request
                            .class("user:{req.user_id}:draw:{self.draw_id}")
                            .no_wait()
                            .lease(::lock_core::__private::Duration::from_millis(90000))
                            .fenced()
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
                        let __lock_fake_return: Result<Prize, LotteryError> = loop {};
                        return __lock_fake_return;
                    }
                    let fence = lock_core::current_fence();
                    self.store.record(req, fence).await
                },
                ::core::convert::From::from,
            )
            .await
    }
    async fn reset(&mut self) -> std::io::Result<impl Display> {
        let __lock_key = "lottery:{global}";
        my_locks::__private::run_locked(
                ::core::result::Result::Ok::<
                    _,
                    my_locks::LockError,
                >({
                        let __lock_locker: &my_locks::Locker = &(self.locker);
                        __lock_locker.lock(__lock_key)
                    })
                    .map(|__lock_request| __lock_request.class("lottery:{{global}}")),
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
                        let __lock_fake_return: std::io::Result<_> = loop {};
                        return __lock_fake_return;
                    }
                    self.draws.clear();
                    Ok("reset")
                },
                ::core::convert::From::from,
            )
            .await
    }
}
