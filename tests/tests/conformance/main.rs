//! The conformance suite: one set of properties, generic over the backend, each run against
//! the memory backend and a real redis-server (`<property>::on_memory::*`,
//! `<property>::on_redis::*`), and again on both with local hand-off turned off
//! (`<property>::without_local_handoff::*`), plus the checks that only make sense on Redis (`redis_only::*`:
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
