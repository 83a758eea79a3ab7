//! A local ZooKeeper ensemble of real server JVMs (3 members by default) on free loopback
//! ports, with its data on tmpfs and a short tick, and the faults consensus tests need: kill
//! (SIGKILL), pause (SIGSTOP), restart with the data kept, a whole-ensemble restart, and a
//! member left without its quorum. [`ZkClient`] looks inside it for assertions (with the
//! `zookeeper-client` crate the backend uses); a [`Proxy`] in front of a member cuts one
//! client off.
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use lock_testkit::zookeeper::ZooKeeperEnsemble;
//!
//! let mut ensemble = ZooKeeperEnsemble::start().await; // 3 members, one leader
//! let zk = ensemble.client().await; // a session on every member's address
//! let czxid = zk.create("/lock", b"").await.czxid;
//!
//! let old = ensemble.kill_leader().await; // SIGKILL
//! let new = ensemble.wait_for_leader().await; // the other two elect one
//! assert_ne!(new, old);
//! assert_eq!(zk.czxid("/lock").await, Some(czxid)); // the client moved on by itself
//!
//! ensemble.restart(old).await; // same ports, same data: it rejoins
//! ensemble.kill_all();
//! ensemble.restart_all().await; // every member back with its data
//! # }
//! ```
//!
//! ## Faults
//!
//! - [`kill`](ZooKeeperEnsemble::kill) / [`restart`](ZooKeeperEnsemble::restart): a crash and
//!   a restart on the same ports with the same data directory (snapshots and transaction log):
//!   the member rejoins and syncs from the leader.
//! - [`pause`](ZooKeeperEnsemble::pause) / [`resume`](ZooKeeperEnsemble::resume): SIGSTOP and
//!   SIGCONT. A paused leader is replaced once its followers have heard nothing for
//!   `syncLimit` ticks; on resume it finds no quorum, steps down and follows the new one.
//!   Sessions connected to a paused member move to another one (the client's own timeout)
//!   or expire.
//! - [`kill_all`](ZooKeeperEnsemble::kill_all) /
//!   [`restart_all`](ZooKeeperEnsemble::restart_all): the whole ensemble down and up again,
//!   keeping every node: a node's `czxid` is unchanged, and the next zxid is larger (a new
//!   epoch).
//! - A client on a minority: [`kill_all_but`](ZooKeeperEnsemble::kill_all_but) kills every
//!   other member. The one left stops serving clients (it drops their connections and answers
//!   "not currently serving requests" to `srvr`) once it notices the lost quorum;
//!   [`restart_killed`](ZooKeeperEnsemble::restart_killed) brings the quorum back.
//! - A member cut off from the quorum while its clients still reach it (a partition between
//!   servers): start with [`quorum_links`](ZooKeeperEnsembleBuilder::quorum_links), then
//!   [`isolate`](ZooKeeperEnsemble::isolate) and [`heal`](ZooKeeperEnsemble::heal). A
//!   follower so cut off answers reads from its aging copy for up to `syncLimit` ticks, then
//!   stops serving.
//! - One client cut off while the others go on: give it a [`Proxy`] per member
//!   ([`proxy`](ZooKeeperEnsemble::proxy), [`proxies`](ZooKeeperEnsemble::proxies)) and cut
//!   them.
//!
//! ## Timing
//!
//! Members run with `tickTime=200`, `initLimit=20`, `syncLimit=5` (see
//! [`ZooKeeperEnsembleBuilder`]): a killed leader is replaced within about a second (the
//! followers see its connections close at once), a paused one after `syncLimit` ticks (1 s)
//! and an election. Sessions may last from 2 ticks (400 ms, ZooKeeper's minimum) to 60 s.
//! Empty containers (lock parents) are deleted within about a second (ZooKeeper's default
//! check runs every minute).
//! A JVM takes a second or two to start; the members start in parallel, and a test that needs
//! no fault of its own shares one ensemble with the others
//! ([`shared`](ZooKeeperEnsemble::shared)), each under its own
//! [`chroot`](ZooKeeperEnsemble::chroot).
//!
//! Data directories are on tmpfs (`/dev/shm`, else the system temp dir): syncs cost nothing,
//! and a restart keeps the data. Every member is killed when the ensemble is dropped, on a
//! panic too, and when the test process ends however it ends (a watchdog process kills the
//! JVMs it leaves: the [`shared`](ZooKeeperEnsemble::shared) ensemble is never dropped).
//!
//! ## What it runs
//!
//! Debian's `zookeeper` package (3.8 on bookworm): `java` with `/usr/share/java/zookeeper.jar`
//! (whose manifest names every other jar it needs) and `slf4j-simple.jar` for the log, main
//! class `org.apache.zookeeper.server.quorum.QuorumPeerMain`, one `zoo.cfg` per member; not
//! the package's `zkServer.sh` nor any system service (`zookeeperd`, which the tests never
//! need). The admin HTTP server is off; every four-letter command is allowed (`ruok`, `srvr`
//! and `mntr` tell the kit whether a member serves and whether it leads).
//!
//! When `java` or the jars are missing, starting an ensemble panics with a message naming the
//! install command (`apt-get install -y zookeeper`); tests never skip silently.
#![allow(
    clippy::panic,
    reason = "a test harness that cannot do its job fails the test using it, loudly and with the cause"
)]

