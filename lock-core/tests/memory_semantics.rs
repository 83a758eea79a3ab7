//! Holding and waiting semantics on the memory backend, on tokio's paused clock: virtual time
//! only moves when every task waits on a timer, so "woken without time passing" proves a
//! notification woke the waiter, and renewal counts are exact functions of virtual time.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use lock_core::{LockError, Locker, MemoryBackend};
use tokio::sync::{Barrier, Mutex};
use tokio::time::Instant;

fn pair() -> (MemoryBackend, Locker, Locker) {
    let backend = MemoryBackend::new();
    let a = Locker::builder(backend.clone()).build();
    let b = Locker::builder(backend.clone()).build();
    (backend, a, b)
}

#[tokio::test(start_paused = true)]
async fn watchdog_keeps_the_lock_past_many_leases_with_batched_renewals() {
    let (_backend, a, b) = pair();
    let lease = Duration::from_millis(300);
    let mut guards = Vec::new();
    for i in 0..100 {
        guards.push(a.lock(format!("k{i}")).lease(lease).await.unwrap());
    }
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let r = b.try_lock("k0").await;
        assert!(matches!(r, Err(LockError::Busy { .. })), "{r:?}");
    }
    assert!(guards.iter().all(|g| g.is_held()));
    let calls = a.stats().renewal_calls;
    // 3 s / (lease/3 = 100 ms) = 30 ticks for all 100 locks together, not 3,000.
    assert!((25..=40).contains(&calls), "renewal calls: {calls}");
    assert_eq!(a.stats().renewed_locks, 100);
    drop(guards);
    tokio::task::yield_now().await;
    assert_eq!(a.stats().renewed_locks, 0);
}

