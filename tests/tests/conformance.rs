//! The conformance suite: one set of tests, generic over the backend, run against the memory
//! backend and a real redis-server (`on_memory::*`, `on_redis::*`), plus the checks that only
//! make sense on Redis (`redis_only::*`: URLs, ACL, connection failures, several OS processes).
//!
//! Where a test reads the backend directly it does so with the harness's own client (GET, PTTL,
//! CLUSTER KEYSLOT), never through lock-core. Durations in assertions are bounds on
//! correctness (not freed before the lease ran out, not timed out before the wait elapsed) or
//! generous hang guards; none claims speed.

#![allow(
    clippy::panic,
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::print_stdout,
    reason = "a test file: its helpers outside #[test] functions assert by panicking and report figures"
)]

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lock_core::{
    Backend, DEFAULT_LEASE, LockError, Locker, LockerBuilder, MAX_KEY_LEN, MAX_LEASE,
    MAX_PREFIX_LEN, MAX_WAIT, MIN_LEASE, MemoryBackend, RedisBackend, current_fence, current_lock,
};
use lock_testkit::RedisServer;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use sha2::{Digest, Sha256};

/// A hang guard for things expected to happen "soon": generous, never a speed claim.
const SOON: Duration = Duration::from_secs(10);

/// The backend under test.
enum Fixture {
    Memory(MemoryBackend),
    Redis(RedisServer),
}

impl Fixture {
    fn memory() -> Self {
        Fixture::Memory(MemoryBackend::new())
    }

    fn redis() -> Self {
        Fixture::Redis(RedisServer::start())
    }

