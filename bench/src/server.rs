//! The Redis under test: one started through the test kit (free loopback port, no persistence,
//! temporary directory, killed at exit) or one given by URL; and `redis-benchmark` against it.

use std::io::ErrorKind;
use std::process::Stdio;

use lock_testkit::RedisServer;
use lock_testkit::server::find_redis_server;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, ConnectionAddr, IntoConnectionInfo};

use crate::Result;

/// The Redis the bench talks to.
#[derive(Debug)]
pub(crate) struct Target {
    pub(crate) url: String,
    /// `Some` when this process started the server (killed when dropped).
    pub(crate) started: Option<RedisServer>,
}

impl Target {
    /// Uses `url`, or starts a private redis-server when `None`.
    pub(crate) fn open(url: Option<&str>) -> Result<Self> {
        if let Some(url) = url {
            url.into_connection_info()
                .map_err(|e| format!("bad Redis URL `{url}`: {e}"))?;
            return Ok(Target {
                url: url.to_owned(),
                started: None,
            });
        }
        // The kit panics when redis-server is missing; a CLI says so and exits instead.
        find_redis_server()?;
        let server = RedisServer::start();
        Ok(Target {
            url: server.url(),
            started: Some(server),
        })
    }

    pub(crate) fn client(&self) -> Result<Client> {
        Ok(Client::open(self.url.as_str())?)
    }

    /// A redis-rs `ConnectionManager` configured as lock-core configures its own: the same
    /// client for the baseline and for us.
    pub(crate) async fn manager(&self) -> Result<ConnectionManager> {
        Ok(ConnectionManager::new_with_config(self.client()?, manager_config()).await?)
    }

    /// Runs `redis-benchmark -t set -c clients -n requests -q` and returns SET requests/s;
    /// `Ok(None)` when the binary is missing or the target is not TCP.
    pub(crate) async fn redis_benchmark_set(
        &self,
        clients: usize,
        n: usize,
    ) -> Result<Option<f64>> {
        let info = self.url.as_str().into_connection_info()?;
        let ConnectionAddr::Tcp(host, port) = info.addr() else {
            return Ok(None);
        };
        let mut cmd = tokio::process::Command::new("redis-benchmark");
        cmd.args(["-h", host, "-p", &port.to_string(), "-t", "set", "-q"])
            .args(["-c", &clients.to_string(), "-n", &n.to_string()]);
        if let Some(user) = info.redis_settings().username() {
            cmd.args(["--user", user]);
        }
        if let Some(pass) = info.redis_settings().password() {
            cmd.args(["-a", pass]);
        }
        let out = match cmd.stdin(Stdio::null()).kill_on_drop(true).output().await {
            Ok(out) => out,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot run redis-benchmark: {e}").into()),
        };
        let text = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let status = out.status;
        let error = format!("cannot read redis-benchmark's output ({status}): {text:?} {stderr:?}");
        Ok(Some(parse_benchmark(&text).ok_or(error)?))
    }
}

/// lock-core's own connection settings, with its default timeouts (taken from lock-core, so
/// the baseline cannot drift from what the lock does).
pub(crate) fn manager_config() -> ConnectionManagerConfig {
    lock_core::RedisBackend::builder("redis://127.0.0.1/").connection_manager_config()
}

/// The requests/s of the `SET:` line of `redis-benchmark -q` (progress lines end in `\r`).
fn parse_benchmark(text: &str) -> Option<f64> {
    text.split(['\r', '\n'])
        .filter_map(|line| line.trim().strip_prefix("SET:"))
        .filter(|rest| rest.contains("requests per second"))
        .filter_map(|rest| rest.split_whitespace().next()?.parse::<f64>().ok())
        .next_back()
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_redis_benchmark_output() {
        let out = "SET: rps=0.0 (overall: nan) avg_msec=nan (overall: nan)\r\
                   SET: 81234.56 requests per second, p50=0.311 msec                    \n\n";
        assert_eq!(super::parse_benchmark(out), Some(81234.56));
        assert_eq!(super::parse_benchmark("garbage"), None);
    }
}
