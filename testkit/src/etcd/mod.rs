//! A local etcd cluster of real `etcd` processes (3 members by default) on free loopback
//! ports, with its data on tmpfs and short election timeouts, and the faults consensus tests
//! need: kill (SIGKILL), pause (SIGSTOP), restart with the data kept, a whole-cluster restart,
//! and a member left without its quorum. [`EtcdClient`] reads and writes it for assertions,
//! without a gRPC client; a [`Proxy`] in front of a member cuts one
//! client off.
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use lock_testkit::etcd::EtcdCluster;
//!
//! let mut cluster = EtcdCluster::start().await; // 3 members, healthy, one leader
//! let etcd = cluster.client();
//! let revision = etcd.put("lock/order:42/token", "holder").await;
//!
//! let old = cluster.kill_leader().await; // SIGKILL
//! let new = cluster.wait_for_leader().await; // the other two elect one
//! assert_ne!(new, old);
//! assert_eq!(etcd.get("lock/order:42/token").await.unwrap().create_revision, revision);
//!
//! cluster.restart(old).await; // same ports, same data: it rejoins
//! cluster.kill_all();
//! cluster.restart_all().await; // every member back with its data
//! assert!(etcd.revision().await >= revision);
//! # }
//! ```
//!
//! ## Faults
//!
//! - [`kill`](EtcdCluster::kill) / [`restart`](EtcdCluster::restart): a crash and a restart on
//!   the same ports with the same data directory; etcd reads its state from there (the
//!   `--initial-cluster*` flags are ignored when the data directory exists) and rejoins.
//! - [`pause`](EtcdCluster::pause) / [`resume`](EtcdCluster::resume): SIGSTOP and SIGCONT.
//!   A paused leader is replaced after an election timeout; on resume it steps down.
//! - [`kill_all`](EtcdCluster::kill_all) / [`restart_all`](EtcdCluster::restart_all): the whole
//!   cluster down and up again, keeping every revision.
//! - A client on a minority: without network namespaces a member cannot be isolated, so
//!   [`kill_all_but`](EtcdCluster::kill_all_but) kills every other member instead. The one left
//!   (already serving clients) is a minority of one: it accepts connections and answers
//!   `maintenance/status`, but commits nothing and answers no linearizable read (etcd fails
//!   them after its request timeout, about 5 s plus two election timeouts).
//!   [`restart_killed`](EtcdCluster::restart_killed) brings the quorum back. A member
//!   restarted alone, without a quorum, does not even serve its client port until the quorum
//!   is back.
//! - One client cut off while the others go on: give it a
//!   [`Proxy`] per member ([`proxy`](EtcdCluster::proxy)) and cut them.
//!
//! ## Timing
//!
//! Members run with `--heartbeat-interval 25 --election-timeout 250` (see
//! [`EtcdClusterBuilder`]): a killed leader is replaced in well under a second. etcd's shortest
//! lease is 1.5 election timeouts rounded up to whole seconds: 1 s here (2 s with etcd's
//! default timeouts), and a 1 s lease does expire about 1 s after its last keepalive. A new
//! leader renews every lease to its full TTL (etcd's lessor promotion): a key bound to a lease
//! outlives its lease's deadline by up to one TTL when the leader changes meanwhile.
//!
//! Such short timeouts make elections quick, and also possible without a fault on a loaded
//! machine (etcd then logs "leader failed to send out heartbeat on time"): a test asks for the
//! leader when it acts on it ([`kill_leader`](EtcdCluster::kill_leader) and
//! [`pause_leader`](EtcdCluster::pause_leader) do) and never assumes it stays; one that needs
//! a steady leader sets longer timeouts on the builder.
//!
//! Data directories are on tmpfs (`/dev/shm`, else the system temp dir): fsyncs cost nothing,
//! and a restart keeps the data. Every member is killed when the cluster is dropped, on a
//! panic too (a test process killed by SIGKILL leaves its members behind, as it would leave
//! a `redis-server`).
//!
//! When `etcd` is not installed, starting a cluster panics with a message naming the install
//! command (`apt-get install -y etcd-server`); tests never skip silently.
#![allow(
    clippy::panic,
    reason = "a test harness that cannot do its job fails the test using it, loudly and with the cause"
)]