mod builder;
mod client;
mod four_letter;
mod health;
mod member;
mod quorum;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::OnceCell;

pub use builder::ZooKeeperEnsembleBuilder;
pub use client::ZkClient;
pub use four_letter::Mode;

use crate::binary::find_binary;
use crate::members::{Members, SetMember};
use crate::proxy::Proxy;
use crate::tempdir::TempDir;
use member::{Member, PortTaken, Settings};
use quorum::QuorumLinks;

/// The command that installs ZooKeeper (and a JRE with it), named in the panic message when
/// it is missing. Not `zookeeperd`: that one starts a system service.
pub const INSTALL_COMMAND: &str = "apt-get install -y zookeeper";

/// Environment variable naming a `java` binary to use instead of the one on `PATH`.
pub const JAVA_ENV: &str = "LOCK_TESTS_JAVA";

/// Environment variable holding the class path of a ZooKeeper server (the jars, separated by
/// `:`) instead of Debian's.
pub const CLASSPATH_ENV: &str = "LOCK_TESTS_ZOOKEEPER_CLASSPATH";

/// Debian's ZooKeeper jar: its manifest's `Class-Path` names the jars it needs.
const DEBIAN_JAR: &str = "/usr/share/java/zookeeper.jar";

/// A logger for ZooKeeper's slf4j (Debian's `libslf4j-java`, which the package depends on):
/// without one the members log nothing.
const DEBIAN_LOGGER_JAR: &str = "/usr/share/java/slf4j-simple.jar";

/// How often a port already taken (by a parallel test) is retried with a new one.
const PORT_ATTEMPTS: usize = 8;

/// How long the ensemble may take to serve with a leader (at start, after a restart).
const HEALTHY_BOUND: Duration = Duration::from_secs(45);

/// How long an election may take.
const LEADER_BOUND: Duration = Duration::from_secs(20);

/// Finds the `java` binary: `$LOCK_TESTS_JAVA`, then `PATH`, then `/usr/bin/java`.
///
/// # Errors
/// A message naming the install command when there is none.
///
/// ```
/// match lock_testkit::zookeeper::find_java() {
///     Ok(path) => assert!(path.is_file()),
///     Err(message) => assert!(message.contains("apt-get install -y zookeeper")),
/// }
/// ```
pub fn find_java() -> Result<PathBuf, String> {
    find_binary("java", JAVA_ENV, &["/usr/bin/java"], missing_message)
}

/// The class path a member runs with: `$LOCK_TESTS_ZOOKEEPER_CLASSPATH`, else Debian's
/// `zookeeper.jar` and its logger.
///
/// # Errors
/// A message naming the install command when Debian's jar is missing (and the variable unset).
///
/// ```
/// match lock_testkit::zookeeper::find_classpath() {
///     Ok(classpath) => assert!(classpath.contains("zookeeper")),
///     Err(message) => assert!(message.contains("apt-get install -y zookeeper")),
/// }
/// ```
pub fn find_classpath() -> Result<String, String> {
    if let Some(classpath) = std::env::var_os(CLASSPATH_ENV) {
        return Ok(classpath.to_string_lossy().into_owned());
    }
    if !Path::new(DEBIAN_JAR).is_file() {
        return Err(missing_message(&format!("{DEBIAN_JAR} does not exist")));
    }
    let mut classpath = DEBIAN_JAR.to_owned();
    if Path::new(DEBIAN_LOGGER_JAR).is_file() {
        classpath.push(':');
        classpath.push_str(DEBIAN_LOGGER_JAR);
    }
    Ok(classpath)
}