#[tokio::test(start_paused = true)]
async fn deleted_key_is_detected_within_a_renewal_period() {
    let (backend, a, b) = pair();
    let lease = Duration::from_millis(300);
    let guard = a.lock("job").lease(lease).await.unwrap();
    assert!(backend.force_delete("job"));
    let deleted_at = Instant::now();
    // Another owner takes it at once.
    let other = b.try_lock("job").await.unwrap();
    guard.lost().await;
    let delay = deleted_at.elapsed();
    assert!(delay <= lease / 3 + Duration::from_millis(1), "{delay:?}");
    assert!(!guard.is_held());
    assert_eq!(guard.remaining(), Duration::ZERO);
    // Releasing after the loss says so and leaves the new owner alone.
    assert!(matches!(
        guard.release().await,
        Err(LockError::LeaseLost { .. })
    ));
    assert!(other.is_held());
    assert!(matches!(
        a.try_lock("job").await,
        Err(LockError::Busy { .. })
    ));
    other.release().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn run_cancels_its_body_when_the_lease_is_lost() {
    let (backend, a, _b) = pair();
    let after_await = Arc::new(AtomicBool::new(false));
    let flag = after_await.clone();
    let started = Arc::new(tokio::sync::Notify::new());
    let started2 = started.clone();
    let run = tokio::spawn(async move {
        a.lock("job")
            .lease(Duration::from_millis(300))
            .run(async move {
                started2.notify_one();
                tokio::time::sleep(Duration::from_secs(3600)).await;
                flag.store(true, Ordering::SeqCst);
            })
            .await
    });
    started.notified().await;
    backend.force_delete("job");
    let r = run.await.unwrap();
    assert!(matches!(r, Err(LockError::LeaseLost { .. })), "{r:?}");
    assert!(!after_await.load(Ordering::SeqCst));
}

#[tokio::test(start_paused = true)]
async fn lease_without_watchdog_expires_and_frees_the_key() {
    let (_backend, a, b) = pair();
    let lease = Duration::from_millis(200);
    let guard = a.lock("k").lease(lease).watchdog(false).await.unwrap();
    let t0 = Instant::now();
    guard.lost().await;
    // Lost at the local validity deadline: lease minus the drift allowance (1 % + 2 ms).
    let at = t0.elapsed();
    assert!(
        at < lease && at >= lease - Duration::from_millis(5),
        "{at:?}"
    );
    tokio::time::sleep(lease - at).await;
    let g = b.try_lock("k").await.unwrap();
    assert!(matches!(
        guard.release().await,
        Err(LockError::LeaseLost { .. })
    ));
    assert!(g.is_held());
}

#[tokio::test(start_paused = true)]
async fn extend_moves_the_deadline_for_manual_holders() {
    let (_backend, a, b) = pair();
    let guard = a
        .lock("k")
        .lease(Duration::from_millis(200))
        .watchdog(false)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    guard.extend(Duration::from_millis(500)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(guard.is_held());
    assert!(b.try_lock("k").await.is_err());
    assert!(guard.extend(Duration::ZERO).await.is_err());
}

#[tokio::test(start_paused = true)]
async fn max_hold_cancels_run() {
    let a = Locker::memory();
    let t0 = Instant::now();
    let r = a
        .lock("k")
        .max_hold(Duration::from_millis(500))
        .run(tokio::time::sleep(Duration::from_secs(60)))
        .await;
    assert!(matches!(r, Err(LockError::MaxHoldExceeded { .. })), "{r:?}");
    assert_eq!(t0.elapsed(), Duration::from_millis(500));
    // Released afterwards.
    let _held = a.try_lock("k").await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn release_wakes_a_waiter_without_time_passing() {
    let (_backend, a, b) = pair();
    let guard = a.lock("hot").await.unwrap();
    let waiter = tokio::spawn(async move {
        let g = b.lock("hot").wait(Duration::from_secs(5)).await;
        (g, Instant::now())
    });
    // Let the waiter reach its wait (virtual time advances only when all tasks are idle).
    tokio::time::sleep(Duration::from_millis(10)).await;
    let released_at = Instant::now();
    guard.release().await.unwrap();
    let (g, acquired_at) = waiter.await.unwrap();
    let _held = g.unwrap();
    // A polling waiter would need virtual time to pass before its next attempt.
    assert_eq!(acquired_at, released_at);
}

#[tokio::test(start_paused = true)]
async fn expiry_without_release_wakes_the_waiter_when_the_lease_runs_out() {
    let (_backend, a, b) = pair();
    let lease = Duration::from_millis(400);
    let holder = a.lock("k").lease(lease).watchdog(false).await.unwrap();
    let t0 = Instant::now();
    let g = b.lock("k").wait(Duration::from_secs(10)).await.unwrap();
    let waited = t0.elapsed();
    assert!(
        waited >= lease && waited <= lease + Duration::from_millis(5),
        "{waited:?}"
    );
    drop((holder, g));
}

#[tokio::test(start_paused = true)]
async fn bounded_wait_times_out_at_its_bound() {
    let (_backend, a, b) = pair();
    let _g = a.lock("k").await.unwrap();
    let t0 = Instant::now();
    let r = b.lock("k").wait(Duration::from_millis(750)).await;
    assert!(matches!(r, Err(LockError::Timeout { .. })), "{r:?}");
    assert_eq!(t0.elapsed(), Duration::from_millis(750));
    assert_eq!(b.stats().waiters, 0);
}

#[tokio::test(start_paused = true)]
async fn local_queue_drains_in_arrival_order() {
    let a = Locker::memory();
    let first = a.lock("q").await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..200u32 {
        let waiter = a.clone();
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            waiter
                .lock("q")
                .run(async {
                    order.lock().await.push(i);
                })
                .await
                .unwrap();
        }));
        // Each waiter has joined the queue before the next one starts.
        while a.stats().waiters < i as usize + 1 {
            tokio::task::yield_now().await;
        }
    }
    assert_eq!(a.stats().waiters, 200);
    first.release().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    let order = order.lock().await.clone();
    assert_eq!(order, (0..200).collect::<Vec<_>>());
    assert_eq!(a.stats().waiting_keys, 0);
}

