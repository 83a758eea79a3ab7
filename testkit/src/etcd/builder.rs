//! The options an [`EtcdCluster`] starts with.

#![allow(
    clippy::panic,
    reason = "a test harness that cannot do its job fails the test using it, loudly and with the cause"
)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::member::{Member, Settings};
use super::{EtcdCluster, find_etcd, missing_message};
use crate::members::Members;
use crate::tempdir::TempDir;

/// Options for starting an [`EtcdCluster`]; from [`EtcdCluster::builder`].
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::time::Duration;
/// let cluster = lock_testkit::etcd::EtcdCluster::builder()
///     .members(5)
///     .heartbeat_interval(Duration::from_millis(50))
///     .election_timeout(Duration::from_millis(500))
///     .start()
///     .await;
/// assert_eq!(cluster.member_count(), 5);
/// # }
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct EtcdClusterBuilder {
    members: usize,
    heartbeat: Duration,
    election_timeout: Duration,
    args: Vec<String>,
    binary: Option<PathBuf>,
}

impl Default for EtcdClusterBuilder {
    fn default() -> Self {
        Self {
            members: 3,
            heartbeat: Duration::from_millis(25),
            election_timeout: Duration::from_millis(250),
            args: Vec::new(),
            binary: None,
        }
    }
}

impl EtcdClusterBuilder {
    /// How many members (default 3; 1 for a cluster that needs no failover, at least 1).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::etcd::EtcdCluster::builder().members(1).start().await;
    /// assert_eq!(cluster.urls().len(), 1);
    /// # }
    /// ```
    pub fn members(mut self, n: usize) -> Self {
        self.members = n;
        self
    }

    /// `--heartbeat-interval` (default 25 ms).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// let cluster = lock_testkit::etcd::EtcdCluster::builder()
    ///     .heartbeat_interval(Duration::from_millis(100))
    ///     .election_timeout(Duration::from_millis(1000))
    ///     .start()
    ///     .await;
    /// assert_eq!(cluster.heartbeat_interval(), Duration::from_millis(100));
    /// # }
    /// ```
    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.heartbeat = interval;
        self
    }

    /// `--election-timeout` (default 250 ms; etcd wants at least 5 heartbeats): how long a
    /// follower waits without hearing from the leader before it starts an election. It also
    /// sets etcd's shortest lease, 1.5 election timeouts rounded up to whole seconds (1 s with
    /// the default).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// let cluster = lock_testkit::etcd::EtcdCluster::builder()
    ///     .election_timeout(Duration::from_millis(500))
    ///     .start()
    ///     .await;
    /// assert_eq!(cluster.election_timeout(), Duration::from_millis(500));
    /// # }
    /// ```
    pub fn election_timeout(mut self, timeout: Duration) -> Self {
        self.election_timeout = timeout;
        self
    }

    /// Adds one extra `etcd` argument (after the kit's own), for every member.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::etcd::EtcdCluster::builder().arg("--pre-vote").start().await;
    /// # drop(cluster);
    /// # }
    /// ```
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Adds extra `etcd` arguments, e.g. `["--auto-compaction-retention", "1"]`.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::etcd::EtcdCluster::builder()
    ///     .args(["--max-txn-ops", "256"])
    ///     .start()
    ///     .await;
    /// # drop(cluster);
    /// # }
    /// ```
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Uses this `etcd` binary instead of looking for one. A path that is not a file makes
    /// [`start`](Self::start) panic with the install command.
    ///
    /// ```should_panic
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// lock_testkit::etcd::EtcdCluster::builder().binary("/nonexistent/etcd").start().await;
    /// # }
    /// ```
    pub fn binary(mut self, path: impl Into<PathBuf>) -> Self {
        self.binary = Some(path.into());
        self
    }

    /// Starts the members one after the other (each serving its peer port before the next
    /// starts, which spares every member etcd's one-second probe of peers that are not up
    /// yet), then waits until every member is healthy and follows one leader.
    ///
    /// # Panics
    /// When `etcd` is missing (the message names `apt-get install -y etcd-server`), when a
    /// member exits at start (the message holds its log), or when the cluster is not healthy
    /// within 30 s (the message says what was still wrong).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::etcd::EtcdCluster::builder().start().await;
    /// assert!(cluster.leader().await.is_some());
    /// # }
    /// ```
    pub async fn start(self) -> EtcdCluster {
        assert!(self.members >= 1, "an etcd cluster needs at least 1 member");
        let binary = match self.binary {
            Some(path) if path.is_file() => path,
            Some(path) => panic!(
                "{}",
                missing_message(&format!(
                    "the etcd binary {} does not exist",
                    path.display()
                ))
            ),
            None => find_etcd().unwrap_or_else(|message| panic!("{message}")),
        };
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let settings = Settings {
            binary,
            // A cluster of its own: a member of another test's cluster that happens to reach
            // one of these ports is refused, not joined.
            token: format!(
                "lock-testkit-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ),
            heartbeat: self.heartbeat,
            election_timeout: self.election_timeout,
            args: self.args,
        };
        let dir = TempDir::on_tmpfs("etcd");
        let mut cluster = EtcdCluster {
            members: Members::new(
                "etcd",
                "cluster",
                (0..self.members)
                    .map(|i| Member::new(i, dir.path()))
                    .collect(),
            ),
            settings,
            dir,
        };
        cluster.launch_new().await;
        cluster.wait_healthy().await;
        cluster
    }
}