fn missing_message(what: &str) -> String {
    format!(
        "{what}. These tests run real ZooKeeper servers and never skip: install ZooKeeper (and \
         a JRE) with `{INSTALL_COMMAND}` (the README's test command, `bash scripts/test.sh`, \
         installs it when it is missing; not `zookeeperd`, which starts a system service), or \
         set {JAVA_ENV} to a java binary and {CLASSPATH_ENV} to a ZooKeeper server's jars."
    )
}

/// A local ZooKeeper ensemble; every member is killed (and the data removed) on drop. See the
/// [module docs](self) for the faults and timings.
///
/// Members are numbered from 0 (`m0`, `m1`, ...; their `myid` is one more) in every method; a
/// member keeps its ports and data directory across kills and restarts.
#[derive(Debug)]
pub struct ZooKeeperEnsemble {
    // Dropped in this order: the processes before their links and directory.
    members: Members<Member>,
    /// The members' links to each other through proxies, when asked for
    /// ([`ZooKeeperEnsembleBuilder::quorum_links`]).
    links: Option<QuorumLinks>,
    settings: Settings,
    dir: TempDir,
}

impl ZooKeeperEnsemble {
    /// Starts 3 members and waits until they serve with a leader. See
    /// [`ZooKeeperEnsembleBuilder::start`] for panics.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::start().await;
    /// assert_eq!(ensemble.addresses().len(), 3);
    /// # }
    /// ```
    pub async fn start() -> Self {
        Self::builder().start().await
    }

