//! The options a [`ZooKeeperEnsemble`] starts with.

#![allow(
    clippy::panic,
    reason = "a test harness that cannot do its job fails the test using it, loudly and with the cause"
)]

use std::path::PathBuf;
use std::time::Duration;

use super::member::{Member, Settings};
use super::{ZooKeeperEnsemble, find_classpath, find_java, missing_message};
use crate::members::Members;
use crate::tempdir::TempDir;

/// Options for starting a [`ZooKeeperEnsemble`]; from [`ZooKeeperEnsemble::builder`].
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::time::Duration;
/// let ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::builder()
///     .members(5)
///     .tick_time(Duration::from_millis(500))
///     .start()
///     .await;
/// assert_eq!(ensemble.member_count(), 5);
/// # }
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct ZooKeeperEnsembleBuilder {
    members: usize,
    tick_time: Duration,
    init_limit: u32,
    sync_limit: u32,
    max_session_timeout: Duration,
    heap_mb: u32,
    container_check_interval: Duration,
    jvm_args: Vec<String>,
    config: Vec<(String, String)>,
    java: Option<PathBuf>,
    classpath: Option<String>,
    quorum_links: bool,
}

impl Default for ZooKeeperEnsembleBuilder {
    fn default() -> Self {
        Self {
            members: 3,
            tick_time: Duration::from_millis(200),
            init_limit: 20,
            sync_limit: 5,
            max_session_timeout: Duration::from_secs(60),
            heap_mb: 128,
            container_check_interval: Duration::from_secs(1),
            // TTL nodes (the backend's idempotency records) need the extended types,
            // and requests up to 4 MiB: an idempotency record of the product's largest size.
            jvm_args: vec![
                "-Dzookeeper.extendedTypesEnabled=true".to_owned(),
                "-Djute.maxbuffer=4194304".to_owned(),
            ],
            config: Vec::new(),
            java: None,
            classpath: None,
            quorum_links: false,
        }
    }
}

impl ZooKeeperEnsembleBuilder {
    /// How many members (default 3; 1 for a standalone server that needs no failover; at
    /// least 1).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::builder().members(1).start().await;
    /// assert_eq!(ensemble.addresses().len(), 1);
    /// # }
    /// ```
    pub fn members(mut self, n: usize) -> Self {
        self.members = n;
        self
    }

    /// `tickTime` (default 200 ms), whole milliseconds: the unit of every ZooKeeper timeout
    /// (the shortest session is 2 ticks, followers give up on a silent leader after
    /// `syncLimit` ticks).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// let ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::builder()
    ///     .tick_time(Duration::from_millis(500))
    ///     .start()
    ///     .await;
    /// assert_eq!(ensemble.min_session_timeout(), Duration::from_secs(1));
    /// # }
    /// ```
    pub fn tick_time(mut self, tick: Duration) -> Self {
        self.tick_time = tick;
        self
    }

    /// `initLimit` (default 20 ticks): how long a follower may take to connect to and sync
    /// with a new leader (generous: JVMs start slowly on a loaded machine).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::builder().init_limit(50).start().await;
    /// # drop(ensemble);
    /// # }
    /// ```
    pub fn init_limit(mut self, ticks: u32) -> Self {
        self.init_limit = ticks;
        self
    }

    /// `syncLimit` (default 5 ticks): how long followers wait for a silent leader (and a
    /// leader for its silent followers) before they elect again.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// let ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::builder().sync_limit(10).start().await;
    /// assert_eq!(ensemble.sync_timeout(), Duration::from_secs(2));
    /// # }
    /// ```
    pub fn sync_limit(mut self, ticks: u32) -> Self {
        self.sync_limit = ticks;
        self
    }

    /// `maxSessionTimeout` (default 60 s): the longest session the members grant.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// let ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::builder()
    ///     .max_session_timeout(Duration::from_secs(5))
    ///     .start()
    ///     .await;
    /// assert_eq!(ensemble.max_session_timeout(), Duration::from_secs(5));
    /// # }
    /// ```
    pub fn max_session_timeout(mut self, timeout: Duration) -> Self {
        self.max_session_timeout = timeout;
        self
    }

    /// Each member's JVM heap, `-Xmx` in MiB (default 128).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::builder().heap_mb(256).start().await;
    /// # drop(ensemble);
    /// # }
    /// ```
    pub fn heap_mb(mut self, mb: u32) -> Self {
        self.heap_mb = mb;
        self
    }

    /// How often the leader deletes empty container nodes (default 1 s; ZooKeeper's own
    /// default is 60 s): a container that had children and has none left is gone within
    /// about this long. `-Dznode.container.checkIntervalMs`, whole milliseconds.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// let ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::builder()
    ///     .container_check_interval(Duration::from_millis(200))
    ///     .start()
    ///     .await;
    /// assert_eq!(ensemble.container_check_interval(), Duration::from_millis(200));
    /// # }
    /// ```
    pub fn container_check_interval(mut self, interval: Duration) -> Self {
        self.container_check_interval = interval;
        self
    }

