//! ZooKeeper's four-letter commands (`ruok`, `srvr`, `mntr`) on a member's client port: what
//! the kit asks to learn whether a member is up, serving, and leading.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a member may take to answer one command (a paused one never does).
pub(super) const ASK_TIMEOUT: Duration = Duration::from_millis(500);

/// Sends `command` and reads the whole answer (the server closes the connection after it).
pub(super) async fn ask(addr: SocketAddr, command: &str) -> Result<String, String> {
    let exchange = async {
        let mut conn = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        conn.write_all(command.as_bytes())
            .await
            .map_err(|e| format!("send `{command}`: {e}"))?;
        let mut answer = Vec::new();
        conn.read_to_end(&mut answer)
            .await
            .map_err(|e| format!("read the answer to `{command}`: {e}"))?;
        Ok(String::from_utf8_lossy(&answer).into_owned())
    };
    tokio::time::timeout(ASK_TIMEOUT, exchange)
        .await
        .unwrap_or_else(|_| Err(format!("no answer to `{command}` within {ASK_TIMEOUT:?}")))
}

/// `ruok` answered `imok`: the JVM runs and serves its client port (before any election).
pub(super) async fn ruok(addr: SocketAddr) -> Result<(), String> {
    let answer = ask(addr, "ruok").await?;
    if answer == "imok" {
        Ok(())
    } else {
        Err(format!("`ruok` answered {answer:?}"))
    }
}

/// A member's role, as `srvr` reports it while it serves clients.
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use lock_testkit::zookeeper::{Mode, ZooKeeperEnsemble};
/// let ensemble = ZooKeeperEnsemble::start_single().await;
/// assert_eq!(ensemble.mode(0).await, Some(Mode::Standalone));
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The ensemble's leader: it has a quorum of followers in sync.
    Leader,
    /// A follower of the leader.
    Follower,
    /// An observer (not voting).
    Observer,
    /// A single server without an ensemble (`start_single`).
    Standalone,
}

/// What `srvr` says about a member that serves clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Srvr {
    pub(super) mode: Mode,
    /// Its last zxid (the epoch in the upper 32 bits).
    pub(super) zxid: i64,
}

/// Asks `srvr`; an error when the member does not serve clients (no quorum, an election under
/// way: it answers "This ZooKeeper instance is not currently serving requests").
pub(super) async fn srvr(addr: SocketAddr) -> Result<Srvr, String> {
    parse_srvr(&ask(addr, "srvr").await?)
}

fn parse_srvr(answer: &str) -> Result<Srvr, String> {
    let field = |name: &str| {
        answer
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .map(str::trim)
    };
    let mode = match field("Mode:") {
        Some("leader") => Mode::Leader,
        Some("follower") => Mode::Follower,
        Some("observer") => Mode::Observer,
        Some("standalone") => Mode::Standalone,
        _ => return Err(format!("`srvr` answered {:?}", answer.trim())),
    };
    let zxid = field("Zxid:")
        .and_then(|z| i64::from_str_radix(z.trim_start_matches("0x"), 16).ok())
        .ok_or_else(|| format!("`srvr` gave no zxid: {:?}", answer.trim()))?;
    Ok(Srvr { mode, zxid })
}

/// One numeric field of `mntr` (`zk_synced_followers`, `zk_znode_count`, ...).
pub(super) async fn mntr_field(addr: SocketAddr, name: &str) -> Result<i64, String> {
    let answer = ask(addr, "mntr").await?;
    answer
        .lines()
        .find_map(|line| {
            let (key, value) = line.split_once('\t')?;
            (key == name).then(|| value.trim().parse().ok())?
        })
        .ok_or_else(|| format!("`mntr` has no {name}: {:?}", answer.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn srvr_answers_are_read() {
        let answer = "Zookeeper version: 3.8.0-x, built on 2024-12-29 17:54 UTC\n\
                      Latency min/avg/max: 0/0.0/0\nReceived: 1\nSent: 0\nConnections: 1\n\
                      Outstanding: 0\nZxid: 0x100000002\nMode: leader\nNode count: 5\n";
        assert_eq!(
            parse_srvr(answer),
            Ok(Srvr {
                mode: Mode::Leader,
                zxid: 0x1_0000_0002
            })
        );
        let err = parse_srvr("This ZooKeeper instance is not currently serving requests\n");
        assert!(err.unwrap_err().contains("not currently serving"));
    }
}
