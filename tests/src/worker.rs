//! The `lock-worker` binary's command line, its output lines, and a handle on a running worker
//! process.
//!
//! Integration tests find the binary with `env!("CARGO_BIN_EXE_lock-worker")`.
//!
//! ## Modes
//!
//! `lock-worker count --url U --key K --iterations N --counter-key C [options]`: `N` times,
//! under `locker.lock(K).run(..)`, a deliberately non-atomic read-modify-write of the Redis
//! string `C` (`GET`, yield, optional sleep, `SET` + 1). With `--fence-key F` each lock is
//! fenced and, under the lock, its token is checked to be above the one stored in `F` (then
//! stored). Ends with one `summary ...` line ([`WorkerSummary`]) and exit code 0.
//!
//! `lock-worker hold --url U --key K [options]`: takes the lock, prints
//! `acquired fence=<n|none>`, then obeys lines on stdin: `release` (prints `released ok` or
//! `released err=<Variant>`, exits), `status` (`status held=<bool> remaining_ms=<n>`),
//! `extend <ms>` (`extended ok` / `extended err=<Variant>`), `exit` (exits without releasing,
//! as a crash would). End of stdin releases and exits. It prints `lost` when the lease is lost.
//!
//! Options: `--prefix P`, `--lease-ms`, `--wait-ms` (default 30000), `--work-us` (count: sleep
//! inside the critical section), `--no-lock` (count: no lock at all, the control case),
//! `--wait-go` (print `ready` once connected, then wait for a line `go` on stdin, so several
//! processes start together), `--fenced` and `--no-watchdog` (hold).
//!
//! Any failure prints `error op=<what> kind=<LockError variant or "redis"> message=<text>` and
//! exits with code 2.
//!
//! ```no_run
//! # #[tokio::main] async fn main() {
//! use std::time::Duration;
//! use lock_tests::worker::{WorkerArgs, WorkerProcess};
//!
//! let server = lock_testkit::RedisServer::start();
//! let args = WorkerArgs::count(&server.url(), "stress", 100, "counter");
//! let worker = WorkerProcess::spawn("target/debug/lock-worker", &args);
//! let out = worker.finish(Duration::from_secs(60)).await;
//! assert_eq!(out.summary().unwrap().increments, 100);
//! # }
//! ```

#![allow(
    clippy::panic,
    reason = "a test harness that cannot do its job fails the test using it, loudly and with the cause"
)]

use std::fmt::Write as _;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// What a worker does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The counter stress.
    Count,
    /// Take the lock and hold it, obeying stdin.
    Hold,
}

/// The command line of `lock-worker`: built by tests, parsed by the binary.
///
/// ```
/// use lock_tests::worker::WorkerArgs;
/// let args = WorkerArgs::count("redis://127.0.0.1:6379/", "k", 10, "c").fence_key("f").wait_go();
/// let line = args.to_args();
/// assert_eq!(WorkerArgs::parse(line.iter().cloned()).unwrap(), args);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerArgs {
    /// The mode.
    pub mode: Mode,
    /// The Redis URL.
    pub url: String,
    /// The lock key.
    pub key: String,
    /// The locker's prefix (default `lock:`).
    pub prefix: Option<String>,
    /// The lease in milliseconds (default: the locker's).
    pub lease_ms: Option<u64>,
    /// The wait in milliseconds.
    pub wait_ms: u64,
    /// Count: iterations.
    pub iterations: u64,
    /// Count: the counter's Redis key.
    pub counter_key: String,
    /// Count: where the highest fencing token seen is kept (turns fencing on).
    pub fence_key: Option<String>,
    /// Count: microseconds to sleep inside the critical section.
    pub work_us: u64,
    /// Count: run without any lock (the control case).
    pub no_lock: bool,
    /// Print `ready` and wait for `go` on stdin before starting.
    pub wait_go: bool,
    /// Hold: take a fenced lock.
    pub fenced: bool,
    /// Hold: do not renew the lease.
    pub no_watchdog: bool,
}

impl WorkerArgs {
    fn new(mode: Mode, url: &str, key: &str) -> Self {
        WorkerArgs {
            mode,
            url: url.to_owned(),
            key: key.to_owned(),
            prefix: None,
            lease_ms: None,
            wait_ms: 30_000,
            iterations: 0,
            counter_key: String::new(),
            fence_key: None,
            work_us: 0,
            no_lock: false,
            wait_go: false,
            fenced: false,
            no_watchdog: false,
        }
    }

