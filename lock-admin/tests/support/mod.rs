//! Running the built `lock-admin` against real servers, and the lockers that hold the locks
//! it looks at.

#![allow(dead_code, reason = "each test file uses a part of the support")]

use std::process::Stdio;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use lock_core::{Locker, RedisBackend};
use lock_testkit::RedisServer;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStderr, ChildStdout, Command};

/// A hang guard for what should happen soon: generous, never a speed claim.
pub(crate) const SOON: Duration = Duration::from_secs(20);

/// The server the tests of one file share while they run (each under its own prefix),
/// started by the first and killed when the last one drops it.
pub(crate) fn shared_server() -> Arc<RedisServer> {
    static SHARED: Mutex<Weak<RedisServer>> = Mutex::new(Weak::new());
    let mut shared = SHARED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(server) = shared.upgrade() {
        return server;
    }
    let server = Arc::new(RedisServer::start());
    *shared = Arc::downgrade(&server);
    server
}

/// A locker on `url` naming itself `holder`, its keys under `prefix`.
pub(crate) async fn holder(url: &str, prefix: &str, holder: &str) -> Locker {
    let backend = RedisBackend::builder(url)
        .response_timeout(Duration::from_secs(5))
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connect");
    Locker::builder(backend)
        .prefix(prefix)
        .holder(holder)
        .build()
}

/// What a finished `lock-admin` run left.
#[derive(Debug)]
pub(crate) struct Ran {
    pub(crate) code: i32,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Ran {
    /// The stdout lines parsed as JSON objects.
    pub(crate) fn json_lines(&self) -> Vec<serde_json::Value> {
        self.stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
            .collect()
    }
}

/// `lock-admin ARGS`, with `input` on its stdin (then closed; `None`: closed at once).
pub(crate) async fn admin(args: &[&str], input: Option<&str>) -> Ran {
    let mut child = spawn(args);
    let mut stdin = child.stdin.take().expect("stdin");
    if let Some(input) = input {
        // The child may exit before reading (a refused URL): a closed pipe is fine.
        let _ = stdin.write_all(input.as_bytes()).await;
    }
    drop(stdin);
    let output = tokio::time::timeout(SOON, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("lock-admin {args:?} did not end within {SOON:?}"))
        .expect("lock-admin runs");
    Ran {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8(output.stdout).expect("UTF-8 stdout"),
        stderr: String::from_utf8(output.stderr).expect("UTF-8 stderr"),
    }
}

/// `lock-admin ARGS` running, its stdin, stdout and stderr piped.
pub(crate) fn spawn(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_lock-admin"))
        .args(args)
        .env_remove("LOCK_ADMIN_URL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn lock-admin")
}

/// Lines of a running child's stdout or stderr.
pub(crate) struct Lines<R>(tokio::io::Lines<BufReader<R>>);

impl<R: tokio::io::AsyncRead + Unpin> Lines<R> {
    pub(crate) fn new(r: R) -> Self {
        Lines(BufReader::new(r).lines())
    }

    /// The next line (bounded wait); `None` at the end.
    pub(crate) async fn next(&mut self) -> Option<String> {
        tokio::time::timeout(SOON, self.0.next_line())
            .await
            .expect("a line within the hang guard")
            .expect("read a line")
    }
}

pub(crate) fn stdout_of(child: &mut Child) -> Lines<ChildStdout> {
    Lines::new(child.stdout.take().expect("stdout"))
}

pub(crate) fn stderr_of(child: &mut Child) -> Lines<ChildStderr> {
    Lines::new(child.stderr.take().expect("stderr"))
}

/// The exit code of a child (bounded wait).
pub(crate) async fn exit_code(child: &mut Child) -> i32 {
    tokio::time::timeout(SOON, child.wait())
        .await
        .expect("the child ends within the hang guard")
        .expect("wait")
        .code()
        .unwrap_or(-1)
}

/// Waits (bounded) until `locker` sees `n` waiters on `key`: a waiter's queue entry is written
/// by its own task, with no signal to the test.
pub(crate) async fn until_waiters(locker: &Locker, key: &str, n: usize) {
    lock_testkit::eventually("the waiters counted", SOON, async || {
        locker.inspect(key).await.map(|s| s.waiters).unwrap_or(0) == n
    })
    .await;
}
