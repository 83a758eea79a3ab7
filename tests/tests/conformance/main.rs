//! The conformance suite: one set of properties, generic over the backend, each run against
//! the memory backend and a real redis-server (`<property>::on_memory::*`,
//! `<property>::on_redis::*`), and again on both with local hand-off turned off
//! (`<property>::without_local_handoff::*`); every check of every module runs on a Redis
//! Cluster too ([`on_cluster`]: one cluster for the binary, the checks one after the other,
//! each under a key prefix of its own) and on a Sentinel set's primary ([`on_sentinel`]); plus the checks that only make sense on Redis (`redis_only::*`:
//! URLs, ACL, connection failures, several OS processes).
//!
//! One module per area: [`acquire`], [`lease`], [`wait`], [`fencing`], [`keys`],
//! [`idempotency`]; each lists its checks in one `conformance!` call, one property per check,
//! named after it (the Redis details of a property, such as what the server stores, as its own
//! `redis_only:` check).
//! [`fixture`] is the backend under test and the set-ups several modules share.
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

/// Runs each listed check (an `async fn(Fixture)` of the calling module) once per backend:
/// `on_memory::<check>` on the embedded memory backend, `on_redis::<check>` on a real
/// redis-server of its own. Checks listed after `redis_only:` are about what only Redis has
/// (key names, TTLs, hash slots, the server's clock) and run as `on_redis::<check>` alone.
macro_rules! conformance {
    (
        $($(#[$attr:meta])* $test:ident),* $(,)?
        $(; redis_only: $($(#[$redis_attr:meta])* $redis_test:ident),* $(,)?)?
    ) => {
        /// The checks against the embedded memory backend.
        mod on_memory {
            $(
                $(#[$attr])*
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test($crate::fixture::Fixture::memory()).await;
                }
            )*
        }
        /// The same checks against a real redis-server, and those only Redis has.
        mod on_redis {
            $(
                $(#[$attr])*
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test($crate::fixture::Fixture::redis()).await;
                }
            )*
            $($(
                $(#[$redis_attr])*
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $redis_test() {
                    super::$redis_test($crate::fixture::Fixture::redis()).await;
                }
            )*)?
        }
        /// The checks for the shared deployments ([`on_cluster`](crate::on_cluster), [`on_sentinel`](crate::on_sentinel)), by name.
        pub(crate) fn checks() -> Vec<$crate::fixture::Check> {
            vec![$((stringify!($test), |fx| Box::pin($test(fx)))),*]
        }
        /// The checks again with local hand-off turned off, on both backends.
        mod without_local_handoff {
            mod on_memory {
                $(
                    $(#[$attr])*
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $test() {
                        super::super::$test(
                            $crate::fixture::Fixture::memory().without_local_handoff(),
                        )
                        .await;
                    }
                )*
            }
            mod on_redis {
                $(
                    $(#[$attr])*
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $test() {
                        super::super::$test(
                            $crate::fixture::Fixture::redis().without_local_handoff(),
                        )
                        .await;
                    }
                )*
            }
        }
    };
}

mod fixture;

mod acquire;
mod fencing;
mod idempotency;
mod keys;
mod lease;
mod wait;

mod redis_only;

/// Every check of every module (but the `redis_only:` ones, which read a single server of
/// their own), in the order given, with local hand-off on and again off.
fn shared_checks() -> Vec<(&'static str, fixture::Check)> {
    [
        ("acquire", acquire::checks()),
        ("fencing", fencing::checks()),
        ("idempotency", idempotency::checks()),
        ("keys", keys::checks()),
        ("lease", lease::checks()),
        ("wait", wait::checks()),
    ]
    .into_iter()
    .flat_map(|(module, checks)| checks.into_iter().map(move |c| (module, c)))
    .collect()
}

/// Runs `checks` one after the other against a deployment shared by the binary (six or more
/// processes per check would be too slow), each with local hand-off on and again off, each on
/// a thread and runtime of its own (a panic fails that check only), on the fixture `fixture`
/// makes for run `i`; every failure is reported by name at the end. `only` (an environment
/// variable's value) keeps the checks whose name contains it (to debug one).
fn run_shared(
    engine: &str,
    checks: Vec<(&'static str, fixture::Check)>,
    only: Option<String>,
    mut fixture: impl FnMut(usize) -> fixture::Fixture,
) {
    let started = std::time::Instant::now();
    let checks: Vec<_> = checks
        .into_iter()
        .filter(|(_, (name, _))| only.as_deref().is_none_or(|only| name.contains(only)))
        .collect();
    let mut failed = Vec::new();
    let runs = checks.iter().flat_map(|c| [(c, true), (c, false)]);
    for (i, (&(module, (name, check)), local_handoff)) in runs.enumerate() {
        let fx = fixture(i);
        let (fx, name) = if local_handoff {
            (fx, name.to_owned())
        } else {
            (
                fx.without_local_handoff(),
                format!("{name} (local hand-off off)"),
            )
        };
        let outcome = std::thread::spawn(move || {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime")
                .block_on(check(fx));
        })
        .join();
        if outcome.is_err() {
            failed.push(format!("{module}::{name}"));
        }
    }
    println!(
        "on_{engine}: {} checks, with local hand-off on and off, in {:?}",
        checks.len(),
        started.elapsed()
    );
    assert!(failed.is_empty(), "failed on {engine}: {failed:?}");
}

/// The shared-deployment runs ([`on_cluster`], [`on_sentinel`], [`on_redlock`]) take turns:
/// each starts many processes and runs long, and on a small machine three at once (beside the
/// other checks of the binary) starve the short leases some checks use.
static SHARED_RUNS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_shared_run() -> std::sync::MutexGuard<'static, ()> {
    // A run that failed (panicked) holding it leaves nothing to repair.
    SHARED_RUNS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Every check of every module on one Redis Cluster (3 primaries, 3 replicas) started for the
/// binary, each check under a key prefix of its own. `CLUSTER_CHECK=<part of a name>` runs
/// only the matching checks.
#[test]
fn on_cluster() {
    use std::sync::Arc;

    let _turn = one_shared_run();

    let runtime = runtime();
    let cluster = Arc::new(runtime.block_on(lock_testkit::cluster::RedisCluster::start()));
    run_shared(
        "cluster",
        shared_checks(),
        std::env::var("CLUSTER_CHECK").ok(),
        |i| fixture::Fixture::cluster(cluster.clone(), format!("c{i}:")),
    );
}

/// Every check of every module on the primary of one Redis Sentinel set (1 primary, 2
/// replicas, 3 sentinels) started for the binary, reached through the sentinels; the data is
/// flushed before each check. `SENTINEL_CHECK=<part of a name>` runs only the matching checks.
#[test]
fn on_sentinel() {
    use std::sync::Arc;

    let _turn = one_shared_run();

    let runtime = runtime();
    let set = Arc::new(runtime.block_on(lock_testkit::sentinel::RedisSentinelSet::start()));
    run_shared(
        "sentinel",
        shared_checks(),
        std::env::var("SENTINEL_CHECK").ok(),
        |_| {
            runtime.block_on(set.primary().flushall());
            fixture::Fixture::sentinel(set.clone())
        },
    );
}

/// The checks on Redlock over 5 servers started for the binary (the data of every server
/// flushed before each check), but those that do not apply, each listed with the reason in
/// [`REDLOCK_REFUSES`]: fencing (`fenced()` is refused: no strictly increasing fence exists over
/// independent servers; `tests/tests/redlock/waiting.rs::fencing_and_fair_mode_are_refused_before_any_io`
/// asserts the refusal), fair mode and handover (no single queue), and two that assume one
/// server. `REDLOCK_CHECK=<name part>` runs only the matching checks.
#[test]
fn on_redlock() {
    use std::sync::Arc;

    let _turn = one_shared_run();

    let runtime = runtime();
    let servers: Arc<Vec<lock_testkit::RedisServer>> =
        Arc::new((0..5).map(|_| lock_testkit::RedisServer::start()).collect());
    let refused = |name: &str| REDLOCK_REFUSES.iter().any(|(part, _)| name.contains(part));
    let checks: Vec<_> = shared_checks()
        .into_iter()
        .filter(|(module, (name, _))| *module != "fencing" && !refused(name))
        .collect();
    run_shared(
        "redlock",
        checks,
        std::env::var("REDLOCK_CHECK").ok(),
        |_| {
            for s in servers.iter() {
                runtime.block_on(s.flushall());
            }
            fixture::Fixture::redlock(servers.clone())
        },
    );
}

/// Checks (by a part of their name) that do not apply to Redlock, and why; the whole `fencing`
/// module is left out too (`fenced()` is refused on Redlock).
const REDLOCK_REFUSES: &[(&str, &str)] = &[
    ("fenced", "fenced() is refused on Redlock"),
    ("fence", "fenced() is refused on Redlock"),
    (
        "odd_keys",
        "these checks lock with fenced(), refused on Redlock",
    ),
    ("fair", "fair() is refused on Redlock: no single queue"),
    (
        "handover",
        "no handover on Redlock (each server would hand the lock to its own queue's head); the set-up is fenced too",
    ),
    ("handed_over", "no handover on Redlock"),
    (
        "queued_waiter_gets_the_released_lock",
        "a handover check (fenced set-up)",
    ),
    (
        "release_lets_no_newcomer_slip_in",
        "a handover property: on Redlock a waiter is woken and contends, a newcomer can win",
    ),
    (
        "one_of_sixteen_racers_wins",
        "on Redlock at most one wins: simultaneous racers can split the vote and all be refused",
    ),
    (
        "the_record_shares_the_locks_hash_slot",
        "reads one server right after the store returns; a Redlock record is stored on a majority, the rest in the background",
    ),
];