    /// The counter stress: `iterations` locked increments of `counter_key`.
    ///
    /// ```
    /// let args = lock_tests::worker::WorkerArgs::count("redis://127.0.0.1/", "k", 5, "c");
    /// assert_eq!(args.iterations, 5);
    /// ```
    pub fn count(url: &str, key: &str, iterations: u64, counter_key: &str) -> Self {
        WorkerArgs {
            iterations,
            counter_key: counter_key.to_owned(),
            ..Self::new(Mode::Count, url, key)
        }
    }

    /// Take `key` and hold it, obeying stdin.
    ///
    /// ```
    /// let args = lock_tests::worker::WorkerArgs::hold("redis://127.0.0.1/", "k").fenced();
    /// assert!(args.fenced);
    /// ```
    pub fn hold(url: &str, key: &str) -> Self {
        Self::new(Mode::Hold, url, key)
    }

    /// Sets the locker's prefix.
    ///
    /// ```
    /// let a = lock_tests::worker::WorkerArgs::hold("redis://h/", "k").prefix("shop:");
    /// assert_eq!(a.prefix.as_deref(), Some("shop:"));
    /// ```
    #[must_use]
    pub fn prefix(mut self, prefix: &str) -> Self {
        self.prefix = Some(prefix.to_owned());
        self
    }

    /// Sets the lease.
    ///
    /// ```
    /// let a = lock_tests::worker::WorkerArgs::hold("redis://h/", "k").lease_ms(500);
    /// assert_eq!(a.lease_ms, Some(500));
    /// ```
    #[must_use]
    pub fn lease_ms(mut self, ms: u64) -> Self {
        self.lease_ms = Some(ms);
        self
    }

    /// Sets the wait.
    ///
    /// ```
    /// let a = lock_tests::worker::WorkerArgs::hold("redis://h/", "k").wait_ms(0);
    /// assert_eq!(a.wait_ms, 0);
    /// ```
    #[must_use]
    pub fn wait_ms(mut self, ms: u64) -> Self {
        self.wait_ms = ms;
        self
    }

    /// Count: fenced locks, checked against the highest token stored in `key`.
    ///
    /// ```
    /// let a = lock_tests::worker::WorkerArgs::count("redis://h/", "k", 1, "c").fence_key("f");
    /// assert_eq!(a.fence_key.as_deref(), Some("f"));
    /// ```
    #[must_use]
    pub fn fence_key(mut self, key: &str) -> Self {
        self.fence_key = Some(key.to_owned());
        self
    }

    /// Count: sleep inside the critical section.
    ///
    /// ```
    /// let a = lock_tests::worker::WorkerArgs::count("redis://h/", "k", 1, "c").work_us(50);
    /// assert_eq!(a.work_us, 50);
    /// ```
    #[must_use]
    pub fn work_us(mut self, us: u64) -> Self {
        self.work_us = us;
        self
    }

    /// Count: no lock (the control case that should lose updates).
    ///
    /// ```
    /// let a = lock_tests::worker::WorkerArgs::count("redis://h/", "k", 1, "c").no_lock();
    /// assert!(a.no_lock);
    /// ```
    #[must_use]
    pub fn no_lock(mut self) -> Self {
        self.no_lock = true;
        self
    }

    /// Print `ready`, then wait for `go` on stdin.
    ///
    /// ```
    /// let a = lock_tests::worker::WorkerArgs::count("redis://h/", "k", 1, "c").wait_go();
    /// assert!(a.wait_go);
    /// ```
    #[must_use]
    pub fn wait_go(mut self) -> Self {
        self.wait_go = true;
        self
    }

    /// Hold: a fenced lock.
    ///
    /// ```
    /// assert!(lock_tests::worker::WorkerArgs::hold("redis://h/", "k").fenced().fenced);
    /// ```
    #[must_use]
    pub fn fenced(mut self) -> Self {
        self.fenced = true;
        self
    }

    /// Hold: no watchdog renewal (the lock lasts one lease).
    ///
    /// ```
    /// assert!(lock_tests::worker::WorkerArgs::hold("redis://h/", "k").no_watchdog().no_watchdog);
    /// ```
    #[must_use]
    pub fn no_watchdog(mut self) -> Self {
        self.no_watchdog = true;
        self
    }

