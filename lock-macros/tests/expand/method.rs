// A method with the locker taken from `self`, every option set, and a literal key.

impl Lottery {
    #[distributed_lock(
        key = "user:{req.user_id}:draw:{self.draw_id}",
        locker = self.locker,
        no_wait,
        lease = "1m30s",
        fenced
    )]
    async fn draw(&self, req: &DrawRequest) -> Result<Prize, LotteryError> {
        let fence = lock_core::current_fence();
        self.store.record(req, fence).await
    }

    #[distributed_lock(key = "lottery:{{global}}", locker = self.locker, crate = "my_locks")]
    async fn reset(&mut self) -> std::io::Result<impl Display> {
        self.draws.clear();
        Ok("reset")
    }
}
