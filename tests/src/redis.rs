//! Real `redis-server` processes for tests: one per test, on a free loopback port, with no
//! persistence and its own temporary directory, killed when dropped.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use lock_tests::redis::RedisServer;
//!
//! let server = RedisServer::start();
//! let locker = lock_core::Locker::redis(&server.url()).await.unwrap();
//! let guard = locker.lock("order:42").await.unwrap();
//! assert!(server.get("lock:{order:42}").await.is_some()); // the token, read directly
//! guard.release().await.unwrap();
//! assert_eq!(server.get("lock:{order:42}").await, None);
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
//! install command (`apt-get install -y redis-server`); tests never skip silently.

#![allow(
    clippy::panic,
    reason = "a test harness that cannot do its job fails the test using it, loudly and with the cause"
)]

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ::redis::aio::MultiplexedConnection;
use ::redis::{AsyncConnectionConfig, Client};

/// The command that installs the server, named in the panic message when it is missing.
pub const INSTALL_COMMAND: &str = "apt-get install -y redis-server";

/// Environment variable naming a `redis-server` binary to use instead of the one on `PATH`.
pub const BINARY_ENV: &str = "LOCK_TESTS_REDIS_SERVER";

/// Where `redis-server` is looked for when it is not on `PATH`.
const FALLBACK_BINARIES: &[&str] = &["/usr/bin/redis-server", "/usr/local/bin/redis-server"];

/// How long a starting server may take to answer `PING`.
const READY_DEADLINE: Duration = Duration::from_secs(15);

/// How often a port already taken (by a parallel test) is retried with a new one.
const PORT_ATTEMPTS: usize = 8;

/// Bound on the harness client's connects and answers (generous: CI machines are busy).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// Finds the `redis-server` binary: `$LOCK_TESTS_REDIS_SERVER`, then `PATH`, then
/// `/usr/bin/redis-server` and `/usr/local/bin/redis-server`.
///
/// # Errors
/// A message naming the install command when there is none.
///
/// ```
/// match lock_tests::redis::find_redis_server() {
///     Ok(path) => assert!(path.ends_with("redis-server") || path.is_file()),
///     Err(message) => assert!(message.contains("apt-get install -y redis-server")),
/// }
/// ```
pub fn find_redis_server() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(BINARY_ENV) {
        let path = PathBuf::from(path);
        if path.is_file() {
            return Ok(path);
        }
        return Err(missing_message(&format!(
            "${BINARY_ENV} points at {}, which is not a file",
            path.display()
        )));
    }
    let fallbacks: Vec<&Path> = FALLBACK_BINARIES.iter().map(Path::new).collect();
    find_redis_server_in(std::env::var_os("PATH").as_deref(), &fallbacks)
}

/// [`find_redis_server`] over an explicit `PATH` value and fallback locations (no environment).
///
/// # Errors
/// A message naming the install command when no candidate is a file.
///
/// ```
/// let err = lock_tests::redis::find_redis_server_in(None, &[]).unwrap_err();
/// assert!(err.contains("apt-get install -y redis-server"));
/// ```
pub fn find_redis_server_in(
    path_var: Option<&OsStr>,
    fallbacks: &[&Path],
) -> Result<PathBuf, String> {
    let on_path = path_var
        .into_iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("redis-server"));
    let fallback = fallbacks.iter().map(|p| p.to_path_buf());
    on_path
        .chain(fallback)
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| {
            let places: Vec<String> = fallbacks.iter().map(|p| p.display().to_string()).collect();
            missing_message(&format!(
                "redis-server is not on PATH nor at {}",
                if places.is_empty() {
                    "any fallback location".to_owned()
                } else {
                    places.join(" or ")
                }
            ))
        })
}

fn missing_message(what: &str) -> String {
    format!(
        "{what}. The lock-tests suite runs real redis-server processes and never skips: install it \
         with `{INSTALL_COMMAND}` (the README's test command, `bash scripts/test.sh`, which .ci/run \
         runs, installs it when it is missing), or set {BINARY_ENV} to a redis-server binary."
    )
}

