//! Child processes that talk in lines: the parent's side ([`ChildProcess`]: spawn, send a line,
//! read the next one within a bound, signal, finish) and the child's side ([`say`], [`flag`]).
//!
//! A test drives a helper binary (a lock client in its own OS process, a worker of a stress
//! run) through its stdin and stdout, one line per command and answer; stderr is collected for
//! failure messages. Every read is bounded, so a stuck child fails the test instead of hanging
//! it, and every failure message holds what the child printed so far.
//!
//! ```no_run
//! # #[tokio::main] async fn main() {
//! use std::time::Duration;
//! use lock_testkit::process::ChildProcess;
//!
//! let mut child = ChildProcess::spawn("target/debug/lock-worker", ["serve", "--url", "redis://127.0.0.1:6379/"]);
//! child.expect_line("READY", Duration::from_secs(20)).await;
//! let answer = child.ask("HOLD job 1000 1").await;
//! child.kill().await;
//! # }
//! ```

#![allow(
    clippy::panic,
    reason = "a test harness that cannot do its job fails the test using it, loudly and with the cause"
)]

use std::ffi::OsStr;
use std::io::Write as _;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::signal::{Signal, send_signal, wait_stopped};

/// How long [`ChildProcess::line`] and [`ChildProcess::ask`] wait for an answer by default
/// (generous: CI machines are slow; a bound that turns a stuck child into a failure).
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(20);

/// A running child process: its stdout read line by line, its stdin written, its stderr
/// collected. Killed on drop.
#[derive(Debug)]
pub struct ChildProcess {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Lines<BufReader<ChildStdout>>,
    stderr: Arc<Mutex<String>>,
    stderr_task: Option<tokio::task::JoinHandle<()>>,
    seen: Vec<String>,
    answer_timeout: Duration,
}

/// How a child ended: from [`ChildProcess::finish`].
#[derive(Debug)]
pub struct ChildOutput {
    /// Its exit status.
    pub status: ExitStatus,
    /// Every stdout line it printed, in order (including those read before).
    pub lines: Vec<String>,
    /// Everything it wrote to stderr.
    pub stderr: String,
}

