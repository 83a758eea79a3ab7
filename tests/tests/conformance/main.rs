//! The conformance suite on every backend of this crate: the kit's checks
//! (`lock_core::conformance`, feature `conformance`), each run against the memory backend
//! and a real redis-server (`<area>::on_memory::*`, `<area>::on_redis::*`), and again on both
//! with local hand-off turned off (`<area>::without_local_handoff::*`); every check of the
//! kit runs on a Redis Cluster too ([`on_cluster`]: one cluster for the binary, the checks one
//! after the other, each under a key prefix of its own), on a Sentinel set's primary
//! ([`on_sentinel`]) and on Redlock ([`on_redlock`]), where the checks of what Redlock refuses
//! check the refusal. Plus what only Redis has: its layout beneath the kit's properties
//! ([`redis_layout`]: key names, TTLs, hash slots, the server's clock) and [`redis_only`]
//! (URLs, ACL, connection failures, several OS processes).
//!
//! [`fixture`] is the backend under test, and the kit's [`Probe`](lock_core::conformance::Probe)
//! on it: where a test reads the backend directly it does so with the harness's own client
//! (GET, PTTL, CLUSTER KEYSLOT), never through lock-core. Durations in assertions are bounds
//! on correctness or generous hang guards; none claims speed.

#![allow(
    clippy::panic,
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::print_stdout,
    reason = "a test file: its helpers outside #[test] functions assert by panicking and report figures"
)]

/// Runs each listed check of the kit (by name, one area per call) once per backend:
/// `on_memory::<check>` on the embedded memory backend, `on_redis::<check>` on a real
/// redis-server of its own, and both again with local hand-off off.
macro_rules! kit {
    ($area:ident: $($check:ident),* $(,)?) => {
        mod $area {
            /// The checks against the embedded memory backend.
            mod on_memory {
                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $check() {
                        $crate::fixture::Fixture::memory().suite().run_check(stringify!($check)).await;
                    }
                )*
            }
            /// The same checks against a real redis-server.
            mod on_redis {
                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $check() {
                        $crate::fixture::Fixture::redis().suite().run_check(stringify!($check)).await;
                    }
                )*
            }
            /// The checks again with local hand-off turned off, on both backends.
            mod without_local_handoff {
                mod on_memory {
                    $(
                        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                        async fn $check() {
                            $crate::fixture::Fixture::memory()
                                .without_local_handoff()
                                .suite()
                                .run_check(stringify!($check))
                                .await;
                        }
                    )*
                }
                mod on_redis {
                    $(
                        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                        async fn $check() {
                            $crate::fixture::Fixture::redis()
                                .without_local_handoff()
                                .suite()
                                .run_check(stringify!($check))
                                .await;
                        }
                    )*
                }
            }
            /// The names listed here, to check them against the kit's.
            pub(crate) const NAMES: &[&str] = &[$(stringify!($check)),*];
        }
    };
}

mod fixture;