/// Options for starting a [`RedisServer`]; from [`RedisServer::builder`].
///
/// ```
/// let server = lock_tests::redis::RedisServer::builder()
///     .args(["--maxclients", "100"])
///     .unixsocket()
///     .start();
/// assert!(server.unix_url().is_some());
/// ```
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct RedisServerBuilder {
    binary: Option<PathBuf>,
    args: Vec<String>,
    unixsocket: bool,
}

impl RedisServerBuilder {
    /// Adds one extra command-line argument (after the harness's own).
    ///
    /// ```
    /// let server = lock_tests::redis::RedisServer::builder().arg("--maxclients").arg("100").start();
    /// # drop(server);
    /// ```
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Adds extra command-line arguments. An ACL rule is one `--user` followed by its words as
    /// separate arguments: `["--user", "app", "on", ">secret", "~*", "+@all"]`.
    ///
    /// ```
    /// let server = lock_tests::redis::RedisServer::builder().args(["--requirepass", "pw"]).start();
    /// assert_eq!(server.password(), Some("pw"));
    /// ```
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Also listens on a unix socket in the server's directory; see [`RedisServer::unix_url`].
    ///
    /// ```
    /// let server = lock_tests::redis::RedisServer::builder().unixsocket().start();
    /// assert!(server.unix_url().unwrap().starts_with("redis+unix://"));
    /// ```
    pub fn unixsocket(mut self) -> Self {
        self.unixsocket = true;
        self
    }

    /// Uses this `redis-server` binary instead of looking for one. A path that is not a file
    /// makes [`start`](Self::start) panic with the install command.
    ///
    /// ```should_panic
    /// lock_tests::redis::RedisServer::builder().binary("/nonexistent/redis-server").start();
    /// ```
    pub fn binary(mut self, path: impl Into<PathBuf>) -> Self {
        self.binary = Some(path.into());
        self
    }

    /// Starts the server and waits until it answers `PING`.
    ///
    /// # Panics
    /// When `redis-server` is missing (the message names `apt-get install -y redis-server`),
    /// when it exits at start (the message holds its log), or when it does not answer within
    /// 15 s.
    ///
    /// ```
    /// let server = lock_tests::redis::RedisServer::builder().start();
    /// assert!(server.port() > 0);
    /// ```
    pub fn start(self) -> RedisServer {
        let binary = match self.binary {
            Some(path) if path.is_file() => path,
            Some(path) => panic!(
                "{}",
                missing_message(&format!(
                    "the redis-server binary {} does not exist",
                    path.display()
                ))
            ),
            None => find_redis_server().unwrap_or_else(|message| panic!("{message}")),
        };
        let dir = TempDir::new();
        let password = requirepass(&self.args);
        let unixsocket = self.unixsocket.then(|| dir.path().join("redis.sock"));
        let mut server = RedisServer {
            binary,
            args: self.args,
            port: 0,
            dir,
            unixsocket,
            password,
            child: None,
            paused: false,
        };
        let mut last = String::new();
        for _ in 0..PORT_ATTEMPTS {
            server.port = free_port();
            match server.launch() {
                Ok(()) => return server,
                Err(Launch::PortTaken(log)) => last = log,
            }
        }
        panic!(
            "redis-server could not bind a free port in {PORT_ATTEMPTS} attempts; last log:\n{last}"
        );
    }
}

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
/// let server = lock_tests::redis::RedisServer::start();
/// server.set("k", "v").await;
/// assert_eq!(server.get("k").await.as_deref(), Some("v"));
/// # }
/// ```
#[derive(Debug)]
pub struct RedisServer {
    binary: PathBuf,
    args: Vec<String>,
    port: u16,
    dir: TempDir,
    unixsocket: Option<PathBuf>,
    password: Option<String>,
    child: Option<Child>,
    paused: bool,
}

enum Launch {
    /// The port was taken between choosing and binding it: choose another.
    PortTaken(String),
}

