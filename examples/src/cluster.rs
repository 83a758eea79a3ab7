//! Several copies of the service as child processes sharing one Redis (`--processes N`).
//!
//! Each child is the same binary in its hidden `--serve-only` mode. It binds an ephemeral port
//! and announces `listening on http://ADDR` as its first line on stdout (the parent waits for
//! that line, not for a guessed delay); it stops when its stdin closes, so children never outlive
//! the demo, even when the demo is killed.

use std::io::Write;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpListener;
use tokio::process::{Child, ChildStdin, Command};

use crate::app::{SetupError, Shop};

/// What a serving process prints first, followed by its base URL.
pub const LISTENING: &str = "listening on ";

/// How long a child may take to announce its address.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// A server process could not be started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// Spawning failed.
    #[error("cannot start server process {exe}: {source}")]
    Spawn {
        /// The program.
        exe: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The child exited or closed stdout before announcing its address.
    #[error("server process {exe} stopped before it listened ({status:?}); see its stderr above")]
    Died {
        /// The program.
        exe: String,
        /// Its exit status, when known.
        status: Option<ExitStatus>,
    },
    /// The child did not announce its address in time.
    #[error("server process {exe} did not listen within {STARTUP_TIMEOUT:?}")]
    Slow {
        /// The program.
        exe: String,
    },
}

/// How to start one server process.
///
/// ```
/// let options = lock_examples::cluster::ServerOptions::new(
///     "target/release/flash-sale".into(), "redis://127.0.0.1:6379/".into(), "run-1:".into());
/// assert!(options.locking);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServerOptions {
    /// The `flash-sale` binary.
    pub exe: PathBuf,
    /// The Redis shared by every process.
    pub redis_url: String,
    /// The key namespace shared by every process.
    pub namespace: String,
    /// The service's `work` time.
    pub work: Duration,
    /// Whether the service locks.
    pub locking: bool,
    /// etcd members (comma-separated) for the locks, when they are not in Redis.
    pub etcd_urls: Option<String>,
    /// A ZooKeeper connect string for the locks, when they are not in Redis.
    pub zookeeper_hosts: Option<String>,
}

impl ServerOptions {
    /// Options with the default work time and locking on.
    ///
    /// ```
    /// let o = lock_examples::cluster::ServerOptions::new("flash-sale".into(), "redis://h/".into(), "ns:".into());
    /// assert_eq!(o.namespace, "ns:");
    /// ```
    pub fn new(exe: PathBuf, redis_url: String, namespace: String) -> Self {
        ServerOptions {
            exe,
            redis_url,
            namespace,
            work: crate::ShopConfig::default().work,
            locking: true,
            etcd_urls: None,
            zookeeper_hosts: None,
        }
    }
}

/// A running server process; stopped by [`stop`](Self::stop), killed when dropped.
#[derive(Debug)]
pub struct ServerProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    base_url: String,
}

impl ServerProcess {
    /// Starts one server process and waits until it listens.
    ///
    /// # Errors
    /// [`ClusterError`] when it cannot be started or never listens.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_examples::cluster::ClusterError> {
    /// use lock_examples::cluster::{ServerOptions, ServerProcess};
    /// let options = ServerOptions::new("flash-sale".into(), "redis://127.0.0.1:6379/".into(), "ns:".into());
    /// let server = ServerProcess::start(&options).await?;
    /// println!("{}", server.base_url());
    /// server.stop().await;
    /// # Ok(()) }
    /// ```
    pub async fn start(options: &ServerOptions) -> Result<ServerProcess, ClusterError> {
        let exe = options.exe.display().to_string();
        let mut command = Command::new(&options.exe);
        command
            .args(["--serve-only", "--port", "0", "--exit-on-stdin-eof"])
            .args(["--namespace", &options.namespace])
            .args(["--redis-url", &options.redis_url])
            .args(["--work-ms", &options.work.as_millis().to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if !options.locking {
            command.arg("--no-lock");
        }
        if let Some(urls) = &options.etcd_urls {
            command.args(["--etcd-url", urls]);
        }
        if let Some(hosts) = &options.zookeeper_hosts {
            command.args(["--zookeeper-hosts", hosts]);
        }
        let mut child = command.spawn().map_err(|source| ClusterError::Spawn {
            exe: exe.clone(),
            source,
        })?;
        let stdin = child.stdin.take();
        let Some(stdout) = child.stdout.take() else {
            return Err(ClusterError::Died { exe, status: None });
        };
        let mut lines = BufReader::new(stdout).lines();
        let announced = tokio::time::timeout(STARTUP_TIMEOUT, async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(url) = line.strip_prefix(LISTENING) {
                    return Some(url.trim().to_owned());
                }
            }
            None
        })
        .await;
        match announced {
            Ok(Some(base_url)) => Ok(ServerProcess {
                child,
                stdin,
                base_url,
            }),
            Ok(None) => {
                let status = child.wait().await.ok();
                Err(ClusterError::Died { exe, status })
            }
            Err(_) => Err(ClusterError::Slow { exe }),
        }
    }

    /// `http://ADDR` of the process.
    ///
    /// ```no_run
    /// # fn f(p: &lock_examples::cluster::ServerProcess) { assert!(p.base_url().starts_with("http://")); }
    /// ```
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// Closes the process's stdin (it finishes what is in flight and exits), waits up to 5 s,
    /// then kills it.
    ///
    /// ```no_run
    /// # async fn f(p: lock_examples::cluster::ServerProcess) { p.stop().await; }
    /// ```
    pub async fn stop(mut self) {
        drop(self.stdin.take());
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// The `--serve-only` mode: serves `shop` on `127.0.0.1:{port}`, announces
/// `listening on http://ADDR` on `announce`, and serves until stdin closes (when
/// `exit_on_stdin_eof`) or forever.
///
/// # Errors
/// [`SetupError::Io`] when the port cannot be bound.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_examples::SetupError> {
/// let shop = lock_examples::Shop::memory(Default::default());
/// lock_examples::cluster::serve(shop, 3000, false, &mut std::io::stdout()).await?;
/// # Ok(()) }
/// ```
pub async fn serve(
    shop: Shop,
    port: u16,
    exit_on_stdin_eof: bool,
    announce: &mut dyn Write,
) -> Result<(), SetupError> {
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    let server = shop.spawn(listener)?;
    writeln!(announce, "{LISTENING}{}", server.base_url())?;
    announce.flush()?;
    if exit_on_stdin_eof {
        let mut stdin = tokio::io::stdin();
        let _ = tokio::io::copy(&mut stdin, &mut tokio::io::sink()).await;
    } else {
        std::future::pending::<()>().await;
    }
    server.stop().await;
    Ok(())
}
