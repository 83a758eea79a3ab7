//! One member of a [`ZooKeeperEnsemble`](super::ZooKeeperEnsemble): its ports, data directory,
//! configuration, log and JVM process.

#![allow(
    clippy::panic,
    reason = "a test harness that cannot do its job fails the test using it, loudly and with the cause"
)]

use std::fmt::Write as _;
use std::fs;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::four_letter::{ask, ruok};
use crate::members::{LaunchLog, SetMember};
use crate::ports::free_port;
use crate::reaper;
use crate::supervised::Supervised;

/// How long a started JVM may take to answer `ruok` on its client port.
const UP_BOUND: Duration = Duration::from_secs(30);

/// What every member of one ensemble starts with.
#[derive(Debug)]
pub(super) struct Settings {
    pub(super) java: PathBuf,
    pub(super) classpath: String,
    pub(super) tick_time: Duration,
    pub(super) init_limit: u32,
    pub(super) sync_limit: u32,
    pub(super) max_session_timeout: Duration,
    pub(super) heap_mb: u32,
    pub(super) container_check_interval: Duration,
    /// Extra JVM arguments, after the kit's own.
    pub(super) jvm_args: Vec<String>,
    /// Extra `key=value` lines of `zoo.cfg`, after the kit's own.
    pub(super) config: Vec<(String, String)>,
    /// Whether members reach each other through proxies (see `quorum.rs`).
    pub(super) quorum_links: bool,
}

/// A launch that failed because a port chosen as free was taken meanwhile.
#[derive(Debug)]
pub(super) struct PortTaken(pub(super) String);

#[derive(Debug)]
pub(super) struct Member {
    /// Its `myid`: the member's index plus one (ZooKeeper ids start at 1).
    pub(super) myid: usize,
    pub(super) client_port: u16,
    pub(super) quorum_port: u16,
    pub(super) election_port: u16,
    pub(super) data_dir: PathBuf,
    config: PathBuf,
    log: LaunchLog,
    pub(super) process: Supervised,
}

impl Member {
    /// Member `i` (`myid` `i + 1`) on fresh ports, its data, configuration and log in `dir`
    /// (not started).
    pub(super) fn new(i: usize, dir: &Path) -> Self {
        let name = format!("m{i}");
        Self {
            myid: i + 1,
            client_port: free_port(),
            quorum_port: free_port(),
            election_port: free_port(),
            data_dir: dir.join(&name),
            config: dir.join(format!("{name}.cfg")),
            log: LaunchLog::new(dir.join(format!("{name}.log"))),
            process: Supervised::default(),
        }
    }

