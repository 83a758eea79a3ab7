//! Real `redis-server` processes: one per test, on a free loopback port, with no persistence
//! and its own temporary directory, killed when dropped.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use lock_testkit::RedisServer;
//!
//! let mut server = RedisServer::start();
//! server.set("order:42", "token").await;
//! assert_eq!(server.get("order:42").await.as_deref(), Some("token"));
//! server.restart(); // no persistence: it comes back empty
//! assert_eq!(server.get("order:42").await, None);
//! # }
//! ```
//!
//! Faults: [`stop`](RedisServer::stop) kills the server (SIGKILL, like a crash) and keeps its
//! port, [`restart`](RedisServer::restart) starts it again on that port with the same
//! arguments (empty: there is no persistence), [`pause`](RedisServer::pause) and
//! [`resume`](RedisServer::resume) freeze and thaw it (SIGSTOP/SIGCONT: connections stay open
//! but nothing is answered), [`client_kill_all`](RedisServer::client_kill_all) drops every
//! client connection.
//!
//! When `redis-server` is not installed, starting a server panics with a message naming the
//! install command (`apt-get install -y redis-server`); tests never skip silently. A caller that
//! must not panic (a benchmark's CLI) checks [`find_redis_server`] first.
#![allow(
    clippy::panic,
    reason = "a test harness that cannot do its job fails the test using it, loudly and with the cause"
)]

mod binary;
mod builder;
mod commands;

use std::fs;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub use binary::{BINARY_ENV, INSTALL_COMMAND, find_redis_server, find_redis_server_in};
pub use builder::RedisServerBuilder;
pub use commands::parse_commandstats;

use crate::acl::AclUser;
use crate::supervised::Supervised;
use crate::tempdir::TempDir;
use binary::missing_message;

/// How long a starting server may take to answer `PING`.
const READY_DEADLINE: Duration = Duration::from_secs(15);

/// How often a port already taken (by a parallel test) is retried with a new one.
const PORT_ATTEMPTS: usize = 8;

/// One `redis-server` process, killed (and its directory removed) on drop.
///
/// Started on `127.0.0.1` with `--save ""`, `--appendonly no`, its own temporary `--dir`, no
/// config file, and `--enable-debug-command local` (so fault tests may use `DEBUG SLEEP`).
///
/// The async helpers ([`get`](Self::get), [`pttl`](Self::pttl), ...) open a fresh connection
/// per call, authenticated with the `--requirepass` password when one was given; they panic
/// on failure, as assertions do. Their own commands show in [`commandstats`](Self::commandstats).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let server = lock_testkit::RedisServer::start();
/// server.set("k", "v").await;
/// assert_eq!(server.get("k").await.as_deref(), Some("v"));
/// # }
/// ```
#[derive(Debug)]
pub struct RedisServer {
    binary: PathBuf,
    args: Vec<String>,
    /// The TLS port and its files, when started with [`RedisServerBuilder::tls`] (boxed: the
    /// rare case keeps the struct small, as enums that hold a server want).
    tls: Option<Box<ServerTls>>,
    port: u16,
    dir: TempDir,
    unixsocket: Option<PathBuf>,
    password: Option<String>,
    /// The config file given as the first argument (written by [`RedisServerBuilder::config`]).
    config: Option<PathBuf>,
    /// Started with `--sentinel` (readiness is judged on the sentinel's own log line).
    sentinel: bool,
    process: Supervised,
}

/// A server's TLS port and the files it serves it with (copies in its directory).
#[derive(Debug)]
struct ServerTls {
    port: u16,
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
    /// `--tls-auth-clients yes`.
    auth_clients: bool,
}

enum Launch {
    /// The port was taken between choosing and binding it: choose another.
    PortTaken(String),
}

impl RedisServer {
    /// Starts a server with the harness's defaults. See [`RedisServerBuilder::start`] for panics.
    ///
    /// ```
    /// let server = lock_testkit::RedisServer::start();
    /// assert!(server.url().starts_with("redis://127.0.0.1:"));
    /// ```
    pub fn start() -> Self {
        Self::builder().start()
    }

    /// Starts a server with extra arguments, e.g. `["--requirepass", "pw"]` or an ACL user
    /// `["--user", "app", "on", ">secret", "~lock:*", "&lock:*", "+@all"]`.
    ///
    /// ```
    /// let server = lock_testkit::RedisServer::start_with(["--requirepass", "pw"]);
    /// assert!(server.admin_url().contains(":pw@"));
    /// ```
    pub fn start_with<I, S>(args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::builder().args(args).start()
    }