    /// The command-line arguments (without the program name).
    ///
    /// ```
    /// let a = lock_tests::worker::WorkerArgs::hold("redis://h/", "k");
    /// assert_eq!(a.to_args()[0], "hold");
    /// ```
    pub fn to_args(&self) -> Vec<String> {
        let mut v = vec![
            match self.mode {
                Mode::Count => "count",
                Mode::Hold => "hold",
            }
            .to_owned(),
        ];
        let mut opt = |name: &str, value: String| {
            v.push(name.to_owned());
            v.push(value);
        };
        opt("--url", self.url.clone());
        opt("--key", self.key.clone());
        opt("--wait-ms", self.wait_ms.to_string());
        if let Some(p) = &self.prefix {
            opt("--prefix", p.clone());
        }
        if let Some(l) = self.lease_ms {
            opt("--lease-ms", l.to_string());
        }
        if self.mode == Mode::Count {
            opt("--iterations", self.iterations.to_string());
            opt("--counter-key", self.counter_key.clone());
            opt("--work-us", self.work_us.to_string());
            if let Some(f) = &self.fence_key {
                opt("--fence-key", f.clone());
            }
        }
        let flags = [
            (self.no_lock, "--no-lock"),
            (self.wait_go, "--wait-go"),
            (self.fenced, "--fenced"),
            (self.no_watchdog, "--no-watchdog"),
        ];
        v.extend(
            flags
                .into_iter()
                .filter(|(on, _)| *on)
                .map(|(_, f)| f.to_owned()),
        );
        v
    }

    /// Parses a command line (without the program name).
    ///
    /// # Errors
    /// A message saying what is wrong.
    ///
    /// ```
    /// use lock_tests::worker::WorkerArgs;
    /// assert!(WorkerArgs::parse(["count".to_owned()].into_iter()).is_err()); // no --url
    /// ```
    pub fn parse(mut args: impl Iterator<Item = String>) -> Result<Self, String> {
        let mode = match args.next().as_deref() {
            Some("count") => Mode::Count,
            Some("hold") => Mode::Hold,
            other => return Err(format!("expected mode `count` or `hold`, got {other:?}")),
        };
        let mut a = Self::new(mode, "", "");
        while let Some(flag) = args.next() {
            let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
            let number = |s: String| {
                s.parse::<u64>()
                    .map_err(|e| format!("{flag}: {s:?} is not a number ({e})"))
            };
            match flag.as_str() {
                "--url" => a.url = value()?,
                "--key" => a.key = value()?,
                "--prefix" => a.prefix = Some(value()?),
                "--lease-ms" => a.lease_ms = Some(number(value()?)?),
                "--wait-ms" => a.wait_ms = number(value()?)?,
                "--iterations" => a.iterations = number(value()?)?,
                "--counter-key" => a.counter_key = value()?,
                "--fence-key" => a.fence_key = Some(value()?),
                "--work-us" => a.work_us = number(value()?)?,
                "--no-lock" => a.no_lock = true,
                "--wait-go" => a.wait_go = true,
                "--fenced" => a.fenced = true,
                "--no-watchdog" => a.no_watchdog = true,
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        if a.url.is_empty() {
            return Err("--url is required".into());
        }
        if a.mode == Mode::Count && a.counter_key.is_empty() {
            return Err("count needs --counter-key".into());
        }
        Ok(a)
    }
}

/// The last line of a `count` worker.
///
/// ```
/// use lock_tests::worker::WorkerSummary;
/// let s = WorkerSummary { pid: 7, iterations: 3, increments: 3, max_fence: 9, fence_violations: 0, elapsed_ms: 12 };
/// assert_eq!(WorkerSummary::parse(&s.to_line()), Some(s));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerSummary {
    /// The worker's process id.
    pub pid: u32,
    /// Iterations asked for.
    pub iterations: u64,
    /// Increments done (equal to `iterations` unless it failed).
    pub increments: u64,
    /// The highest fencing token it drew (0 when not fenced).
    pub max_fence: u64,
    /// Fenced locks whose token was not above the highest stored one (must be 0).
    pub fence_violations: u64,
    /// Wall time of the loop.
    pub elapsed_ms: u64,
}

impl WorkerSummary {
    /// The line as the worker prints it.
    ///
    /// ```
    /// use lock_tests::worker::WorkerSummary;
    /// let s = WorkerSummary { pid: 1, iterations: 1, increments: 1, max_fence: 0, fence_violations: 0, elapsed_ms: 1 };
    /// assert!(s.to_line().starts_with("summary "));
    /// ```
    pub fn to_line(&self) -> String {
        let mut s = String::from("summary mode=count");
        let _ = write!(
            s,
            " pid={} iterations={} increments={} max_fence={} fence_violations={} elapsed_ms={}",
            self.pid,
            self.iterations,
            self.increments,
            self.max_fence,
            self.fence_violations,
            self.elapsed_ms
        );
        s
    }