impl ChildProcess {
    /// Starts `binary` with `args`, its three streams piped. Must be called inside a tokio
    /// runtime.
    ///
    /// # Panics
    /// When the process cannot be started.
    pub fn spawn<I, S>(binary: impl AsRef<Path>, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let binary = binary.as_ref();
        let name = binary.file_name().map_or_else(
            || binary.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        let mut child = Command::new(binary)
            .args(args)
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
        ChildProcess {
            name,
            child,
            stdin: Some(stdin),
            stdout: BufReader::new(stdout).lines(),
            stderr: collected,
            stderr_task: Some(stderr_task),
            seen: Vec::new(),
            answer_timeout: ANSWER_TIMEOUT,
        }
    }

    /// Sets how long [`line`](Self::line) and [`ask`](Self::ask) wait (default
    /// [`ANSWER_TIMEOUT`]).
    #[must_use]
    pub fn answer_timeout(mut self, bound: Duration) -> Self {
        self.answer_timeout = bound;
        self
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// The next stdout line; `None` at the end of its output.
    ///
    /// # Panics
    /// When no line comes `within` (the message holds what it printed so far).
    pub async fn next_line(&mut self, within: Duration) -> Option<String> {
        match tokio::time::timeout(within, self.stdout.next_line()).await {
            Ok(Ok(Some(line))) => {
                self.seen.push(line.clone());
                Some(line)
            }
            Ok(Ok(None) | Err(_)) => None,
            Err(_) => panic!(
                "{} printed no line within {within:?}; {}",
                self.label(),
                self.transcript()
            ),
        }
    }

    /// The next stdout line, which must come within the answer timeout.
    ///
    /// # Panics
    /// When none comes (the output ended, or the bound ran out).
    pub async fn line(&mut self) -> String {
        match self.next_line(self.answer_timeout).await {
            Some(line) => line,
            None => panic!(
                "{} ended its output without answering; {}",
                self.label(),
                self.transcript()
            ),
        }
    }

    /// The next stdout line, which must start with `prefix`.
    ///
    /// # Panics
    /// When it does not, or none comes `within`.
    pub async fn expect_line(&mut self, prefix: &str, within: Duration) -> String {
        match self.next_line(within).await {
            Some(line) if line.starts_with(prefix) => line,
            other => panic!(
                "{}: expected a line starting with {prefix:?}, got {other:?}; {}",
                self.label(),
                self.transcript()
            ),
        }
    }

    /// Writes one line to the child's stdin.
    ///
    /// # Panics
    /// When stdin was closed or the write fails.
    pub async fn send(&mut self, line: &str) {
        let label = self.label();
        let Some(stdin) = self.stdin.as_mut() else {
            panic!("{label}: stdin is closed");
        };
        let mut bytes = line.as_bytes().to_vec();
        bytes.push(b'\n');
        if let Err(e) = stdin.write_all(&bytes).await {
            panic!("cannot write to {label}: {e}");
        }
        let _ = stdin.flush().await;
    }

    /// Sends one command line and returns the next line (within the answer timeout).
    pub async fn ask(&mut self, command: &str) -> String {
        self.send(command).await;
        self.line().await
    }

    /// What the child wrote to stderr so far (complete once it exited).
    pub fn stderr(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Sends `signal` to the child.
    ///
    /// # Panics
    /// When it is not running or the signal cannot be sent.
    pub fn signal(&self, signal: Signal) {
        send_signal(self.running_pid(), signal);
    }

    /// Freezes the child (SIGSTOP) and waits until every one of its threads has stopped (a
    /// signal is only queued when `kill` returns; a thread may still run for a moment).
    pub async fn pause(&self) {
        let pid = self.running_pid();
        send_signal(pid, Signal::Stop);
        wait_stopped(pid).await;
    }

    /// Thaws a child frozen by [`pause`](Self::pause) (SIGCONT).
    pub fn resume(&self) {
        self.signal(Signal::Cont);
    }

    /// Kills the child (SIGKILL: a crash, nothing is cleaned up) and reaps it.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// Closes stdin, reads the rest of stdout and waits for the exit.
    ///
    /// # Panics
    /// When the child does not exit `within` (it is killed first).
    pub async fn finish(mut self, within: Duration) -> ChildOutput {
        drop(self.stdin.take());
        let drained = tokio::time::timeout(within, async {
            while let Ok(Some(line)) = self.stdout.next_line().await {
                self.seen.push(line);
            }
            self.child.wait().await
        })
        .await;
        let status = match drained {
            Ok(Ok(status)) => status,
            Ok(Err(e)) => panic!("cannot wait for {}: {e}", self.label()),
            Err(_) => {
                let _ = self.child.kill().await;
                panic!(
                    "{} did not finish within {within:?}; {}",
                    self.label(),
                    self.transcript()
                );
            }
        };
        // The stderr reader ends when the child's end of the pipe closes.
        if let Some(task) = self.stderr_task.take() {
            let _ = tokio::time::timeout(within, task).await;
        }
        ChildOutput {
            status,
            lines: std::mem::take(&mut self.seen),
            stderr: self.stderr(),
        }
    }

    fn running_pid(&self) -> u32 {
        self.pid()
            .unwrap_or_else(|| panic!("{} is not running", self.name))
    }

    fn label(&self) -> String {
        format!("{} (pid {:?})", self.name, self.pid())
    }

    fn transcript(&self) -> String {
        format!("stdout so far: {:?}; stderr: {}", self.seen, self.stderr())
    }
}

/// The child's side: prints one line on stdout and flushes it, so the parent reads it at once.
///
/// ```
/// lock_testkit::process::say("READY");
/// ```
pub fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// The child's side: the value following `name` on a command line (`--url U`), if any.
///
/// ```
/// let args = ["prog", "--url", "redis://h/"].map(String::from);
/// assert_eq!(lock_testkit::process::flag(&args, "--url"), Some("redis://h/"));
/// assert_eq!(lock_testkit::process::flag(&args, "--key"), None);
/// ```
pub fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}
