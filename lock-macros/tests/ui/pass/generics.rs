//! Generic functions, `where` clauses, lifetimes and `impl Trait` parameters.

use std::fmt::Display;

use lock_core::{LockError, Locker, current_lock, distributed_lock};

#[derive(Debug)]
struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError(e)
    }
}

#[distributed_lock(key = "job:{id}", locker = locker)]
async fn generic<T: Display + Send>(locker: &Locker, id: T) -> Result<String, AppError> {
    Ok(format!("{id}"))
}

#[distributed_lock(key = "job:{id}:{tag}", locker = locker)]
async fn with_where<'a, I, T>(locker: &Locker, id: I, tag: &'a T) -> Result<&'a T, AppError>
where
    I: Display,
    T: Display + ?Sized,
{
    Ok(tag)
}

#[distributed_lock(key = "job:{name}", locker = locker)]
async fn impl_trait(locker: &Locker, name: impl Display, items: impl IntoIterator<Item = u32>) -> Result<u32, AppError> {
    Ok(items.into_iter().sum())
}

// The error type may be generic too.
#[distributed_lock(key = "job:{id}", locker = locker)]
async fn generic_error<E: From<LockError>>(locker: &Locker, id: u32) -> Result<u32, E> {
    Ok(id)
}

#[distributed_lock(key = "job:{id}", locker = locker)]
async fn returns_impl_trait(locker: &Locker, id: u32) -> Result<impl Display, AppError> {
    Ok(current_lock().map(|l| l.key().to_owned()).unwrap_or_default())
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let locker = Locker::memory();
    rt.block_on(async {
        assert_eq!(generic(&locker, 5u8).await.unwrap(), "5");
        assert_eq!(with_where(&locker, 1, "tag").await.unwrap(), "tag");
        assert_eq!(impl_trait(&locker, "sum", vec![1, 2]).await.unwrap(), 3);
        assert_eq!(generic_error::<AppError>(&locker, 4).await.unwrap(), 4);
        assert_eq!(returns_impl_trait(&locker, 8).await.unwrap().to_string(), "job:8");
    });
}
