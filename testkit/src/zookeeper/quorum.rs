//! Quorum links through proxies (opt-in: [`ZooKeeperEnsembleBuilder::quorum_links`]): every
//! member reaches every other one's quorum port (a follower's link to its leader) and
//! election port through a [`Proxy`] of its own, so that a test can cut one member off from
//! the others, both ways, while its client port stays reachable: a member partitioned from
//! the quorum that its clients still talk to.
//!
//! Member `i`'s `zoo.cfg` names its own real ports on its own `server.N` line (it binds them)
//! and, on every other member `j`'s line, the proxies of the link `i → j`: 2 proxies per
//! ordered pair of members (12 for 3 members).
//!
//! Behind each proxy a relay reaches the member (retrying for a moment a port that is not
//! listening yet, see [`relay`]). ZooKeeper's election connections need one more step. A
//! member that receives an election connection from a member of a lower id drops it and
//! connects back, to the election address the other sent in its first message (its own,
//! real one), not through its configuration: such a connection would bypass the proxies and
//! survive a cut. The relay behind each election proxy rewrites that first message (`protocol version, id, address
//! length, address`; versions -65536 and -65535) to name the proxy of the link back instead.
//!
//! [`ZooKeeperEnsembleBuilder::quorum_links`]: super::ZooKeeperEnsembleBuilder::quorum_links

#![allow(
    clippy::panic,
    reason = "a test harness that cannot do its job fails the test using it, loudly and with the cause"
)]

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::ZooKeeperEnsemble;
use super::member::Member;
use crate::proxy::Proxy;

/// The first long of an election connection that carries the sender's address (ZooKeeper's
/// `PROTOCOL_VERSION_V1` and `PROTOCOL_VERSION_V2`).
const ADDRESSED_VERSIONS: [i64; 2] = [-65536, -65535];

/// The longest address a first message may carry here (ZooKeeper's own limit is larger; ours
/// are `127.0.0.1:<port>`). A longer one is passed on unchanged.
const MAX_ADDRESS: usize = 4096;

/// How long a relay retries to reach a member's port that refuses connections.
const CONNECT_PATIENCE: Duration = Duration::from_secs(1);

/// One member's way to another: its quorum port and its election port, each through a proxy.
#[derive(Debug)]
struct Link {
    quorum: Proxy,
    election: Proxy,
    /// Between each proxy and the member (see [`relay`]).
    relays: [JoinHandle<()>; 2],
}

impl Drop for Link {
    fn drop(&mut self) {
        self.relays.iter().for_each(JoinHandle::abort);
    }
}

/// Every member's links to every other one, and which members are cut off.
#[derive(Debug)]
pub(super) struct QuorumLinks {
    /// `links[from][to]`; `None` on the diagonal.
    links: Vec<Vec<Option<Link>>>,
    isolated: Vec<bool>,
}

impl QuorumLinks {
    /// The links between `members` (on their current ports), all open.
    pub(super) async fn start(members: &[Member]) -> Self {
        let n = members.len();
        // Each proxy forwards to a relay, and an election relay names the proxy of the link
        // back: every listener is bound before any relay is spawned.
        let mut pending = Vec::with_capacity(n);
        for from in 0..n {
            let mut row = Vec::with_capacity(n);
            for to in 0..n {
                if to == from {
                    row.push(None);
                    continue;
                }
                let (quorum_relay, election_relay) = (bind().await, bind().await);
                let quorum = Proxy::start(local_addr(&quorum_relay)).await;
                let election = Proxy::start(local_addr(&election_relay)).await;
                row.push(Some((quorum, election, quorum_relay, election_relay)));
            }
            pending.push(row);
        }
        // The election proxy of each link, by (from, to): a relay names the one of the way back.
        let elections: Vec<Vec<Option<SocketAddr>>> = pending
            .iter()
            .map(|row| {
                row.iter()
                    .map(|p| p.as_ref().map(|(_, election, ..)| election.addr()))
                    .collect()
            })
            .collect();
        let mut links = Vec::with_capacity(n);
        for (from, row) in pending.into_iter().enumerate() {
            let mut out = Vec::with_capacity(n);
            for ((to, member), pending) in members.iter().enumerate().zip(row) {
                let (Some((quorum, election, quorum_relay, election_relay)), Some(back)) =
                    (pending, elections[to][from])
                else {
                    out.push(None);
                    continue;
                };
                let relays = [
                    tokio::spawn(relay(quorum_relay, member.quorum_addr(), None)),
                    tokio::spawn(relay(election_relay, member.election_addr(), Some(back))),
                ];
                out.push(Some(Link {
                    quorum,
                    election,
                    relays,
                }));
            }
            links.push(out);
        }
        Self {
            links,
            isolated: vec![false; n],
        }
    }