kit!(acquire:
    acquire_returns_a_held_guard_for_the_key,
    another_locker_is_refused_while_held,
    holding_locker_is_refused_outside_run,
    other_keys_are_independent,
    released_key_is_free_for_another_locker,
    release_removes_the_lock_from_the_backend,
    one_of_sixteen_racers_wins_a_fresh_key,
    try_lock_on_a_held_key_is_a_retryable_busy_naming_the_key,
    busy_hints_a_retry_within_the_holders_lease,
    no_wait_on_a_held_key_is_busy,
    zero_wait_on_a_held_key_is_busy,
    busy_run_never_runs_its_body,
    release_after_expiry_says_lease_lost,
    release_after_expiry_leaves_the_new_holder_alone,
    usurped_guard_cannot_know_it_lost,
    extend_by_a_usurped_guard_says_lease_lost,
    release_by_a_usurped_guard_says_lease_lost,
    usurped_guard_leaves_the_new_holder_alone,
    stress_bodies_never_overlap,
    stress_counter_ends_exact,
    stress_leaves_no_lock_behind,
    unlocked_counter_loses_updates,
    current_lock_is_set_only_inside_run,
    run_returns_its_bodys_value,
    lock_inside_run_on_the_same_key_is_reentrant,
    try_lock_inside_run_on_the_same_key_is_reentrant,
    releasing_a_reentrant_guard_keeps_the_lock,
    nested_run_sees_the_lock,
    nested_run_end_keeps_the_lock,
    spawned_task_inside_run_is_not_reentrant,
    other_key_inside_run_is_an_ordinary_lock,
    outermost_run_end_releases_the_lock,
    dropped_guard_is_released_in_background,
    guard_dropped_outside_the_runtime_is_released_in_background,
    aborted_run_is_released_in_background,
    cancelled_waiter_leaves_the_queue,
    release_after_a_cancelled_wait_frees_the_key,
);
kit!(lease:
    watchdog_off_renews_nothing,
    expired_lease_frees_the_key,
    expiring_key_is_not_free_before_the_lease_runs_out,
    expired_guard_is_no_longer_held,
    expired_guard_reports_the_loss,
    watchdog_keeps_a_short_lease_alive,
    watchdog_renews_repeatedly,
    released_lock_is_no_longer_renewed,
    absurd_max_hold_is_invalid_config,
    absurd_max_hold_in_run_is_invalid_config,
    absurd_max_hold_leaves_nothing_behind,
    max_hold_of_a_handed_over_lock_starts_when_it_arrives,
);
kit!(wait:
    bounded_wait_on_a_held_key_times_out,
    queued_waiters_each_time_out_on_their_own_bound,
    lockers_default_wait_bounds_a_plain_lock,
    timed_out_waiters_leave_the_lockers_queue,
    timed_out_waiters_leave_the_holder_alone,
    release_lets_no_newcomer_slip_in_before_the_waiter,
    queued_waiter_gets_the_released_lock,
    handed_over_lock_carries_the_next_fence,
    handover_empties_the_queue,
    watchdog_extends_a_handed_over_lease,
    fair_release_lets_no_newcomer_slip_in_before_the_waiter,
    fair_waiter_gets_the_released_lock,
    key_is_free_after_the_handed_over_lock_is_released,
    timed_out_waiter_leaves_the_backend_queue,
    timed_out_fair_waiter_leaves_the_backend_queue,
    release_after_timed_out_waits_leaves_the_key_free,
);
kit!(fencing:
    fences_rise_across_release,
    fences_rise_across_lockers,
    unfenced_lock_has_no_fence,
    unfenced_acquisitions_do_not_disturb_fences,
    fences_rise_across_expiry,
    fences_rise_across_background_release,
    current_fence_inside_run_is_the_next_fence,
    each_key_has_its_own_fence_counter,
    guards_and_lock_infos_never_show_the_token,
    lockers_and_backends_never_show_the_token,
    errors_never_show_the_token,
);
kit!(keys:
    empty_key_is_invalid_key,
    run_with_an_invalid_key_never_runs_its_body,
    over_long_key_is_invalid_key_naming_the_limit,
    invalid_key_error_shortens_a_long_key,
    key_limit_counts_bytes_not_chars,
    key_of_exactly_max_key_len_bytes_locks,
    out_of_range_leases_are_invalid_config,
    out_of_range_waits_are_invalid_config,
    zero_max_hold_is_invalid_config,
    invalid_locker_options_fail_try_build,
    locker_built_from_invalid_options_refuses_every_attempt,
    extend_with_an_invalid_lease_is_invalid_config,
    invalid_extend_leaves_the_lock_held,
    rejected_requests_leave_the_backend_empty,
    odd_keys_lock,
    odd_keys_exclude,
    odd_keys_are_free_after_release,
    odd_keys_start_their_own_fence_counter,
    keys_differing_in_braces_or_suffixes_do_not_collide,
    released_odd_keys_leave_only_their_fence_counters,
);
kit!(idempotency:
    state_goes_absent_in_flight_completed,
    stored_bytes_and_fingerprint_come_back_exactly,
    record_expires_after_its_ttl,
    a_store_after_the_lease_was_lost_is_refused,
    a_reentrant_guard_stores_for_the_outer_lock,
    bad_input_is_a_typed_error,
    records_of_different_keys_and_prefixes_never_meet,
    idempotency_state_is_one_request,
    the_started_mark_lets_the_work_run_at_most_once,
    clear_started_never_takes_another_requests_mark,
);