    /// A server in cluster mode that owns no slots: it cannot store keys, but it answers
    /// `CLUSTER KEYSLOT` (see [`keyslot`](Self::keyslot)), which a standalone server refuses.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let node = lock_testkit::RedisServer::start_cluster_node();
    /// assert_eq!(node.keyslot("foo").await, 12182);
    /// # }
    /// ```
    pub fn start_cluster_node() -> Self {
        Self::start_with([
            "--cluster-enabled".to_owned(),
            "yes".to_owned(),
            "--cluster-config-file".to_owned(),
            "nodes.conf".to_owned(),
            // Its own bus port: the default, port + 10000, is refused above port 55535 (about
            // a fifth of the range the kernel picks free ports from) and may be taken.
            "--cluster-port".to_owned(),
            crate::ports::free_port().to_string(),
        ])
    }

    /// Options for starting a server.
    ///
    /// ```
    /// let server = lock_testkit::RedisServer::builder().arg("--maxclients").arg("50").start();
    /// # drop(server);
    /// ```
    pub fn builder() -> RedisServerBuilder {
        RedisServerBuilder::default()
    }

    /// The TCP port (kept across [`stop`](Self::stop) and [`restart`](Self::restart)).
    ///
    /// ```
    /// let server = lock_testkit::RedisServer::start();
    /// assert!(server.url().contains(&server.port().to_string()));
    /// ```
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/`, without credentials.
    ///
    /// ```
    /// let server = lock_testkit::RedisServer::start();
    /// assert_eq!(server.url(), format!("redis://127.0.0.1:{}/", server.port()));
    /// ```
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The TLS port, when started with [`RedisServerBuilder::tls`] (kept across
    /// [`restart`](Self::restart)).
    ///
    /// ```
    /// assert_eq!(lock_testkit::RedisServer::start().tls_port(), None);
    /// ```
    pub fn tls_port(&self) -> Option<u16> {
        self.tls.as_ref().map(|tls| tls.port)
    }

    /// The port clients, replicas, sentinels and cluster peers use: the TLS port when there is
    /// one, else the plain port.
    ///
    /// ```
    /// let server = lock_testkit::RedisServer::start();
    /// assert_eq!(server.service_port(), server.port());
    /// ```
    pub fn service_port(&self) -> u16 {
        self.tls_port().unwrap_or(self.port)
    }

    /// `rediss://127.0.0.1:<tls port>/`, without credentials.
    ///
    /// # Panics
    /// When the server was started without [`RedisServerBuilder::tls`].
    ///
    /// ```
    /// let certs = lock_testkit::TlsCerts::generate();
    /// let server = lock_testkit::RedisServer::builder().tls(&certs).start();
    /// assert_eq!(server.tls_url(), format!("rediss://127.0.0.1:{}/", server.tls_port().unwrap()));
    /// ```
    pub fn tls_url(&self) -> String {
        match self.tls_port() {
            Some(port) => format!("rediss://127.0.0.1:{port}/"),
            None => panic!(
                "the server on port {} has no TLS port (start it with RedisServerBuilder::tls)",
                self.port
            ),
        }
    }

    /// The URL with an ACL user and password: `redis://<user>:<password>@127.0.0.1:<port>/`.
    /// An empty user means the default user (`redis://:<password>@...`).
    ///
    /// ```
    /// let server = lock_testkit::RedisServer::start();
    /// assert_eq!(server.url_as("app", "pw"), format!("redis://app:pw@127.0.0.1:{}/", server.port()));
    /// ```
    pub fn url_as(&self, user: &str, password: &str) -> String {
        format!("redis://{user}:{password}@127.0.0.1:{}/", self.port)
    }

    /// The URL that logs in as `user` (defined with [`RedisServerBuilder::user`]).
    ///
    /// ```
    /// let user = lock_testkit::AclUser::new("app", "pw");
    /// let server = lock_testkit::RedisServer::builder().user(&user).start();
    /// assert_eq!(server.url_for(&user), server.url_as("app", "pw"));
    /// ```
    pub fn url_for(&self, user: &AclUser) -> String {
        self.url_as(user.name(), user.password())
    }

    /// The URL the helpers use: [`url`](Self::url) with the `--requirepass` password, if any.
    ///
    /// ```
    /// let server = lock_testkit::RedisServer::start();
    /// assert_eq!(server.admin_url(), server.url());
    /// ```
    pub fn admin_url(&self) -> String {
        match &self.password {
            Some(pw) => self.url_as("", pw),
            None => self.url(),
        }
    }

    /// `redis+unix://<dir>/redis.sock` when started with [`RedisServerBuilder::unixsocket`].
    ///
    /// ```
    /// assert_eq!(lock_testkit::RedisServer::start().unix_url(), None);
    /// ```
    pub fn unix_url(&self) -> Option<String> {
        self.unixsocket
            .as_ref()
            .map(|p| format!("redis+unix://{}", p.display()))
    }

    /// The `--requirepass` password given at start, if any.
    ///
    /// ```
    /// assert_eq!(lock_testkit::RedisServer::start().password(), None);
    /// ```
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The server's working directory (removed on drop).
    ///
    /// ```
    /// assert!(lock_testkit::RedisServer::start().dir().is_dir());
    /// ```
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The process id, while running.
    ///
    /// ```
    /// let mut server = lock_testkit::RedisServer::start();
    /// assert!(server.pid().is_some());
    /// server.stop();
    /// assert!(server.pid().is_none());
    /// ```
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Whether the process is running (paused counts as running).
    ///
    /// ```
    /// let server = lock_testkit::RedisServer::start();
    /// assert!(server.is_running());
    /// ```
    pub fn is_running(&self) -> bool {
        self.process.is_running()
    }

    /// Whether the server is paused by [`pause`](Self::pause).
    ///
    /// ```
    /// assert!(!lock_testkit::RedisServer::start().is_paused());
    /// ```
    pub fn is_paused(&self) -> bool {
        self.process.is_paused()
    }

    /// The server's log so far (for failure messages).
    ///
    /// ```
    /// assert!(lock_testkit::RedisServer::start().log().contains("Ready to accept connections"));
    /// ```
    pub fn log(&self) -> String {
        read_logs(self.dir.path())
    }

    /// Kills the server with SIGKILL, like a crash, and waits for it to exit. The port is kept
    /// for [`restart`](Self::restart). Does nothing when it is not running.
    ///
    /// ```
    /// let mut server = lock_testkit::RedisServer::start();
    /// server.stop();
    /// assert!(std::net::TcpStream::connect(("127.0.0.1", server.port())).is_err());
    /// ```
    pub fn stop(&mut self) {
        self.process.kill();
    }

    /// Starts the server again on the same port with the same arguments (stopping it first
    /// if it runs). Without persistence it comes back empty.
    ///
    /// # Panics
    /// When the port stays taken by another process or the server does not come up.
    ///
    /// ```
    /// let mut server = lock_testkit::RedisServer::start();
    /// let port = server.port();
    /// server.restart();
    /// assert_eq!(server.port(), port);
    /// assert!(server.is_running());
    /// ```
    pub fn restart(&mut self) {
        self.stop();
        let mut last = String::new();
        // The old process is gone, but the port may linger briefly in the kernel.
        for attempt in 0..PORT_ATTEMPTS {
            match self.launch() {
                Ok(()) => return,
                Err(Launch::PortTaken(log)) => last = log,
            }
            std::thread::sleep(Duration::from_millis(50 << attempt.min(4)));
        }
        panic!(
            "redis-server could not restart on port {}: still taken; last log:\n{last}",
            self.port
        );
    }

    /// Freezes the server with SIGSTOP: connections stay open, nothing is answered, keys do not
    /// expire while it is frozen (its clock still runs: they expire at once on resume).
    ///
    /// # Panics
    /// When the server is not running or `kill` fails.
    ///
    /// ```
    /// let mut server = lock_testkit::RedisServer::start();
    /// server.pause();
    /// assert!(server.is_paused());
    /// server.resume();
    /// ```
    pub fn pause(&mut self) {
        self.process.pause(&self.what());
    }

    /// Thaws a server frozen by [`pause`](Self::pause) (SIGCONT).
    ///
    /// # Panics
    /// When the server is not running or `kill` fails.
    ///
    /// ```
    /// let mut server = lock_testkit::RedisServer::start();
    /// server.pause();
    /// server.resume();
    /// assert!(!server.is_paused());
    /// ```
    pub fn resume(&mut self) {
        self.process.resume(&self.what());
    }

    fn what(&self) -> String {
        format!("redis-server on port {}", self.port)
    }

    fn launch(&mut self) -> Result<(), Launch> {
        let dir = self.dir.path().to_path_buf();
        // Fresh logs per launch: readiness is judged on this launch's log alone.
        let _ = fs::remove_file(dir.join("redis.log"));
        let stderr = fs::File::create(dir.join("stderr.log"))
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.join("stderr.log").display()));
        let mut cmd = Command::new(&self.binary);
        // A config file must be the first argument; sentinel rewrites it (it lives in `dir`).
        if let Some(config) = &self.config {
            cmd.arg(config);
        }
        cmd.arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .arg("--logfile")
            .arg(dir.join("redis.log"))
            .args(["--daemonize", "no"])
            .args(["--enable-debug-command", "local"]);
        if let Some(sock) = &self.unixsocket {
            cmd.arg("--unixsocket")
                .arg(sock)
                .args(["--unixsocketperm", "700"]);
        }
        if let Some(tls) = &self.tls {
            cmd.arg("--tls-port")
                .arg(tls.port.to_string())
                .arg("--tls-cert-file")
                .arg(&tls.cert)
                .arg("--tls-key-file")
                .arg(&tls.key)
                .arg("--tls-ca-cert-file")
                .arg(&tls.ca)
                .arg("--tls-auth-clients")
                .arg(if tls.auth_clients { "yes" } else { "no" });
        }
        cmd.args(&self.args);
        if self.sentinel {
            cmd.arg("--sentinel");
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        let child = cmd.spawn().unwrap_or_else(|e| {
            panic!(
                "{}",
                missing_message(&format!("cannot run {}: {e}", self.binary.display()))
            )
        });
        self.process.set(child);
        self.wait_ready()
    }

