//! Methods: `&self`, `&mut self` and `self`, with the locker and key parts taken from `self`.

use std::sync::Arc;

use lock_core::{LockError, Locker, current_lock, distributed_lock};

#[derive(Debug)]
struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError(e)
    }
}

struct Account {
    locker: Locker,
    shared: Arc<Locker>,
    id: u64,
    balance: i64,
}

impl Account {
    #[distributed_lock(key = "account:{self.id}", locker = self.locker)]
    async fn balance(&self) -> Result<i64, AppError> {
        Ok(self.balance)
    }

    #[distributed_lock(key = "account:{self.id}", locker = self.locker)]
    async fn deposit(&mut self, amount: i64) -> Result<i64, AppError> {
        self.balance += amount;
        Ok(self.balance)
    }

    // An `Arc<Locker>` field coerces to `&Locker`.
    #[distributed_lock(key = "account:{self.id}:close", locker = self.shared)]
    async fn close(self) -> Result<i64, AppError> {
        Ok(self.balance)
    }

    // The locker expression may call methods and use parameters.
    #[distributed_lock(key = "account:{id}", locker = self.locker.clone())]
    async fn peek(&self, id: u64) -> Result<String, AppError> {
        Ok(current_lock().map(|l| l.key().to_owned()).unwrap_or_default())
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut account = Account {
            locker: Locker::memory(),
            shared: Arc::new(Locker::memory()),
            id: 3,
            balance: 10,
        };
        assert_eq!(account.balance().await.unwrap(), 10);
        assert_eq!(account.deposit(5).await.unwrap(), 15);
        assert_eq!(account.peek(4).await.unwrap(), "account:4");
        assert_eq!(account.close().await.unwrap(), 15);
    });
}
