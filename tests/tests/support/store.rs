//! A store shared by two lockers (each another process, as far as locks go): the memory
//! backend or a real redis-server; and `on_both!`, which runs a property on each.

#![allow(
    unused_macros,
    unused_imports,
    reason = "shared by the test files that include `support`; only some run properties on both"
)]

use std::sync::Arc;

use lock_core::backend::{Backend, IntoBackend};
use lock_core::{Locker, LockerBuilder, MemoryBackend, RedisBackend};
use lock_testkit::RedisServer;

/// A hang guard, never a speed claim: the default wait of the lockers built here.
pub const SOON: std::time::Duration = std::time::Duration::from_secs(10);

/// Where the lockers of a property keep their locks.
pub enum Store {
    Memory(MemoryBackend),
    Redis(RedisServer),
}

impl Store {
    pub fn memory() -> Self {
        Store::Memory(MemoryBackend::new())
    }

    pub fn redis() -> Self {
        Store::Redis(RedisServer::start())
    }

    /// A locker of its own on the shared store (another process, as far as locks go).
    pub async fn builder(&self) -> LockerBuilder {
        let backend: Arc<dyn Backend> = match self {
            Store::Memory(m) => m.clone().into_backend(),
            Store::Redis(s) => RedisBackend::connect(&s.url())
                .await
                .expect("connect to the test's redis-server")
                .into_backend(),
        };
        Locker::builder(backend).wait(SOON)
    }

    /// How many waiters queue for `key` in the backend (default prefix).
    pub async fn queued(&self, key: &str) -> usize {
        match self {
            Store::Memory(m) => m.queued(key),
            Store::Redis(s) => usize::try_from(super::queued(s, key).await).unwrap_or(0),
        }
    }

    pub async fn delete(&self, key: &str) {
        match self {
            Store::Memory(m) => assert!(m.force_delete(key)),
            Store::Redis(s) => {
                // The default prefix and the key's hash tag, as lock-core names it.
                assert_eq!(s.del(&format!("lock:{{{key}}}")).await, 1);
            }
        }
    }
}

/// Runs each property on both backends.
macro_rules! on_both {
    // Known holes, each shown by a test that fails until it is fixed: run with `--ignored`.
    (ignore = $why:literal; $($test:ident),* $(,)?) => {
        mod holes_on_memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[ignore = $why]
                async fn $test() {
                    super::$test(super::Store::memory()).await;
                }
            )*
        }
        mod holes_on_redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[ignore = $why]
                async fn $test() {
                    super::$test(super::Store::redis()).await;
                }
            )*
        }
    };
    ($($test:ident),* $(,)?) => {
        mod on_memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(super::Store::memory()).await;
                }
            )*
        }
        mod on_redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(super::Store::redis()).await;
                }
            )*
        }
    };
}
pub(crate) use on_both;

/// Runs `round` (a property of two lockers on `store`, answering the local hand-offs that
/// happened) until one had a local hand-off, 5 times at most, then fails: under load the two
/// lockers can alternate so closely that every turn goes to the other locker's waiter (a local
/// hand-off, and a grace, give way to one), a round that proves nothing about local hand-offs.
pub async fn until_a_local_handoff(store: &Store, round: impl AsyncFn(&Store) -> u64) {
    const ROUNDS: usize = 5;
    for _ in 0..ROUNDS {
        if round(store).await > 0 {
            return;
        }
    }
    panic!("no local hand-off happened in {ROUNDS} rounds: the test proves nothing");
}
