//! A local Redis Sentinel set-up of real `redis-server` processes: one primary, two replicas
//! (`--replicaof`) and three sentinels (`redis-server <conf> --sentinel`, each with its own
//! config file, which sentinel rewrites) watching it under the name `mymaster`, on free
//! loopback ports; with the helpers tests need to fail over and crash the primary.
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use std::time::Duration;
//! use lock_testkit::sentinel::RedisSentinelSet;
//!
//! let mut set = RedisSentinelSet::start().await;
//! assert_eq!(set.primary_port().await, set.primary().port());
//!
//! let old = set.failover().await; // SENTINEL FAILOVER: a replica is promoted
//! assert_ne!(set.primary_port().await, old);
//!
//! let old = set.kill_primary(); // a crash: the sentinels elect and promote a replica
//! let new = set.wait_for_new_primary(old, Duration::from_secs(30)).await;
//! assert_eq!(set.primary().port(), new);
//! # }
//! ```
//!
//! Sentinels run with `down-after-milliseconds` 1000 and `failover-timeout` 3000 (see
//! [`RedisSentinelSetBuilder`]): a crashed primary is replaced within a few seconds. After a
//! failover, Sentinel does not start another automatic one for the same primary within twice
//! the failover timeout (6 s); [`RedisSentinelSet::failover`] is not bound by that.
#![allow(
    clippy::panic,
    reason = "a test harness that cannot do its job fails the test using it, loudly and with the cause"
)]

use std::time::Duration;

use crate::cluster::{info_field, role_of};
use crate::eventually::eventually_ok;
use crate::server::{RedisServer, RedisServerBuilder};
use crate::tls::TlsCerts;

/// The name the sentinels monitor the primary under.
pub const MASTER_NAME: &str = "mymaster";

/// How long the set may take to settle at start.
const START_BOUND: Duration = Duration::from_secs(30);

/// How long a [`RedisSentinelSet::failover`] may take, retries of a refused one included.
const FAILOVER_BOUND: Duration = Duration::from_secs(30);

/// Options for starting a [`RedisSentinelSet`]; from [`RedisSentinelSet::builder`].
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let set = lock_testkit::sentinel::RedisSentinelSet::builder().replicas(1).start().await;
/// assert_eq!(set.replicas().len(), 1);
/// # }
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct RedisSentinelSetBuilder {
    replicas: usize,
    sentinels: usize,
    down_after: Duration,
    failover_timeout: Duration,
    /// Every process's options (TLS, when asked for).
    base: RedisServerBuilder,
}

impl Default for RedisSentinelSetBuilder {
    fn default() -> Self {
        Self {
            replicas: 2,
            sentinels: 3,
            down_after: Duration::from_millis(1000),
            failover_timeout: Duration::from_millis(3000),
            base: RedisServerBuilder::default(),
        }
    }
}

impl RedisSentinelSetBuilder {
    /// How many replicas the primary has (default 2; at least 1, to fail over to).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let set = lock_testkit::sentinel::RedisSentinelSet::builder().replicas(3).start().await;
    /// assert_eq!(set.replicas().len(), 3);
    /// # }
    /// ```
    pub fn replicas(mut self, n: usize) -> Self {
        self.replicas = n;
        self
    }

    /// How many sentinels watch it (default 3; the quorum is a majority of them).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let set = lock_testkit::sentinel::RedisSentinelSet::builder().sentinels(5).start().await;
    /// assert_eq!(set.sentinel_urls().len(), 5);
    /// # }
    /// ```
    pub fn sentinels(mut self, n: usize) -> Self {
        self.sentinels = n;
        self
    }

    /// `sentinel down-after-milliseconds` (default 1000 ms): how long the primary may not
    /// answer before a sentinel thinks it down.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// let set = lock_testkit::sentinel::RedisSentinelSet::builder()
    ///     .down_after(Duration::from_millis(500))
    ///     .start()
    ///     .await;
    /// # drop(set);
    /// # }
    /// ```
    pub fn down_after(mut self, after: Duration) -> Self {
        self.down_after = after;
        self
    }