    /// Adds one JVM argument for every member (after the kit's own), e.g. a
    /// `-Dzookeeper.<property>=<value>` that `zoo.cfg` cannot set.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::builder()
    ///     .jvm_arg("-Dzookeeper.extendedTypesEnabled=true")
    ///     .start()
    ///     .await;
    /// # drop(ensemble);
    /// # }
    /// ```
    pub fn jvm_arg(mut self, arg: impl Into<String>) -> Self {
        self.jvm_args.push(arg.into());
        self
    }

    /// Adds one `key=value` line to every member's `zoo.cfg` (after the kit's own, which it
    /// overrides), e.g. `("extendedTypesEnabled", "true")` for TTL nodes.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::builder()
    ///     .config("extendedTypesEnabled", "true")
    ///     .start()
    ///     .await;
    /// # drop(ensemble);
    /// # }
    /// ```
    pub fn config(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.config.push((key.into(), value.into()));
        self
    }

    /// Whether members reach each other through proxies (default `false`): needed by
    /// [`isolate`](ZooKeeperEnsemble::isolate) and [`heal`](ZooKeeperEnsemble::heal), which
    /// cut a member off from the others while its clients still reach it. Costs 2 proxies per
    /// ordered pair of members in the test process (12 for 3 members), and every peer message
    /// a hop through them.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let mut ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::builder()
    ///     .quorum_links(true)
    ///     .start()
    ///     .await;
    /// ensemble.isolate(0);
    /// assert!(ensemble.is_isolated(0));
    /// # }
    /// ```
    pub fn quorum_links(mut self, on: bool) -> Self {
        self.quorum_links = on;
        self
    }

    /// Uses this `java` binary instead of looking for one. A path that is not a file makes
    /// [`start`](Self::start) panic with the install command.
    ///
    /// ```should_panic
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// lock_testkit::zookeeper::ZooKeeperEnsemble::builder().java("/nonexistent/java").start().await;
    /// # }
    /// ```
    pub fn java(mut self, path: impl Into<PathBuf>) -> Self {
        self.java = Some(path.into());
        self
    }

    /// Uses this class path (a ZooKeeper server's jars, separated by `:`) instead of
    /// Debian's.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::builder()
    ///     .classpath("/opt/zookeeper/lib/*")
    ///     .start()
    ///     .await;
    /// # drop(ensemble);
    /// # }
    /// ```
    pub fn classpath(mut self, classpath: impl Into<String>) -> Self {
        self.classpath = Some(classpath.into());
        self
    }

    /// Starts every member's JVM at once, then waits until every member serves clients and
    /// one leads a quorum.
    ///
    /// # Panics
    /// When `java` or the ZooKeeper jars are missing (the message names
    /// `apt-get install -y zookeeper`), when a member exits at start (the message holds its
    /// log), or when the ensemble does not serve within 45 s (the message says what was still
    /// wrong).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::builder().start().await;
    /// assert!(ensemble.leader().await.is_some());
    /// # }
    /// ```
    pub async fn start(self) -> ZooKeeperEnsemble {
        assert!(
            self.members >= 1,
            "a ZooKeeper ensemble needs at least 1 member"
        );
        let java = match self.java {
            Some(path) if path.is_file() => path,
            Some(path) => panic!(
                "{}",
                missing_message(&format!(
                    "the java binary {} does not exist",
                    path.display()
                ))
            ),
            None => find_java().unwrap_or_else(|message| panic!("{message}")),
        };
        let classpath = match self.classpath {
            Some(classpath) => classpath,
            None => find_classpath().unwrap_or_else(|message| panic!("{message}")),
        };
        let settings = Settings {
            java,
            classpath,
            tick_time: self.tick_time,
            init_limit: self.init_limit,
            sync_limit: self.sync_limit,
            max_session_timeout: self.max_session_timeout,
            heap_mb: self.heap_mb,
            container_check_interval: self.container_check_interval,
            jvm_args: self.jvm_args,
            config: self.config,
            quorum_links: self.quorum_links,
        };
        let dir = TempDir::on_tmpfs("zookeeper");
        let mut ensemble = ZooKeeperEnsemble {
            members: Members::new(
                "ZooKeeper",
                "ensemble",
                (0..self.members)
                    .map(|i| Member::new(i, dir.path()))
                    .collect(),
            ),
            links: None,
            settings,
            dir,
        };
        ensemble.launch_new().await;
        ensemble.wait_healthy().await;
        ensemble
    }
}
