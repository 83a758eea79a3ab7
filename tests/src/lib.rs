//! Cross-crate integration and fault tests for the lock workspace, and the lock-specific
//! harness they use. The lock-agnostic harness (redis-server processes, child-process drivers)
//! is the `lock-testkit` crate.
//!
//! - [`worker`]: the `lock-worker` binary's command line and a handle on a worker process, for
//!   tests that need several OS processes contending for one lock.
//! - [`chaos`]: the records, clock and store script shared by the randomized fault test
//!   (`tests/chaos/`) and its `lock-chaos-worker` processes.
//! - [`probe`]: checks that run inside critical sections, in Redis.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use lock_testkit::RedisServer;
//!
//! let server = RedisServer::start();
//! let locker = lock_core::Locker::redis(&server.url()).await.unwrap();
//! let fence = locker.lock("job").fenced().run(async { lock_core::current_fence() }).await.unwrap();
//! let fence = fence.expect("fenced");
//! assert_eq!(server.get("lock:{job}:fence").await, Some(fence.to_string()));
//! # }
//! ```
//!
//! The tests live in `tests/` (`conformance/`: one suite run against the memory backend and
//! Redis; `harness.rs`: the worker harness itself). Run them with `cargo test -p lock-tests`;
//! `redis-server` must be installed (`apt-get install -y redis-server`).

#![forbid(unsafe_code)]

pub mod chaos;
pub mod probe;
pub mod worker;

/// The guide's chapters (`docs/src`) and the root README, whose Rust examples run as this
/// crate's doctests (`cargo test -p lock-tests --doc`): the book never shows code that does not
/// build or does not do what its text says. Chapters that only include a crate's README
/// (`{{#include ..}}`) are tested as that crate's docs.
#[cfg(doctest)]
mod guide {
    macro_rules! chapters {
        ($($name:ident = $path:literal;)*) => {
            $(
                #[doc = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../", $path))]
                #[allow(dead_code, reason = "a carrier for the file's doctests")]
                struct $name;
            )*
        };
    }
    chapters! {
        Readme = "README.md";
        Introduction = "docs/src/introduction.md";
        GettingStarted = "docs/src/getting-started.md";
        Lease = "docs/src/concepts/lease.md";
        Fencing = "docs/src/concepts/fencing.md";
        Reentrancy = "docs/src/concepts/reentrancy.md";
        Waiting = "docs/src/concepts/waiting.md";
        Choosing = "docs/src/backends/choosing.md";
        Memory = "docs/src/backends/memory.md";
        Redis = "docs/src/backends/redis.md";
        Cluster = "docs/src/backends/cluster.md";
        Sentinel = "docs/src/backends/sentinel.md";
        Failover = "docs/src/backends/failover.md";
        Redlock = "docs/src/backends/redlock.md";
        Custom = "docs/src/backends/custom.md";
        Idempotency = "docs/src/idempotency.md";
        Operating = "docs/src/operating.md";
        Metrics = "docs/src/metrics.md";
        Upgrading = "docs/src/upgrading.md";
    }

    /// The etcd chapter's examples need the etcd backend (feature `etcd`).
    #[cfg(feature = "etcd")]
    mod etcd {
        chapters! {
            Etcd = "docs/src/backends/etcd.md";
        }
    }

    /// The ZooKeeper chapter's examples need the ZooKeeper backend (feature `zookeeper`).
    #[cfg(feature = "zookeeper")]
    mod zookeeper {
        chapters! {
            ZooKeeper = "docs/src/backends/zookeeper.md";
        }
    }
}
