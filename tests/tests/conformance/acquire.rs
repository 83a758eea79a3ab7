//! Acquiring and releasing: one holder at a time, releases that only touch their own lock,
//! the counter stress that would lose updates without the lock, reentrancy inside `run`, and
//! a dropped guard released in the background.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lock_core::{DEFAULT_LEASE, LockError, current_lock};

use crate::fixture::{Fixture, SOON, assert_busy, soon};

/// One holder at a time: a second owner (another locker, or the same locker outside a `run`
/// scope) is refused while the lock is held, gets it after the release, other keys are
/// independent, and of 16 tasks racing for a fresh key exactly one wins.
async fn exclusive_acquisition(fx: Fixture) {
    let a = fx.locker().await;
    let b = fx.locker().await;
    let guard = a.lock("order:42").await.expect("first acquire");
    assert!(guard.is_held());
    assert_eq!(guard.key(), "order:42");
    assert!(!guard.is_reentrant());
    if let Some(stored) = fx.stored("order:42").await {
        let token = stored
            .token
            .clone()
            .expect("the lock key exists while held");
        assert_eq!(token.len(), 32);
        assert!(stored.pttl > 0 && stored.pttl <= 30_000, "{stored:?}");
    }
    assert_busy(b.try_lock("order:42").await, "order:42");
    // Reentrancy is scoped to `run`: a plain second acquire by the same locker is refused too.
    assert_busy(a.try_lock("order:42").await, "order:42");
    let other = b
        .try_lock("order:43")
        .await
        .expect("another key is independent");
    other.release().await.expect("release other key");
    guard.release().await.expect("release while held");
    assert_eq!(fx.stored("order:42").await.and_then(|s| s.token), None);
    let again = b.try_lock("order:42").await.expect("free after release");
    again.release().await.expect("release");

    // A race on a fresh key: exactly one of 16 simultaneous attempts from 4 lockers wins.
    let mut lockers = vec![a, b];
    for _ in 0..2 {
        lockers.push(fx.locker().await);
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(16));
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let locker = lockers[i % lockers.len()].clone();
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                match locker.try_lock("race").await {
                    Ok(guard) => Some(guard),
                    Err(LockError::Busy { .. }) => None,
                    Err(e) => panic!("race attempt failed: {e}"),
                }
            })
        })
        .collect();
    let mut winners = Vec::new();
    for t in tasks {
        if let Some(g) = t.await.expect("race task") {
            winners.push(g);
        }
    }
    assert_eq!(winners.len(), 1, "exactly one racer must win");
}

/// `try_lock` (and `no_wait`, and a zero wait) on a held key is `Busy` at once, carries the key
/// and a retry hint no longer than the holder's lease, and `run` never runs its body then.
async fn try_lock_on_held_key_is_busy(fx: Fixture) {
    let a = fx.locker().await;
    let b = fx.locker().await;
    let lease = Duration::from_secs(10);
    let _held = a.lock("busy").lease(lease).await.expect("acquire");
    match b.try_lock("busy").await {
        Err(e @ LockError::Busy { .. }) => {
            assert!(e.is_retryable());
            assert_eq!(e.key(), Some("busy"));
            assert!(e.to_string().contains("busy"));
            let LockError::Busy { retry_after, .. } = e else {
                unreachable!()
            };
            let hint = retry_after.expect("the backend reports the holder's remaining lease");
            assert!(hint > Duration::ZERO && hint <= lease, "{hint:?}");
        }
        other => panic!("expected Busy, got {other:?}"),
    }
    assert_busy(b.lock("busy").no_wait().await, "busy");
    assert_busy(b.lock("busy").wait(Duration::ZERO).await, "busy");
    let ran = AtomicUsize::new(0);
    let r = b
        .try_lock("busy")
        .run(async {
            ran.fetch_add(1, Ordering::SeqCst);
        })
        .await;
    assert_busy(r, "busy");
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "the body must not run without the lock"
    );
}