    pub(super) fn client_addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.client_port))
    }

    /// Its quorum port's address (where followers reach it when it leads).
    pub(super) fn quorum_addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.quorum_port))
    }

    /// Its election port's address.
    pub(super) fn election_addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.election_port))
    }

    /// Its `server.<myid>=` line in every member's configuration.
    pub(super) fn server_line(&self) -> String {
        format!(
            "server.{}=127.0.0.1:{}:{}",
            self.myid, self.quorum_port, self.election_port
        )
    }

    pub(super) fn log(&self) -> String {
        self.log.read()
    }

    /// Writes its configuration (`servers`: every member's [`server_line`](Self::server_line),
    /// none for a standalone server), starts the JVM, and waits until it answers `ruok` on its
    /// client port (which it does before an election; serving clients waits for a quorum).
    /// The data directory, when it holds data, is where the member's state comes back from.
    pub(super) async fn launch(
        &mut self,
        settings: &Settings,
        servers: &[String],
    ) -> Result<(), PortTaken> {
        self.spawn(settings, servers);
        self.wait_up().await
    }

    /// Writes its configuration and starts the JVM, without waiting (see
    /// [`launch`](Self::launch)): an ensemble starts every JVM before it waits for any.
    pub(super) fn spawn(&mut self, settings: &Settings, servers: &[String]) {
        fs::create_dir_all(&self.data_dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", self.data_dir.display()));
        fs::write(self.data_dir.join("myid"), format!("{}\n", self.myid))
            .unwrap_or_else(|e| panic!("cannot write {}'s myid: {e}", self.what()));
        fs::write(&self.config, self.config_text(settings, servers))
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", self.config.display()));
        let log = self.log.open_for_launch();
        let log_err = log
            .try_clone()
            .unwrap_or_else(|e| panic!("cannot share {}'s log file: {e}", self.what()));
        let mut cmd = Command::new(&settings.java);
        // The JVM reads these from the environment: the test's must not change the members.
        cmd.env_remove("JAVA_TOOL_OPTIONS")
            .env_remove("_JAVA_OPTIONS")
            .env_remove("JDK_JAVA_OPTIONS")
            .arg(format!("-Xmx{}m", settings.heap_mb))
            .args([
                "-Xms16m",
                "-Xss512k",
                "-XX:+UseSerialGC",
                // C1 only: the JVM answers sooner, and a test's load needs no C2 code.
                "-XX:TieredStopAtLevel=1",
                // No /tmp/hsperfdata_* file per JVM.
                "-XX:-UsePerfData",
                "-Djava.net.preferIPv4Stack=true",
                // Election connections to a paused member give up after 1 s (5 s by default).
                "-Dzookeeper.cnxTimeout=1000",
                // Election rounds retry every 200 ms doubling up to 1 s (60 s by default): a
                // member whose peers start late (a loaded machine) does not back off long.
                "-Dzookeeper.fastleader.maxNotificationInterval=1000",
                "-Dzookeeper.jmx.log4j.disable=true",
                "-Dorg.slf4j.simpleLogger.showDateTime=true",
                "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
            ])
            // A system property only (zoo.cfg cannot set it): how often empty containers are
            // deleted (every 60 s by default).
            .arg(format!(
                "-Dznode.container.checkIntervalMs={}",
                settings.container_check_interval.as_millis()
            ))
            .args(&settings.jvm_args)
            .arg("-cp")
            .arg(&settings.classpath)
            .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        let child = cmd.spawn().unwrap_or_else(|e| {
            panic!(
                "{}",
                super::missing_message(&format!("cannot run {}: {e}", settings.java.display()))
            )
        });
        let pid = child.id();
        self.process.set(child);
        // Its configuration's path is unique to this test process: the marker.
        reaper::kill_at_exit(pid, &self.config.display().to_string());
    }

    fn config_text(&self, settings: &Settings, servers: &[String]) -> String {
        let mut text = format!(
            "# {} (written by lock-testkit)\n\
             tickTime={}\n\
             initLimit={}\n\
             syncLimit={}\n\
             dataDir={}\n\
             clientPort={}\n\
             clientPortAddress=127.0.0.1\n\
             maxSessionTimeout={}\n\
             admin.enableServer=false\n\
             4lw.commands.whitelist=*\n\
             preAllocSize=1024\n\
             forceSync=no\n\
             maxClientCnxns=0\n",
            self.what(),
            settings.tick_time.as_millis(),
            settings.init_limit,
            settings.sync_limit,
            self.data_dir.display(),
            self.client_port,
            settings.max_session_timeout.as_millis(),
        );
        for line in servers {
            let _ = writeln!(text, "{line}");
        }
        for (key, value) in &settings.config {
            let _ = writeln!(text, "{key}={value}");
        }
        text
    }

    /// Waits until the JVM [`spawn`](Self::spawn) started answers `ruok`. A port taken
    /// meanwhile (the client port: the JVM exits; the election port: it logs the failed bind
    /// and retries) is [`PortTaken`].
    pub(super) async fn wait_up(&mut self) -> Result<(), PortTaken> {
        let start = Instant::now();
        loop {
            let this_launch = self.log.this_launch();
            if this_launch.contains("Address already in use") {
                self.process.kill();
                return Err(PortTaken(this_launch));
            }
            if let Some(status) = self.process.exited() {
                panic!(
                    "{} exited at start ({status}); its log:\n{}",
                    self.what(),
                    self.log.tail()
                );
            }
            if ruok(self.client_addr()).await.is_ok() {
                return Ok(());
            }
            if start.elapsed() > UP_BOUND {
                self.process.kill();
                panic!(
                    "{} did not answer `ruok` within {UP_BOUND:?}; its log:\n{}",
                    self.what(),
                    self.log.tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Its answer to a four-letter command.
    pub(super) async fn ask(&self, command: &str) -> Result<String, String> {
        ask(self.client_addr(), command).await
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
        format!(
            "ZooKeeper member m{} (client {})",
            self.myid - 1,
            self.client_addr()
        )
    }
}
