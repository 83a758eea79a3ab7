//! The process-wide locker. It is process-wide state, so this file (its own test process)
//! holds exactly one test, which sets and clears it in sequence.

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

use lock_core::{LockError, Locker, distributed_lock};

#[derive(Debug)]
struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError(e)
    }
}

#[distributed_lock(key = "global:{id}", no_wait)]
async fn on_global(id: u32, ran: &AtomicBool) -> Result<bool, AppError> {
    ran.store(true, SeqCst);
    // Whether the lock is held on the global locker: another task (outside this task's
    // reentrancy scope) finds the key busy.
    let probe =
        tokio::spawn(async move { lock_core::global()?.try_lock(format!("global:{id}")).await });
    Ok(matches!(probe.await, Ok(Err(LockError::Busy { .. }))))
}

#[tokio::test]
async fn missing_global_locker_is_the_users_error_then_the_global_is_used() {
    let ran = AtomicBool::new(false);
    lock_core::clear_global();
    match on_global(1, &ran).await {
        // A unit variant: matched as it is spelled, without `{ .. }`.
        Err(AppError(LockError::NoGlobalLocker)) => {}
        other => panic!("expected NoGlobalLocker, got {other:?}"),
    }
    assert!(!ran.load(SeqCst), "the body ran without a lock");

    let locker = Locker::memory();
    lock_core::set_global(locker.clone());
    let held_on_global = on_global(1, &ran).await.unwrap();
    assert!(ran.load(SeqCst));
    assert!(
        held_on_global,
        "the body ran, but not under the global locker's lock"
    );
    // Released afterwards, on that same locker.
    locker
        .try_lock("global:1")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    // The global is read at each call: clearing it takes effect at once.
    lock_core::clear_global();
    assert!(matches!(
        on_global(2, &ran).await,
        Err(AppError(LockError::NoGlobalLocker))
    ));
}