impl RedisServer {
    /// Starts a server with the harness's defaults. See [`RedisServerBuilder::start`] for panics.
    ///
    /// ```
    /// let server = lock_tests::redis::RedisServer::start();
    /// assert!(server.url().starts_with("redis://127.0.0.1:"));
    /// ```
    pub fn start() -> Self {
        Self::builder().start()
    }

    /// Starts a server with extra arguments, e.g. `["--requirepass", "pw"]` or an ACL user
    /// `["--user", "app", "on", ">secret", "~lock:*", "&lock:*", "+@all"]`.
    ///
    /// ```
    /// let server = lock_tests::redis::RedisServer::start_with(["--requirepass", "pw"]);
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
    /// let node = lock_tests::redis::RedisServer::start_cluster_node();
    /// assert_eq!(node.keyslot("foo").await, 12182);
    /// # }
    /// ```
    pub fn start_cluster_node() -> Self {
        Self::start_with([
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
        ])
    }

    /// Options for starting a server.
    ///
    /// ```
    /// let server = lock_tests::redis::RedisServer::builder().arg("--maxclients").arg("50").start();
    /// # drop(server);
    /// ```
    pub fn builder() -> RedisServerBuilder {
        RedisServerBuilder::default()
    }

    /// The TCP port (kept across [`stop`](Self::stop) and [`restart`](Self::restart)).
    ///
    /// ```
    /// let server = lock_tests::redis::RedisServer::start();
    /// assert!(server.url().contains(&server.port().to_string()));
    /// ```
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/`, without credentials.
    ///
    /// ```
    /// let server = lock_tests::redis::RedisServer::start();
    /// assert_eq!(server.url(), format!("redis://127.0.0.1:{}/", server.port()));
    /// ```
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The URL with an ACL user and password: `redis://<user>:<password>@127.0.0.1:<port>/`.
    /// An empty user means the default user (`redis://:<password>@...`).
    ///
    /// ```
    /// let server = lock_tests::redis::RedisServer::start();
    /// assert_eq!(server.url_as("app", "pw"), format!("redis://app:pw@127.0.0.1:{}/", server.port()));
    /// ```
    pub fn url_as(&self, user: &str, password: &str) -> String {
        format!("redis://{user}:{password}@127.0.0.1:{}/", self.port)
    }

    /// The URL the helpers use: [`url`](Self::url) with the `--requirepass` password, if any.
    ///
    /// ```
    /// let server = lock_tests::redis::RedisServer::start();
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
    /// assert_eq!(lock_tests::redis::RedisServer::start().unix_url(), None);
    /// ```
    pub fn unix_url(&self) -> Option<String> {
        self.unixsocket
            .as_ref()
            .map(|p| format!("redis+unix://{}", p.display()))
    }

    /// The `--requirepass` password given at start, if any.
    ///
    /// ```
    /// assert_eq!(lock_tests::redis::RedisServer::start().password(), None);
    /// ```
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The server's working directory (removed on drop).
    ///
    /// ```
    /// assert!(lock_tests::redis::RedisServer::start().dir().is_dir());
    /// ```
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The process id, while running.
    ///
    /// ```
    /// let mut server = lock_tests::redis::RedisServer::start();
    /// assert!(server.pid().is_some());
    /// server.stop();
    /// assert!(server.pid().is_none());
    /// ```
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process is running (paused counts as running).
    ///
    /// ```
    /// let server = lock_tests::redis::RedisServer::start();
    /// assert!(server.is_running());
    /// ```
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Whether the server is paused by [`pause`](Self::pause).
    ///
    /// ```
    /// assert!(!lock_tests::redis::RedisServer::start().is_paused());
    /// ```
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// The server's log so far (for failure messages).
    ///
    /// ```
    /// assert!(lock_tests::redis::RedisServer::start().log().contains("Ready to accept connections"));
    /// ```
    pub fn log(&self) -> String {
        read_logs(self.dir.path())
    }