    /// Parses a `summary ...` line.
    ///
    /// ```
    /// assert_eq!(lock_tests::worker::WorkerSummary::parse("ready"), None);
    /// ```
    pub fn parse(line: &str) -> Option<Self> {
        let rest = line.strip_prefix("summary ")?;
        let field = |name: &str| -> Option<u64> {
            rest.split_whitespace()
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))?
                .parse()
                .ok()
        };
        Some(WorkerSummary {
            pid: u32::try_from(field("pid")?).ok()?,
            iterations: field("iterations")?,
            increments: field("increments")?,
            max_fence: field("max_fence")?,
            fence_violations: field("fence_violations")?,
            elapsed_ms: field("elapsed_ms")?,
        })
    }
}

/// A running `lock-worker` process: its stdout read line by line, its stdin written, its
/// stderr collected. Killed on drop.
#[derive(Debug)]
pub struct WorkerProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Lines<BufReader<ChildStdout>>,
    stderr: Arc<Mutex<String>>,
    stderr_task: Option<tokio::task::JoinHandle<()>>,
    seen: Vec<String>,
}

/// How a worker ended.
#[derive(Debug)]
pub struct WorkerOutput {
    /// Its exit status.
    pub status: ExitStatus,
    /// Every stdout line it printed, in order (including those read before).
    pub lines: Vec<String>,
    /// Everything it wrote to stderr.
    pub stderr: String,
}

impl WorkerOutput {
    /// The `summary` line, parsed.
    ///
    /// ```no_run
    /// # fn demo(out: lock_tests::worker::WorkerOutput) {
    /// let increments = out.summary().map(|s| s.increments);
    /// # }
    /// ```
    pub fn summary(&self) -> Option<WorkerSummary> {
        self.lines
            .iter()
            .rev()
            .find_map(|l| WorkerSummary::parse(l))
    }
}

