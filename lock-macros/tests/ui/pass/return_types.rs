//! Result aliases, boxed errors, and `?` on other error types inside the body.

use lock_core::{LockError, Locker, distributed_lock};

#[derive(Debug)]
enum AppError {
    Lock(LockError),
    Parse(std::num::ParseIntError),
}

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError::Lock(e)
    }
}

impl From<std::num::ParseIntError> for AppError {
    fn from(e: std::num::ParseIntError) -> Self {
        AppError::Parse(e)
    }
}

mod app {
    pub type Result<T> = std::result::Result<T, super::AppError>;
}

#[distributed_lock(key = "parse:{text}", locker = locker)]
async fn alias(locker: &Locker, text: &str) -> app::Result<u32> {
    let n: u32 = text.parse()?;
    Ok(n)
}

#[distributed_lock(key = "parse:{text}", locker = locker)]
async fn boxed(locker: &Locker, text: &str) -> Result<u32, Box<dyn std::error::Error + Send + Sync>> {
    Ok(text.parse()?)
}

#[distributed_lock(key = "parse:{text}", locker = locker)]
async fn full_path(locker: &Locker, text: &str) -> std::result::Result<(), AppError> {
    text.parse::<u32>()?;
    Ok(())
}

#[distributed_lock(key = "parse:{text}", locker = locker)]
async fn early_return(locker: &Locker, text: &str) -> Result<&'static str, AppError> {
    if text.is_empty() {
        return Ok("empty");
    }
    Ok("full")
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let locker = Locker::memory();
    rt.block_on(async {
        assert_eq!(alias(&locker, "12").await.unwrap(), 12);
        assert!(matches!(alias(&locker, "x").await, Err(AppError::Parse(_))));
        assert_eq!(boxed(&locker, "3").await.unwrap(), 3);
        assert!(full_path(&locker, "1").await.is_ok());
        assert_eq!(early_return(&locker, "").await.unwrap(), "empty");
    });
}