mod builder;
mod client;
mod health;
mod http;
mod member;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use builder::EtcdClusterBuilder;
pub use client::{EtcdClient, KeyValue, encode};

use crate::binary::find_binary;
use crate::eventually::eventually_ok;
use crate::members::{Members, SetMember};
use crate::proxy::Proxy;
use crate::tempdir::TempDir;
use member::{Member, PortTaken, Settings};

/// The command that installs etcd, named in the panic message when it is missing.
pub const INSTALL_COMMAND: &str = "apt-get install -y etcd-server";

/// Environment variable naming an `etcd` binary to use instead of the one on `PATH`.
pub const BINARY_ENV: &str = "LOCK_TESTS_ETCD";

/// Where `etcd` is looked for when it is not on `PATH`.
const FALLBACK_BINARIES: &[&str] = &["/usr/bin/etcd", "/usr/local/bin/etcd"];

/// How often a port already taken (by a parallel test) is retried with a new one.
const PORT_ATTEMPTS: usize = 8;

/// How long the cluster may take to become healthy (at start, after a restart).
const HEALTHY_BOUND: Duration = Duration::from_secs(30);

/// How long an election may take.
const LEADER_BOUND: Duration = Duration::from_secs(15);

/// Finds the `etcd` binary: `$LOCK_TESTS_ETCD`, then `PATH`, then `/usr/bin/etcd` and
/// `/usr/local/bin/etcd`.
///
/// # Errors
/// A message naming the install command when there is none.
///
/// ```
/// match lock_testkit::etcd::find_etcd() {
///     Ok(path) => assert!(path.is_file()),
///     Err(message) => assert!(message.contains("apt-get install -y etcd-server")),
/// }
/// ```
pub fn find_etcd() -> Result<PathBuf, String> {
    find_binary("etcd", BINARY_ENV, FALLBACK_BINARIES, missing_message)
}

fn missing_message(what: &str) -> String {
    format!(
        "{what}. These tests run real etcd processes and never skip: install etcd 3.4 with \
         `{INSTALL_COMMAND}` (the README's test command, `bash scripts/test.sh`, installs it \
         when it is missing), or set {BINARY_ENV} to an etcd binary."
    )
}

/// A local etcd cluster; every member is killed (and the data removed) on drop. See the
/// [module docs](self) for the faults and timings.
///
/// Members are numbered from 0 (`m0`, `m1`, ...) in every method; a member keeps its ports and
/// data directory across kills and restarts.
#[derive(Debug)]
pub struct EtcdCluster {
    // Dropped in this order: the processes before their directory.
    members: Members<Member>,
    settings: Settings,
    dir: TempDir,
}

impl EtcdCluster {
    /// Starts 3 members and waits until they are healthy with a leader. See
    /// [`EtcdClusterBuilder::start`] for panics.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::etcd::EtcdCluster::start().await;
    /// assert_eq!(cluster.urls().len(), 3);
    /// # }
    /// ```
    pub async fn start() -> Self {
        Self::builder().start().await
    }

    /// Starts a 1-member cluster: for tests that need no failover (it is cheaper).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::etcd::EtcdCluster::start_single().await;
    /// assert_eq!(cluster.leader().await, Some(0));
    /// # }
    /// ```
    pub async fn start_single() -> Self {
        Self::builder().members(1).start().await
    }

    /// Options for starting a cluster.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::etcd::EtcdCluster::builder().members(5).start().await;
    /// # drop(cluster);
    /// # }
    /// ```
    pub fn builder() -> EtcdClusterBuilder {
        EtcdClusterBuilder::default()
    }

    /// How many members it has (running or not).
    ///
    /// See [`EtcdClusterBuilder::members`].
    pub fn member_count(&self) -> usize {
        self.members.len()
    }

    /// How many members make a quorum: a majority.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// assert_eq!(lock_testkit::etcd::EtcdCluster::start().await.quorum(), 2);
    /// # }
    /// ```
    pub fn quorum(&self) -> usize {
        self.members.quorum()
    }

