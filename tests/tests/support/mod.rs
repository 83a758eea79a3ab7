//! Drives `lock-agent` child processes (a lock client in its own OS process) from tests.

#![allow(
    dead_code,
    unreachable_pub,
    clippy::expect_used,
    clippy::panic,
    reason = "test support shared by test files: a failure here fails the test that uses it"
)]

use std::process::Stdio;
use std::time::{Duration, Instant};

use lock_core::{Locker, RedisBackend};
use lock_testkit::RedisServer;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// How long an agent may take to answer one command (generous: CI machines are slow).
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(20);

/// A lock client in its own OS process (`lock-agent`, `lock-macro-worker`), driven by lines on
/// its stdin and answering one line per command on its stdout.
pub struct Agent {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    answer_timeout: Duration,
}

impl Agent {
    /// Starts a `lock-agent` connected to `url` and waits until it is ready.
    pub async fn start(url: &str) -> Agent {
        Agent::spawn(env!("CARGO_BIN_EXE_lock-agent"), url, ANSWER_TIMEOUT).await
    }

    /// Starts `binary --url <url>` and waits for its `READY` line; each later answer may take
    /// up to `answer_timeout` (a bound that turns a stuck process into a failure, not a hang).
    pub async fn spawn(binary: &str, url: &str, answer_timeout: Duration) -> Agent {
        let mut child = Command::new(binary)
            .arg("--url")
            .arg(url)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {binary}: {e}"));
        let stdin = child.stdin.take().expect("child stdin");
        let stdout = child.stdout.take().expect("child stdout");
        let mut agent = Agent {
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
            answer_timeout,
        };
        let ready = agent.line().await;
        assert_eq!(ready, "READY");
        agent
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("agent pid")
    }

    pub async fn send(&mut self, command: &str) {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .expect("write to agent");
        self.stdin.flush().await.expect("flush agent stdin");
    }

    /// The next line the agent prints.
    pub async fn line(&mut self) -> String {
        match tokio::time::timeout(self.answer_timeout, self.lines.next_line()).await {
            Ok(Ok(Some(line))) => line,
            other => panic!("the child process gave no answer: {other:?}"),
        }
    }

    pub async fn ask(&mut self, command: &str) -> String {
        self.send(command).await;
        self.line().await
    }

    /// Holds `key`; returns its fencing token (when fenced).
    pub async fn hold(&mut self, key: &str, lease_ms: u64, fenced: bool) -> Option<u64> {
        let answer = self
            .ask(&format!("HOLD {key} {lease_ms} {}", u8::from(fenced)))
            .await;
        let fence = answer
            .strip_prefix(&format!("HELD {key} fence="))
            .unwrap_or_else(|| panic!("agent could not hold {key}: {answer}"));
        fence.parse().ok()
    }

    pub fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// SIGSTOPs the agent and waits until every one of its threads has stopped (a signal is
    /// only queued when `kill` returns; a thread may still run for a moment).
    pub async fn stop(&self) {
        self.signal("STOP");
        let tasks = format!("/proc/{}/task", self.pid());
        eventually("the agent stopped", Duration::from_secs(5), async || {
            let Ok(entries) = std::fs::read_dir(&tasks) else {
                return false;
            };
            entries.flatten().all(|task| {
                std::fs::read_to_string(task.path().join("stat")).is_ok_and(|stat| {
                    // The state is the field after the parenthesised command name.
                    stat.rsplit_once(") ")
                        .is_some_and(|(_, rest)| rest.starts_with('T') || rest.starts_with('t'))
                })
            })
        })
        .await;
    }

    pub async fn kill(mut self) {
        self.child.kill().await.expect("kill agent");
    }
}

/// A locker on `server` with its own connections; `timeout` bounds connecting and each answer.
pub async fn locker(server: &RedisServer, timeout: Duration) -> Locker {
    let backend = RedisBackend::builder(&server.url())
        .response_timeout(timeout)
        .connect_timeout(timeout)
        .connect()
        .await
        .expect("connect");
    Locker::builder(backend).build()
}

/// Polls a condition that has no signal of its own (server-side state), within a bound.
pub async fn eventually(what: &str, bound: Duration, mut check: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < bound, "{what}: not true within {bound:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Every channel with a subscriber (sharded and plain).
pub async fn subscribed_channels(server: &RedisServer) -> Vec<String> {
    let mut all: Vec<String> = server
        .query(redis::cmd("PUBSUB").arg("SHARDCHANNELS").clone())
        .await;
    let plain: Vec<String> = server
        .query(redis::cmd("PUBSUB").arg("CHANNELS").clone())
        .await;
    all.extend(plain);
    all
}

/// Waits (bounded) until no channel has a subscriber any more: unsubscribing happens on the
/// subscriber connection's own task, with no signal to the test.
pub async fn until_no_subscriptions(server: &RedisServer) {
    eventually(
        "subscriptions dropped",
        Duration::from_secs(5),
        async || subscribed_channels(server).await.is_empty(),
    )
    .await;
}