kit!(operations:
    inspect_shows_holder_lease_and_age_and_nothing_after_release,
    inspect_shows_the_last_fence,
    inspect_counts_the_queued_waiters,
    force_unlock_hands_the_lock_on_and_the_old_holder_learns,
    force_unlock_of_a_free_lock_removes_nothing,
    force_unlock_seen_removes_only_the_holding_seen,
    list_streams_the_held_locks_under_a_pattern,
);

mod idempotency_redis;
mod kit;
mod redis_layout;
mod redis_only;

/// Every check of the kit is listed above (none lost), once.
#[test]
fn every_kit_check_runs_here() {
    let mut listed: Vec<&str> = [
        acquire::NAMES,
        lease::NAMES,
        wait::NAMES,
        fencing::NAMES,
        keys::NAMES,
        idempotency::NAMES,
        operations::NAMES,
    ]
    .concat();
    let mut kit = lock_core::conformance::Suite::checks();
    listed.sort_unstable();
    kit.sort_unstable();
    assert_eq!(listed, kit);
}

/// Every check of the kit by name, and the Redis layout checks the shared deployments have
/// too, in order; each runs with local hand-off on and again off.
fn shared_checks(layout: bool) -> Vec<(&'static str, Shared)> {
    let mut checks: Vec<_> = lock_core::conformance::Suite::checks()
        .into_iter()
        .map(|name| {
            (
                lock_core::conformance::Suite::area(name).unwrap_or("kit"),
                Shared::Kit(name),
            )
        })
        .collect();
    if layout {
        checks.extend(
            redis_layout::checks()
                .into_iter()
                .map(|(name, check)| ("redis_layout", Shared::Own(name, check))),
        );
    }
    checks
}

/// A check of a shared run: the kit's, by name, or one of this harness's.
enum Shared {
    Kit(&'static str),
    Own(
        &'static str,
        fn(fixture::Fixture) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>,
    ),
}

impl Shared {
    fn name(&self) -> &'static str {
        match self {
            Shared::Kit(name) | Shared::Own(name, _) => name,
        }
    }

    async fn run(&self, fx: fixture::Fixture) {
        match self {
            Shared::Kit(name) => {
                fx.suite().run_check(name).await;
            }
            Shared::Own(_, check) => check(fx).await,
        }
    }
}