#[tokio::test(start_paused = true)]
async fn dropped_waiters_leave_no_queue_entries_or_listeners() {
    let (backend, a, b) = pair();
    let holder = a.lock("k").await.unwrap();
    let mut waiters = Vec::new();
    for _ in 0..100 {
        let b = b.clone();
        waiters.push(tokio::spawn(async move { b.lock("k").await }));
    }
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(b.stats().waiters, 100);
    assert_eq!(backend.listener_count(), 1);
    for w in &waiters {
        w.abort();
    }
    for w in waiters {
        assert!(w.await.unwrap_err().is_cancelled());
    }
    assert_eq!(b.stats().waiters, 0);
    assert_eq!(b.stats().waiting_keys, 0);
    // The emptied queue keeps its subscription a moment for the next waiter, then drops it.
    assert_eq!(backend.listener_count(), 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(backend.listener_count(), 0);
    // The lock is untouched and still works for the next waiter.
    assert!(holder.is_held());
    holder.release().await.unwrap();
    let _held = b.try_lock("k").await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn reentrant_inside_run_but_not_in_spawned_tasks() {
    let a = Locker::memory();
    let a2 = a.clone();
    let out = a
        .lock("k")
        .fenced()
        .run(async move {
            let outer_fence = lock_core::current_fence();
            // Same scope: immediate, same fence, released by the outer scope only.
            let inner = a2.lock("k").no_wait().await.unwrap();
            assert!(inner.is_reentrant());
            assert_eq!(inner.fence(), outer_fence);
            inner.release().await.unwrap();
            let nested = a2.lock("k").no_wait().run(async { 7 }).await.unwrap();
            // Outer lock is fenced, so asking for a fence again is fine...
            assert!(a2.lock("k").fenced().await.is_ok());
            assert!(a2.try_lock("k").await.unwrap().is_reentrant());
            // A spawned task is another owner.
            let a3 = a2.clone();
            let spawned = tokio::spawn(async move { a3.try_lock("k").await.map(drop) })
                .await
                .unwrap();
            assert!(matches!(spawned, Err(LockError::Busy { .. })));
            nested
        })
        .await
        .unwrap();
    assert_eq!(out, 7);
    // The outermost exit released it.
    let _held = a.try_lock("k").await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn reentrant_request_for_a_fence_the_scope_lacks_is_refused() {
    let a = Locker::memory();
    let a2 = a.clone();
    a.lock("k")
        .run(async move {
            let r = a2.lock("k").fenced().await;
            assert!(matches!(r, Err(LockError::InvalidConfig { .. })), "{r:?}");
            let r = a2.lock("k").fenced().run(async {}).await;
            assert!(matches!(r, Err(LockError::InvalidConfig { .. })), "{r:?}");
        })
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn fences_strictly_increase_across_release_and_expiry() {
    let (_backend, a, b) = pair();
    let mut last = 0;
    for i in 0..20 {
        let locker = if i % 2 == 0 { &a } else { &b };
        let g = locker
            .lock("f")
            .fenced()
            .lease(Duration::from_millis(50))
            .watchdog(false)
            .await
            .unwrap();
        let f = g.fence().unwrap();
        assert!(f > last, "{f} after {last}");
        last = f;
        if i % 3 == 0 {
            // Let it expire instead of releasing.
            tokio::time::sleep(Duration::from_millis(60)).await;
            drop(g);
        } else {
            g.release().await.unwrap();
        }
    }
}

#[tokio::test(start_paused = true)]
async fn fair_mode_serves_waiters_of_several_lockers_in_arrival_order() {
    let backend = MemoryBackend::new();
    let lockers: Vec<Locker> = (0..3)
        .map(|_| Locker::builder(backend.clone()).build())
        .collect();
    let holder = lockers[0].lock("fair").fair().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..5usize {
        let locker = lockers[i % 3].clone();
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let g = locker.lock("fair").fair().await.unwrap();
            order.lock().await.push(i);
            tokio::task::yield_now().await;
            g.release().await.unwrap();
        }));
        // Each waiter has joined the queue before the next arrives.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    holder.release().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock().await, vec![0, 1, 2, 3, 4]);
    assert_eq!(backend.listener_count(), 0);
}

#[tokio::test(start_paused = true)]
async fn fair_waiter_that_gives_up_hands_the_turn_on() {
    let (_backend, a, b) = pair();
    let holder = a.lock("k").fair().await.unwrap();
    let quitter = {
        let b = b.clone();
        tokio::spawn(async move { b.lock("k").fair().wait(Duration::from_millis(100)).await })
    };
    tokio::time::sleep(Duration::from_millis(1)).await;
    let patient = {
        let b = b.clone();
        tokio::spawn(async move { b.lock("k").fair().wait(Duration::from_secs(10)).await })
    };
    assert!(matches!(
        quitter.await.unwrap(),
        Err(LockError::Timeout { .. })
    ));
    let released_at = Instant::now();
    holder.release().await.unwrap();
    let g = patient.await.unwrap().unwrap();
    assert!(g.is_held());
    // Not held up by the quitter's ticket until it expired.
    assert!(released_at.elapsed() < Duration::from_millis(10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn non_atomic_counter_stays_exact_under_contention() {
    let a = Locker::memory();
    let counter = Arc::new(AtomicU32::new(0));
    let barrier = Arc::new(Barrier::new(8));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (a, counter, barrier) = (a.clone(), counter.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            for _ in 0..500 {
                a.lock("counter")
                    .run(async {
                        let v = counter.load(Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        counter.store(v + 1, Ordering::SeqCst);
                    })
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(counter.load(Ordering::SeqCst), 4000);
}

#[tokio::test(start_paused = true)]
async fn a_reentrant_run_inside_a_guard_scope_is_cancelled_on_loss() {
    let (backend, a, b) = pair();
    let guard = a
        .lock("stock:1")
        .lease(Duration::from_millis(300))
        .await
        .unwrap();
    let after_await = Arc::new(AtomicBool::new(false));
    let flag = after_await.clone();
    let inner = a.clone();
    let work = guard.scope(async move {
        inner
            .lock("stock:1")
            .run(async move {
                tokio::time::sleep(Duration::from_secs(10)).await;
                flag.store(true, Ordering::SeqCst);
            })
            .await
    });
    let thief = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        backend.force_delete("stock:1");
        b.try_lock("stock:1").await.unwrap()
    };
    let (result, _other) = tokio::join!(work, thief);
    assert!(
        matches!(result, Err(LockError::LeaseLost { .. })),
        "{result:?}"
    );
    assert!(!after_await.load(Ordering::SeqCst));
}

/// A lock passed on locally to a waiter that asked for a shorter lease: the waiter's renewals
/// shorten the lease in the backend, and the lock's local deadline must follow them down.
/// Once renewals stop (here `max_hold`), the backend frees the key and the guard no longer
/// says held: never two holders, one of them only believing it holds the lock.
#[tokio::test(start_paused = true)]
async fn a_lock_passed_locally_with_a_shorter_lease_is_not_reported_held_after_it_expired() {
    let (_backend, a, b) = pair();
    let holder = a.lock("k").lease(Duration::from_secs(3)).await.unwrap();
    let first = tokio::spawn({
        let a = a.clone();
        async move {
            a.lock("k")
                .lease(Duration::from_secs(3))
                .wait(Duration::from_secs(10))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    let waiter = tokio::spawn({
        let a = a.clone();
        async move {
            a.lock("k")
                .lease(Duration::from_millis(100))
                .max_hold(Duration::from_millis(1500))
                .wait(Duration::from_secs(10))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    holder.release().await.unwrap();
    let first = first.await.unwrap().unwrap();
    // Passed to the waiter within the locker, with the 3 s lease's deadline.
    first.release().await.unwrap();
    let guard = waiter.await.unwrap().unwrap();
    assert_eq!(a.stats().local_handoffs, 1);
    tokio::time::sleep(Duration::from_millis(1800)).await;
    let other = b.try_lock("k").await;
    assert!(
        !(other.is_ok() && guard.is_held()),
        "two holders: b acquired while a's guard says held for {:?} more",
        guard.remaining()
    );
}

/// A lock handed over by a release (with the short hand-over lease, 3 s) is renewed to its
/// full lease after 5 ms and within 100 ms (a thirtieth of the hand-over lease) of its arrival;
/// one released at once is never renewed.
#[tokio::test(start_paused = true)]
async fn a_hand_over_is_renewed_within_a_thirtieth_of_its_lease_unless_released_before() {
    let (_backend, a, b) = pair();
    for keep in [false, true] {
        let holder = a.lock("h").await.unwrap();
        let waiter = tokio::spawn({
            let b = b.clone();
            async move { b.lock("h").wait(Duration::from_secs(10)).await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        let calls = b.stats().renewal_calls;
        holder.release().await.unwrap();
        let guard = waiter.await.unwrap().unwrap();
        assert_eq!(b.stats().renewal_calls, calls, "renewed at once");
        if keep {
            tokio::time::sleep(Duration::from_millis(4)).await;
            assert_eq!(b.stats().renewal_calls, calls, "renewed within 5 ms");
            tokio::time::sleep(Duration::from_millis(97)).await;
            assert_eq!(b.stats().renewal_calls, calls + 1);
            assert!(
                guard.remaining() > Duration::from_secs(29),
                "{:?}",
                guard.remaining()
            );
        }
        guard.release().await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(b.stats().renewal_calls, calls + u64::from(keep));
    }
    assert_eq!(b.stats().handovers, 2);
}

/// One contended turn on "k": `a` holds, a task of `b` queues (with a subscription), `a`
/// releases, the waiter takes the lock and releases it: `b`'s queue empties.
#[allow(
    clippy::unwrap_used,
    reason = "test helper: a failed step fails the test"
)]
async fn contend(a: &Locker, b: &Locker) {
    let held = a.lock("k").await.unwrap();
    let waiter = tokio::spawn({
        let b = b.clone();
        async move { b.lock("k").await.unwrap().release().await.unwrap() }
    });
    // Paused clock: time moves only once every task waits, so the waiter has queued.
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(b.stats().waiters, 1);
    held.release().await.unwrap();
    waiter.await.unwrap();
}

/// A locker used from two runtimes, the first never driven again (found by review: the queue's
/// one sweeper sat there): the queue emptied on the running runtime still drops its
/// subscription once it has lingered.
#[test]
fn a_queue_used_on_a_running_runtime_drops_its_subscription_though_another_runtime_idles() {
    let (backend, a, b) = pair();
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap()
    };
    let idle = runtime();
    idle.block_on(contend(&a, &b));
    runtime().block_on(async {
        for _ in 0..3 {
            contend(&a, &b).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    });
    assert_eq!(
        backend.listener_count(),
        0,
        "b's queue kept its subscription 1 s after it last emptied"
    );
    drop(idle);
    assert_eq!(backend.listener_count(), 0);
}

/// The memory backend's `Debug` shows counts, never what its table holds (lock keys, tokens,
/// idempotency keys and stored results have no place in logs).
#[tokio::test(start_paused = true)]
async fn the_memory_backends_debug_shows_counts_not_contents() {
    let (backend, a, _) = pair();
    let guard = a.lock("secret-order-42").fenced().await.unwrap();
    guard
        .store_result("fingerprint-7", b"card 4242", Duration::from_secs(60))
        .await
        .unwrap();
    let shown = format!("{backend:?} {a:?}");
    for hidden in ["secret-order-42", "fingerprint-7", "card 4242", "4242"] {
        assert!(!shown.contains(hidden), "{hidden:?} in {shown}");
    }
    assert!(shown.contains("locks: 1"), "{shown}");
    guard.release().await.unwrap();
}

/// A dropped guard frees its key before the drop returns (no I/O to wait for): the same task's
/// next `try_lock` and another locker's find it free (found by an outside audit:
/// `drop(guard); try_lock` was `Busy` on a current-thread runtime).
#[test]
fn a_dropped_guard_frees_its_key_at_once() {
    let (_backend, a, b) = pair();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        for next in [&a, &b] {
            let guard = a.lock("dropped").await.unwrap();
            drop(guard);
            let again = next.try_lock("dropped").await.expect("free once dropped");
            again.release().await.unwrap();
        }
        // Reentrant: the inner guard's drop leaves the outer one's lock alone.
        a.lock("dropped")
            .run(async {
                drop(a.lock("dropped").await.unwrap());
                assert!(matches!(
                    b.try_lock("dropped").await,
                    Err(LockError::Busy { .. })
                ));
            })
            .await
            .unwrap();
    });
}

/// A lock request is a future itself, not only `IntoFuture`: it can be spawned, blocked on and
/// given to `timeout` as it is (found by an outside audit: `block_on(locker.lock(k))` and
/// `tokio::spawn(locker.lock(k))` did not compile). Its options count as set before the first
/// poll.
#[test]
fn a_lock_request_is_a_future() {
    fn spawnable<F: std::future::Future + Send + Unpin + 'static>(_: &F) {}
    let (_backend, a, b) = pair();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let held = runtime.block_on(a.lock("f").fenced()).unwrap();
    assert_eq!(held.fence(), Some(1));
    let request = b.lock("f").wait(Duration::from_secs(5));
    spawnable(&request);
    runtime.block_on(async {
        let waiter = tokio::spawn(request);
        let timed_out = tokio::time::timeout(Duration::from_millis(10), b.lock("f")).await;
        assert!(timed_out.is_err(), "held by a: the timeout ends the wait");
        held.release().await.unwrap();
        let guard = waiter
            .await
            .unwrap()
            .expect("the spawned request gets the lock");
        assert_eq!(guard.key(), "f");
        guard.release().await.unwrap();
    });
}

fn poll_once<F: std::future::Future + Unpin>(f: &mut F) -> std::task::Poll<F::Output> {
    std::pin::Pin::new(f).poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
}

/// A request polled once keeps its key, and what is set or done with it afterwards counts: an
/// option set then starts the acquisition again with it (a wait of 50 ms bounds the wait), and
/// `run` runs on the requested key, the acquisition in flight given up first (found by review:
/// the key was moved out at the first poll, a later `.wait()` was ignored, and `run` waited
/// behind the acquisition it had dropped).
#[tokio::test(start_paused = true)]
async fn a_request_polled_once_keeps_its_key_and_its_later_options() {
    fn sync<T: Sync>(_: &T) {}
    let (_backend, a, b) = pair();
    let held = a.lock("k").await.unwrap();
    let mut request = b.lock("k");
    sync(&request);
    assert!(poll_once(&mut request).is_pending());
    assert_eq!(request.key(), "k");
    let started = Instant::now();
    let bounded = request.wait(Duration::from_millis(50)).await;
    assert!(
        matches!(bounded, Err(LockError::Timeout { .. })),
        "{bounded:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(1));

    let mut request = b.lock("k").wait(Duration::from_secs(5));
    assert!(poll_once(&mut request).is_pending());
    let releasing = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        held.release().await.unwrap();
    };
    let (ran, ()) = tokio::join!(request.run(async { current_key() }), releasing);
    assert_eq!(ran.unwrap().as_deref(), Some("k"));
    assert_eq!(b.stats().waiters, 0);
}

fn current_key() -> Option<String> {
    lock_core::current_lock().map(|info| info.key().to_owned())
}

/// A guard dropped outside any runtime while a task of its locker waits for the key on a
/// runtime (found by review): no panic in `Drop`. The runtime is idle but alive, so the drop
/// sends its release there (the watchdog's runtime) and the waiter gets the lock; the case of
/// no runtime running at all is `held::tests::a_lock_dropped_outside_any_running_runtime_*`.
#[test]
fn a_guard_dropped_outside_a_runtime_with_a_local_waiter_does_not_panic() {
    let locker = Locker::memory();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (waiter, guard) = runtime.block_on(async {
        let first = locker.lock("k").watchdog(false).await.unwrap();
        let queued = |watchdog: bool| {
            let locker = locker.clone();
            tokio::spawn(async move {
                locker
                    .lock("k")
                    .watchdog(watchdog)
                    .lease(Duration::from_secs(1))
                    .wait(Duration::from_secs(10))
                    .await
            })
        };
        let next = queued(false);
        while locker.stats().waiters < 1 {
            tokio::task::yield_now().await;
        }
        let waiter = queued(true);
        while locker.stats().waiters < 2 {
            tokio::task::yield_now().await;
        }
        first.release().await.unwrap();
        (waiter, next.await.unwrap().unwrap())
    });
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(guard)));
    assert!(
        dropped.is_ok(),
        "dropping a guard outside a runtime panicked"
    );
    let got = runtime.block_on(async { waiter.await.unwrap() });
    assert!(got.is_ok(), "{got:?}");
}

/// A guard dropped by a thread-local's destructor after tokio's own thread-local context is
/// gone (the guard's thread-local was made first, so it is destroyed last), while its
/// locker's runtime runs: the process does not abort (entering a runtime from there panics,
/// and a panic in a thread-local destructor aborts; found by review), and the key is free
/// when its lease ends. Run in a child process of this test binary, which an abort would end.
#[test]
fn a_guard_dropped_by_a_thread_local_destructor_does_not_abort() {
    const CHILD: &str = "LOCK_CORE_TLS_DROP_CHILD";
    const NAME: &str = "a_guard_dropped_by_a_thread_local_destructor_does_not_abort";
    if std::env::var_os(CHILD).is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", NAME, "--test-threads=1"])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "the child ended with {:?}:\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    // The child.
    thread_local! {
        static KEPT: std::cell::RefCell<Option<lock_core::LockGuard>> =
            const { std::cell::RefCell::new(None) };
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let locker = Locker::builder(MemoryBackend::new())
        .lease(Duration::from_millis(300))
        .build();
    let guard = runtime.block_on(locker.lock("tls")).unwrap();
    std::thread::spawn(move || {
        // Made first: destroyed after tokio's context, made next.
        KEPT.with(|kept| *kept.borrow_mut() = Some(guard));
        assert!(tokio::runtime::Handle::try_current().is_err());
    })
    .join()
    .unwrap();
    let again = runtime.block_on(locker.lock("tls").wait(Duration::from_secs(10)));
    assert!(again.is_ok(), "{again:?}");
}
