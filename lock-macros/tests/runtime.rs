//! Run-time behaviour of `#[distributed_lock]` on the memory backend: exclusion, errors
//! through the user's type, lease loss, fencing, reentrancy, and the locker expression.
//!
//! The process-wide locker is tested in `global.rs` (its own process): nothing here touches it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use lock_core::{LockError, Locker, MemoryBackend, current_fence, current_lock, distributed_lock};

#[derive(Debug)]
enum AppError {
    Lock(LockError),
    Invalid(&'static str),
}

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError::Lock(e)
    }
}

/// A counter whose increment is a separate read and write with a yield in between: without
/// mutual exclusion, concurrent increments are lost.
#[derive(Default)]
struct RacyCounter {
    value: AtomicU64,
    inside: AtomicUsize,
    max_inside: AtomicUsize,
}

#[distributed_lock(key = "counter:{name}", locker = locker, wait = "30s")]
async fn bump(locker: &Locker, name: &str, counter: &RacyCounter) -> Result<(), AppError> {
    let now_inside = counter.inside.fetch_add(1, SeqCst) + 1;
    counter.max_inside.fetch_max(now_inside, SeqCst);
    let read = counter.value.load(SeqCst);
    tokio::task::yield_now().await;
    tokio::time::sleep(Duration::from_micros(50)).await;
    counter.value.store(read + 1, SeqCst);
    counter.inside.fetch_sub(1, SeqCst);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn annotated_fn_excludes_concurrent_callers() {
    const TASKS: u64 = 16;
    const ROUNDS: u64 = 25;
    let locker = Locker::memory();
    let counter = Arc::new(RacyCounter::default());
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (locker, counter) = (locker.clone(), counter.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                bump(&locker, "shared", &counter).await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(
        counter.value.load(SeqCst),
        TASKS * ROUNDS,
        "an increment was lost"
    );
    assert_eq!(counter.max_inside.load(SeqCst), 1, "two bodies ran at once");
    // Released after the last call: the key is free again.
    locker
        .try_lock("counter:shared")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

#[distributed_lock(key = "report:{day}", locker = locker, no_wait)]
async fn report_once(locker: &Locker, day: u32, ran: &AtomicBool) -> Result<(), AppError> {
    ran.store(true, SeqCst);
    Ok(())
}

#[tokio::test]
async fn no_wait_returns_busy_through_the_users_error_type() {
    let locker = Locker::memory();
    let ran = AtomicBool::new(false);
    let held = locker.lock("report:12").await.unwrap();
    match report_once(&locker, 12, &ran).await {
        Err(AppError::Lock(LockError::Busy { key, .. })) => assert_eq!(key, "report:12"),
        other => panic!("expected Busy, got {other:?}"),
    }
    assert!(!ran.load(SeqCst), "the body ran without the lock");
    // Another key is not affected, and after release the same key works.
    report_once(&locker, 13, &ran).await.unwrap();
    assert!(ran.swap(false, SeqCst));
    held.release().await.unwrap();
    report_once(&locker, 12, &ran).await.unwrap();
    assert!(ran.load(SeqCst));
}

#[distributed_lock(key = "slow:{id}", locker = locker, wait = "20ms")]
async fn slow(locker: &Locker, id: u32) -> Result<(), AppError> {
    Ok(())
}

#[tokio::test]
async fn wait_times_out_through_the_users_error_type() {
    let locker = Locker::memory();
    let _held = locker.lock("slow:1").await.unwrap();
    match slow(&locker, 1).await {
        Err(AppError::Lock(LockError::Timeout { key, .. })) => assert_eq!(key, "slow:1"),
        other => panic!("expected Timeout, got {other:?}"),
    }
}

#[distributed_lock(key = "lease:{id}", locker = locker, lease = "50ms")]
async fn outlive_the_lease(
    locker: &Locker,
    id: u32,
    started: &AtomicBool,
    finished: &AtomicBool,
) -> Result<(), AppError> {
    started.store(true, SeqCst);
    tokio::time::sleep(Duration::from_secs(5)).await;
    finished.store(true, SeqCst);
    Ok(())
}

#[tokio::test]
async fn lease_loss_cancels_the_body() {
    // No watchdog: the 50 ms lease runs out while the body sleeps.
    let locker = Locker::builder(MemoryBackend::new())
        .watchdog(false)
        .build();
    let (started, finished) = (AtomicBool::new(false), AtomicBool::new(false));
    let result = outlive_the_lease(&locker, 1, &started, &finished).await;
    match result {
        Err(AppError::Lock(LockError::LeaseLost { key, .. })) => assert_eq!(key, "lease:1"),
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    assert!(started.load(SeqCst));
    assert!(
        !finished.load(SeqCst),
        "the body went on after the lease was lost"
    );
}

#[distributed_lock(key = "lease:{id}", locker = locker, lease = "50ms")]
async fn renewed(locker: &Locker, id: u32) -> Result<bool, AppError> {
    // Several leases long: only renewal keeps the lock.
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(current_lock().is_some_and(|l| l.is_held()))
}

// On paused tokio time (the memory backend runs on tokio's clock): renewals happen when due
// whatever the machine's load, so the test checks the watchdog, not the scheduler.
#[tokio::test(start_paused = true)]
async fn watchdog_keeps_a_short_lease_while_the_body_runs() {
    let locker = Locker::memory();
    assert!(renewed(&locker, 2).await.unwrap());
}

#[distributed_lock(key = "ledger:{account}", locker = locker, fenced)]
async fn fenced_post(locker: &Locker, account: &str) -> Result<Option<u64>, AppError> {
    Ok(current_fence())
}

#[distributed_lock(key = "ledger:{account}", locker = locker)]
async fn unfenced_post(
    locker: &Locker,
    account: &str,
) -> Result<(Option<String>, Option<u64>), AppError> {
    Ok((current_lock().map(|l| l.key().to_owned()), current_fence()))
}

#[tokio::test]
async fn fencing_token_is_visible_in_the_body() {
    let locker = Locker::memory();
    let first = fenced_post(&locker, "acc-1").await.unwrap().unwrap();
    let second = fenced_post(&locker, "acc-1").await.unwrap().unwrap();
    assert!(second > first, "{second} <= {first}");
    let (key, fence) = unfenced_post(&locker, "acc-1").await.unwrap();
    assert_eq!(key.as_deref(), Some("ledger:acc-1"));
    assert_eq!(fence, None);
    // Outside a locked function there is no current lock.
    assert!(current_lock().is_none());
}

#[distributed_lock(key = "account:{id}", locker = locker, wait = "5s")]
async fn transfer(locker: &Locker, id: u32, depth: u32) -> Result<u32, AppError> {
    if depth == 0 {
        return audit(locker, id).await;
    }
    // Same key, same task: reentrant, so this does not wait for itself.
    Box::pin(transfer(locker, id, depth - 1)).await
}

#[distributed_lock(key = "account:{id}", locker = locker, no_wait)]
async fn audit(locker: &Locker, id: u32) -> Result<u32, AppError> {
    Ok(id)
}

#[tokio::test]
async fn nested_calls_with_the_same_key_are_reentrant() {
    let locker = Locker::memory();
    // `audit` alone uses no_wait: it would fail with Busy if the nested call were not reentrant.
    let out = tokio::time::timeout(Duration::from_secs(2), transfer(&locker, 5, 3))
        .await
        .expect("nested call waited for its own lock")
        .unwrap();
    assert_eq!(out, 5);
    // The outermost call released the lock.
    locker
        .try_lock("account:5")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

struct Service {
    locker: Locker,
    shard: u32,
    calls: u32,
}

impl Service {
    #[distributed_lock(key = "shard:{self.shard}:{item}", locker = self.locker, no_wait)]
    async fn handle(&self, item: &str, ran: &AtomicBool) -> Result<(), AppError> {
        ran.store(true, SeqCst);
        Ok(())
    }

    #[distributed_lock(key = "shard:{self.shard}:{item}", locker = self.locker, no_wait)]
    async fn handle_mut(&mut self, item: &str) -> Result<u32, AppError> {
        if item.is_empty() {
            return Err(AppError::Invalid("empty item"));
        }
        self.calls += 1;
        Ok(self.calls)
    }
}

#[tokio::test]
async fn locker_expression_uses_self() {
    let mut service = Service {
        locker: Locker::memory(),
        shard: 2,
        calls: 0,
    };
    let ran = AtomicBool::new(false);
    // Held on another locker (another backend): no effect on the service's.
    let elsewhere = Locker::memory();
    let _other = elsewhere.lock("shard:2:a").await.unwrap();
    service.handle("a", &ran).await.unwrap();
    assert!(ran.swap(false, SeqCst));
    // Held on the service's own locker: Busy, body not run.
    let held = service.locker.lock("shard:2:a").await.unwrap();
    assert!(matches!(
        service.handle("a", &ran).await,
        Err(AppError::Lock(LockError::Busy { .. }))
    ));
    assert!(!ran.load(SeqCst));
    assert!(matches!(
        service.handle_mut("a").await,
        Err(AppError::Lock(LockError::Busy { .. }))
    ));
    held.release().await.unwrap();
    assert_eq!(service.handle_mut("a").await.unwrap(), 1);
    assert!(matches!(
        service.handle_mut("").await,
        Err(AppError::Invalid("empty item"))
    ));
    assert_eq!(service.calls, 1);
}

fn pick<'a>(lockers: &'a [Locker], evaluations: &AtomicUsize, shard: usize) -> &'a Locker {
    evaluations.fetch_add(1, SeqCst);
    &lockers[shard % lockers.len()]
}

#[distributed_lock(key = "item:{shard}", locker = pick(lockers, evaluations, shard), no_wait)]
async fn sharded(
    lockers: &[Locker],
    evaluations: &AtomicUsize,
    shard: usize,
) -> Result<(), AppError> {
    Ok(())
}

#[tokio::test]
async fn locker_expression_is_evaluated_per_call_with_the_parameters() {
    let lockers = [Locker::memory(), Locker::memory()];
    let evaluations = AtomicUsize::new(0);
    let _held = lockers[1].lock("item:1").await.unwrap();
    sharded(&lockers, &evaluations, 0).await.unwrap();
    // Shard 1 picks the second locker, where the key is held.
    assert!(matches!(
        sharded(&lockers, &evaluations, 1).await,
        Err(AppError::Lock(LockError::Busy { .. }))
    ));
    sharded(&lockers, &evaluations, 0).await.unwrap();
    assert_eq!(evaluations.load(SeqCst), 3);
}

#[distributed_lock(key = "{id}", locker = locker)]
async fn from_input(locker: &Locker, id: &str, ran: &AtomicBool) -> Result<(), AppError> {
    ran.store(true, SeqCst);
    Ok(())
}

#[tokio::test]
async fn invalid_runtime_key_is_an_error_not_a_panic() {
    let locker = Locker::memory();
    let ran = AtomicBool::new(false);
    assert!(matches!(
        from_input(&locker, "", &ran).await,
        Err(AppError::Lock(LockError::InvalidKey { .. }))
    ));
    let long = "x".repeat(lock_core::MAX_KEY_LEN + 1);
    assert!(matches!(
        from_input(&locker, &long, &ran).await,
        Err(AppError::Lock(LockError::InvalidKey { .. }))
    ));
    assert!(!ran.load(SeqCst));
}

// `LockError` itself as the error type: the conversion is the identity (and must not trip
// clippy's `useless_conversion` in the user's crate).
#[distributed_lock(key = "plain:{id}", locker = locker, no_wait)]
async fn plain_lock_error(locker: &Locker, id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[tokio::test]
async fn lock_error_itself_can_be_the_error_type() {
    let locker = Locker::memory();
    assert_eq!(plain_lock_error(&locker, 3).await.unwrap(), 3);
    let _held = locker.lock("plain:4").await.unwrap();
    assert!(matches!(
        plain_lock_error(&locker, 4).await,
        Err(LockError::Busy { .. })
    ));
}
