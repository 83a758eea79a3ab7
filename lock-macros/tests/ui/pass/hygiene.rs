//! The generated code's names cannot clash with the user's.

use lock_core::{LockError, Locker, current_lock, distributed_lock};

#[derive(Debug)]
struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError(e)
    }
}

// Parameters named like the macro's internals, and a local `Result` and `Ok` in scope.
#[distributed_lock(key = "{__lock_key}:{__lock_request}", locker = __lock_locker)]
async fn clashing(
    __lock_locker: &Locker,
    __lock_key: &str,
    __lock_request: u32,
    __lock_output: u32,
) -> Result<String, AppError> {
    let __lock_error = __lock_output;
    let _ = __lock_error;
    Ok(current_lock().map(|l| l.key().to_owned()).unwrap_or_default())
}

mod shadowing {
    use super::*;

    #[allow(dead_code)]
    enum Shadow {
        Ok,
        Err,
    }
    #[allow(unused_imports)]
    use Shadow::{Err, Ok};

    #[distributed_lock(key = "shadow", locker = locker)]
    pub(super) async fn shadowed(locker: &Locker) -> Result<u32, AppError> {
        std::result::Result::Ok(1)
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let locker = Locker::memory();
    assert_eq!(rt.block_on(clashing(&locker, "k", 2, 3)).unwrap(), "k:2");
    assert_eq!(rt.block_on(shadowing::shadowed(&locker)).unwrap(), 1);
}
