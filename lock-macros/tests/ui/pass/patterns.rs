//! Pattern parameters are allowed (they just cannot be named in the key).

use lock_core::{LockError, Locker, distributed_lock};

#[derive(Debug)]
struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError(e)
    }
}

struct Point {
    x: i32,
    y: i32,
}

struct Meters(u32);

#[distributed_lock(key = "grid:{name}", locker = locker)]
async fn patterns(
    locker: &Locker,
    name: &str,
    (a, b): (u32, u32),
    Point { x, y }: Point,
    Meters(m): Meters,
    _: u8,
    mut counter: u32,
) -> Result<i64, AppError> {
    counter += 1;
    Ok(i64::from(a + b + m + counter) + i64::from(x + y))
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let locker = Locker::memory();
    let total = rt
        .block_on(patterns(&locker, "g", (1, 2), Point { x: 3, y: 4 }, Meters(5), 0, 0))
        .unwrap();
    assert_eq!(total, 16);
}