    /// Member `me`'s `server.N=` lines: its own with its real ports, the others' with the
    /// proxies of its links to them.
    pub(super) fn server_lines(&self, me: usize, members: &[Member]) -> Vec<String> {
        members
            .iter()
            .enumerate()
            .map(|(to, member)| match &self.links[me][to] {
                None => member.server_line(),
                Some(link) => format!(
                    "server.{}=127.0.0.1:{}:{}",
                    member.myid,
                    link.quorum.addr().port(),
                    link.election.addr().port()
                ),
            })
            .collect()
    }

    fn touching(&self, i: usize) -> impl Iterator<Item = (usize, &Link)> {
        self.links.iter().enumerate().flat_map(move |(from, row)| {
            row.iter().enumerate().filter_map(move |(to, link)| {
                let link = link.as_ref()?;
                if from == i {
                    Some((to, link))
                } else if to == i {
                    Some((from, link))
                } else {
                    None
                }
            })
        })
    }

    fn isolate(&mut self, i: usize) {
        self.isolated[i] = true;
        for (_, link) in self.touching(i) {
            link.quorum.blackhole();
            link.election.blackhole();
        }
    }

    fn heal(&mut self, i: usize) {
        self.isolated[i] = false;
        for (other, link) in self.touching(i) {
            if self.isolated[other] {
                continue;
            }
            // Held-back bytes are dropped with their connections: both ends connect afresh.
            for proxy in [&link.quorum, &link.election] {
                proxy.cut();
                proxy.restore();
            }
        }
    }
}

/// A listener on a free loopback port, for a relay.
async fn bind() -> TcpListener {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .unwrap_or_else(|e| panic!("cannot bind a loopback port for a relay: {e}"))
}

fn local_addr(listener: &TcpListener) -> SocketAddr {
    listener
        .local_addr()
        .unwrap_or_else(|e| panic!("cannot read a relay's port: {e}"))
}