/// Runs `checks` one after the other against a deployment shared by the binary (six or more
/// processes per check would be too slow), each with local hand-off on and again off, each on
/// a thread and runtime of its own (a panic fails that check only), on the fixture `fixture`
/// makes for run `i`; every failure is reported by name at the end. `only` (an environment
/// variable's value) keeps the checks whose name contains it (to debug one).
fn run_shared(
    engine: &str,
    checks: Vec<(&'static str, Shared)>,
    only: Option<String>,
    mut fixture: impl FnMut(usize) -> fixture::Fixture,
) {
    let started = std::time::Instant::now();
    let checks: Vec<_> = checks
        .into_iter()
        .filter(|(_, check)| {
            only.as_deref()
                .is_none_or(|only| check.name().contains(only))
        })
        .collect();
    let mut failed = Vec::new();
    let checks = std::sync::Arc::new(checks);
    let runs = (0..checks.len()).flat_map(|c| [(c, true), (c, false)]);
    for (i, (c, local_handoff)) in runs.enumerate() {
        let (module, name) = (checks[c].0, checks[c].1.name());
        let fx = fixture(i);
        let (fx, name) = if local_handoff {
            (fx, name.to_owned())
        } else {
            (
                fx.without_local_handoff(),
                format!("{name} (local hand-off off)"),
            )
        };
        let checks = checks.clone();
        let outcome = std::thread::spawn(move || {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime")
                .block_on(checks[c].1.run(fx));
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
        shared_checks(true),
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
        shared_checks(true),
        std::env::var("SENTINEL_CHECK").ok(),
        |_| {
            runtime.block_on(set.primary().flushall());
            fixture::Fixture::sentinel(set.clone())
        },
    );
}

/// The kit's checks on Redlock over 5 servers started for the binary (the data of every server
/// flushed before each check): those of fencing and fair mode check their refusal (no strictly
/// increasing fence exists over independent servers, no single queue), those of hand-over are
/// skipped (a waiter is woken and contends), and "exactly one racer wins" reads "at most one"
/// (simultaneous racers can split the vote). `REDLOCK_CHECK=<name part>` runs only the
/// matching checks.
#[test]
fn on_redlock() {
    use std::sync::Arc;

    let _turn = one_shared_run();

    let runtime = runtime();
    let servers: Arc<Vec<lock_testkit::RedisServer>> =
        Arc::new((0..5).map(|_| lock_testkit::RedisServer::start()).collect());
    let checks = shared_checks(false);
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

/// The kit's checks on one etcd member started for the binary (feature `etcd`), each under a
/// prefix of its own, with local hand-off on and off; none is skipped. Leases on etcd are whole
/// seconds, at least [`ETCD_MIN_LEASE`](lock_core::ETCD_MIN_LEASE): the checks that watch a
/// short lease run out or be renewed take that floor, their waits scaled with it, and run
/// together after the others (they mostly wait). Fences are compared, never counted (a revision
/// is taken by every write in the cluster). `ETCD_CHECK=<name part>` runs only the matching
/// checks.
#[cfg(feature = "etcd")]
#[test]
fn on_etcd() {
    use std::sync::Arc;

    use lock_core::backend::IntoBackend;
    use lock_core::conformance::{Probe, Suite};

    /// Reads and deletes contender keys with the test kit's own client, never lock-core.
    struct EtcdProbe(lock_testkit::etcd::EtcdClient);

    impl EtcdProbe {
        async fn contenders(&self, prefix: &str, key: &str) -> Vec<lock_testkit::etcd::KeyValue> {
            let name = lock_core::backend::LockKey::new(prefix, key).expect("a valid key");
            let mut keys = self.0.range_prefix(format!("{}/q/", name.name())).await;
            keys.sort_by_key(|kv| kv.create_revision);
            keys
        }
    }

    impl Probe for EtcdProbe {
        fn force_delete<'a>(
            &'a self,
            prefix: &'a str,
            key: &'a str,
        ) -> lock_core::backend::BoxFuture<'a, bool> {
            Box::pin(async move {
                match self.contenders(prefix, key).await.first() {
                    Some(holder) => self.0.delete(&holder.key).await,
                    None => false,
                }
            })
        }

        fn queued<'a>(
            &'a self,
            prefix: &'a str,
            key: &'a str,
        ) -> lock_core::backend::BoxFuture<'a, Option<usize>> {
            Box::pin(
                async move { Some(self.contenders(prefix, key).await.len().saturating_sub(1)) },
            )
        }
    }

    let _turn = one_shared_run();
    let runtime = runtime();
    let cluster = runtime.block_on(lock_testkit::etcd::EtcdCluster::start_single());
    let urls = Arc::new(cluster.urls());
    let suite = Suite::new(move || {
        let urls = urls.clone();
        async move {
            let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
            lock_core::EtcdBackend::connect(&urls)
                .await
                .map(IntoBackend::into_backend)
        }
    })
    .probe(EtcdProbe(cluster.client()))
    .min_lease(lock_core::ETCD_MIN_LEASE)
    // A fence is the holder key's create revision: nothing keeps it once the key is deleted.
    .last_fence_kept(false)
    .stress_iterations(100)
    .prefix("conf:");
    let report = run_kit(&runtime, "etcd", suite, "ETCD_CHECK");
    assert!(report.skipped().is_empty(), "{:?}", report.skipped());
}