    /// Member `i`'s client URL, `http://127.0.0.1:<port>`.
    ///
    /// # Panics
    /// When there is no member `i` (as every per-member method).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::etcd::EtcdCluster::start_single().await;
    /// assert_eq!(cluster.client_url(0), format!("http://{}", cluster.client_addr(0)));
    /// # }
    /// ```
    pub fn client_url(&self, i: usize) -> String {
        self.member(i).client_url()
    }

    /// Member `i`'s client address (`127.0.0.1:<port>`), e.g. for a [`Proxy`].
    ///
    /// See [`client_url`](Self::client_url).
    pub fn client_addr(&self, i: usize) -> SocketAddr {
        self.member(i).client_addr()
    }

    /// Every member's client URL, in member order (what `Locker::etcd` takes).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::etcd::EtcdCluster::start().await;
    /// assert_eq!(cluster.urls()[1], cluster.client_url(1));
    /// # }
    /// ```
    pub fn urls(&self) -> Vec<String> {
        self.members.iter().map(Member::client_url).collect()
    }

    /// Member `i`'s raft id (as etcd reports it in headers and `leader` fields).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::etcd::EtcdCluster::start().await;
    /// assert_ne!(cluster.member_id(0), cluster.member_id(1));
    /// # }
    /// ```
    pub fn member_id(&self, i: usize) -> u64 {
        self.member(i).id
    }

