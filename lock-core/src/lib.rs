#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

pub mod backend;
mod background;
#[cfg(feature = "conformance")]
pub mod conformance;
mod engine;
mod error;
#[cfg(feature = "idempotent")]
mod faithful;
mod global;
mod guard;
mod idempotency;
mod inspect;
mod key;
mod locker;
mod macro_support;
mod observe;
mod request;
mod sync;
#[cfg(test)]
mod test_support;
mod token;

#[cfg(any(feature = "redis", feature = "etcd", feature = "zookeeper"))]
pub use backend::MAX_TIMEOUT;
pub use backend::{Backend, MemoryBackend};
#[cfg(feature = "redlock")]
pub use backend::{DEFAULT_SERVER_TIMEOUT, NoQuorum, RedlockBackend, RedlockBackendBuilder};
#[cfg(feature = "etcd")]
pub use backend::{ETCD_MIN_LEASE, EtcdBackend, EtcdBackendBuilder};
#[cfg(feature = "redis")]
pub use backend::{RedisBackend, RedisBackendBuilder};
#[cfg(feature = "cluster")]
pub use backend::{RedisClusterBackend, RedisClusterBackendBuilder};
#[cfg(feature = "sentinel")]
pub use backend::{RedisSentinelBackend, RedisSentinelBackendBuilder};
#[cfg(feature = "zookeeper")]
pub use backend::{ZooKeeperBackend, ZooKeeperBackendBuilder};
pub use engine::scope::{Scoped, current_fence, current_lock};
pub use error::{BoxError, LockError};
pub use global::{clear_global, global, set_global};
pub use guard::{LockGuard, LockInfo};
pub use idempotency::{
    DEFAULT_RESULT_TTL, IdempotencyRecord, IdempotencyState, MAX_FINGERPRINT_LEN, MAX_RESULT_LEN,
    MAX_RESULT_TTL,
};
pub use inspect::{HeldLocks, LockState, MAX_HOLDER_LEN, Unlocked};
pub use key::{DEFAULT_PREFIX, MAX_KEY_LEN, MAX_PREFIX_LEN};
pub use locker::{
    DEFAULT_LEASE, DEFAULT_WAIT, Locker, LockerBuilder, LockerStats, MAX_LEASE, MAX_LOCAL_GRACE,
    MAX_WAIT, MIN_LEASE,
};
pub use request::LockRequest;

#[cfg(feature = "macros")]
pub use lock_macros::distributed_lock;

/// Support for the code `#[distributed_lock]` generates. Not a public API: it may change in any
/// release.
#[doc(hidden)]
pub mod __private {
    pub use std::time::Duration;

    pub use crate::global::global;
    pub use crate::macro_support::run_locked;
    #[cfg(feature = "idempotent")]
    pub use crate::macro_support::{Stored, function_path, run_idempotent, stored};
}
