//! Reentrancy never crosses tasks, and ends when the outer lock ends (issue 12, holes 1 and 2),
//! and `run` never reports `Ok` when its final release finds the lock no longer ours (hole 3).
//! Memory backend, on tokio's paused clock: "ended without virtual time passing" proves a
//! signal ended it, not a timer; the `timeout`s are only bounds that turn a hang into a failure.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed expectation fails the test"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lock_core::{LockError, LockGuard, Locker, MemoryBackend, current_lock};
use tokio::sync::oneshot;
use tokio::time::Instant;

/// Turns "never ends" into a failure on the paused clock (virtual time, so it costs nothing).
const BOUND: Duration = Duration::from_secs(3600);

fn pair() -> (MemoryBackend, Locker, Locker) {
    let backend = MemoryBackend::new();
    let a = Locker::builder(backend.clone()).build();
    let b = Locker::builder(backend.clone()).build();
    (backend, a, b)
}

// ---- hole 1: a scope is read when the future first runs, not when it is built ----

#[tokio::test(start_paused = true)]
async fn a_scope_spawned_from_a_run_does_not_carry_the_outer_lock() {
    let (_backend, a, _b) = pair();
    let locker = a.clone();
    let (outer_seen, inner_seen) = a
        .lock("outer")
        .run(async move {
            let guard = locker.lock("inner").await.unwrap();
            let l = locker.clone();
            let task = tokio::spawn(guard.scope(async move {
                let outer = l.try_lock("outer").await.map(|g| g.is_reentrant());
                let inner = l.try_lock("inner").await.map(|g| g.is_reentrant());
                (outer, inner)
            }));
            let seen = task.await.unwrap();
            guard.release().await.unwrap();
            seen
        })
        .await
        .unwrap();
    // The spawned task is another owner of "outer": it must wait like anyone else.
    assert!(
        matches!(outer_seen, Err(LockError::Busy { .. })),
        "{outer_seen:?}"
    );
    // The guard's own lock is what `scope` carries.
    assert!(matches!(inner_seen, Ok(true)), "{inner_seen:?}");
}