    /// Member `i`'s process id, while it runs.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let mut cluster = lock_testkit::etcd::EtcdCluster::start().await;
    /// assert!(cluster.pid(2).is_some());
    /// cluster.kill(2);
    /// assert!(cluster.pid(2).is_none());
    /// # }
    /// ```
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.member(i).process.pid()
    }

    /// Whether member `i` runs (paused counts as running).
    ///
    /// See [`kill`](Self::kill).
    pub fn is_running(&self, i: usize) -> bool {
        self.member(i).process.is_running()
    }

    /// Whether member `i` is paused by [`pause`](Self::pause).
    ///
    /// See [`pause`](Self::pause).
    pub fn is_paused(&self, i: usize) -> bool {
        self.member(i).process.is_paused()
    }

    /// Member `i`'s log, every launch of it (for failure messages).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::etcd::EtcdCluster::start_single().await;
    /// assert!(cluster.log(0).contains("serving client traffic"));
    /// # }
    /// ```
    pub fn log(&self, i: usize) -> String {
        self.member(i).log()
    }

    /// Member `i`'s data directory (kept across restarts, removed on drop).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::etcd::EtcdCluster::start_single().await;
    /// assert!(cluster.data_dir(0).join("member").is_dir());
    /// # }
    /// ```
    pub fn data_dir(&self, i: usize) -> &Path {
        &self.member(i).data_dir
    }

    /// The members' `--heartbeat-interval`.
    ///
    /// See [`EtcdClusterBuilder::heartbeat_interval`].
    pub fn heartbeat_interval(&self) -> Duration {
        self.settings.heartbeat
    }

    /// The members' `--election-timeout`: pause a leader longer than this to have it replaced.
    ///
    /// See [`EtcdClusterBuilder::election_timeout`].
    pub fn election_timeout(&self) -> Duration {
        self.settings.election_timeout
    }

    /// A client of every member (it tries them in turn), for assertions.
    ///
    /// See [`EtcdClient`].
    pub fn client(&self) -> EtcdClient {
        EtcdClient::new(self.members.iter().map(Member::client_addr))
    }

    /// A client of member `i` alone: what a client that reaches only that member sees.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::etcd::EtcdCluster::start().await;
    /// cluster.member_client(0).put("k", "v").await;
    /// assert!(cluster.member_client(2).get("k").await.is_some());
    /// # }
    /// ```
    pub fn member_client(&self, i: usize) -> EtcdClient {
        EtcdClient::new([self.client_addr(i)])
    }

    /// A TCP proxy in front of member `i`'s client port: a client given
    /// `http://<proxy.addr()>` can be cut off alone.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::etcd::EtcdCluster::start_single().await;
    /// let proxy = cluster.proxy(0).await;
    /// let through = lock_testkit::etcd::EtcdClient::new([proxy.addr()]);
    /// through.put("k", "v").await;
    /// proxy.cut();
    /// assert!(through.call("/v3/kv/range", &serde_json::json!({"key": "aw=="})).await.is_err());
    /// # }
    /// ```
    pub async fn proxy(&self, i: usize) -> Proxy {
        Proxy::start(self.client_addr(i)).await
    }

    /// A [`Proxy`] in front of every member, in member order: give one client
    /// `http://<addr>` of each, and [`cut`](Proxy::cut) or [`blackhole`](Proxy::blackhole)
    /// them all to cut that client off from the whole cluster while others go on.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::etcd::EtcdCluster::start().await;
    /// let proxies = cluster.proxies().await;
    /// let urls: Vec<String> = proxies.iter().map(|p| format!("http://{}", p.addr())).collect();
    /// // ... a client on `urls` takes a lock, then:
    /// proxies.iter().for_each(|p| p.blackhole());
    /// # drop(urls);
    /// # }
    /// ```
    pub async fn proxies(&self) -> Vec<Proxy> {
        Proxy::start_each(self.members.iter().map(Member::client_addr)).await
    }

    /// Kills member `i` with SIGKILL, like a crash (a paused member too), and waits for it to
    /// exit. Its ports and data are kept for [`restart`](Self::restart). Does nothing when it
    /// is not running.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let mut cluster = lock_testkit::etcd::EtcdCluster::start().await;
    /// cluster.kill(1);
    /// assert!(!cluster.is_running(1));
    /// cluster.client().put("k", "v").await; // two of three: still a quorum
    /// # }
    /// ```
    pub fn kill(&mut self, i: usize) {
        self.members.kill(i);
    }

    /// Kills every member (SIGKILL); [`restart_all`](Self::restart_all) brings them back with
    /// their data.
    ///
    /// See [`restart_all`](Self::restart_all).
    pub fn kill_all(&mut self) {
        self.members.kill_all();
    }

    /// Kills every member but `i`: member `i` is left as a minority of one (see the
    /// [module docs](self)). [`restart_killed`](Self::restart_killed) brings the others back.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let mut cluster = lock_testkit::etcd::EtcdCluster::start().await;
    /// cluster.kill_all_but(0);
    /// let lonely = cluster.member_client(0).timeout(std::time::Duration::from_secs(1));
    /// assert!(lonely.call("/v3/kv/put", &serde_json::json!({"key": "aw=="})).await.is_err());
    /// cluster.restart_killed().await;
    /// # }
    /// ```
    pub fn kill_all_but(&mut self, i: usize) {
        self.members.kill_all_but(i);
    }

    /// Freezes member `i` with SIGSTOP (waits until it has stopped): connections stay open,
    /// nothing is answered, it sends no heartbeats.
    ///
    /// # Panics
    /// When it is not running or `kill` fails.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let mut cluster = lock_testkit::etcd::EtcdCluster::start().await;
    /// let leader = cluster.pause_leader().await;
    /// assert!(cluster.is_paused(leader));
    /// assert_ne!(cluster.wait_for_leader().await, leader);
    /// cluster.resume(leader);
    /// cluster.wait_healthy().await;
    /// # }
    /// ```
    pub fn pause(&mut self, i: usize) {
        self.members.pause(i);
    }

    /// Thaws member `i` (SIGCONT).
    ///
    /// # Panics
    /// When it is not running or `kill` fails.
    ///
    /// See [`pause`](Self::pause).
    pub fn resume(&mut self, i: usize) {
        self.members.resume(i);
    }

    /// Kills the current leader (SIGKILL) and returns its index; the others elect a new one
    /// ([`wait_for_leader`](Self::wait_for_leader)).
    ///
    /// # Panics
    /// When no leader is elected within 15 s.
    ///
    /// See the [module docs](self).
    pub async fn kill_leader(&mut self) -> usize {
        let leader = self.wait_for_leader().await;
        self.kill(leader);
        leader
    }

    /// Pauses the current leader (SIGSTOP) and returns its index.
    ///
    /// # Panics
    /// When no leader is elected within 15 s.
    ///
    /// See [`pause`](Self::pause).
    pub async fn pause_leader(&mut self) -> usize {
        let leader = self.wait_for_leader().await;
        self.pause(leader);
        leader
    }

    /// Starts member `i` again (killing it first if it runs) on the same ports with its data:
    /// it rejoins as the member it was. When a quorum of members is then live (running, not
    /// paused), waits until member `i` is healthy; otherwise only until it serves its peer port
    /// (without a quorum it serves no client).
    ///
    /// # Panics
    /// When its ports stay taken, it exits, or it is not healthy within 30 s.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let mut cluster = lock_testkit::etcd::EtcdCluster::start().await;
    /// let revision = cluster.client().put("k", "v").await;
    /// cluster.kill(2);
    /// cluster.restart(2).await;
    /// assert_eq!(cluster.member_client(2).get("k").await.unwrap().mod_revision, revision);
    /// # }
    /// ```
    pub async fn restart(&mut self, i: usize) {
        self.members.kill(i);
        self.relaunch(i).await;
        if self.live_count() >= self.quorum() {
            let member = self.member(i);
            eventually_ok(
                &format!("{} healthy after its restart", member.what()),
                HEALTHY_BOUND,
                async || member.healthy().await,
            )
            .await;
        }
    }

    /// Restarts every member that is not running (killed), with its data, and, when that
    /// makes a quorum live, waits until the cluster is healthy.
    ///
    /// # Panics
    /// As [`restart`](Self::restart) and [`wait_healthy`](Self::wait_healthy).
    ///
    /// See [`kill_all_but`](Self::kill_all_but).
    pub async fn restart_killed(&mut self) {
        for i in self.members.not_running() {
            self.relaunch(i).await;
        }
        if self.live_count() >= self.quorum() {
            self.wait_healthy().await;
        }
    }

    /// Restarts the whole cluster: kills every member still running, starts them all again
    /// with their data, and waits until the cluster is healthy. Revisions, keys and leases
    /// survive (a lease's clock restarts with its full TTL).
    ///
    /// # Panics
    /// As [`restart`](Self::restart) and [`wait_healthy`](Self::wait_healthy).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let mut cluster = lock_testkit::etcd::EtcdCluster::start().await;
    /// let revision = cluster.client().put("k", "v").await;
    /// cluster.kill_all();
    /// cluster.restart_all().await;
    /// assert_eq!(cluster.client().revision().await, revision);
    /// # }
    /// ```
    pub async fn restart_all(&mut self) {
        self.kill_all();
        self.restart_killed().await;
    }

    fn member(&self, i: usize) -> &Member {
        self.members.member(i)
    }

    fn live_count(&self) -> usize {
        self.members.live_count()
    }

    fn initial_cluster(&self) -> String {
        let peers: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect();
        peers.join(",")
    }

    /// Starts a new cluster's members one after the other; when another process took one of
    /// the ports meanwhile, starts afresh on new ones.
    async fn launch_new(&mut self) {
        let mut last = String::new();
        for _ in 0..PORT_ATTEMPTS {
            match self.try_launch_new().await {
                Ok(()) => return,
                Err(taken) => last = taken.0,
            }
            self.kill_all();
            for i in 0..self.members.len() {
                let _ = std::fs::remove_dir_all(&self.members[i].data_dir);
                self.members[i] = Member::new(i, self.dir.path());
            }
        }
        panic!("etcd could not bind free ports in {PORT_ATTEMPTS} attempts; last log:\n{last}");
    }

    async fn try_launch_new(&mut self) -> Result<(), PortTaken> {
        let initial = self.initial_cluster();
        for member in self.members.iter_mut() {
            member.launch(&self.settings, &initial).await?;
        }
        Ok(())
    }

    /// Starts member `i` again on its ports, retrying while a port is still taken.
    async fn relaunch(&mut self, i: usize) {
        let initial = self.initial_cluster();
        let mut last = String::new();
        for attempt in 0..PORT_ATTEMPTS {
            match self.members[i].launch(&self.settings, &initial).await {
                Ok(()) => return,
                Err(taken) => last = taken.0,
            }
            tokio::time::sleep(Duration::from_millis(50 << attempt.min(4))).await;
        }
        panic!(
            "{} could not restart: its ports stay taken; last log:\n{last}",
            self.members[i].what()
        );
    }
}