    /// `sentinel failover-timeout` (default 3000 ms).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// let set = lock_testkit::sentinel::RedisSentinelSet::builder()
    ///     .failover_timeout(Duration::from_secs(5))
    ///     .start()
    ///     .await;
    /// # drop(set);
    /// # }
    /// ```
    pub fn failover_timeout(mut self, timeout: Duration) -> Self {
        self.failover_timeout = timeout;
        self
    }

    /// Every server and sentinel of the set speaks TLS with the certificates of `certs`
    /// ([`RedisServerBuilder::tls`]): replication and the sentinels' connections to the
    /// servers and to each other go over TLS (`--tls-replication yes`), so the sentinels name
    /// the primary's TLS port ([`RedisServer::service_port`]). The code under test is given
    /// [`RedisSentinelSet::sentinel_tls_urls`]; the kit's helpers keep the plain ports.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let certs = lock_testkit::TlsCerts::generate();
    /// let set = lock_testkit::sentinel::RedisSentinelSet::builder().tls(&certs).start().await;
    /// assert_eq!(set.primary_port().await, set.primary().tls_port().unwrap());
    /// # }
    /// ```
    pub fn tls(mut self, certs: &TlsCerts) -> Self {
        self.base = self.base.tls(certs).args(["--tls-replication", "yes"]);
        self
    }

    /// Starts the primary and its replicas, waits until the replicas are in sync
    /// (`master_link_status:up`), starts the sentinels, and waits until every sentinel reports
    /// the primary, sees every replica and every other sentinel, and `SENTINEL CKQUORUM`
    /// passes.
    ///
    /// # Panics
    /// With no replica or no sentinel; when `redis-server` is missing (the message names the
    /// install command); when the set has not settled within 30 s (the message says why).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let set = lock_testkit::sentinel::RedisSentinelSet::builder().start().await;
    /// assert_eq!(set.replicas().len(), 2);
    /// # }
    /// ```
    pub async fn start(self) -> RedisSentinelSet {
        assert!(
            self.replicas >= 1 && self.sentinels >= 1,
            "a sentinel set needs a replica and a sentinel; got {} replicas, {} sentinels",
            self.replicas,
            self.sentinels
        );
        // Replicas sync at once (the default waits 5 s for more replicas).
        let data_node = || self.base.clone().args(["--repl-diskless-sync-delay", "0"]);
        let primary = data_node().start();
        let mut servers = vec![primary];
        for _ in 0..self.replicas {
            let port = servers[0].service_port().to_string();
            servers.push(
                data_node()
                    .args(["--replicaof", "127.0.0.1", port.as_str()])
                    .start(),
            );
        }
        let mut set = RedisSentinelSet {
            servers,
            sentinels: Vec::new(),
            primary: 0,
        };
        // Before the sentinels start: they learn the replicas from the primary's INFO, which
        // they read at once and then only every 10 s.
        eventually_ok("the replicas in sync", START_BOUND, async || {
            set.check_replicas(0).await
        })
        .await;
        let config = format!(
            "sentinel monitor {MASTER_NAME} 127.0.0.1 {port} {quorum}\n\
             sentinel down-after-milliseconds {MASTER_NAME} {down}\n\
             sentinel failover-timeout {MASTER_NAME} {failover}\n\
             sentinel parallel-syncs {MASTER_NAME} {replicas}\n\
             sentinel resolve-hostnames no\n",
            port = set.servers[0].service_port(),
            quorum = self.sentinels / 2 + 1,
            down = self.down_after.as_millis(),
            failover = self.failover_timeout.as_millis(),
            replicas = self.replicas,
        );
        set.sentinels = (0..self.sentinels)
            .map(|_| self.base.clone().config(config.clone()).sentinel().start())
            .collect();
        eventually_ok("the sentinels settled", START_BOUND, async || {
            set.check_sentinels().await
        })
        .await;
        set
    }
}