/// A guard whose lock was lost (expired, or deleted and retaken) cannot release or extend the
/// new holder's lock: its release says `LeaseLost` and the new holder's key keeps its token and
/// its TTL (read directly on Redis; on memory the new holder still holds and still excludes).
async fn stale_release_does_not_touch_the_new_holder(fx: Fixture) {
    let a = fx.locker().await;
    let b = fx.locker().await;
    let c = fx.locker().await;

    // 1. Lost by expiry: the local deadline passes, the key expires, b takes it.
    let stale = a
        .lock("stale")
        .lease(Duration::from_millis(150))
        .watchdog(false)
        .await
        .expect("acquire");
    soon("lost() after expiry", stale.lost()).await;
    assert!(!stale.is_held());
    let fresh = b
        .lock("stale")
        .lease(Duration::from_secs(30))
        .wait(SOON)
        .await
        .expect("b takes the expired lock");
    let before = fx.stored("stale").await;
    match stale.release().await {
        Err(LockError::LeaseLost { key, .. }) => assert_eq!(key, "stale"),
        other => panic!("stale release must say LeaseLost, got {other:?}"),
    }
    assert!(fresh.is_held());
    assert_busy(c.try_lock("stale").await, "stale");
    if let (Some(before), Some(after)) = (before, fx.stored("stale").await) {
        assert!(before.token.is_some());
        assert_eq!(
            after.token, before.token,
            "the new holder's token was touched"
        );
        assert!(after.pttl > 25_000 && after.pttl <= 30_000, "{after:?}");
    }
    fresh.release().await.expect("release fresh");

    // 2. Lost behind the guard's back while it still believes it holds: the key is deleted
    //    and taken by b. Only the backend's token check can protect b now.
    let unaware = a.lock("taken").await.expect("acquire");
    fx.force_delete("taken").await;
    let thief = b
        .lock("taken")
        .lease(Duration::from_secs(20))
        .await
        .expect("b takes the deleted lock");
    let before = fx.stored("taken").await;
    assert!(unaware.is_held(), "locally it cannot know yet");
    match unaware.extend(Duration::from_secs(60)).await {
        Err(LockError::LeaseLost { .. }) => {}
        other => panic!("extend by a non-owner must say LeaseLost, got {other:?}"),
    }
    match unaware.release().await {
        Err(LockError::LeaseLost { .. }) => {}
        other => panic!("release by a non-owner must say LeaseLost, got {other:?}"),
    }
    assert!(thief.is_held());
    assert_busy(c.try_lock("taken").await, "taken");
    if let (Some(before), Some(after)) = (before, fx.stored("taken").await) {
        assert!(before.token.is_some());
        assert_eq!(
            after.token, before.token,
            "the new holder's token was touched"
        );
        // Not extended to the stale guard's 60 s: still within b's own 20 s lease.
        assert!(after.pttl > 0 && after.pttl <= 20_000, "{after:?}");
    }
    thief.release().await.expect("release thief");
}