#[tokio::test(start_paused = true)]
#[allow(
    clippy::async_yields_async,
    reason = "the point: a scoped future built inside a run, awaited after it"
)]
async fn a_scope_built_inside_a_run_and_polled_after_it_does_not_carry_the_run_lock() {
    let (_backend, a, _b) = pair();
    let guard = a.lock("inner").await.unwrap();
    let l = a.clone();
    // Built inside run("outer"), first polled once that run has released "outer".
    let later = a
        .lock("outer")
        .run(async {
            guard.scope(async move { l.try_lock("outer").await.map(|g| g.is_reentrant()) })
        })
        .await
        .unwrap();
    let seen = later.await;
    // "outer" is free now: taking it is a real (owned) acquisition, not a stale reentrant one.
    assert!(matches!(seen, Ok(false)), "{seen:?}");
    guard.release().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_guard_scope_still_carries_its_own_lock_into_a_spawned_task() {
    let (_backend, a, b) = pair();
    let guard = a.lock("k").await.unwrap();
    let l = a.clone();
    let inside = tokio::spawn(guard.scope(async move {
        let g = l.try_lock("k").await.unwrap();
        (g.is_reentrant(), current_lock().map(|i| i.key().to_owned()))
    }))
    .await
    .unwrap();
    assert_eq!(inside, (true, Some("k".to_owned())));
    assert!(matches!(b.try_lock("k").await, Err(LockError::Busy { .. })));
    guard.release().await.unwrap();
}

// ---- hole 2: every reentrant use ends when the outer lock ends, whatever the reason ----

/// Spawns, inside `guard`'s scope, a reentrant `run` of "k" whose body never ends by itself.
/// Returns the task, the signal that the body started, and whether the body got past an await.
fn spawn_reentrant_run(
    guard: &lock_core::LockGuard,
    locker: &Locker,
) -> (
    tokio::task::JoinHandle<Result<(), LockError>>,
    oneshot::Receiver<()>,
    Arc<AtomicBool>,
) {
    let (started_tx, started) = oneshot::channel();
    let escaped = Arc::new(AtomicBool::new(false));
    let flag = escaped.clone();
    let l = locker.clone();
    let task = tokio::spawn(guard.scope(async move {
        l.lock("k")
            .run(async move {
                started_tx.send(()).unwrap();
                std::future::pending::<()>().await;
                flag.store(true, Ordering::SeqCst);
            })
            .await
    }));
    (task, started, escaped)
}

#[tokio::test(start_paused = true)]
async fn a_reentrant_run_in_another_task_ends_when_the_outer_guard_is_released() {
    let (_backend, a, b) = pair();
    let guard = a.lock("k").await.unwrap();
    let (task, started, escaped) = spawn_reentrant_run(&guard, &a);
    started.await.unwrap();
    guard.release().await.unwrap();
    let released_at = Instant::now();
    // Someone else holds "k" now: the reentrant body must not go on.
    let other = b.try_lock("k").await.unwrap();
    let r = tokio::time::timeout(BOUND, task)
        .await
        .expect("the reentrant body kept running after the outer lock was released")
        .unwrap();
    assert!(matches!(r, Err(LockError::LeaseLost { .. })), "{r:?}");
    assert_eq!(released_at.elapsed(), Duration::ZERO, "ended by a signal");
    assert!(!escaped.load(Ordering::SeqCst));
    other.release().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_reentrant_run_in_another_task_ends_when_the_outer_guard_is_dropped() {
    let (_backend, a, b) = pair();
    let guard = a.lock("k").await.unwrap();
    let (task, started, escaped) = spawn_reentrant_run(&guard, &a);
    started.await.unwrap();
    drop(guard);
    let dropped_at = Instant::now();
    let r = tokio::time::timeout(BOUND, task)
        .await
        .expect("the reentrant body kept running after the outer guard was dropped")
        .unwrap();
    assert!(matches!(r, Err(LockError::LeaseLost { .. })), "{r:?}");
    assert_eq!(dropped_at.elapsed(), Duration::ZERO, "ended by a signal");
    assert!(!escaped.load(Ordering::SeqCst));
    // The drop's background release went through: another locker gets the key.
    let next = b.lock("k").wait(Duration::from_secs(1)).await.unwrap();
    next.release().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_reentrant_run_in_another_task_ends_when_the_outer_lease_runs_out() {
    let (_backend, a, _b) = pair();
    let lease = Duration::from_millis(300);
    let guard = a.lock("k").watchdog(false).lease(lease).await.unwrap();
    let (task, started, escaped) = spawn_reentrant_run(&guard, &a);
    started.await.unwrap();
    let start = Instant::now();
    let r = tokio::time::timeout(BOUND, task).await.unwrap().unwrap();
    assert!(matches!(r, Err(LockError::LeaseLost { .. })), "{r:?}");
    assert!(start.elapsed() <= lease, "{:?}", start.elapsed());
    assert!(!escaped.load(Ordering::SeqCst));
    drop(guard);
}

#[tokio::test(start_paused = true)]
async fn a_reentrant_guard_reports_lost_and_not_held_when_the_outer_guard_is_released() {
    let (_backend, a, b) = pair();
    let guard = a.lock("k").await.unwrap();
    let (ready_tx, ready) = oneshot::channel();
    let l = a.clone();
    let task = tokio::spawn(guard.scope(async move {
        let inner = l.lock("k").await.unwrap();
        assert!(inner.is_reentrant() && inner.is_held());
        ready_tx.send(()).unwrap();
        inner.lost().await;
        (inner.is_held(), inner.remaining())
    }));
    ready.await.unwrap();
    guard.release().await.unwrap();
    let released_at = Instant::now();
    let (held, remaining) = tokio::time::timeout(BOUND, task)
        .await
        .expect("a reentrant guard's lost() did not resolve when the outer lock was released")
        .unwrap();
    assert_eq!(
        released_at.elapsed(),
        Duration::ZERO,
        "resolved by a signal"
    );
    assert!(!held);
    assert_eq!(remaining, Duration::ZERO);
    let next = b.try_lock("k").await.unwrap();
    next.release().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn locking_again_inside_a_scope_whose_guard_was_released_is_refused() {
    let (_backend, a, _b) = pair();
    let guard = a.lock("k").await.unwrap();
    let (go_tx, go) = oneshot::channel::<()>();
    let l = a.clone();
    let task = tokio::spawn(guard.scope(async move {
        go.await.unwrap();
        l.try_lock("k").await.map(|g| g.is_reentrant())
    }));
    guard.release().await.unwrap();
    go_tx.send(()).unwrap();
    let r = task.await.unwrap();
    assert!(matches!(r, Err(LockError::LeaseLost { .. })), "{r:?}");
}

// ---- hole 3: `run` reports a final release that found the lock no longer ours ----

#[tokio::test(start_paused = true)]
async fn run_returns_lease_lost_when_its_final_release_finds_the_key_taken_by_another() {
    let (backend, a, b) = pair();
    let mut taken = None;
    let r = a
        .lock("k")
        .watchdog(false)
        .lease(Duration::from_secs(60))
        .run(async {
            // An operator's DEL (or a server that lost its data) and a new owner, unseen by the
            // holder: no watchdog, and the local validity deadline is far away.
            assert!(backend.force_delete("k"));
            taken = Some(b.try_lock("k").await.unwrap());
        })
        .await;
    assert!(matches!(r, Err(LockError::LeaseLost { .. })), "{r:?}");
    // The other owner's lock was not touched.
    let other = taken.unwrap();
    assert!(other.is_held());
    assert!(matches!(a.try_lock("k").await, Err(LockError::Busy { .. })));
    other.release().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn run_returns_lease_lost_when_its_final_release_finds_the_key_gone() {
    let (backend, a, _b) = pair();
    let r = a
        .lock("k")
        .watchdog(false)
        .lease(Duration::from_secs(60))
        .run(async {
            assert!(backend.force_delete("k"));
        })
        .await;
    assert!(matches!(r, Err(LockError::LeaseLost { .. })), "{r:?}");
}

/// A reentrant guard's release is never `Ok` for a lock known to be gone: the outer lock lost
/// (its key deleted and taken by another owner, the watchdog's renewal found it), or ended (the
/// outer `run` returned). Found by an outside audit: `Ok` while another owner held the key.
#[tokio::test(start_paused = true)]
async fn a_reentrant_release_after_the_outer_lock_ended_is_lease_lost() {
    let (backend, a, b) = pair();
    let outer = a.lock("k").await.unwrap();
    let inner = again(&outer, &a).await;
    assert!(backend.force_delete("k"));
    let taken = b.try_lock("k").await.unwrap();
    tokio::time::timeout(BOUND, outer.lost()).await.unwrap();
    let r = inner.release().await;
    assert!(matches!(r, Err(LockError::LeaseLost { .. })), "{r:?}");
    let r = outer.release().await;
    assert!(matches!(r, Err(LockError::LeaseLost { .. })), "{r:?}");
    assert!(taken.is_held(), "the other owner's lock was touched");
    taken.release().await.unwrap();

    // Ended: the reentrant guard outlives the `run` that held the lock.
    let inner = a
        .lock("j")
        .run({
            let a = a.clone();
            async move { a.lock("j").await.unwrap() }
        })
        .await
        .unwrap();
    assert!(inner.is_reentrant());
    let r = inner.release().await;
    assert!(matches!(r, Err(LockError::LeaseLost { .. })), "{r:?}");
    // While the outer lock is held, it is `Ok` (and the outer lock stays held).
    let outer = a.lock("m").await.unwrap();
    let inner = again(&outer, &a).await;
    inner.release().await.unwrap();
    assert!(outer.is_held());
    outer.release().await.unwrap();
}

/// The key of `outer`, locked again through `locker` inside its scope: a reentrant guard.
async fn again(outer: &LockGuard, locker: &Locker) -> LockGuard {
    let locker = locker.clone();
    let key = outer.key().to_owned();
    let inner = outer
        .scope(async move { locker.lock(key).await })
        .await
        .unwrap();
    assert!(inner.is_reentrant());
    inner
}

#[tokio::test(start_paused = true)]
async fn run_returns_the_body_output_when_its_final_release_is_clean() {
    let (_backend, a, b) = pair();
    let r = a.lock("k").run(async { 7 }).await;
    assert!(matches!(r, Ok(7)), "{r:?}");
    let next = b.try_lock("k").await.unwrap();
    next.release().await.unwrap();
}

/// A scoped future holds its body once: before its first poll as the body, after it inside the
/// task-local scope, never both. Holding both doubled the future at each nesting level, and
/// nested `#[distributed_lock]` calls overflowed the stack (tests/macro_redis.rs).
#[tokio::test]
async fn a_scoped_future_stores_its_body_once() {
    let locker = Locker::memory();
    let guard = locker.lock("k").await.expect("acquire");
    let body = async {
        let big = [7u8; 4096];
        tokio::task::yield_now().await;
        std::hint::black_box(&big);
    };
    let body_size = std::mem::size_of_val(&body);
    assert!(body_size >= 4096);
    let scoped = guard.scope(body);
    let scoped_size = std::mem::size_of_val(&scoped);
    assert!(
        scoped_size < body_size + 256,
        "a {body_size}-byte body makes a {scoped_size}-byte scoped future"
    );
    scoped.await;
    guard.release().await.expect("release");
}

/// `run` keeps its body on the heap, once: its future does not grow with the body, so nested
/// runs (reentrant `#[distributed_lock]` calls) cannot multiply their size level by level (they
/// overflowed the stack in tests/macro_redis.rs when each level held its body twice).
#[test]
fn a_run_future_does_not_grow_with_its_body() {
    let locker = Locker::memory();
    let body = async {
        let big = [7u8; 4096];
        tokio::task::yield_now().await;
        std::hint::black_box(&big);
    };
    assert!(std::mem::size_of_val(&body) >= 4096);
    let empty = std::mem::size_of_val(&locker.lock("k").run(async {}));
    let big = std::mem::size_of_val(&locker.lock("k").run(body));
    assert_eq!(big, empty, "a 4 KiB body makes the run future grow");
    let nested = locker.lock("k").run(locker.lock("k").run(async {}));
    // Only the wider output (a `Result` in a `Result`) may add a few bytes.
    let nested = std::mem::size_of_val(&nested);
    assert!(
        nested <= empty + 64,
        "a run inside a run: {nested} bytes, an empty run {empty}"
    );
}