/// A primary, its replicas and the sentinels watching them; every process is killed (and its
/// directory removed) on drop.
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let set = lock_testkit::sentinel::RedisSentinelSet::start().await;
/// set.primary().set("k", "v").await;
/// assert_eq!(set.master_name(), "mymaster");
/// # }
/// ```
#[derive(Debug)]
pub struct RedisSentinelSet {
    /// The data nodes: index 0 started as the primary.
    servers: Vec<RedisServer>,
    sentinels: Vec<RedisServer>,
    /// The index in `servers` of the primary as last seen.
    primary: usize,
}

impl RedisSentinelSet {
    /// Starts a primary, 2 replicas and 3 sentinels. See [`RedisSentinelSetBuilder::start`].
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let set = lock_testkit::sentinel::RedisSentinelSet::start().await;
    /// assert_eq!(set.sentinels().len(), 3);
    /// # }
    /// ```
    pub async fn start() -> Self {
        Self::builder().start().await
    }

    /// Options for starting a set.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let set = lock_testkit::sentinel::RedisSentinelSet::builder().replicas(1).start().await;
    /// # drop(set);
    /// # }
    /// ```
    pub fn builder() -> RedisSentinelSetBuilder {
        RedisSentinelSetBuilder::default()
    }

    /// The name the sentinels monitor the primary under, [`MASTER_NAME`].
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let set = lock_testkit::sentinel::RedisSentinelSet::start().await;
    /// assert_eq!(set.master_name(), lock_testkit::sentinel::MASTER_NAME);
    /// # }
    /// ```
    pub fn master_name(&self) -> &str {
        MASTER_NAME
    }

