//! The kit itself, through its public feature: the whole of it passes on the memory backend,
//! and it fails on a backend that breaks a guarantee (a release that ignores the owner token).

use std::sync::Arc;
use std::time::Duration;

use lock_core::backend::{
    Attempt, AttemptOptions, Backend, BoxFuture, Inbox, IntoBackend, LockKey, Marked, Renewal,
    Renewed, Token,
};
use lock_core::conformance::{Outcome, Suite};
use lock_core::{IdempotencyState, LockError, MemoryBackend};

/// The whole kit, as a user would run it (`Suite::run`: every check, local hand-off on then
/// off), on the memory backend, its own probe: nothing skipped, nothing failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_kit_passes_on_the_memory_backend() {
    let store = MemoryBackend::new();
    let handles = store.clone();
    let report = Suite::new(move || {
        let store = handles.clone();
        async move { Ok(store.into_backend()) }
    })
    .probe(store)
    .consecutive_fences(true)
    .run()
    .await;
    assert_eq!(report.passed().len(), 2 * Suite::checks().len());
    assert!(report.skipped().is_empty(), "{:?}", report.skipped());
}

/// The memory backend, but its release deletes the lock whoever holds it (the token ignored)
/// when `ignores_the_token` is set; it notes the shortest lease it was asked for.
#[derive(Debug, Clone, Default)]
struct Altered {
    store: MemoryBackend,
    ignores_the_token: bool,
    shortest_lease: Arc<std::sync::Mutex<Option<Duration>>>,
}

impl Altered {
    fn ignoring_the_token() -> Self {
        Altered {
            ignores_the_token: true,
            ..Altered::default()
        }
    }

    fn asked_for(&self, lease: Duration) {
        let mut shortest = self.shortest_lease.lock().expect("not poisoned");
        *shortest = Some(shortest.map_or(lease, |s| s.min(lease)));
    }
}

impl Backend for Altered {
    fn acquire<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        lease: Duration,
        options: AttemptOptions<'a>,
    ) -> BoxFuture<'a, Result<Attempt, LockError>> {
        self.asked_for(lease);
        self.store.acquire(key, token, lease, options)
    }
    fn release<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<bool, LockError>> {
        if !self.ignores_the_token {
            return self.store.release(key, token);
        }
        Box::pin(async move { Ok(self.store.force_delete(key.user())) })
    }
    fn renew<'a>(&'a self, items: &'a [Renewal]) -> BoxFuture<'a, Result<Vec<Renewed>, LockError>> {
        for item in items {
            self.asked_for(item.lease);
        }
        self.store.renew(items)
    }
    fn subscribe<'a>(&'a self, key: &'a LockKey, inbox: &'a Arc<Inbox>) -> BoxFuture<'a, bool> {
        self.store.subscribe(key, inbox)
    }
    fn unsubscribe(&self, key: &LockKey, inbox: &Arc<Inbox>) {
        self.store.unsubscribe(key, inbox);
    }
    fn store_result<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        fingerprint: &'a str,
        result: &'a [u8],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, LockError>> {
        self.store
            .store_result(key, token, fingerprint, result, ttl)
    }
    fn mark_started<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        mark: &'a Token,
        fingerprint: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Marked, LockError>> {
        self.store.mark_started(key, token, mark, fingerprint, ttl)
    }
    fn clear_started<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        mark: &'a Token,
    ) -> BoxFuture<'a, Result<bool, LockError>> {
        self.store.clear_started(key, token, mark)
    }
    fn idempotency_state<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<IdempotencyState, LockError>> {
        self.store.idempotency_state(key)
    }
}

/// The kit on a backend that ignores the token ([`Altered`]), running `check` on a thread and runtime of its own: the
/// panic's message, if it failed.
fn broken(check: &'static str) -> Option<String> {
    std::thread::spawn(move || {
        let store = Altered::ignoring_the_token();
        let handles = store.clone();
        let suite = Suite::new(move || {
            let store = handles.clone();
            async move { Ok(store.into_backend()) }
        })
        .probe(store.store);
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(suite.run_check(check))
    })
    .join()
    .err()
    .map(|e| {
        e.downcast_ref::<String>()
            .cloned()
            .unwrap_or_else(|| "a panic without a message".to_owned())
    })
}

/// A release that ignores the token deletes the lock another owner took after ours expired or
/// after ours was deleted: the kit fails, naming each check that saw it.
#[test]
fn the_kit_catches_a_release_that_ignores_the_token() {
    // (`release_after_expiry_says_lease_lost` passes on it: the guard knows locally its lease
    // ran out, and the engine answers without asking the backend.)
    let caught: Vec<(&str, Option<String>)> = [
        "release_after_expiry_leaves_the_new_holder_alone",
        "release_by_a_usurped_guard_says_lease_lost",
        "usurped_guard_leaves_the_new_holder_alone",
    ]
    .into_iter()
    .map(|check| (check, broken(check)))
    .collect();
    for (check, failure) in caught {
        let failure = failure.unwrap_or_else(|| panic!("{check} passed on a broken backend"));
        assert!(
            failure.contains(&format!("conformance check {check} failed")),
            "{failure}"
        );
    }
    // The checks that do not involve a stale release still pass on it.
    assert_eq!(broken("empty_key_is_invalid_key"), None);
}

/// What a backend refuses is checked, not skipped: on a backend that keeps the trait's
/// default (`refuses` turns fencing and fair waiting down), their checks check the refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_capability_checks_the_refusal() {
    let suite = Suite::new(|| async { Ok(Altered::default().into_backend()) });
    // Altered keeps the trait's default: fencing and fair waiting refused.
    assert_eq!(
        suite.run_check("fences_rise_across_release").await,
        Outcome::Refused
    );
    // Checked even though, without a probe, the check itself would be skipped.
    assert_eq!(
        suite.run_check("fair_waiter_gets_the_released_lock").await,
        Outcome::Refused
    );
    assert_eq!(
        suite
            .run_check("timed_out_waiter_leaves_the_backend_queue")
            .await,
        Outcome::Skipped("needs a Probe")
    );
}

/// On a backend with a lease floor (`min_lease`), the checks that watch a short lease run out
/// or be renewed are not skipped: they ask for the floor instead (never less), scale their waits
/// and pass; [`Suite::run`] runs them together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_floor_scales_the_short_lease_checks() {
    let store = Altered::default();
    let handles = store.clone();
    let floor = Duration::from_secs(1);
    let report = Suite::new(move || {
        let store = handles.clone();
        async move { Ok(store.into_backend()) }
    })
    .probe(store.store.clone())
    .min_lease(floor)
    .only("expir")
    .run()
    .await;
    assert!(report.skipped().is_empty(), "{:?}", report.skipped());
    let ran: Vec<&str> = report.passed();
    for check in [
        "lease::expired_lease_frees_the_key",
        "lease::expiring_key_is_not_free_before_the_lease_runs_out (local hand-off off)",
        "acquire::release_after_expiry_says_lease_lost",
    ] {
        assert!(ran.contains(&check), "{check} did not run: {ran:?}");
    }
    let shortest = *store.shortest_lease.lock().expect("not poisoned");
    assert_eq!(
        shortest,
        Some(floor),
        "no lease below the floor, and the floor used"
    );
}