/// Forwards each connection to `upstream` (a member's quorum or election port); with `back`,
/// an election connection's first message names `back` as the sender's address.
///
/// The proxy in front has accepted the connection before the relay reaches the member: a
/// port not listening yet (a leader just elected opens its quorum port a moment later) would
/// look to the connecting member like a connection closed at once, where it would have
/// retried a refused one; so the relay retries for up to [`CONNECT_PATIENCE`].
async fn relay(listener: TcpListener, upstream: SocketAddr, back: Option<SocketAddr>) {
    loop {
        let Ok((mut from, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(async move {
            let Some(mut to) = connect_patiently(upstream).await else {
                return;
            };
            let first = match back {
                Some(back) => match first_message(&mut from, back).await {
                    Ok(first) => first,
                    Err(_) => return,
                },
                None => Vec::new(),
            };
            if to.write_all(&first).await.is_ok() {
                let _ = tokio::io::copy_bidirectional(&mut from, &mut to).await;
            }
        });
    }
}

/// Connects to `upstream`, retrying a refused connection for up to [`CONNECT_PATIENCE`].
async fn connect_patiently(upstream: SocketAddr) -> Option<TcpStream> {
    let deadline = tokio::time::Instant::now() + CONNECT_PATIENCE;
    loop {
        match TcpStream::connect(upstream).await {
            Ok(stream) => return Some(stream),
            Err(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(_) => return None,
        }
    }
}

/// Reads an election connection's first message and returns it with `back` as the sender's
/// address (unchanged when it carries none).
async fn first_message(from: &mut TcpStream, back: SocketAddr) -> std::io::Result<Vec<u8>> {
    let version = from.read_i64().await?;
    let mut out = version.to_be_bytes().to_vec();
    if !ADDRESSED_VERSIONS.contains(&version) {
        return Ok(out);
    }
    let sid = from.read_i64().await?;
    out.extend_from_slice(&sid.to_be_bytes());
    let len = from.read_i32().await?;
    match usize::try_from(len) {
        Ok(len) if len <= MAX_ADDRESS => {
            let mut address = vec![0; len];
            from.read_exact(&mut address).await?;
            let back = back.to_string();
            let back_len = i32::try_from(back.len()).unwrap_or(i32::MAX);
            out.extend_from_slice(&back_len.to_be_bytes());
            out.extend_from_slice(back.as_bytes());
        }
        _ => out.extend_from_slice(&len.to_be_bytes()),
    }
    Ok(out)
}

impl ZooKeeperEnsemble {
    /// Cuts member `i` off from every other member, both ways: its quorum links (to a leader,
    /// from its followers) and its election links pass nothing more, as in a network
    /// partition (connections stay open, silent), while its client port stays reachable.
    /// A follower so cut off goes on answering its clients' reads from its own, aging copy
    /// until it has heard nothing from its leader for `syncLimit` ticks
    /// ([`sync_timeout`](Self::sync_timeout)); then it stops serving (it looks for a leader,
    /// finds none it can reach) until [`heal`](Self::heal). Writes and syncs sent through it
    /// get no answer. A cut-off leader steps down after the sync limit, and the others elect
    /// one among them. Waits such as [`wait_healthy`](Self::wait_healthy) count it as a
    /// member that does not serve.
    ///
    /// # Panics
    /// When the ensemble was not started with
    /// [`quorum_links`](super::ZooKeeperEnsembleBuilder::quorum_links).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use lock_testkit::zookeeper::ZooKeeperEnsemble;
    /// let mut ensemble = ZooKeeperEnsemble::builder().quorum_links(true).start().await;
    /// let leader = ensemble.wait_for_leader().await;
    /// let follower = (leader + 1) % 3;
    /// ensemble.isolate(follower);
    /// // ... its clients still reach it; it stops serving after the sync limit.
    /// ensemble.heal(follower);
    /// ensemble.wait_healthy().await;
    /// # }
    /// ```
    pub fn isolate(&mut self, i: usize) {
        self.quorum_links_mut("isolate").isolate(i);
    }

    /// Ends [`isolate`](Self::isolate) for member `i` (links to members still isolated stay
    /// cut): what the partition held back is dropped with its connections, and the members
    /// connect to each other afresh; it rejoins as a follower and syncs.
    ///
    /// # Panics
    /// As [`isolate`](Self::isolate).
    ///
    /// See [`isolate`](Self::isolate).
    pub fn heal(&mut self, i: usize) {
        self.quorum_links_mut("heal").heal(i);
    }

    /// Whether member `i` is cut off by [`isolate`](Self::isolate) (false without quorum
    /// links).
    ///
    /// See [`isolate`](Self::isolate).
    pub fn is_isolated(&self, i: usize) -> bool {
        self.links.as_ref().is_some_and(|l| l.isolated[i])
    }

    fn quorum_links_mut(&mut self, what: &str) -> &mut QuorumLinks {
        self.links.as_mut().unwrap_or_else(|| {
            panic!(
                "{what} needs the quorum links: start the ensemble with \
                 ZooKeeperEnsemble::builder().quorum_links(true)"
            )
        })
    }
}