    /// Every sentinel's URL, `redis://127.0.0.1:<port>/`: the seed list for a sentinel client.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let set = lock_testkit::sentinel::RedisSentinelSet::start().await;
    /// assert!(set.sentinel_urls().iter().all(|u| u.starts_with("redis://127.0.0.1:")));
    /// # }
    /// ```
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::url).collect()
    }

    /// The sentinels' `rediss://` URLs, of a set started with [`RedisSentinelSetBuilder::tls`].
    ///
    /// # Panics
    /// When the set was started without TLS.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let certs = lock_testkit::TlsCerts::generate();
    /// let set = lock_testkit::sentinel::RedisSentinelSet::builder().tls(&certs).start().await;
    /// assert!(set.sentinel_tls_urls()[0].starts_with("rediss://"));
    /// # }
    /// ```
    pub fn sentinel_tls_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::tls_url).collect()
    }

    /// The sentinel processes (to query with `SENTINEL ...` commands).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let set = lock_testkit::sentinel::RedisSentinelSet::start().await;
    /// let masters: Vec<redis::Value> = set.sentinels()[0].query(redis::cmd("SENTINEL").arg("MASTERS").clone()).await;
    /// assert_eq!(masters.len(), 1);
    /// # }
    /// ```
    pub fn sentinels(&self) -> &[RedisServer] {
        &self.sentinels
    }

    /// Sentinel `index`, to stop, restart, pause or resume it.
    ///
    /// # Panics
    /// When there is no such sentinel.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let mut set = lock_testkit::sentinel::RedisSentinelSet::start().await;
    /// set.sentinel_mut(2).stop();
    /// # }
    /// ```
    pub fn sentinel_mut(&mut self, index: usize) -> &mut RedisServer {
        let len = self.sentinels.len();
        self.sentinels
            .get_mut(index)
            .unwrap_or_else(|| panic!("no sentinel {index} (there are {len})"))
    }

    /// Every data node (primary and replicas), in a fixed order; the first started as primary.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let set = lock_testkit::sentinel::RedisSentinelSet::start().await;
    /// assert_eq!(set.servers().len(), 3);
    /// # }
    /// ```
    pub fn servers(&self) -> &[RedisServer] {
        &self.servers
    }

    /// Data node `index` (of [`servers`](Self::servers)), to stop, restart, pause or resume
    /// it. A killed primary restarted (empty) is made a replica of the new primary by the
    /// sentinels some seconds later ([`wait_until_in_sync`](Self::wait_until_in_sync)).
    ///
    /// # Panics
    /// When there is no such node.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// let mut set = lock_testkit::sentinel::RedisSentinelSet::start().await;
    /// let old = set.kill_primary();
    /// set.wait_for_new_primary(old, Duration::from_secs(30)).await;
    /// let index = set.servers().iter().position(|s| s.port() == old).unwrap();
    /// set.server_mut(index).restart();
    /// set.wait_until_in_sync(Duration::from_secs(30)).await;
    /// # }
    /// ```
    pub fn server_mut(&mut self, index: usize) -> &mut RedisServer {
        let len = self.servers.len();
        self.servers
            .get_mut(index)
            .unwrap_or_else(|| panic!("no data node {index} (there are {len})"))
    }

    /// The primary as last seen: at start, and after [`failover`](Self::failover) or
    /// [`wait_for_new_primary`](Self::wait_for_new_primary). Ask the sentinels with
    /// [`primary_port`](Self::primary_port).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let set = lock_testkit::sentinel::RedisSentinelSet::start().await;
    /// assert!(set.primary().info("replication").await.contains("role:master"));
    /// # }
    /// ```
    pub fn primary(&self) -> &RedisServer {
        &self.servers[self.primary]
    }

    /// The primary as last seen, to stop, restart, pause or resume it.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let mut set = lock_testkit::sentinel::RedisSentinelSet::start().await;
    /// set.primary_mut().pause();
    /// # set.primary_mut().resume();
    /// # }
    /// ```
    pub fn primary_mut(&mut self) -> &mut RedisServer {
        &mut self.servers[self.primary]
    }

    /// The other data nodes (replicas of the primary as last seen; a killed one included).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let set = lock_testkit::sentinel::RedisSentinelSet::start().await;
    /// for replica in set.replicas() {
    ///     assert!(replica.info("replication").await.contains("role:slave"));
    /// }
    /// # }
    /// ```
    pub fn replicas(&self) -> Vec<&RedisServer> {
        self.servers
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != self.primary)
            .map(|(_, s)| s)
            .collect()
    }

    /// The primary's port as the first answering sentinel reports it
    /// (`SENTINEL GET-MASTER-ADDR-BY-NAME`).
    ///
    /// # Panics
    /// When no sentinel answers.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let set = lock_testkit::sentinel::RedisSentinelSet::start().await;
    /// assert_eq!(set.primary_port().await, set.primary().port());
    /// # }
    /// ```
    pub async fn primary_port(&self) -> u16 {
        let mut errors = Vec::new();
        for sentinel in self.live_sentinels() {
            match reported_primary(sentinel).await {
                Ok(port) => return port,
                Err(e) => errors.push(format!("sentinel on port {}: {e}", sentinel.port())),
            }
        }
        panic!("no sentinel reports the primary: {errors:?}");
    }

    /// A failover on demand: `SENTINEL FAILOVER mymaster` (retried while a sentinel answers
    /// that one is in progress or no replica is ready yet), then
    /// [`wait_for_new_primary`](Self::wait_for_new_primary). Returns the old primary's port.
    ///
    /// The old primary still says `role:master` until the sentinels demote it, about 8 to 10 s
    /// later (Sentinel's own delay; a split brain a test can use): wait for that with
    /// [`wait_until_in_sync`](Self::wait_until_in_sync).
    ///
    /// # Panics
    /// When no failover happens within 30 s.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let mut set = lock_testkit::sentinel::RedisSentinelSet::start().await;
    /// let old = set.failover().await;
    /// assert_ne!(set.primary().port(), old);
    /// # }
    /// ```
    pub async fn failover(&mut self) -> u16 {
        let old = self.primary_port().await;
        eventually_ok("SENTINEL FAILOVER accepted", FAILOVER_BOUND, async || {
            let Some(sentinel) = self.live_sentinels().next() else {
                return Err("no sentinel is running".to_owned());
            };
            sentinel
                .try_query::<()>(
                    redis::cmd("SENTINEL")
                        .arg("FAILOVER")
                        .arg(MASTER_NAME)
                        .clone(),
                )
                .await
                .map_err(|e| e.to_string())
        })
        .await;
        self.wait_for_new_primary(old, FAILOVER_BOUND).await;
        old
    }

    /// Kills the primary as last seen with SIGKILL (a crash) and returns its port; follow with
    /// [`wait_for_new_primary`](Self::wait_for_new_primary).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let mut set = lock_testkit::sentinel::RedisSentinelSet::start().await;
    /// let old = set.kill_primary();
    /// assert!(!set.primary().is_running());
    /// # let _ = old;
    /// # }
    /// ```
    pub fn kill_primary(&mut self) -> u16 {
        let primary = self.primary_mut();
        primary.stop();
        primary.service_port()
    }

    /// Waits until every live sentinel reports the same primary, on another port than
    /// `old_port`; that server reports `role:master`, and every other live data node but the
    /// old primary is its replica, in sync. Returns the new primary's port; [`primary`](Self::primary) is it now.
    ///
    /// # Panics
    /// When that is not so within `timeout` (the message says what was still wrong), or the
    /// sentinels report a server the set did not start.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// let mut set = lock_testkit::sentinel::RedisSentinelSet::start().await;
    /// let old = set.kill_primary();
    /// let new = set.wait_for_new_primary(old, Duration::from_secs(30)).await;
    /// assert_ne!(new, old);
    /// # }
    /// ```
    pub async fn wait_for_new_primary(&mut self, old_port: u16, timeout: Duration) -> u16 {
        let what = format!("a new primary instead of port {old_port}");
        let index = eventually_ok(&what, timeout, async || {
            let mut reported = None;
            for sentinel in self.live_sentinels() {
                let port = reported_primary(sentinel)
                    .await
                    .map_err(|e| format!("sentinel on port {}: {e}", sentinel.port()))?;
                if port == old_port {
                    return Err(format!(
                        "sentinel on port {} still reports {old_port}",
                        sentinel.port()
                    ));
                }
                if reported.is_some_and(|p| p != port) {
                    return Err(format!("the sentinels disagree ({reported:?} and {port})"));
                }
                reported = Some(port);
            }
            let port = reported.ok_or("no sentinel is running")?;
            let index = self
                .servers
                .iter()
                .position(|s| s.service_port() == port)
                .unwrap_or_else(|| panic!("the sentinels report port {port}, not one of the set"));
            let role = role_of(&self.servers[index]).await?;
            if role != "master" {
                return Err(format!("port {port} says role {role}"));
            }
            // The old primary, when running still, is demoted by the sentinels only seconds
            // later: wait_until_in_sync waits for that.
            let old = self
                .servers
                .iter()
                .position(|s| s.service_port() == old_port);
            self.check_replicas_but(index, old).await?;
            Ok(index)
        })
        .await;
        self.primary = index;
        self.servers[index].service_port()
    }

    /// Waits until every live data node but the primary (as last seen) is its replica and in
    /// sync (`master_link_status:up`): after a failover, until the sentinels have demoted the
    /// old primary; after a restart of a killed one, until it has rejoined.
    ///
    /// # Panics
    /// When that is not so within `timeout` (the message says which node is not).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// let mut set = lock_testkit::sentinel::RedisSentinelSet::start().await;
    /// set.failover().await;
    /// set.wait_until_in_sync(Duration::from_secs(30)).await;
    /// assert_eq!(set.replicas().len(), 2);
    /// # }
    /// ```
    pub async fn wait_until_in_sync(&self, timeout: Duration) {
        eventually_ok(
            "every data node a replica of the primary, in sync",
            timeout,
            async || self.check_replicas(self.primary).await,
        )
        .await;
    }

    fn live_sentinels(&self) -> impl Iterator<Item = &RedisServer> {
        self.sentinels
            .iter()
            .filter(|s| s.is_running() && !s.is_paused())
    }

    /// `Ok` when every live data node but `primary` replicates it, in sync.
    async fn check_replicas(&self, primary: usize) -> Result<(), String> {
        self.check_replicas_but(primary, None).await
    }

    /// [`check_replicas`](Self::check_replicas) leaving `skip` out.
    async fn check_replicas_but(&self, primary: usize, skip: Option<usize>) -> Result<(), String> {
        let primary_port = self.servers[primary].service_port().to_string();
        for (i, server) in self.servers.iter().enumerate() {
            if i == primary || Some(i) == skip || !server.is_running() || server.is_paused() {
                continue;
            }
            let port = server.port();
            let info: String = server
                .try_query(redis::cmd("INFO").arg("replication").clone())
                .await
                .map_err(|e| format!("port {port}: INFO: {e}"))?;
            let field = |name| info_field(&info, name).unwrap_or("?");
            if field("role") != "slave" || field("master_port") != primary_port {
                return Err(format!(
                    "port {port} is {} of {}, not a replica of {primary_port}",
                    field("role"),
                    field("master_port")
                ));
            }
            if field("master_link_status") != "up" {
                return Err(format!(
                    "replica on port {port} has master_link_status:{}",
                    field("master_link_status")
                ));
            }
        }
        Ok(())
    }

    /// `Ok` when every sentinel reports the primary and sees every replica and every other
    /// sentinel, and the quorum is reachable.
    async fn check_sentinels(&self) -> Result<(), String> {
        let primary = self.servers[self.primary].service_port();
        let (replicas, others) = (self.servers.len() - 1, self.sentinels.len() - 1);
        for sentinel in self.live_sentinels() {
            let port = sentinel.port();
            let reported = reported_primary(sentinel)
                .await
                .map_err(|e| format!("sentinel on port {port}: {e}"))?;
            if reported != primary {
                return Err(format!(
                    "sentinel on port {port} reports {reported}, not {primary}"
                ));
            }
            for (what, want) in [("REPLICAS", replicas), ("SENTINELS", others)] {
                let seen: Vec<redis::Value> = sentinel
                    .try_query(redis::cmd("SENTINEL").arg(what).arg(MASTER_NAME).clone())
                    .await
                    .map_err(|e| format!("sentinel on port {port}: SENTINEL {what}: {e}"))?;
                if seen.len() != want {
                    return Err(format!(
                        "sentinel on port {port} sees {} {what}, not {want}",
                        seen.len()
                    ));
                }
            }
            let () = sentinel
                .try_query(
                    redis::cmd("SENTINEL")
                        .arg("CKQUORUM")
                        .arg(MASTER_NAME)
                        .clone(),
                )
                .await
                .map_err(|e| format!("sentinel on port {port}: SENTINEL CKQUORUM: {e}"))?;
        }
        Ok(())
    }
}