    /// One 3-member ensemble for the whole test process, started by the first caller (the
    /// others wait for it): a JVM ensemble costs seconds to start, so tests that need no
    /// fault of their own share this one, each under its own [`chroot`](Self::chroot). It
    /// cannot be faulted (a shared reference), and its members are killed when the test
    /// process ends, however it ends.
    ///
    /// # Panics
    /// As [`start`](Self::start).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use lock_testkit::zookeeper::ZooKeeperEnsemble;
    /// let ensemble = ZooKeeperEnsemble::shared().await;
    /// assert!(std::ptr::eq(ensemble, ZooKeeperEnsemble::shared().await));
    /// # }
    /// ```
    pub async fn shared() -> &'static ZooKeeperEnsemble {
        static SHARED: OnceCell<ZooKeeperEnsemble> = OnceCell::const_new();
        SHARED.get_or_init(Self::start).await
    }

    /// Creates a fresh, empty node `/<name>-<n>` (`n` unique in this test process) and returns
    /// the connect string rooted there (`127.0.0.1:p1,...,127.0.0.1:p3/<name>-<n>`): a test's
    /// own tree in a [`shared`](Self::shared) ensemble.
    ///
    /// # Panics
    /// When the node cannot be created (no quorum).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use lock_testkit::zookeeper::{ZkClient, ZooKeeperEnsemble};
    /// let ensemble = ZooKeeperEnsemble::shared().await;
    /// let mine = ZkClient::connect(&ensemble.chroot("fifo").await).await;
    /// mine.create("/lock", b"").await; // /fifo-<n>/lock in the ensemble
    /// # }
    /// ```
    pub async fn chroot(&self, name: &str) -> String {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let root = format!("/{name}-{}", NEXT.fetch_add(1, Ordering::Relaxed));
        self.client().await.create(&root, b"").await;
        format!("{}{root}", self.connect_string())
    }

    /// Starts a single standalone server: for tests that need no failover (it is cheaper).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::start_single().await;
    /// assert_eq!(ensemble.leader().await, Some(0));
    /// # }
    /// ```
    pub async fn start_single() -> Self {
        Self::builder().members(1).start().await
    }

    /// Options for starting an ensemble.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::builder().members(5).start().await;
    /// # drop(ensemble);
    /// # }
    /// ```
    pub fn builder() -> ZooKeeperEnsembleBuilder {
        ZooKeeperEnsembleBuilder::default()
    }

    /// How many members it has (running or not).
    ///
    /// See [`ZooKeeperEnsembleBuilder::members`].
    pub fn member_count(&self) -> usize {
        self.members.len()
    }

    /// How many members make a quorum: a majority.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// assert_eq!(lock_testkit::zookeeper::ZooKeeperEnsemble::start().await.quorum(), 2);
    /// # }
    /// ```
    pub fn quorum(&self) -> usize {
        self.members.quorum()
    }

    /// Member `i`'s client address (`127.0.0.1:<port>`), e.g. for a [`Proxy`].
    ///
    /// # Panics
    /// When there is no member `i` (as every per-member method).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::start_single().await;
    /// assert!(ensemble.client_addr(0).ip().is_loopback());
    /// # }
    /// ```
    pub fn client_addr(&self, i: usize) -> SocketAddr {
        self.member(i).client_addr()
    }

    /// Every member's client address, in member order.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::start().await;
    /// assert_eq!(ensemble.addresses()[1], ensemble.client_addr(1));
    /// # }
    /// ```
    pub fn addresses(&self) -> Vec<SocketAddr> {
        self.members.iter().map(Member::client_addr).collect()
    }

    /// The connect string of every member, `127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3` (what
    /// `Locker::zookeeper` takes; append a path for a chroot).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::start().await;
    /// assert_eq!(ensemble.connect_string().split(',').count(), 3);
    /// # }
    /// ```
    pub fn connect_string(&self) -> String {
        connect_string(self.addresses())
    }

    /// Member `i`'s process id, while it runs.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let mut ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::start().await;
    /// assert!(ensemble.pid(2).is_some());
    /// ensemble.kill(2);
    /// assert!(ensemble.pid(2).is_none());
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
    /// let ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::start_single().await;
    /// assert!(ensemble.log(0).contains("QuorumPeerConfig"));
    /// # }
    /// ```
    pub fn log(&self, i: usize) -> String {
        self.member(i).log()
    }

    /// Member `i`'s data directory (kept across restarts, removed on drop).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::start_single().await;
    /// assert!(ensemble.data_dir(0).join("myid").is_file());
    /// # }
    /// ```
    pub fn data_dir(&self, i: usize) -> &Path {
        &self.member(i).data_dir
    }

    /// The members' `tickTime`: ZooKeeper's unit of time (heartbeats, limits, the shortest
    /// session is 2 ticks).
    ///
    /// See [`ZooKeeperEnsembleBuilder::tick_time`].
    pub fn tick_time(&self) -> Duration {
        self.settings.tick_time
    }

    /// How long followers wait for the leader before they elect another: `syncLimit` ticks.
    /// Pause a leader longer than this to have it replaced.
    ///
    /// See [`ZooKeeperEnsembleBuilder::sync_limit`].
    pub fn sync_timeout(&self) -> Duration {
        self.settings.tick_time * self.settings.sync_limit
    }

    /// The shortest session the members grant (2 ticks): a client asking less gets this.
    ///
    /// See [`tick_time`](Self::tick_time).
    pub fn min_session_timeout(&self) -> Duration {
        self.settings.tick_time * 2
    }

    /// The longest session the members grant: a client asking more gets this.
    ///
    /// See [`ZooKeeperEnsembleBuilder::max_session_timeout`].
    pub fn max_session_timeout(&self) -> Duration {
        self.settings.max_session_timeout
    }

    /// How often the leader deletes empty containers.
    ///
    /// See [`ZooKeeperEnsembleBuilder::container_check_interval`].
    pub fn container_check_interval(&self) -> Duration {
        self.settings.container_check_interval
    }

    /// A session on every member (the client picks one and moves on when it goes), for
    /// assertions; see [`ZkClient`].
    ///
    /// # Panics
    /// When no session is established within 10 s.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::start().await;
    /// let zk = ensemble.client().await;
    /// assert_eq!(zk.children("/").await.unwrap(), ["zookeeper"]);
    /// # }
    /// ```
    pub async fn client(&self) -> ZkClient {
        ZkClient::connect(&self.connect_string()).await
    }

    /// A session on member `i` alone: what a client that reaches only that member sees.
    ///
    /// # Panics
    /// When no session is established within 10 s (a member without a quorum serves none).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::start().await;
    /// let stat = ensemble.member_client(0).await.create("/k", b"v").await;
    /// assert_eq!(ensemble.member_client(2).await.czxid("/k").await, Some(stat.czxid));
    /// # }
    /// ```
    pub async fn member_client(&self, i: usize) -> ZkClient {
        ZkClient::connect(&connect_string([self.client_addr(i)])).await
    }

    /// A TCP proxy in front of member `i`'s client port: a client given
    /// `<proxy.addr()>` as its connect string can be cut off alone.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::start_single().await;
    /// let proxy = ensemble.proxy(0).await;
    /// let through = lock_testkit::zookeeper::ZkClient::connect(&proxy.addr().to_string()).await;
    /// through.create("/k", b"v").await;
    /// proxy.cut(); // its session is disconnected, and expires unless the proxy is restored
    /// # }
    /// ```
    pub async fn proxy(&self, i: usize) -> Proxy {
        Proxy::start(self.client_addr(i)).await
    }

    /// A [`Proxy`] in front of every member, in member order: give one client
    /// [`proxied_connect_string`] of them, and [`cut`](Proxy::cut) or
    /// [`blackhole`](Proxy::blackhole) them all to cut that client off from the whole
    /// ensemble while others go on.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use lock_testkit::zookeeper::{ZooKeeperEnsemble, proxied_connect_string};
    /// let ensemble = ZooKeeperEnsemble::start().await;
    /// let proxies = ensemble.proxies().await;
    /// let connect = proxied_connect_string(&proxies);
    /// // ... a client on `connect` takes a lock, then:
    /// proxies.iter().for_each(|p| p.blackhole());
    /// # drop(connect);
    /// # }
    /// ```
    pub async fn proxies(&self) -> Vec<Proxy> {
        Proxy::start_each(self.addresses()).await
    }

    /// Kills member `i` with SIGKILL, like a crash (a paused member too), and waits for it to
    /// exit. Its ports and data are kept for [`restart`](Self::restart). Does nothing when it
    /// is not running.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let mut ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::start().await;
    /// ensemble.kill(1);
    /// assert!(!ensemble.is_running(1));
    /// ensemble.client().await.create("/k", b"v").await; // two of three: still a quorum
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
    /// let mut ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::start().await;
    /// ensemble.kill_all_but(0);
    /// ensemble.wait_for_no_leader().await;
    /// ensemble.restart_killed().await;
    /// # }
    /// ```
    pub fn kill_all_but(&mut self, i: usize) {
        self.members.kill_all_but(i);
    }

    /// Freezes member `i` with SIGSTOP (waits until every thread has stopped): connections
    /// stay open, nothing is answered, it sends no heartbeats.
    ///
    /// # Panics
    /// When it is not running or `kill` fails.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let mut ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::start().await;
    /// let leader = ensemble.pause_leader().await;
    /// assert!(ensemble.is_paused(leader));
    /// assert_ne!(ensemble.wait_for_leader().await, leader);
    /// ensemble.resume(leader);
    /// ensemble.wait_healthy().await;
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
    /// When no leader is elected within 20 s.
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
    /// When no leader is elected within 20 s.
    ///
    /// See [`pause`](Self::pause).
    pub async fn pause_leader(&mut self) -> usize {
        let leader = self.wait_for_leader().await;
        self.pause(leader);
        leader
    }

    /// Starts member `i` again (killing it first if it runs) on the same ports with its data:
    /// it rejoins as the member it was. When a quorum of members is then live (running, not
    /// paused), waits until member `i` serves clients; otherwise only until it answers `ruok`
    /// (without a quorum it serves no client).
    ///
    /// # Panics
    /// When its ports stay taken, it exits, or it does not serve within 45 s.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let mut ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::start().await;
    /// let stat = ensemble.client().await.create("/k", b"v").await;
    /// ensemble.kill(2);
    /// ensemble.restart(2).await;
    /// assert_eq!(ensemble.member_client(2).await.czxid("/k").await, Some(stat.czxid));
    /// # }
    /// ```
    pub async fn restart(&mut self, i: usize) {
        self.members.kill(i);
        self.relaunch(i).await;
        if self.live_count() >= self.quorum() {
            self.wait_serving(i).await;
        }
    }

    /// Restarts every member that is not running (killed), with its data, and, when that
    /// makes a quorum live, waits until the ensemble is healthy.
    ///
    /// # Panics
    /// As [`restart`](Self::restart) and [`wait_healthy`](Self::wait_healthy).
    ///
    /// See [`kill_all_but`](Self::kill_all_but).
    pub async fn restart_killed(&mut self) {
        let killed = self.members.not_running();
        // Every JVM starts before the kit waits for any: they start in parallel.
        for &i in &killed {
            let servers = self.server_lines(i);
            self.members[i].spawn(&self.settings, &servers);
        }
        for &i in &killed {
            if self.members[i].wait_up().await.is_err() {
                self.relaunch(i).await;
            }
        }
        if self.live_count() >= self.quorum() {
            self.wait_healthy().await;
        }
    }

    /// Restarts the whole ensemble: kills every member still running, starts them all again
    /// with their data, and waits until the ensemble is healthy. Nodes, their zxids and
    /// sessions survive (a session's clock restarts with its full timeout).
    ///
    /// # Panics
    /// As [`restart`](Self::restart) and [`wait_healthy`](Self::wait_healthy).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let mut ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::start().await;
    /// let stat = ensemble.client().await.create("/k", b"v").await;
    /// ensemble.kill_all();
    /// ensemble.restart_all().await;
    /// assert_eq!(ensemble.client().await.czxid("/k").await, Some(stat.czxid));
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

    /// Member `i`'s `server.N=` lines (every member's, the others' through its quorum links
    /// when there are some); none for a single member (it runs standalone).
    fn server_lines(&self, i: usize) -> Vec<String> {
        if self.members.len() == 1 {
            return Vec::new();
        }
        match &self.links {
            Some(links) => links.server_lines(i, &self.members),
            None => self.members.iter().map(Member::server_line).collect(),
        }
    }

    /// Starts a new ensemble's members in parallel; when another process took one of the
    /// ports meanwhile, starts afresh on new ones.
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
        panic!(
            "ZooKeeper could not bind free ports in {PORT_ATTEMPTS} attempts; last log:\n{last}"
        );
    }

    async fn try_launch_new(&mut self) -> Result<(), PortTaken> {
        if self.settings.quorum_links {
            // On these members' ports (new ones after a port was taken).
            self.links = Some(QuorumLinks::start(&self.members).await);
        }
        for i in 0..self.members.len() {
            let servers = self.server_lines(i);
            self.members[i].spawn(&self.settings, &servers);
        }
        for member in self.members.iter_mut() {
            member.wait_up().await?;
        }
        Ok(())
    }

    /// Starts member `i` again on its ports, retrying while a port is still taken.
    async fn relaunch(&mut self, i: usize) {
        let servers = self.server_lines(i);
        let mut last = String::new();
        for attempt in 0..PORT_ATTEMPTS {
            match self.members[i].launch(&self.settings, &servers).await {
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

/// `127.0.0.1:p1,127.0.0.1:p2` for these addresses: a connect string.
///
/// ```
/// let addrs: Vec<std::net::SocketAddr> = vec!["127.0.0.1:1".parse().unwrap(), "127.0.0.1:2".parse().unwrap()];
/// assert_eq!(lock_testkit::zookeeper::connect_string(addrs), "127.0.0.1:1,127.0.0.1:2");
/// ```
pub fn connect_string(addrs: impl IntoIterator<Item = SocketAddr>) -> String {
    let addrs: Vec<String> = addrs.into_iter().map(|a| a.to_string()).collect();
    addrs.join(",")
}

/// The connect string of these proxies (their addresses, in order): a client on it reaches
/// the ensemble only through them.
///
/// See [`ZooKeeperEnsemble::proxies`].
pub fn proxied_connect_string(proxies: &[Proxy]) -> String {
    connect_string(proxies.iter().map(Proxy::addr))
}
