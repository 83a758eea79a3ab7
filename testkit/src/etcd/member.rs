//! One member of an [`EtcdCluster`](super::EtcdCluster): its ports, data directory, log and
//! process, and the questions the cluster asks it over HTTP.

#![allow(
    clippy::panic,
    reason = "a test harness that cannot do its job fails the test using it, loudly and with the cause"
)]

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use super::client::uint_field;
use super::http::request;
use crate::members::{LaunchLog, SetMember};
use crate::ports::free_port;
use crate::supervised::Supervised;

/// How long a started member may take to serve its peer port. A restarted member of a loaded
/// cluster once logged nothing for 15 s after its transport came up (a CI run of the etcd
/// load test): the bound is generous, and its failure prints the whole launch's log.
const PEER_BOUND: Duration = Duration::from_secs(30);

/// How long a member may take to answer one status or health question.
const ASK_TIMEOUT: Duration = Duration::from_millis(500);

/// What every member of one cluster starts with.
#[derive(Debug)]
pub(super) struct Settings {
    pub(super) binary: PathBuf,
    pub(super) token: String,
    pub(super) heartbeat: Duration,
    pub(super) election_timeout: Duration,
    pub(super) args: Vec<String>,
}

/// A launch that failed because a port chosen as free was taken meanwhile.
#[derive(Debug)]
pub(super) struct PortTaken(pub(super) String);

/// What a member says about itself (`/v3/maintenance/status`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Status {
    pub(super) id: u64,
    /// The leader it follows (0: none).
    pub(super) leader: u64,
}

#[derive(Debug)]
pub(super) struct Member {
    pub(super) name: String,
    pub(super) client_port: u16,
    pub(super) peer_port: u16,
    pub(super) data_dir: PathBuf,
    log: LaunchLog,
    pub(super) process: Supervised,
    /// Its raft id, learned from its status once it has answered.
    pub(super) id: u64,
}

impl Member {
    /// A member named `m<i>` on fresh ports, its data and log in `dir` (not started).
    pub(super) fn new(i: usize, dir: &Path) -> Self {
        let name = format!("m{i}");
        Self {
            client_port: free_port(),
            peer_port: free_port(),
            data_dir: dir.join(&name),
            log: LaunchLog::new(dir.join(format!("{name}.log"))),
            name,
            process: Supervised::default(),
            id: 0,
        }
    }

    pub(super) fn client_addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.client_port))
    }

    pub(super) fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }

    pub(super) fn client_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    pub(super) fn log(&self) -> String {
        self.log.read()
    }

    /// Starts the process (the data directory, when it exists, holds its state: etcd then
    /// ignores the `--initial-cluster*` flags and rejoins as the member it was) and waits until
    /// it serves its peer port, which it does before it has a quorum (its client port waits
    /// for one).
    pub(super) async fn launch(
        &mut self,
        settings: &Settings,
        initial_cluster: &str,
    ) -> Result<(), PortTaken> {
        let log = self.log.open_for_launch();
        let mut cmd = Command::new(&settings.binary);
        // etcd reads every `ETCD_*` variable as a flag: the test's environment must not
        // configure the members behind the kit's back.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("ETCD_") {
                cmd.env_remove(name);
            }
        }
        cmd.arg("--name")
            .arg(&self.name)
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--listen-client-urls")
            .arg(self.client_url())
            .arg("--advertise-client-urls")
            .arg(self.client_url())
            .arg("--listen-peer-urls")
            .arg(self.peer_url())
            .arg("--initial-advertise-peer-urls")
            .arg(self.peer_url())
            .arg("--initial-cluster")
            .arg(initial_cluster)
            .args(["--initial-cluster-state", "new"])
            .arg("--initial-cluster-token")
            .arg(&settings.token)
            .arg("--heartbeat-interval")
            .arg(settings.heartbeat.as_millis().to_string())
            .arg("--election-timeout")
            .arg(settings.election_timeout.as_millis().to_string())
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .args(&settings.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        let child = cmd.spawn().unwrap_or_else(|e| {
            panic!(
                "{}",
                super::missing_message(&format!("cannot run {}: {e}", settings.binary.display()))
            )
        });
        self.process.set(child);
        self.wait_serving_peers().await
    }

    async fn wait_serving_peers(&mut self) -> Result<(), PortTaken> {
        let peer = SocketAddr::from((Ipv4Addr::LOCALHOST, self.peer_port));
        let start = std::time::Instant::now();
        loop {
            if let Some(status) = self.process.exited() {
                let this_launch = self.log.this_launch();
                if this_launch.contains("address already in use") {
                    return Err(PortTaken(this_launch));
                }
                panic!(
                    "{} exited at start ({status}); its log:\n{}",
                    self.what(),
                    self.log.tail()
                );
            }
            // A connection made before etcd serves its (already bound) peer port hangs: ask
            // briefly first, longer later (a loaded machine may answer slowly).
            let timeout = (Duration::from_millis(25) + start.elapsed() / 4).min(ASK_TIMEOUT);
            if matches!(
                request(peer, "GET", "/members", b"", timeout).await,
                Ok((200, _))
            ) {
                return Ok(());
            }
            if start.elapsed() > PEER_BOUND {
                self.process.kill();
                panic!(
                    "{} did not serve its peer port {} within {PEER_BOUND:?}; its log since \
                     this launch:\n{}",
                    self.what(),
                    self.peer_port,
                    self.log.this_launch()
                );
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Its `/v3/maintenance/status` (a member without a quorum still answers it once it has
    /// served clients).
    pub(super) async fn status(&self) -> Result<Status, String> {
        status_at(self.client_addr()).await
    }

    /// `GET /health` says true: it has a leader and a quorum read went through.
    pub(super) async fn healthy(&self) -> Result<(), String> {
        let (code, body) = request(self.client_addr(), "GET", "/health", b"", ASK_TIMEOUT).await?;
        let text = String::from_utf8_lossy(&body);
        let json: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if code == 200 && json["health"] == "true" {
            Ok(())
        } else {
            Err(format!("/health: HTTP {code}: {}", text.trim()))
        }
    }
}

impl SetMember for Member {
    fn process(&self) -> &Supervised {
        &self.process
    }

    fn process_mut(&mut self) -> &mut Supervised {
        &mut self.process
    }

    fn launch_log(&self) -> &LaunchLog {
        &self.log
    }

    fn what(&self) -> String {
        format!("etcd member {} (client {})", self.name, self.client_addr())
    }
}

/// What the member serving clients at `addr` says about itself (a task of its own: the
/// cluster asks every member at once, and a paused one costs its whole timeout).
pub(super) async fn status_at(addr: SocketAddr) -> Result<Status, String> {
    let (code, body) = request(addr, "POST", "/v3/maintenance/status", b"{}", ASK_TIMEOUT).await?;
    let text = String::from_utf8_lossy(&body);
    if code != 200 {
        return Err(format!("status: HTTP {code}: {}", text.trim()));
    }
    let json: Value =
        serde_json::from_str(&text).map_err(|e| format!("status: not JSON ({e}): {text}"))?;
    Ok(Status {
        id: uint_field(&json["header"], "member_id"),
        leader: uint_field(&json, "leader"),
    })
}