/// 8 tasks x 500 iterations (through 4 lockers sharing the store) of a non-atomic
/// read-modify-write under the lock: the counter ends exact and no two bodies ever overlap.
async fn stress_counter_ends_exact(fx: Fixture) {
    const TASKS: usize = 8;
    const ITERATIONS: u64 = 500;
    const LOCKERS: usize = 4;
    let mut lockers = Vec::new();
    for _ in 0..LOCKERS {
        lockers.push(fx.locker().await);
    }
    let counter = fx.counter("stress:counter").await;
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|i| {
            let locker = lockers[i % LOCKERS].clone();
            let mut counter = counter.clone();
            let inside = inside.clone();
            let overlaps = overlaps.clone();
            tokio::spawn(async move {
                for _ in 0..ITERATIONS {
                    locker
                        .lock("stress")
                        .wait(Duration::from_secs(60))
                        .run(async {
                            if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                                overlaps.fetch_add(1, Ordering::SeqCst);
                            }
                            counter.increment().await;
                            inside.fetch_sub(1, Ordering::SeqCst);
                        })
                        .await
                        .unwrap_or_else(|e| panic!("locked increment failed: {e}"));
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("stress task");
    }
    let elapsed = start.elapsed();
    let total = TASKS as u64 * ITERATIONS;
    let last = counter.clone().read().await;
    println!(
        "[{}] in-process stress: {TASKS} tasks x {ITERATIONS} iterations via {LOCKERS} lockers on one key = {total} locked read-modify-writes; final count {last}; overlapping bodies {}; {elapsed:.2?}",
        fx.name(),
        overlaps.load(Ordering::SeqCst)
    );
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two bodies ran at once");
    assert_eq!(last, total, "lost updates under the lock");
    assert!(fx.stored("stress").await.is_none_or(|s| s.token.is_none()));
}

/// The control for the stress: the same read-modify-write without the lock loses updates, so
/// the stress above can fail.
async fn unlocked_counter_loses_updates(fx: Fixture) {
    const TASKS: usize = 8;
    const ITERATIONS: u64 = 200;
    let counter = fx.counter("control:counter").await;
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let mut counter = counter.clone();
            tokio::spawn(async move {
                for _ in 0..ITERATIONS {
                    counter.increment().await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("control task");
    }
    let total = TASKS as u64 * ITERATIONS;
    let last = counter.clone().read().await;
    println!(
        "[{}] control without lock: {TASKS} tasks x {ITERATIONS} = {total} read-modify-writes; final count {last} ({} updates lost)",
        fx.name(),
        total - last
    );
    assert!(last < total, "without a lock some updates must be lost");
}

/// Inside `run`, locking the same key through the same locker (or a clone) is reentrant:
/// guards are marked reentrant, their release does nothing, nested runs work, and the lock is
/// released only when the outermost run ends. A spawned task and another locker are not inside
/// the scope and are refused.
async fn reentrancy_inside_run(fx: Fixture) {
    let a = fx.locker().await;
    let other = fx.locker().await;
    assert!(current_lock().is_none());
    let inner_locker = a.clone();
    let out = a
        .lock("reentrant")
        .run(async {
            let l = &inner_locker;
            let info = current_lock().expect("inside run");
            assert_eq!(info.key(), "reentrant");
            let again = l
                .lock("reentrant")
                .wait(Duration::ZERO)
                .await
                .expect("reentrant lock");
            assert!(again.is_reentrant());
            assert_eq!(again.key(), "reentrant");
            let twice = l.try_lock("reentrant").await.expect("reentrant try_lock");
            assert!(twice.is_reentrant());
            twice.release().await.expect("reentrant release is a no-op");
            drop(again);
            assert_busy(other.try_lock("reentrant").await, "reentrant");
            let nested = l
                .lock("reentrant")
                .run(async { current_lock().map(|i| i.key().to_owned()) })
                .await
                .expect("nested run");
            assert_eq!(nested.as_deref(), Some("reentrant"));
            assert_busy(other.try_lock("reentrant").await, "reentrant");
            // A spawned task does not inherit the scope: it contends like anyone else.
            let spawned = l.clone();
            let r = tokio::spawn(async move { spawned.try_lock("reentrant").await.map(drop) })
                .await
                .expect("spawned task");
            assert_busy(r, "reentrant");
            // A different key inside the scope is an ordinary lock.
            let g = l.try_lock("reentrant-other").await.expect("other key");
            assert!(!g.is_reentrant());
            g.release().await.expect("release other key");
            7
        })
        .await
        .expect("outer run");
    assert_eq!(out, 7);
    assert!(current_lock().is_none());
    let after = other
        .try_lock("reentrant")
        .await
        .expect("released when the outermost run ended");
    after.release().await.expect("release");
}

/// Dropping a guard releases the lock in the background: another locker gets it long before
/// the 30 s lease would have freed it. Aborting a task inside `run` does the same, and a
/// cancelled waiter leaves the queue.
async fn dropped_guard_is_released_in_background(fx: Fixture) {
    let a = fx.locker().await;
    let b = fx.locker().await;
    let guard = a
        .lock("dropped")
        .lease(DEFAULT_LEASE)
        .await
        .expect("acquire");
    drop(guard);
    // A wait of 10 s, shorter than the 30 s lease: only the background release can free it.
    let g = b
        .lock("dropped")
        .wait(SOON)
        .await
        .expect("a dropped guard is released in the background");
    g.release().await.expect("release");

    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let runner = a.clone();
    let task = tokio::spawn(async move {
        runner
            .lock("aborted")
            .lease(DEFAULT_LEASE)
            .run(async move {
                let _ = started_tx.send(());
                std::future::pending::<()>().await;
            })
            .await
    });
    soon("run body starts", started_rx)
        .await
        .expect("body started");
    assert_busy(b.try_lock("aborted").await, "aborted");
    task.abort();
    assert!(task.await.is_err_and(|e| e.is_cancelled()));
    let g = b
        .lock("aborted")
        .wait(SOON)
        .await
        .expect("an aborted run releases its lock in the background");
    g.release().await.expect("release");

    let holder = a.lock("queued").await.expect("acquire");
    let cancelled = tokio::time::timeout(
        Duration::from_millis(100),
        b.lock("queued").wait(SOON).into_future(),
    )
    .await;
    assert!(cancelled.is_err(), "the waiter was cancelled while waiting");
    assert_eq!(b.stats().waiters, 0, "a cancelled waiter leaves the queue");
    holder.release().await.expect("release");
    // The release may hand the lock to the cancelled waiter's ticket if its cleanup (sent in
    // the background) has not reached the backend yet; the cleanup then passes it on.
    b.lock("queued")
        .wait(SOON)
        .await
        .expect("free after release and the cancelled waiter's cleanup")
        .release()
        .await
        .expect("release");
}

conformance!(
    exclusive_acquisition,
    try_lock_on_held_key_is_busy,
    stale_release_does_not_touch_the_new_holder,
    stress_counter_ends_exact,
    unlocked_counter_loses_updates,
    reentrancy_inside_run,
    dropped_guard_is_released_in_background,
);