impl WorkerProcess {
    /// Starts `binary` with `args`. Must be called inside a tokio runtime.
    ///
    /// # Panics
    /// When the process cannot be started.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() {
    /// use lock_tests::worker::{WorkerArgs, WorkerProcess};
    /// let w = WorkerProcess::spawn("target/debug/lock-worker", &WorkerArgs::hold("redis://127.0.0.1:6379/", "k"));
    /// # drop(w);
    /// # }
    /// ```
    pub fn spawn(binary: impl AsRef<Path>, args: &WorkerArgs) -> Self {
        let binary = binary.as_ref();
        let mut child = Command::new(binary)
            .args(args.to_args())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        let (Some(stdin), Some(stdout), Some(mut stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            panic!("{} started without its pipes", binary.display());
        };
        let collected = Arc::new(Mutex::new(String::new()));
        let sink = collected.clone();
        let stderr_task = tokio::spawn(async move {
            let mut buf = Vec::new();
            let _ = stderr.read_to_end(&mut buf).await;
            sink.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push_str(&String::from_utf8_lossy(&buf));
        });
        WorkerProcess {
            child,
            stdin: Some(stdin),
            stdout: BufReader::new(stdout).lines(),
            stderr: collected,
            stderr_task: Some(stderr_task),
            seen: Vec::new(),
        }
    }

    /// The process id, while it runs.
    ///
    /// ```no_run
    /// # fn demo(w: &lock_tests::worker::WorkerProcess) {
    /// let pid = w.pid();
    /// # }
    /// ```
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// The next stdout line; `None` at end of output.
    ///
    /// # Panics
    /// When no line comes `within` (the message holds what it printed so far).
    ///
    /// ```no_run
    /// # async fn demo(w: &mut lock_tests::worker::WorkerProcess) {
    /// let line = w.next_line(std::time::Duration::from_secs(5)).await;
    /// # }
    /// ```
    pub async fn next_line(&mut self, within: Duration) -> Option<String> {
        match tokio::time::timeout(within, self.stdout.next_line()).await {
            Ok(Ok(Some(line))) => {
                self.seen.push(line.clone());
                Some(line)
            }
            Ok(Ok(None) | Err(_)) => None,
            Err(_) => panic!(
                "worker {:?} printed no line within {within:?}; stdout so far: {:?}; stderr: {}",
                self.pid(),
                self.seen,
                self.stderr()
            ),
        }
    }

    /// The next stdout line, which must start with `prefix`.
    ///
    /// # Panics
    /// When it does not, or none comes `within`.
    ///
    /// ```no_run
    /// # async fn demo(w: &mut lock_tests::worker::WorkerProcess) {
    /// let acquired = w.expect_line("acquired", std::time::Duration::from_secs(5)).await;
    /// # }
    /// ```
    pub async fn expect_line(&mut self, prefix: &str, within: Duration) -> String {
        match self.next_line(within).await {
            Some(line) if line.starts_with(prefix) => line,
            other => panic!(
                "worker {:?}: expected a line starting with {prefix:?}, got {other:?}; stdout so far: {:?}; stderr: {}",
                self.pid(),
                self.seen,
                self.stderr()
            ),
        }
    }

    /// Writes one line to the worker's stdin.
    ///
    /// # Panics
    /// When stdin was closed.
    ///
    /// ```no_run
    /// # async fn demo(w: &mut lock_tests::worker::WorkerProcess) {
    /// w.send("release").await;
    /// # }
    /// ```
    pub async fn send(&mut self, line: &str) {
        let Some(stdin) = self.stdin.as_mut() else {
            panic!("worker stdin is closed");
        };
        let mut bytes = line.as_bytes().to_vec();
        bytes.push(b'\n');
        if let Err(e) = stdin.write_all(&bytes).await {
            panic!("cannot write to worker {:?}: {e}", self.pid());
        }
        let _ = stdin.flush().await;
    }

    /// What the worker wrote to stderr so far (complete once it exited).
    ///
    /// ```no_run
    /// # fn demo(w: &lock_tests::worker::WorkerProcess) {
    /// eprintln!("{}", w.stderr());
    /// # }
    /// ```
    pub fn stderr(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Sends SIGKILL (a crash: nothing is released).
    ///
    /// ```no_run
    /// # async fn demo(mut w: lock_tests::worker::WorkerProcess) {
    /// w.kill().await;
    /// # }
    /// ```
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// Freezes (`true`, SIGSTOP) or thaws (`false`, SIGCONT) the worker.
    ///
    /// # Panics
    /// When it is not running or `kill` fails.
    ///
    /// ```no_run
    /// # fn demo(w: &lock_tests::worker::WorkerProcess) {
    /// w.freeze(true);
    /// w.freeze(false);
    /// # }
    /// ```
    pub fn freeze(&self, frozen: bool) {
        let Some(pid) = self.pid() else {
            panic!("worker is not running");
        };
        let signal = if frozen { "-STOP" } else { "-CONT" };
        let status = std::process::Command::new("kill")
            .arg(signal)
            .arg(pid.to_string())
            .status()
            .unwrap_or_else(|e| panic!("cannot run kill: {e}"));
        assert!(status.success(), "`kill {signal} {pid}` failed");
    }

    /// Closes stdin, reads the rest of stdout and waits for the exit.
    ///
    /// # Panics
    /// When the worker does not exit `within` (it is killed first).
    ///
    /// ```no_run
    /// # async fn demo(w: lock_tests::worker::WorkerProcess) {
    /// let out = w.finish(std::time::Duration::from_secs(30)).await;
    /// assert!(out.status.success(), "{}", out.stderr);
    /// # }
    /// ```
    pub async fn finish(mut self, within: Duration) -> WorkerOutput {
        drop(self.stdin.take());
        let pid = self.pid();
        let drained = tokio::time::timeout(within, async {
            while let Ok(Some(line)) = self.stdout.next_line().await {
                self.seen.push(line);
            }
            self.child.wait().await
        })
        .await;
        let status = match drained {
            Ok(Ok(status)) => status,
            Ok(Err(e)) => panic!("cannot wait for worker {pid:?}: {e}"),
            Err(_) => {
                let _ = self.child.kill().await;
                panic!(
                    "worker {pid:?} did not finish within {within:?}; stdout: {:?}; stderr: {}",
                    self.seen,
                    self.stderr()
                );
            }
        };
        // The stderr reader ends when the worker's end of the pipe closes.
        if let Some(task) = self.stderr_task.take() {
            let _ = tokio::time::timeout(within, task).await;
        }
        WorkerOutput {
            status,
            lines: std::mem::take(&mut self.seen),
            stderr: self.stderr(),
        }
    }
}