    fn name(&self) -> &'static str {
        match self {
            Fixture::Memory(_) => "memory",
            Fixture::Redis(_) => "redis",
        }
    }

    /// A new handle on the same store: lockers built on it contend like separate processes.
    async fn backend(&self) -> Backend {
        match self {
            Fixture::Memory(m) => Backend::from(m.clone()),
            Fixture::Redis(s) => RedisBackend::connect(&s.url())
                .await
                .unwrap_or_else(|e| panic!("connect to {}: {e}", s.url()))
                .into(),
        }
    }

    async fn builder(&self) -> LockerBuilder {
        Locker::builder(self.backend().await)
    }

    async fn locker(&self) -> Locker {
        self.builder().await.build()
    }

    /// What the backend stores for `key` (default prefix), read without lock-core: the token and
    /// the PTTL. `None` for the memory backend, whose tokens cannot be read from outside.
    async fn stored(&self, key: &str) -> Option<Stored> {
        let Fixture::Redis(server) = self else {
            return None;
        };
        let name = lock_name("lock:", key);
        let token = server.get(&name).await;
        let pttl = server.pttl(&name).await;
        Some(Stored { token, pttl })
    }

    /// How many waiters queue for `key` (default prefix) in the backend.
    async fn queued(&self, key: &str) -> usize {
        match self {
            Fixture::Memory(m) => m.queued(key),
            Fixture::Redis(s) => {
                let len: i64 = s
                    .query(
                        redis::cmd("HLEN")
                            .arg(format!("{}:waiters", lock_name("lock:", key)))
                            .clone(),
                    )
                    .await;
                usize::try_from(len).unwrap_or(0)
            }
        }
    }

    /// Waits until `n` waiters queue for `key` in the backend (polled: nothing signals it).
    async fn until_queued(&self, key: &str, n: usize) {
        let deadline = Instant::now() + SOON;
        while self.queued(key).await != n {
            assert!(
                Instant::now() < deadline,
                "{}: {n} waiter(s) never queued for {key:?}",
                self.name()
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Deletes the lock whoever holds it, as an operator's DEL would.
    async fn force_delete(&self, key: &str) {
        let deleted = match self {
            Fixture::Memory(m) => m.force_delete(key),
            Fixture::Redis(s) => s.del(&lock_name("lock:", key)).await == 1,
        };
        assert!(deleted, "{}: no lock to delete for {key:?}", self.name());
    }

    /// Whether the backend holds nothing at all (no lock, no counter, nothing).
    async fn is_empty(&self) -> bool {
        match self {
            Fixture::Memory(m) => m.is_empty(),
            Fixture::Redis(s) => s.dbsize().await == 0,
        }
    }

    /// A shared counter for the read-modify-write stress: in Redis (GET/SET) or in memory.
    async fn counter(&self, name: &str) -> Counter {
        match self {
            Fixture::Memory(_) => Counter::Memory(Arc::new(AtomicU64::new(0))),
            Fixture::Redis(s) => Counter::Redis(s.client().await, name.to_owned()),
        }
    }
}

#[derive(Debug)]
struct Stored {
    token: Option<String>,
    pttl: i64,
}

/// A counter incremented by a deliberately non-atomic read, yield, write.
#[derive(Clone)]
enum Counter {
    Memory(Arc<AtomicU64>),
    Redis(MultiplexedConnection, String),
}

impl Counter {
    async fn read(&mut self) -> u64 {
        match self {
            Counter::Memory(c) => c.load(Ordering::SeqCst),
            Counter::Redis(conn, key) => {
                let v: Option<u64> = conn.get(&*key).await.expect("GET counter");
                v.unwrap_or(0)
            }
        }
    }

    async fn write(&mut self, value: u64) {
        match self {
            Counter::Memory(c) => c.store(value, Ordering::SeqCst),
            Counter::Redis(conn, key) => {
                let () = conn.set(&*key, value).await.expect("SET counter");
            }
        }
    }

    /// The non-atomic increment: a lost update whenever two of these overlap.
    async fn increment(&mut self) {
        let v = self.read().await;
        tokio::task::yield_now().await;
        self.write(v + 1).await;
    }
}

/// The Redis name of a lock, computed here from the documented layout (not by lock-core):
/// `{prefix}{<key>}` for a key without braces, else `{prefix}{#<16 hex of sha256>}<key>`.
fn lock_name(prefix: &str, key: &str) -> String {
    if key.contains(['{', '}']) {
        let digest = Sha256::digest(key.as_bytes());
        let tag: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        format!("{prefix}{{#{tag}}}{key}")
    } else {
        format!("{prefix}{{{key}}}")
    }
}

/// Whether `s` holds a run of at least `n` lowercase hex digits (what a token looks like).
fn has_hex_run(s: &str, n: usize) -> bool {
    let mut run = 0;
    for c in s.chars() {
        if c.is_ascii_digit() || ('a'..='f').contains(&c) {
            run += 1;
            if run >= n {
                return true;
            }
        } else {
            run = 0;
        }
    }
    false
}

async fn soon<F: Future>(what: &str, fut: F) -> F::Output {
    tokio::time::timeout(SOON, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: not done within {SOON:?}"))
}

#[track_caller]
fn assert_busy<T: std::fmt::Debug>(r: Result<T, LockError>, key: &str) {
    match r {
        Err(LockError::Busy { key: k, .. }) => assert_eq!(k, key),
        other => panic!("expected Busy for {key:?}, got {other:?}"),
    }
}

#[track_caller]
fn assert_invalid_key<T: std::fmt::Debug>(r: Result<T, LockError>) {
    match r {
        Err(LockError::InvalidKey { reason, .. }) => assert!(!reason.is_empty()),
        other => panic!("expected InvalidKey, got {other:?}"),
    }
}

#[track_caller]
fn assert_invalid_config<T: std::fmt::Debug>(r: Result<T, LockError>, what: &str) {
    match r {
        Err(LockError::InvalidConfig { what: w }) => assert!(!w.is_empty()),
        other => panic!("{what}: expected InvalidConfig, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// The suite. Each function runs once per backend (see `conformance!` at the end).
// ---------------------------------------------------------------------------------------------

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
        Err(LockError::LeaseLost { key }) => assert_eq!(key, "stale"),
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

/// Without renewal a lock lasts one lease: then the key is free for others (not before), the
/// old guard reports the loss, and its release is `LeaseLost`.
async fn lease_expiry_frees_the_key(fx: Fixture) {
    let a = fx.locker().await;
    let b = fx.locker().await;
    let lease = Duration::from_millis(200);
    let t0 = Instant::now();
    let first = a
        .lock("expiring")
        .lease(lease)
        .watchdog(false)
        .await
        .expect("acquire");
    assert_eq!(a.stats().renewed_locks, 0, "watchdog(false) renews nothing");
    let first_token = fx.stored("expiring").await.and_then(|s| s.token);
    let second = b
        .lock("expiring")
        .wait(SOON)
        .await
        .expect("an expired lease frees the key");
    // Correctness bound, not speed: the key was not free before the lease ran out (10 ms of
    // slack for the millisecond clocks of the backends).
    assert!(
        t0.elapsed() + Duration::from_millis(10) >= lease,
        "freed after {:?}, before the {lease:?} lease ran out",
        t0.elapsed()
    );
    assert!(!first.is_held());
    assert_eq!(first.remaining(), Duration::ZERO);
    soon("lost() after expiry", first.lost()).await;
    if let Some(now) = fx.stored("expiring").await {
        assert!(first_token.is_some());
        assert_ne!(
            now.token, first_token,
            "the key now holds the second owner's token"
        );
        assert!(now.pttl > 0);
    }
    assert!(matches!(
        first.release().await,
        Err(LockError::LeaseLost { .. })
    ));
    assert!(second.is_held());
    second.release().await.expect("release");
}

/// With the watchdog on, a short lease is renewed and the lock outlives it many times over.
async fn watchdog_keeps_a_short_lease_alive(fx: Fixture) {
    let a = fx.locker().await;
    let b = fx.locker().await;
    let lease = Duration::from_millis(600);
    let guard = a.lock("renewed").lease(lease).await.expect("acquire");
    let wait = Duration::from_millis(1_500);
    match b.lock("renewed").wait(wait).await {
        Err(LockError::Timeout { .. }) => {}
        other => panic!("a renewed lock must stay held past 2.5 leases, got {other:?}"),
    }
    assert!(guard.is_held());
    let stats = a.stats();
    assert_eq!(stats.renewed_locks, 1);
    assert!(stats.renewal_calls >= 2, "{stats:?}");
    if let Some(s) = fx.stored("renewed").await {
        assert!(s.pttl > 0 && s.pttl <= 600, "{s:?}");
    }
    guard.release().await.expect("release");
    assert_eq!(a.stats().renewed_locks, 0);
}

/// A bounded wait on a held key ends in `Timeout`, not before the wait elapsed and within a
/// generous bound after it; also for a second waiter queued behind the first, and for the
/// locker's default wait. The holder is unaffected and the wait queue is empty afterwards.
async fn bounded_wait_returns_timeout(fx: Fixture) {
    let a = fx.locker().await;
    let b = fx.builder().await.wait(Duration::from_millis(250)).build();
    let holder = a
        .lock("waited")
        .lease(Duration::from_secs(30))
        .await
        .expect("acquire");

    async fn timed(
        r: impl Future<Output = Result<lock_core::LockGuard, LockError>>,
        wait: Duration,
    ) {
        let start = Instant::now();
        let result = r.await;
        let elapsed = start.elapsed();
        match result {
            Err(LockError::Timeout { key, waited }) => {
                assert_eq!(key, "waited");
                assert!(waited >= wait, "reported {waited:?} for a {wait:?} wait");
            }
            other => panic!("expected Timeout after {wait:?}, got {other:?}"),
        }
        assert!(
            elapsed >= wait,
            "returned after {elapsed:?}, before the {wait:?} wait"
        );
        assert!(
            elapsed < wait + Duration::from_secs(2),
            "returned after {elapsed:?} for a {wait:?} wait"
        );
    }

    let first = Duration::from_millis(300);
    let second = Duration::from_millis(500);
    tokio::join!(
        timed(b.lock("waited").wait(first).into_future(), first),
        timed(b.lock("waited").wait(second).into_future(), second),
    );
    // The locker's default wait (250 ms) bounds a plain `lock`.
    timed(b.lock("waited").into_future(), Duration::from_millis(250)).await;
    assert_eq!(b.stats().waiters, 0, "timed-out waiters leave the queue");
    assert!(holder.is_held());
    holder.release().await.expect("release");
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

/// Empty and over-long keys are `InvalidKey`; zero, too short and absurd leases, absurd waits,
/// a zero `max_hold`, a prefix with a brace or too long are `InvalidConfig`; nothing panics and
/// nothing is written to the backend.
async fn invalid_keys_and_options_are_rejected(fx: Fixture) {
    let locker = fx.locker().await;
    // Keys.
    assert_invalid_key(locker.lock("").await);
    assert_invalid_key(locker.try_lock("").await);
    let ran = AtomicUsize::new(0);
    assert_invalid_key(
        locker
            .lock("")
            .run(async {
                ran.fetch_add(1, Ordering::SeqCst);
            })
            .await,
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    let long = "k".repeat(MAX_KEY_LEN + 1);
    match locker.lock(&long).await {
        Err(LockError::InvalidKey { key, reason }) => {
            assert!(key.len() < long.len(), "the error shortens a long key");
            assert!(reason.contains(&MAX_KEY_LEN.to_string()), "{reason}");
        }
        other => panic!("expected InvalidKey, got {other:?}"),
    }
    assert_invalid_key(locker.lock("é".repeat(MAX_KEY_LEN / 2 + 1)).await); // bytes, not chars
    let longest = "k".repeat(MAX_KEY_LEN);
    locker
        .lock(&longest)
        .await
        .expect("a key of exactly MAX_KEY_LEN bytes is fine")
        .release()
        .await
        .expect("release");

    // Per-request options.
    let ms = Duration::from_millis;
    for (what, lease) in [
        ("zero lease", Duration::ZERO),
        ("lease below MIN_LEASE", MIN_LEASE - ms(1)),
        ("lease above MAX_LEASE", MAX_LEASE + ms(1)),
        ("Duration::MAX lease", Duration::MAX),
    ] {
        assert_invalid_config(locker.lock("k").lease(lease).await, what);
    }
    for (what, wait) in [
        ("wait above MAX_WAIT", MAX_WAIT + ms(1)),
        ("Duration::MAX wait", Duration::MAX),
    ] {
        assert_invalid_config(locker.lock("k").wait(wait).await, what);
    }
    assert_invalid_config(
        locker.lock("k").max_hold(Duration::ZERO).await,
        "zero max_hold",
    );

    // Locker options: try_build says so, and a built locker reports it on every attempt.
    type Configure = fn(LockerBuilder) -> LockerBuilder;
    let builders: [(&str, Configure); 6] = [
        ("zero lease", |b| b.lease(Duration::ZERO)),
        ("absurd lease", |b| b.lease(Duration::MAX)),
        ("absurd wait", |b| b.wait(Duration::MAX)),
        ("prefix with {", |b| b.prefix("shop{1}:")),
        ("prefix with }", |b| b.prefix("shop}")),
        ("prefix too long", |b| {
            b.prefix("p".repeat(MAX_PREFIX_LEN + 1))
        }),
    ];
    for (what, configure) in builders {
        assert_invalid_config(configure(fx.builder().await).try_build(), what);
        let built = configure(fx.builder().await).build();
        assert_invalid_config(built.lock("k").await, what);
        assert_invalid_config(built.try_lock("k").run(async {}).await, what);
    }

    // Extending with a bad lease is refused and leaves the lock alone.
    let guard = locker.lock("extend").await.expect("acquire");
    assert_invalid_config(guard.extend(Duration::ZERO).await, "extend zero");
    assert_invalid_config(guard.extend(Duration::MAX).await, "extend absurd");
    assert!(guard.is_held());
    guard.release().await.expect("release");

    assert!(
        fx.is_empty().await,
        "rejected requests must not write to the backend"
    );
}

/// An absurd `max_hold` is a configuration error like an absurd lease: no panic, and no lock
/// left behind in the backend.
async fn absurd_max_hold_is_rejected(fx: Fixture) {
    let locker = fx.locker().await;
    let attempt = locker.clone();
    let outcome =
        tokio::spawn(async move { attempt.lock("k").max_hold(Duration::MAX).await.map(drop) })
            .await;
    match outcome {
        Ok(r) => assert_invalid_config(r, "Duration::MAX max_hold"),
        Err(e) => panic!("max_hold(Duration::MAX) panicked: {e}"),
    }
    let run = locker.clone();
    let outcome =
        tokio::spawn(async move { run.lock("k").max_hold(Duration::MAX).run(async {}).await })
            .await;
    match outcome {
        Ok(r) => assert_invalid_config(r, "Duration::MAX max_hold in run"),
        Err(e) => panic!("run with max_hold(Duration::MAX) panicked: {e}"),
    }
    assert!(
        fx.is_empty().await,
        "a refused request must not leave a lock behind"
    );
}

/// Fencing tokens strictly increase per key across release, expiry, background release and
/// lockers; unfenced acquisitions do not disturb them; each key counts on its own; on Redis the
/// counter key has no TTL.
async fn fencing_tokens_strictly_increase(fx: Fixture) {
    let a = fx.locker().await;
    let b = fx.locker().await;
    let mut fences = Vec::new();

    let g = a.lock("fenced").fenced().await.expect("acquire");
    fences.push(g.fence().expect("fenced lock has a token"));
    g.release().await.expect("release");

    let g = b.lock("fenced").fenced().await.expect("acquire on b");
    fences.push(g.fence().expect("token"));
    g.release().await.expect("release");

    let g = a.lock("fenced").await.expect("unfenced acquire");
    assert_eq!(g.fence(), None);
    g.release().await.expect("release");

    // Across expiry.
    let expiring = a
        .lock("fenced")
        .fenced()
        .lease(Duration::from_millis(150))
        .watchdog(false)
        .await
        .expect("acquire");
    fences.push(expiring.fence().expect("token"));
    let g = b
        .lock("fenced")
        .fenced()
        .wait(SOON)
        .await
        .expect("acquire after expiry");
    fences.push(g.fence().expect("token"));
    // Across a background release (drop).
    drop(g);
    let g = a
        .lock("fenced")
        .fenced()
        .wait(SOON)
        .await
        .expect("acquire after drop");
    fences.push(g.fence().expect("token"));
    g.release().await.expect("release");
    // Inside run, through current_fence().
    let inner = a
        .lock("fenced")
        .fenced()
        .run(async { current_fence() })
        .await
        .expect("run");
    fences.push(inner.expect("current_fence inside a fenced run"));

    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens must strictly increase: {fences:?}"
    );
    let other = a.lock("fenced-other").fenced().await.expect("acquire");
    match &fx {
        Fixture::Memory(_) => assert_eq!(other.fence(), Some(1), "each key has its own counter"),
        Fixture::Redis(server) => {
            let counter = format!("{}:fence", lock_name("lock:", "fenced-other"));
            assert_eq!(
                server.get(&counter).await,
                other.fence().map(|f| f.to_string()),
                "each key has its own counter"
            );
        }
    }
    other.release().await.expect("release");

    if let Fixture::Redis(server) = &fx {
        // The counter keeps the last token, never below the server's clock in microseconds
        // (so tokens rise across data loss), and expires: it needs no life of its own.
        let counter = format!("{}:fence", lock_name("lock:", "fenced"));
        let last = fences.last().copied().unwrap_or_default();
        assert_eq!(server.get(&counter).await, Some(last.to_string()));
        let pttl = server.pttl(&counter).await;
        assert!(pttl > 0, "the fence counter has a TTL: {pttl}");
        let time: Vec<String> = server.query(redis::cmd("TIME").clone()).await;
        let now_us = time[0].parse::<u64>().expect("secs") * 1_000_000
            + time[1].parse::<u64>().expect("micros");
        assert!(
            fences
                .iter()
                .all(|&f| f > now_us - 60_000_000 && f <= now_us),
            "tokens follow the server's clock in microseconds: {fences:?} (now {now_us})"
        );
    }
    drop(expiring);
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

/// Keys with braces and odd bytes (newlines, NUL, tabs, non-ASCII, a key of exactly
/// MAX_KEY_LEN bytes) lock, exclude and release; keys differing only in braces or suffixes do
/// not collide. On Redis: the key names follow the documented layout and the lock, its fence
/// counter and its release channel share one cluster hash slot, as computed by a real
/// cluster-mode redis-server.
async fn odd_keys_work_and_share_one_slot(fx: Fixture) {
    let a = fx.locker().await;
    let b = fx.locker().await;
    let mut at_limit = String::from("{x}");
    while at_limit.len() + "é".len() <= MAX_KEY_LEN {
        at_limit.push('é');
    }
    while at_limit.len() < MAX_KEY_LEN {
        at_limit.push('}');
    }
    assert_eq!(at_limit.len(), MAX_KEY_LEN);
    let keys = [
        "a}b{c".to_owned(),
        "{order:42}".to_owned(),
        "}{".to_owned(),
        "{}".to_owned(),
        "ключ 🔒\t\r\n\0end".to_owned(),
        "line\nbreak{".to_owned(),
        at_limit,
    ];
    let node = match &fx {
        Fixture::Redis(_) => Some(RedisServer::start_cluster_node()),
        Fixture::Memory(_) => None,
    };
    for key in &keys {
        let guard = a
            .lock(key)
            .fenced()
            .await
            .unwrap_or_else(|e| panic!("{key:?}: {e}"));
        assert_eq!(guard.key(), key);
        let first = guard.fence().expect("fenced");
        if let Fixture::Memory(_) = &fx {
            assert_eq!(first, 1);
        }
        assert_busy(b.try_lock(key).await, key);
        if let (Fixture::Redis(server), Some(node)) = (&fx, &node) {
            let name = lock_name("lock:", key);
            let fence = format!("{name}:fence");
            let channel = format!("{name}:released");
            let token = server
                .get(&name)
                .await
                .unwrap_or_else(|| panic!("{key:?}: no lock at {name:?}"));
            assert!(token.len() == 32 && has_hex_run(&token, 32), "{key:?}");
            assert_eq!(server.get(&fence).await, Some(first.to_string()), "{key:?}");
            let slot = node.keyslot(&name).await;
            assert_eq!(node.keyslot(&fence).await, slot, "{key:?}: fence slot");
            assert_eq!(node.keyslot(&channel).await, slot, "{key:?}: channel slot");
        }
        guard.release().await.expect("release");
        let again = b.try_lock(key).await.expect("free after release");
        again.release().await.expect("release");
    }
    // Names do not collide: these are all different locks, held at once.
    let distinct = ["a", "{a}", "a}", "a:fence", "{a}:fence", "#0", "{#0}"];
    let mut held = Vec::new();
    for key in distinct {
        held.push(
            b.try_lock(key)
                .await
                .unwrap_or_else(|e| panic!("{key:?}: {e}")),
        );
    }
    for g in held {
        g.release().await.expect("release");
    }
    if let Fixture::Redis(server) = &fx {
        // Only the fence counters remain: every lock key was removed by its release.
        let mut expected: Vec<String> = keys
            .iter()
            .map(|k| format!("{}:fence", lock_name("lock:", k)))
            .collect();
        expected.sort();
        assert_eq!(server.keys("*").await, expected);
    }
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

/// Owner tokens never show in `Debug` or `Display` of guards, lock infos, lockers, backends or
/// errors (on Redis the real token is read from the server and searched for).
async fn tokens_never_appear_in_debug_output(fx: Fixture) {
    let a = fx.locker().await;
    let b = fx.locker().await;
    let guard = a.lock("secret").fenced().await.expect("acquire");
    let token = fx.stored("secret").await.and_then(|s| s.token);
    if let Some(t) = &token {
        assert!(has_hex_run(t, 32), "the detector recognises a real token");
    }
    let busy = b.try_lock("secret").await.expect_err("busy");
    let timeout = b
        .lock("secret")
        .wait(Duration::from_millis(50))
        .await
        .expect_err("timeout");
    let inside = a
        .lock("secret-run")
        .run(async {
            format!(
                "{:?} {:?}",
                current_lock(),
                current_lock().map(|i| i.key().to_owned())
            )
        })
        .await
        .expect("run");
    let stale = a
        .lock("secret-stale")
        .lease(Duration::from_millis(50))
        .watchdog(false)
        .await
        .expect("acquire");
    let stale_token = fx.stored("secret-stale").await.and_then(|s| s.token);
    let stale_dbg = format!("{stale:?}");
    soon("stale lost", stale.lost()).await;
    let lost = stale.release().await.expect_err("stale release");
    let texts = [
        format!("{guard:?}"),
        format!("{guard:#?}"),
        format!("{:?}", guard.info()),
        format!("{a:?}"),
        format!("{:#?}", a.backend()),
        format!("{busy:?} {busy}"),
        format!("{timeout:?} {timeout}"),
        format!("{lost:?} {lost}"),
        stale_dbg,
        inside,
    ];
    for text in &texts {
        assert!(!has_hex_run(text, 32), "a token-like value leaked: {text}");
        for t in token.iter().chain(stale_token.iter()) {
            assert!(!text.contains(t.as_str()), "the token leaked: {text}");
        }
    }
    guard.release().await.expect("release");
}

/// A release hands the lock straight to the waiter queued for it: when the release returns,
/// the lock is already the waiter's (a newcomer finds it busy, so nobody slips in between), with
/// the next fencing token; the handed-over lease is short and the watchdog takes it to the full
/// lease; a waiter that gives up after a handover passes the lock on.
async fn release_hands_the_lock_to_the_queued_waiter(fx: Fixture) {
    let (a, b, c) = (fx.locker().await, fx.locker().await, fx.locker().await);
    let holder = a.lock("handover").fenced().await.expect("acquire");
    let first = holder.fence().expect("fenced");
    let waiter = tokio::spawn({
        let b = b.clone();
        async move { b.lock("handover").fenced().wait(SOON).await }
    });
    fx.until_queued("handover", 1).await;
    holder.release().await.expect("release");
    let newcomer = c.try_lock("handover").await;
    assert!(
        matches!(newcomer, Err(LockError::Busy { .. })),
        "{}: the lock went to the queued waiter, not to a newcomer: {newcomer:?}",
        fx.name()
    );
    let guard = waiter.await.expect("join").expect("handed over");
    assert!(guard.is_held());
    assert!(guard.waited());
    match &fx {
        Fixture::Memory(_) => assert_eq!(guard.fence(), Some(first + 1)),
        // Redis tokens follow the server's clock (so they rise across data loss): above.
        Fixture::Redis(_) => assert!(guard.fence() > Some(first), "{:?}", guard.fence()),
    }
    assert_eq!(fx.queued("handover").await, 0);
    // Handed over with a lease of at most 3 s (tests/handoff.rs sees it on a waiter killed
    // before it could renew); the watchdog extends it to the 30 s default as it arrives.
    let deadline = Instant::now() + SOON;
    while guard.remaining() <= Duration::from_secs(3) {
        assert!(Instant::now() < deadline, "{}: never extended", fx.name());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if let Some(stored) = fx.stored("handover").await {
        assert!(stored.pttl > 3_000, "{stored:?}");
    }
    guard.release().await.expect("release");

    // Fair mode hands over the same way.
    let holder = a.lock("handover").await.expect("acquire");
    let waiter = tokio::spawn({
        let b = b.clone();
        async move { b.lock("handover").fair().wait(SOON).await }
    });
    fx.until_queued("handover", 1).await;
    holder.release().await.expect("release");
    assert!(matches!(
        c.try_lock("handover").await,
        Err(LockError::Busy { .. })
    ));
    waiter
        .await
        .expect("join")
        .expect("handed over in fair mode")
        .release()
        .await
        .expect("release");
    c.try_lock("handover")
        .await
        .expect("free after the last release")
        .release()
        .await
        .expect("release");
}

/// A lock handed over by a release counts `max_hold` from when it arrived, not from the
/// waiter's earlier attempt that the handover names (its lease, though, counts from there).
async fn max_hold_of_a_handed_over_lock_starts_when_it_arrives(fx: Fixture) {
    let (a, b) = (fx.locker().await, fx.locker().await);
    let holder = a.lock("capped").await.expect("acquire");
    let ran = Arc::new(AtomicUsize::new(0));
    let waiter = tokio::spawn({
        let ran = ran.clone();
        async move {
            b.lock("capped")
                .wait(SOON)
                .max_hold(Duration::from_millis(200))
                .run(async move {
                    ran.fetch_add(1, Ordering::SeqCst);
                })
                .await
        }
    });
    fx.until_queued("capped", 1).await;
    // The holder keeps the lock for longer than the waiter's max_hold (but less than the
    // waiter's ticket refresh interval, so the handover names the queuing attempt).
    tokio::time::sleep(Duration::from_millis(400)).await;
    holder.release().await.expect("release");
    waiter
        .await
        .expect("join")
        .expect("the body runs under the handed-over lock");
    assert_eq!(ran.load(Ordering::SeqCst), 1, "{}", fx.name());
}

/// A waiter that times out has left the backend's queue by the time its `Timeout` returns: the
/// next release does not hand the lock to it, and a newcomer finds the key free at once.
async fn timed_out_waiter_leaves_no_trace(fx: Fixture) {
    let (a, b, c) = (fx.locker().await, fx.locker().await, fx.locker().await);
    let holder = a.lock("gone").await.expect("acquire");
    for fair in [false, true] {
        let mut request = b.lock("gone").wait(Duration::from_millis(50));
        if fair {
            request = request.fair();
        }
        let timed_out = request.await;
        assert!(
            matches!(timed_out, Err(LockError::Timeout { .. })),
            "{timed_out:?}"
        );
        assert_eq!(fx.queued("gone").await, 0, "{} fair={fair}", fx.name());
    }
    holder.release().await.expect("release");
    c.try_lock("gone")
        .await
        .expect("free right after the release")
        .release()
        .await
        .expect("release");
}

macro_rules! conformance {
    ($($(#[$attr:meta])* $test:ident),* $(,)?) => {
        /// The suite against the embedded memory backend.
        mod on_memory {
            $(
                $(#[$attr])*
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(super::Fixture::memory()).await;
                }
            )*
        }
        /// The same suite against a real redis-server.
        mod on_redis {
            $(
                $(#[$attr])*
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(super::Fixture::redis()).await;
                }
            )*
        }
    };
}

conformance!(
    exclusive_acquisition,
    try_lock_on_held_key_is_busy,
    stale_release_does_not_touch_the_new_holder,
    lease_expiry_frees_the_key,
    watchdog_keeps_a_short_lease_alive,
    bounded_wait_returns_timeout,
    stress_counter_ends_exact,
    unlocked_counter_loses_updates,
    invalid_keys_and_options_are_rejected,
    absurd_max_hold_is_rejected,
    fencing_tokens_strictly_increase,
    reentrancy_inside_run,
    odd_keys_work_and_share_one_slot,
    dropped_guard_is_released_in_background,
    release_hands_the_lock_to_the_queued_waiter,
    timed_out_waiter_leaves_no_trace,
    max_hold_of_a_handed_over_lock_starts_when_it_arrives,
    tokens_never_appear_in_debug_output,
);

/// Checks that only make sense on Redis: URLs, ACL, connection failures, OS processes.
mod redis_only {
    use super::*;
    use lock_testkit::{AclUser, ChildOutput, ChildProcess};
    use lock_tests::worker::{WorkerArgs, WorkerSummary};

    const WORKER: &str = env!("CARGO_BIN_EXE_lock-worker");

    /// A server that is down at connect gives `LockError::Backend` (retryable), promptly and
    /// without a panic; after a restart on the same port, connecting works again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_down_at_connect_is_a_backend_error() {
        let mut server = RedisServer::start();
        server.stop();
        match soon("connect to a stopped server", Locker::redis(&server.url())).await {
            Err(e @ LockError::Backend { .. }) => {
                assert!(e.is_retryable());
                let LockError::Backend { operation, .. } = &e else {
                    unreachable!()
                };
                assert_eq!(*operation, "connect");
            }
            other => panic!("expected Backend, got {other:?}"),
        }
        let quick = RedisBackend::builder(&server.url())
            .connect_timeout(Duration::from_millis(200))
            .connect();
        assert!(matches!(
            soon("connect with a short timeout", quick).await,
            Err(LockError::Backend { .. })
        ));
        server.restart();
        let locker = Locker::redis(&server.url())
            .await
            .expect("connects after restart");
        locker
            .lock("up")
            .await
            .expect("lock")
            .release()
            .await
            .expect("release");
    }

    /// Malformed URLs and zero timeouts are `InvalidConfig`, not a panic or a Backend error.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bad_url_is_invalid_config() {
        for url in [
            "",
            "not a url",
            "http://127.0.0.1:6379/",
            "redis://127.0.0.1:notaport/",
            "redis://127.0.0.1:6379/notadb",
        ] {
            match soon(url, Locker::redis(url)).await {
                Err(LockError::InvalidConfig { what }) => {
                    assert!(what.contains("URL"), "{url:?}: {what}");
                }
                other => panic!("{url:?}: expected InvalidConfig, got {other:?}"),
            }
        }
        let server = RedisServer::start();
        let zero = RedisBackend::builder(&server.url())
            .response_timeout(Duration::ZERO)
            .connect()
            .await;
        assert!(matches!(zero, Err(LockError::InvalidConfig { .. })));
    }

    /// An ACL user and password in the URL work, with the user's keys and channels restricted
    /// to `lock:*` (so the lock touches nothing outside its prefix); a waiter is handed the lock
    /// through the restricted release channel. A wrong password or none is a `Backend` error.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn acl_user_and_password_in_the_url() {
        let app = AclUser::new("app", "s3cret").rules(["~lock:*", "&lock:*", "+@all"]);
        let server = RedisServer::builder()
            .requirepass("adminpw")
            .user(&app)
            .start();
        let url = server.url_for(&app);
        let a = Locker::redis(&url).await.expect("the ACL user connects");
        let b = Locker::redis(&url).await.expect("the ACL user connects");
        let guard = a
            .lock("acl:1")
            .fenced()
            .await
            .expect("lock as the ACL user");
        assert!(guard.fence().is_some());
        assert!(server.exists("lock:{acl:1}").await);
        server.reset_stats().await;
        let waiter = tokio::spawn(async move { b.lock("acl:1").wait(SOON).await });
        // No signal says "the waiter subscribed": watch the server until it did (bounded).
        let deadline = Instant::now() + SOON;
        while server
            .commandstats()
            .await
            .get("ssubscribe")
            .copied()
            .unwrap_or(0)
            == 0
        {
            assert!(Instant::now() < deadline, "the waiter never subscribed");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        guard.release().await.expect("release");
        let handed = soon("hand-over", waiter)
            .await
            .expect("waiter task")
            .expect("the waiter gets the lock after the release");
        handed.release().await.expect("release");
        for bad in [server.url_as("app", "wrong"), server.url()] {
            match soon("bad credentials", Locker::redis(&bad)).await {
                Err(LockError::Backend { .. }) => {}
                other => panic!("{bad}: expected Backend, got {other:?}"),
            }
        }
    }

    /// `redis+unix://` URLs work.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unix_socket_url_works() {
        let server = RedisServer::builder().unixsocket().start();
        let url = server.unix_url().expect("unix socket");
        let locker = Locker::redis(&url)
            .await
            .expect("connect over the unix socket");
        let guard = locker.lock("unix").await.expect("lock");
        assert!(server.exists("lock:{unix}").await);
        guard.release().await.expect("release");
        assert!(!server.exists("lock:{unix}").await);
    }

    /// Runs `processes` lock-worker processes with `args` started together; returns their
    /// outputs and the wall time.
    async fn run_workers(processes: usize, args: &WorkerArgs) -> (Vec<ChildOutput>, Duration) {
        let mut workers: Vec<_> = (0..processes)
            .map(|_| ChildProcess::spawn(WORKER, args.to_args()))
            .collect();
        for w in &mut workers {
            w.expect_line("ready", Duration::from_secs(30)).await;
        }
        let start = Instant::now();
        for w in &mut workers {
            w.send("go").await;
        }
        let mut outputs = Vec::new();
        for w in workers {
            outputs.push(w.finish(Duration::from_secs(120)).await);
        }
        (outputs, start.elapsed())
    }

    /// 4 OS processes x 250 iterations of a non-atomic GET/SET increment of one Redis counter,
    /// each under a fenced lock on one key: the counter ends exact, and every process saw its
    /// fencing token above the highest one stored before it (checked under the lock).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn multi_process_stress_counter_ends_exact() {
        const PROCESSES: usize = 4;
        const ITERATIONS: u64 = 250;
        let server = RedisServer::start();
        let args = WorkerArgs::count(&server.url(), "mp-stress", ITERATIONS, "mp:counter")
            .fence_key("mp:fence-seen")
            .wait_go();
        let (outputs, elapsed) = run_workers(PROCESSES, &args).await;
        let mut max_fence = 0;
        for out in &outputs {
            assert!(
                out.status.success(),
                "worker failed: {:?}\nstdout: {:?}\nstderr: {}",
                out.status,
                out.lines,
                out.stderr
            );
            let s = WorkerSummary::find(&out.lines).expect("summary line");
            assert_eq!(s.increments, ITERATIONS);
            assert_eq!(s.fence_violations, 0, "fencing token went backwards");
            max_fence = max_fence.max(s.max_fence);
        }
        let total = PROCESSES as u64 * ITERATIONS;
        let last: u64 = server
            .get("mp:counter")
            .await
            .and_then(|v| v.parse().ok())
            .expect("counter");
        println!(
            "[redis] multi-process stress: {PROCESSES} processes x {ITERATIONS} iterations on one key = {total} locked read-modify-writes; final count {last}; highest fencing token {max_fence}; {elapsed:.2?}"
        );
        assert_eq!(last, total, "lost updates across processes");
        // The counter holds the last token drawn, the highest any process saw.
        assert_eq!(
            server
                .get(&format!("{}:fence", lock_name("lock:", "mp-stress")))
                .await,
            Some(max_fence.to_string())
        );
        assert!(!server.exists(&lock_name("lock:", "mp-stress")).await);
    }

    /// The control for the multi-process stress: the same workers without the lock lose
    /// updates, so the test above can fail.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn multi_process_without_lock_loses_updates() {
        const PROCESSES: usize = 4;
        const ITERATIONS: u64 = 200;
        let server = RedisServer::start();
        let args = WorkerArgs::count(&server.url(), "mp-control", ITERATIONS, "mp:control")
            .no_lock()
            .wait_go();
        let (outputs, _) = run_workers(PROCESSES, &args).await;
        for out in &outputs {
            assert!(out.status.success(), "{:?} {}", out.lines, out.stderr);
        }
        let total = PROCESSES as u64 * ITERATIONS;
        let last: u64 = server
            .get("mp:control")
            .await
            .and_then(|v| v.parse().ok())
            .expect("counter");
        println!(
            "[redis] multi-process control without lock: {PROCESSES} processes x {ITERATIONS} = {total}; final count {last} ({} updates lost)",
            total - last
        );
        assert!(last < total, "without a lock some updates must be lost");
    }
}