/// The kit's checks on ZooKeeper (feature `zookeeper`): the test kit's shared ensemble, each
/// check under a prefix of its own, with local hand-off on and off. Sessions of 40 s let every
/// check's lease through (a lease may be at most three quarters of the session); no check
/// waits for a session to expire. Fences are czxids: compared, never counted. Busy answers
/// carry no hint of the holder's remaining lease. `ZOOKEEPER_CHECK=<name part>` runs only the
/// matching checks.
#[cfg(feature = "zookeeper")]
#[test]
fn on_zookeeper() {
    use std::sync::Arc;

    use lock_core::backend::IntoBackend;
    use lock_core::conformance::{Probe, Suite};
    use lock_testkit::zookeeper::{ZkClient, ZooKeeperEnsemble};

    /// Reads and deletes contender nodes with the test kit's own client, never lock-core.
    struct ZkProbe(String);

    impl ZkProbe {
        /// The lock's container and its contender nodes, in queue order.
        async fn contenders(&self, prefix: &str, key: &str) -> (String, Vec<String>) {
            let name = lock_core::backend::LockKey::new(prefix, key).expect("a valid key");
            let dir = format!("/lock-core/{}", escape(name.name()));
            let client = ZkClient::connect(&self.0).await;
            let mut nodes: Vec<String> = client
                .children(&dir)
                .await
                .unwrap_or_default()
                .into_iter()
                .filter(|c| ["q-", "f-", "t-"].iter().any(|k| c.starts_with(k)))
                .collect();
            nodes.sort_by_key(|n| n.rsplit('-').next().map(str::to_owned));
            (dir, nodes)
        }
    }

    /// The backend's escape of a lock name into one node name.
    fn escape(name: &str) -> String {
        name.bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"_:{}@=,+-".contains(&b) {
                    char::from(b).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect()
    }

    impl Probe for ZkProbe {
        fn force_delete<'a>(
            &'a self,
            prefix: &'a str,
            key: &'a str,
        ) -> lock_core::backend::BoxFuture<'a, bool> {
            Box::pin(async move {
                let (dir, nodes) = self.contenders(prefix, key).await;
                match nodes.first() {
                    Some(holder) => {
                        ZkClient::connect(&self.0)
                            .await
                            .delete(&format!("{dir}/{holder}"))
                            .await
                    }
                    None => false,
                }
            })
        }

        fn queued<'a>(
            &'a self,
            prefix: &'a str,
            key: &'a str,
        ) -> lock_core::backend::BoxFuture<'a, Option<usize>> {
            // Behind the holder, waiters' nodes only: a single attempt's (`t-`) is deleted
            // before the attempt answers.
            Box::pin(async move {
                let nodes = self.contenders(prefix, key).await.1;
                Some(
                    nodes
                        .iter()
                        .skip(1)
                        .filter(|n| !n.starts_with("t-"))
                        .count(),
                )
            })
        }
    }

    let _turn = one_shared_run();
    let runtime = runtime();
    let hosts = runtime.block_on(async {
        ZooKeeperEnsemble::shared()
            .await
            .chroot("conformance")
            .await
    });
    let connect = Arc::new(hosts.clone());
    let suite = Suite::new(move || {
        let hosts = connect.clone();
        async move {
            lock_core::ZooKeeperBackend::builder(&hosts)
                .session_timeout(std::time::Duration::from_secs(40))
                // The kit's servers read requests up to 4 MiB: records of the largest size.
                .max_request(4 << 20)
                .connect()
                .await
                .map(IntoBackend::into_backend)
        }
    })
    .probe(ZkProbe(hosts))
    .busy_hint(false)
    // A fence is the holder node's czxid: nothing keeps it once the node is deleted.
    .last_fence_kept(false)
    .stress_iterations(100)
    .prefix("conf:");
    let report = run_kit(&runtime, "zookeeper", suite, "ZOOKEEPER_CHECK");
    // Only the check of the busy answer's hint, which ZooKeeper does not give.
    assert!(report.skipped().len() <= 2, "{:?}", report.skipped());
}

/// Runs the kit's `suite` on `runtime` (only the checks named by the environment variable
/// `only`, when set), prints what passed and was skipped, and checks something ran.
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
fn run_kit(
    runtime: &tokio::runtime::Runtime,
    name: &str,
    mut suite: lock_core::conformance::Suite,
    only: &str,
) -> lock_core::conformance::Report {
    if let Ok(only) = std::env::var(only) {
        suite = suite.only(only);
    }
    let started = std::time::Instant::now();
    let report = runtime.block_on(suite.run());
    println!(
        "[{name}] {} checks passed, skipped {:?}, in {:.1?}",
        report.passed().len(),
        report.skipped(),
        started.elapsed()
    );
    assert!(!report.passed().is_empty(), "no check ran");
    report
}