    /// Polls until this launch answers PING on its port and its log says it is ready (the log
    /// tells our process from another one that may have taken the port meanwhile).
    fn wait_ready(&mut self) -> Result<(), Launch> {
        let deadline = Instant::now() + READY_DEADLINE;
        loop {
            if !self.process.is_running() {
                panic!("redis-server on port {} is not running", self.port);
            }
            if let Some(status) = self.process.exited() {
                let log = read_logs(self.dir.path());
                if log.contains("Address already in use") {
                    return Err(Launch::PortTaken(log));
                }
                panic!(
                    "redis-server exited at start ({status}) on port {} with arguments {:?}; its log:\n{log}",
                    self.port, self.args
                );
            }
            // A sentinel never logs "Ready to accept connections"; it logs its id once running.
            let ready_line = if self.sentinel {
                "Sentinel ID is"
            } else {
                "Ready to accept connections"
            };
            if answers_ping(self.port)
                && fs::read_to_string(self.dir.path().join("redis.log"))
                    .is_ok_and(|l| l.contains(ready_line))
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.stop();
                panic!(
                    "redis-server on port {} did not answer PING within {READY_DEADLINE:?}; its log:\n{}",
                    self.port,
                    read_logs(self.dir.path())
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// The value following `--requirepass`, if any.
fn requirepass(args: &[String]) -> Option<String> {
    args.iter()
        .position(|a| a == "--requirepass")
        .and_then(|i| args.get(i + 1))
        .cloned()
}

/// Whether something on `port` answers a RESP `PING` (`+PONG`, or `-NOAUTH` with a password).
fn answers_ping(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    if stream
        .set_read_timeout(Some(Duration::from_millis(500)))
        .is_err()
        || stream.write_all(b"PING\r\n").is_err()
    {
        return false;
    }
    let mut buf = [0u8; 64];
    match stream.read(&mut buf) {
        Ok(n) if n > 0 => {
            let reply = &buf[..n];
            reply.starts_with(b"+PONG") || reply.starts_with(b"-NOAUTH")
        }
        Ok(_) => false,
        Err(e) if e.kind() == ErrorKind::Interrupted => false,
        Err(_) => false,
    }
}

fn read_logs(dir: &Path) -> String {
    let log = fs::read_to_string(dir.join("redis.log")).unwrap_or_default();
    let stderr = fs::read_to_string(dir.join("stderr.log")).unwrap_or_default();
    if stderr.trim().is_empty() {
        log
    } else {
        format!("{log}\n[stderr]\n{stderr}")
    }
}