/// The primary's port as `sentinel` reports it.
async fn reported_primary(sentinel: &RedisServer) -> Result<u16, String> {
    let addr: Option<(String, u16)> = sentinel
        .try_query(
            redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(MASTER_NAME)
                .clone(),
        )
        .await
        .map_err(|e| e.to_string())?;
    addr.map(|(_, port)| port)
        .ok_or_else(|| format!("it does not know {MASTER_NAME}"))
}

/// A sentinel of its own, outside any set, that monitors the server on `port` under
/// [`MASTER_NAME`] (quorum 1): a sentinel that names another server than a set's sentinels do
/// (one left with an old or wrong configuration, or cut off from the others). It shares no
/// server with a set, so neither hears of the other. Killed on drop.
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let stray = lock_testkit::RedisServer::start();
/// let sentinel = lock_testkit::sentinel::lone_sentinel(stray.port());
/// let _: Option<(String, u16)> = sentinel
///     .query(redis::cmd("SENTINEL").arg("GET-MASTER-ADDR-BY-NAME").arg("mymaster").clone())
///     .await;
/// # }
/// ```
pub fn lone_sentinel(port: u16) -> RedisServer {
    RedisServer::builder()
        .config(format!(
            "sentinel monitor {MASTER_NAME} 127.0.0.1 {port} 1\n\
             sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
             sentinel failover-timeout {MASTER_NAME} 3000\n\
             sentinel resolve-hostnames no\n"
        ))
        .sentinel()
        .start()
}
