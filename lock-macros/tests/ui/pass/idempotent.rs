//! `idempotent` compiles with the default TTL, an explicit one, every other option, tuples,
//! generic error types and methods; the TTL bound matches lock-core's.

use lock_core::{LockError, Locker, distributed_lock};
use serde::{Deserialize, Serialize};

const _: () = assert!(lock_core::MAX_RESULT_TTL.as_secs() == 365 * 24 * 3600);

#[derive(Debug)]
struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError(e)
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Receipt {
    id: u64,
    items: Vec<String>,
}

struct Order {
    id: u64,
}

#[distributed_lock(key = "charge:{order.id}", idempotent)]
async fn charge(order: &Order) -> Result<Receipt, AppError> {
    Ok(Receipt { id: order.id, items: Vec::new() })
}

#[distributed_lock(key = "a:{id}", locker = locker, no_wait, lease = "5s", fenced, idempotent = "1d 12h")]
async fn every_option(locker: &Locker, id: u64) -> Result<(u64, Option<String>), AppError> {
    Ok((id, None))
}

#[distributed_lock(key = "g:{id}", wait = "1s", idempotent = "500ms")]
async fn generic<E: From<LockError>>(id: u32) -> Result<Vec<u32>, E> {
    Ok(vec![id])
}

struct Service {
    locker: Locker,
}

impl Service {
    #[distributed_lock(key = "s:{id}", locker = self.locker, idempotent = "365d")]
    async fn method(&self, id: u64) -> Result<(), AppError> {
        Ok(())
    }
}

fn main() {
    let run = async {
        let service = Service { locker: Locker::memory() };
        service.method(1).await?;
        every_option(&service.locker, 2).await?;
        lock_core::set_global(Locker::memory());
        assert_eq!(charge(&Order { id: 3 }).await?.id, 3);
        assert_eq!(generic::<AppError>(4).await?, vec![4]);
        Ok::<_, AppError>(())
    };
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(run)
        .unwrap();
}