    /// Kills the server with SIGKILL, like a crash, and waits for it to exit. The port is kept
    /// for [`restart`](Self::restart). Does nothing when it is not running.
    ///
    /// ```
    /// let mut server = lock_tests::redis::RedisServer::start();
    /// server.stop();
    /// assert!(std::net::TcpStream::connect(("127.0.0.1", server.port())).is_err());
    /// ```
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGKILL ends a stopped (paused) process too.
            let _ = child.kill();
            let _ = child.wait();
        }
        self.paused = false;
    }

    /// Starts the server again on the same port with the same arguments (stopping it first
    /// if it runs). Without persistence it comes back empty.
    ///
    /// # Panics
    /// When the port stays taken by another process or the server does not come up.
    ///
    /// ```
    /// let mut server = lock_tests::redis::RedisServer::start();
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
    /// let mut server = lock_tests::redis::RedisServer::start();
    /// server.pause();
    /// assert!(server.is_paused());
    /// server.resume();
    /// ```
    pub fn pause(&mut self) {
        self.signal("-STOP");
        self.paused = true;
    }

    /// Thaws a server frozen by [`pause`](Self::pause) (SIGCONT).
    ///
    /// # Panics
    /// When the server is not running or `kill` fails.
    ///
    /// ```
    /// let mut server = lock_tests::redis::RedisServer::start();
    /// server.pause();
    /// server.resume();
    /// assert!(!server.is_paused());
    /// ```
    pub fn resume(&mut self) {
        self.signal("-CONT");
        self.paused = false;
    }

    fn signal(&self, signal: &str) {
        let Some(pid) = self.pid() else {
            panic!("redis-server on port {} is not running", self.port);
        };
        let status = Command::new("kill")
            .arg(signal)
            .arg(pid.to_string())
            .status()
            .unwrap_or_else(|e| panic!("cannot run `kill {signal} {pid}`: {e}"));
        assert!(status.success(), "`kill {signal} {pid}` failed: {status}");
    }

    fn launch(&mut self) -> Result<(), Launch> {
        let dir = self.dir.path().to_path_buf();
        // Fresh logs per launch: readiness is judged on this launch's log alone.
        let _ = fs::remove_file(dir.join("redis.log"));
        let stderr = fs::File::create(dir.join("stderr.log"))
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.join("stderr.log").display()));
        let mut cmd = Command::new(&self.binary);
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
        cmd.args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        let child = cmd.spawn().unwrap_or_else(|e| {
            panic!(
                "{}",
                missing_message(&format!("cannot run {}: {e}", self.binary.display()))
            )
        });
        self.child = Some(child);
        self.paused = false;
        self.wait_ready()
    }

    /// Polls until this launch answers PING on its port and its log says it is ready (the log
    /// tells our process from another one that may have taken the port meanwhile).
    fn wait_ready(&mut self) -> Result<(), Launch> {
        let deadline = Instant::now() + READY_DEADLINE;
        loop {
            let Some(child) = self.child.as_mut() else {
                panic!("redis-server on port {} is not running", self.port);
            };
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                let log = read_logs(self.dir.path());
                if log.contains("Address already in use") {
                    return Err(Launch::PortTaken(log));
                }
                panic!(
                    "redis-server exited at start ({status}) on port {} with arguments {:?}; its log:\n{log}",
                    self.port, self.args
                );
            }
            if answers_ping(self.port)
                && fs::read_to_string(self.dir.path().join("redis.log"))
                    .is_ok_and(|l| l.contains("Ready to accept connections"))
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

    /// A new connection (authenticated with the `--requirepass` password, if any) for
    /// assertions; commands time out after 5 s.
    ///
    /// # Panics
    /// When the server cannot be reached.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let server = lock_tests::redis::RedisServer::start();
    /// let mut conn = server.client().await;
    /// let pong: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
    /// assert_eq!(pong, "PONG");
    /// # }
    /// ```
    pub async fn client(&self) -> MultiplexedConnection {
        self.try_client()
            .await
            .unwrap_or_else(|e| panic!("cannot connect to redis-server on port {}: {e}", self.port))
    }

    /// Like [`client`](Self::client), returning the error instead of panicking.
    ///
    /// # Errors
    /// The connection error (server stopped, paused...).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let mut server = lock_tests::redis::RedisServer::start();
    /// server.stop();
    /// assert!(server.try_client().await.is_err());
    /// # }
    /// ```
    pub async fn try_client(&self) -> Result<MultiplexedConnection, ::redis::RedisError> {
        let client = Client::open(self.admin_url())?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CLIENT_TIMEOUT))
            .set_response_timeout(Some(CLIENT_TIMEOUT));
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
    }

    /// Runs one command on a fresh connection and converts the answer.
    ///
    /// # Panics
    /// When the command fails or the answer does not convert.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let server = lock_tests::redis::RedisServer::start();
    /// let n: i64 = server.query(redis::cmd("DBSIZE")).await;
    /// assert_eq!(n, 0);
    /// # }
    /// ```
    pub async fn query<T: ::redis::FromRedisValue>(&self, cmd: ::redis::Cmd) -> T {
        let mut conn = self.client().await;
        match cmd.query_async(&mut conn).await {
            Ok(v) => v,
            Err(e) => panic!("redis-server on port {}: command failed: {e}", self.port),
        }
    }

    /// `GET key`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let server = lock_tests::redis::RedisServer::start();
    /// assert_eq!(server.get("missing").await, None);
    /// # }
    /// ```
    pub async fn get(&self, key: &str) -> Option<String> {
        self.query(::redis::cmd("GET").arg(key).clone()).await
    }

    /// `SET key value`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let server = lock_tests::redis::RedisServer::start();
    /// server.set("k", "1").await;
    /// assert_eq!(server.get("k").await.as_deref(), Some("1"));
    /// # }
    /// ```
    pub async fn set(&self, key: &str, value: &str) {
        let () = self
            .query(::redis::cmd("SET").arg(key).arg(value).clone())
            .await;
    }

    /// `PTTL key`: milliseconds left, `-1` without expiry, `-2` when the key does not exist.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let server = lock_tests::redis::RedisServer::start();
    /// assert_eq!(server.pttl("missing").await, -2);
    /// # }
    /// ```
    pub async fn pttl(&self, key: &str) -> i64 {
        self.query(::redis::cmd("PTTL").arg(key).clone()).await
    }

    /// `DEL key`: how many keys were deleted (0 or 1).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let server = lock_tests::redis::RedisServer::start();
    /// assert_eq!(server.del("missing").await, 0);
    /// # }
    /// ```
    pub async fn del(&self, key: &str) -> i64 {
        self.query(::redis::cmd("DEL").arg(key).clone()).await
    }

    /// `EXISTS key`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let server = lock_tests::redis::RedisServer::start();
    /// assert!(!server.exists("missing").await);
    /// # }
    /// ```
    pub async fn exists(&self, key: &str) -> bool {
        self.query::<i64>(::redis::cmd("EXISTS").arg(key).clone())
            .await
            == 1
    }

    /// `DBSIZE`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// assert_eq!(lock_tests::redis::RedisServer::start().dbsize().await, 0);
    /// # }
    /// ```
    pub async fn dbsize(&self) -> i64 {
        self.query(::redis::cmd("DBSIZE")).await
    }

    /// Every key matching a glob `pattern`, sorted (walks `SCAN`).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let server = lock_tests::redis::RedisServer::start();
    /// server.set("a:1", "x").await;
    /// assert_eq!(server.keys("a:*").await, vec!["a:1".to_owned()]);
    /// # }
    /// ```
    pub async fn keys(&self, pattern: &str) -> Vec<String> {
        let mut conn = self.client().await;
        let mut cursor: u64 = 0;
        let mut keys = Vec::new();
        loop {
            let (next, batch): (u64, Vec<String>) = ::redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("SCAN failed on port {}: {e}", self.port));
            keys.extend(batch);
            if next == 0 {
                break;
            }
            cursor = next;
        }
        keys.sort();
        keys.dedup();
        keys
    }

    /// `FLUSHALL`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let server = lock_tests::redis::RedisServer::start();
    /// server.set("k", "v").await;
    /// server.flushall().await;
    /// assert_eq!(server.dbsize().await, 0);
    /// # }
    /// ```
    pub async fn flushall(&self) {
        let () = self.query(::redis::cmd("FLUSHALL")).await;
    }

    /// `INFO <section>` as text.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let server = lock_tests::redis::RedisServer::start();
    /// assert!(server.info("server").await.contains("redis_version:"));
    /// # }
    /// ```
    pub async fn info(&self, section: &str) -> String {
        self.query(::redis::cmd("INFO").arg(section).clone()).await
    }

    /// `INFO commandstats` as a map from command name (lowercase, `client|kill` for
    /// subcommands) to its number of calls since start (or the last `CONFIG RESETSTAT`).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let server = lock_tests::redis::RedisServer::start();
    /// server.set("k", "v").await;
    /// assert_eq!(server.commandstats().await.get("set"), Some(&1));
    /// # }
    /// ```
    pub async fn commandstats(&self) -> BTreeMap<String, u64> {
        parse_commandstats(&self.info("commandstats").await)
    }

    /// `CONFIG RESETSTAT`: zeroes the command statistics.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let server = lock_tests::redis::RedisServer::start();
    /// server.set("k", "v").await;
    /// server.reset_stats().await;
    /// assert_eq!(server.commandstats().await.get("set"), None);
    /// # }
    /// ```
    pub async fn reset_stats(&self) {
        let () = self
            .query(::redis::cmd("CONFIG").arg("RESETSTAT").clone())
            .await;
    }

    /// Closes every client connection (normal and pub/sub) except the helper's own; returns how
    /// many were closed.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let server = lock_tests::redis::RedisServer::start();
    /// let _other = server.client().await;
    /// assert!(server.client_kill_all().await >= 1);
    /// # }
    /// ```
    pub async fn client_kill_all(&self) -> i64 {
        let mut conn = self.client().await;
        let mut killed = 0;
        for kind in ["normal", "pubsub"] {
            let n: i64 = ::redis::cmd("CLIENT")
                .arg("KILL")
                .arg("TYPE")
                .arg(kind)
                .arg("SKIPME")
                .arg("yes")
                .query_async(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("CLIENT KILL failed on port {}: {e}", self.port));
            killed += n;
        }
        killed
    }

    /// `CLUSTER KEYSLOT key`: the cluster hash slot the server computes for `key`.
    ///
    /// # Panics
    /// On a standalone server (Redis 7.0 refuses the command there): use
    /// [`start_cluster_node`](Self::start_cluster_node).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let node = lock_tests::redis::RedisServer::start_cluster_node();
    /// assert_eq!(node.keyslot("{user1000}.following").await, node.keyslot("user1000").await);
    /// # }
    /// ```
    pub async fn keyslot(&self, key: &str) -> u16 {
        self.query(::redis::cmd("CLUSTER").arg("KEYSLOT").arg(key).clone())
            .await
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Parses the text of `INFO commandstats`.
///
/// ```
/// let stats = lock_tests::redis::parse_commandstats(
///     "# Commandstats\r\ncmdstat_evalsha:calls=3,usec=9,usec_per_call=3.00,rejected_calls=0,failed_calls=0\r\n",
/// );
/// assert_eq!(stats.get("evalsha"), Some(&3));
/// ```
pub fn parse_commandstats(info: &str) -> BTreeMap<String, u64> {
    info.lines()
        .filter_map(|line| {
            let (name, fields) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = fields
                .split(',')
                .find_map(|f| f.strip_prefix("calls="))?
                .trim()
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

/// The value following `--requirepass`, if any.
fn requirepass(args: &[String]) -> Option<String> {
    args.iter()
        .position(|a| a == "--requirepass")
        .and_then(|i| args.get(i + 1))
        .cloned()
}

/// A port that was free a moment ago (the kernel picks it; the listener is closed again).
fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap_or_else(|e| panic!("cannot bind a loopback port: {e}"));
    listener
        .local_addr()
        .unwrap_or_else(|e| panic!("cannot read the bound port: {e}"))
        .port()
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

/// A directory under the system temp dir, removed on drop.
#[derive(Debug)]
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path = std::env::temp_dir().join(format!(
            "lock-tests-redis-{}-{}-{nanos}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(&path)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
        TempDir(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}
