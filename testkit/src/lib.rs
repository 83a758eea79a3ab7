//! The workspace's test kit: everything tests and benches need around the code under test, and
//! nothing of it (no dependency on the lock crates), in the manner of redis-rs's `redis-test`.
//!
//! - [`server`]: real `redis-server` processes on free loopback ports (no persistence,
//!   temporary directories, killed on drop) that a test can stop, restart, pause and resume,
//!   with async helpers to read and poke Redis directly in assertions.
//!
//! - [`cluster`]: a local Redis Cluster ([`cluster::RedisCluster`], 3 primaries and 3 replicas
//!   by default) with failover and slot-migration helpers, and the key-to-slot function.
//! - [`sentinel`]: a primary, its replicas and the sentinels watching it
//!   ([`sentinel::RedisSentinelSet`]), with failover and crash helpers.
//! - [`etcd`]: a local etcd cluster ([`etcd::EtcdCluster`], 3 members by default, data on
//!   tmpfs, short election timeouts) whose members can be killed, paused and restarted with
//!   their data, and a small client of etcd's JSON gateway for assertions
//!   ([`etcd::EtcdClient`]).
//! - [`zookeeper`]: a local ZooKeeper ensemble ([`zookeeper::ZooKeeperEnsemble`], 3 members
//!   by default, data on tmpfs, a short tick) whose members can be killed, paused and
//!   restarted with their data, and a session for assertions ([`zookeeper::ZkClient`]).
//! - [`proxy`]: a TCP proxy that cuts one client off ([`proxy::Proxy`]: drop every
//!   connection, blackhole them, or hold back the answer to one request).
//! - [`acl`]: ACL users a server starts with ([`AclUser`]), and their URLs.
//! - [`tls`]: certificates for TLS tests ([`TlsCerts`]: an authority, server and client
//!   certificates, an unrelated authority); servers take them with
//!   [`RedisServerBuilder::tls`](server::RedisServerBuilder::tls).
//! - [`process`]: child processes driven by lines on stdin and stdout ([`ChildProcess`]), and
//!   the child's side of that protocol ([`process::say`]).
//! - [`signal`]: SIGSTOP/SIGCONT/SIGKILL to a process, and waiting until it has stopped.
//! - [`eventually()`]: a bounded wait for a condition nothing signals.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let server = lock_testkit::RedisServer::start();
//! server.set("k", "v").await;
//! assert_eq!(server.get("k").await.as_deref(), Some("v"));
//! # }
//! ```
//!
//! `redis-server` must be installed (`apt-get install -y redis-server`), and `etcd` 3.4 for the
//! etcd tests (`apt-get install -y etcd-server`), and ZooKeeper with a JRE for the ZooKeeper
//! tests (`apt-get install -y zookeeper`); without them, starting a server or a cluster
//! panics with that command. The kit is unpublished (`publish = false`) and used as a
//! dev-dependency (a dependency of lock-tests and lock-bench, whose binaries use it too).
//!
//! ## Layout
//!
//! One module per kind of process set the tests run. A standalone server is [`server`]; the
//! scale-out set-ups sit beside it, each a set of [`RedisServer`]s started through
//! [`server::RedisServerBuilder`] (free ports, temporary directories, readiness, faults come
//! from there) with its own topology helpers: [`cluster`] (nodes started with
//! `--cluster-enabled yes`, joined with `redis-cli --cluster create`) and [`sentinel`]
//! (sentinels are `redis-server <config> --sentinel`, through
//! [`RedisServerBuilder::sentinel`](server::RedisServerBuilder::sentinel)). [`etcd`] is the
//! consensus store's own set of processes; it shares the kit's free ports, temporary
//! directories, signals and process supervision with the Redis servers, and talks HTTP/JSON
//! to etcd instead of pulling in a gRPC client. [`zookeeper`] runs server JVMs the same way
//! and asks them four-letter commands (`srvr`, `mntr`) who leads. Their waits are bounded and say, when they
//! give up, what was still wrong.

#![forbid(unsafe_code)]

pub mod acl;
mod binary;
pub mod cluster;
pub mod etcd;
mod eventually;
mod members;
mod ports;
pub mod process;
pub mod proxy;
mod reaper;
pub mod sentinel;
pub mod server;
pub mod signal;
mod supervised;
mod tempdir;
pub mod tls;
pub mod zookeeper;

pub use crate::acl::AclUser;
pub use crate::eventually::eventually;
pub use crate::process::{ChildOutput, ChildProcess};
pub use crate::server::RedisServer;
pub use crate::tls::TlsCerts;
