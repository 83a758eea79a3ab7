//! Key templates: literal keys, escapes, tuple indices, raw identifiers, nested fields.

use lock_core::{LockError, Locker, current_lock, distributed_lock};

#[derive(Debug)]
struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError(e)
    }
}

struct Outer {
    inner: Inner,
    pair: (u8, &'static str),
}

struct Inner {
    r#type: &'static str,
}

fn key() -> String {
    current_lock().map(|l| l.key().to_owned()).unwrap_or_default()
}

#[distributed_lock(key = "nightly-job", locker = locker)]
async fn literal(locker: &Locker) -> Result<String, AppError> {
    Ok(key())
}

#[distributed_lock(key = "{{literal}}:{{{id}}}", locker = locker)]
async fn escapes(locker: &Locker, id: u32) -> Result<String, AppError> {
    Ok(key())
}

#[distributed_lock(key = "{outer.inner.r#type}/{outer.pair.0}/{outer.pair.1}/{r#type}", locker = locker)]
async fn fields(locker: &Locker, outer: Outer, r#type: char) -> Result<String, AppError> {
    Ok(key())
}

#[distributed_lock(key = "{id}{id}", locker = locker)]
async fn repeated(locker: &Locker, id: &str) -> Result<String, AppError> {
    Ok(key())
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let locker = Locker::memory();
    rt.block_on(async {
        assert_eq!(literal(&locker).await.unwrap(), "nightly-job");
        assert_eq!(escapes(&locker, 4).await.unwrap(), "{literal}:{4}");
        let outer = Outer { inner: Inner { r#type: "t" }, pair: (1, "x") };
        assert_eq!(fields(&locker, outer, 'c').await.unwrap(), "t/1/x/c");
        assert_eq!(repeated(&locker, "ab").await.unwrap(), "abab");
    });
}
