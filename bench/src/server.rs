//! The Redis under test: one started here (free loopback port, no persistence, temporary
//! directory, killed at exit) or one given by URL; and `redis-benchmark` against it.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, ConnectionAddr, IntoConnectionInfo};

use crate::Result;

const INSTALL_HINT: &str = "redis-server was not found on PATH: install it with `apt-get install -y redis-server` \
     (Debian/Ubuntu; it also ships redis-benchmark), or point the bench at a running server with \
     --redis-url URL / REDIS_URL";

/// The Redis the bench talks to.
#[derive(Debug)]
pub(crate) struct Target {
    pub(crate) url: String,
    host: String,
    port: u16,
    username: Option<String>,
    password: Option<String>,
    /// `Some` when this process started the server (killed when dropped).
    pub(crate) started: Option<RedisServer>,
}

impl Target {
    /// Uses `url`, or starts a private redis-server when `None`.
    pub(crate) fn open(url: Option<&str>) -> Result<Self> {
        match url {
            Some(url) => {
                let info = url
                    .into_connection_info()
                    .map_err(|e| format!("bad Redis URL `{url}`: {e}"))?;
                // redis-benchmark is run for plain TCP targets only.
                let (host, port) = match info.addr() {
                    ConnectionAddr::Tcp(h, p) => (h.clone(), *p),
                    _ => (String::new(), 0),
                };
                Ok(Target {
                    url: url.to_owned(),
                    host,
                    port,
                    username: info.redis_settings().username().map(str::to_owned),
                    password: info.redis_settings().password().map(str::to_owned),
                    started: None,
                })
            }
            None => {
                let server = RedisServer::start()?;
                Ok(Target {
                    url: format!("redis://127.0.0.1:{}/", server.port),
                    host: "127.0.0.1".to_owned(),
                    port: server.port,
                    username: None,
                    password: None,
                    started: Some(server),
                })
            }
        }
    }

    pub(crate) fn client(&self) -> Result<Client> {
        Ok(Client::open(self.url.as_str())?)
    }

    /// A redis-rs `ConnectionManager` configured as lock-core configures its own (2 s connect
    /// and response timeouts, one retry): the same client for the baseline and for us.
    pub(crate) async fn manager(&self) -> Result<ConnectionManager> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(Duration::from_secs(2)))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(500));
        Ok(ConnectionManager::new_with_config(self.client()?, config).await?)
    }

    /// Runs `redis-benchmark -t set -c clients -n requests -q` and returns SET requests/s;
    /// `Ok(None)` when the binary is missing or the target is not TCP.
    pub(crate) async fn redis_benchmark_set(
        &self,
        clients: usize,
        requests: usize,
    ) -> Result<Option<f64>> {
        if self.port == 0 {
            return Ok(None);
        }
        let mut cmd = tokio::process::Command::new("redis-benchmark");
        cmd.args(["-h", &self.host, "-p", &self.port.to_string()])
            .args(["-t", "set", "-q"])
            .args(["-c", &clients.to_string(), "-n", &requests.to_string()]);
        if let Some(user) = &self.username {
            cmd.args(["--user", user]);
        }
        if let Some(pass) = &self.password {
            cmd.args(["-a", pass]);
        }
        cmd.stdin(Stdio::null()).kill_on_drop(true);
        let out = match cmd.output().await {
            Ok(out) => out,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot run redis-benchmark: {e}").into()),
        };
        let text = String::from_utf8_lossy(&out.stdout);
        parse_benchmark(&text).map(Some).ok_or_else(|| {
            format!(
                "cannot read redis-benchmark's output (status {}): {text:?} {:?}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
            .into()
        })
    }
}

/// The requests/s of the `SET:` line of `redis-benchmark -q` (progress lines end in `\r`).
fn parse_benchmark(text: &str) -> Option<f64> {
    text.split(['\r', '\n'])
        .filter_map(|line| line.trim().strip_prefix("SET:"))
        .filter(|rest| rest.contains("requests per second"))
        .filter_map(|rest| rest.split_whitespace().next()?.parse::<f64>().ok())
        .next_back()
}

/// A redis-server child process with its temporary directory, removed on drop.
#[derive(Debug)]
pub(crate) struct RedisServer {
    child: Child,
    dir: PathBuf,
    pub(crate) port: u16,
}

impl RedisServer {
    fn start() -> Result<Self> {
        match Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
        {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => return Err(INSTALL_HINT.into()),
            Err(e) => return Err(format!("cannot run redis-server: {e}").into()),
        }
        let mut last = String::new();
        // A free port may be taken between choosing it and redis binding it: try a few.
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
            let dir =
                std::env::temp_dir().join(format!("lock-bench-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir)?;
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .args(["--daemonize", "no", "--protected-mode", "yes"])
                .arg("--dir")
                .arg(&dir)
                .arg("--logfile")
                .arg(dir.join("redis.log"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?;
            let mut server = RedisServer { child, dir, port };
            match server.wait_ready() {
                Ok(()) => return Ok(server),
                Err(e) => last = e,
            }
        }
        Err(format!("redis-server did not start: {last}").into())
    }

    fn wait_ready(&mut self) -> std::result::Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                let log = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
                return Err(format!("exited with {status}: {log}"));
            }
            if ping(self.port) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err("no PONG within 10 s".to_owned());
            }
            // Start-up poll of a process we do not control; not a synchronization shortcut.
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn ping(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let mut buf = [0u8; 7];
    s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_redis_benchmark_output() {
        let out = "SET: rps=0.0 (overall: nan) avg_msec=nan (overall: nan)\r\
                   SET: 81234.56 requests per second, p50=0.311 msec                    \n\n";
        assert_eq!(parse_benchmark(out), Some(81234.56));
        assert_eq!(parse_benchmark("garbage"), None);
    }
}
