//! A minimal redis-server harness: one real server per test on a free port, stopped on drop.
//!
//! A stop-gap copy until the lock-tests package's harness can be shared; it waits for the
//! server's own "Ready to accept connections" log line, never for a guessed delay.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test helpers outside #[test] functions fail the test by panicking, by design"
)]

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const INSTALL_HINT: &str = "redis-server is not on PATH: these tests start real Redis servers. Install it with `apt-get install -y redis-server` (Debian/Ubuntu), or run `bash scripts/test.sh`, which does.";

/// A redis-server child process.
pub(crate) struct RedisServer {
    child: Child,
    port: u16,
}

impl RedisServer {
    /// Starts redis-server on a free port (no persistence) and waits until it is ready.
    pub(crate) fn start() -> RedisServer {
        let exe = find_redis_server().unwrap_or_else(|| panic!("{INSTALL_HINT}"));
        let mut last_log = String::new();
        for _ in 0..5 {
            let port = free_port();
            match Self::try_start(&exe, port) {
                Ok(server) => return server,
                // Another process took the port between our probe and redis's bind: try again.
                Err(log) => last_log = log,
            }
        }
        panic!("redis-server did not start after 5 attempts; last log:\n{last_log}");
    }

    fn try_start(exe: &PathBuf, port: u16) -> Result<RedisServer, String> {
        let mut child = Command::new(exe)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(std::env::temp_dir())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", exe.display()));
        let stdout = child.stdout.take().expect("piped stdout");
        let (ready_tx, ready_rx) = mpsc::channel();
        // Reads the log until redis says it is ready, then keeps draining it so redis never
        // blocks on a full pipe.
        std::thread::spawn(move || {
            let mut log = String::new();
            let mut told = false;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if !told {
                    log.push_str(&line);
                    log.push('\n');
                    if line.contains("Ready to accept connections") {
                        let _ = ready_tx.send(Ok(()));
                        told = true;
                    }
                }
            }
            if !told {
                let _ = ready_tx.send(Err(log));
            }
        });
        match ready_rx.recv_timeout(Duration::from_secs(20)) {
            Ok(Ok(())) => Ok(RedisServer { child, port }),
            Ok(Err(log)) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(log)
            }
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("redis-server on port {port} did not become ready within 20 s");
            }
        }
    }

    /// `redis://127.0.0.1:PORT/`.
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn find_redis_server() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("redis-server"))
        .find(|candidate| candidate.is_file())
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local address").port()
}
