//! A local Redis Cluster of real `redis-server` processes: by default 3 primaries and 3
//! replicas on free loopback ports, created with `redis-cli --cluster create`, with the
//! topology helpers tests need to fail over, kill and reshard while a client works.
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use lock_testkit::cluster::RedisCluster;
//!
//! let mut cluster = RedisCluster::start().await; // 6 nodes, all 16384 slots served
//! let primary = cluster.primary_for_key("order:42").await;
//! cluster.node(primary).server().set("order:42", "token").await;
//!
//! // Reshard the key's slot to another primary; the cluster still serves it.
//! let slot = lock_testkit::cluster::key_slot("order:42");
//! let other = cluster.primaries().await.into_iter().find(|&p| p != primary).unwrap();
//! cluster.migrate_slot(slot, primary, other).await;
//! assert_eq!(cluster.node(other).server().get("order:42").await.as_deref(), Some("token"));
//!
//! // Crash the new owner: its replica takes over.
//! cluster.kill_node(other);
//! let promoted = cluster.wait_for_failover(other).await;
//! assert_ne!(promoted, other);
//! # }
//! ```
//!
//! Nodes are named by their index in [`RedisCluster::nodes`], which never changes; their
//! roles do (a failover swaps a primary and its replica), so the role helpers ask the cluster
//! each time. Every node runs with `--cluster-node-timeout` 1000 ms (see
//! [`RedisClusterBuilder::node_timeout`]), so a killed primary is replaced within a few
//! seconds, and `--cluster-replica-validity-factor 0` (a replica may always take over).
//!
//! Besides `redis-server`, creating the cluster needs `redis-cli` (Debian's `redis-tools`, a
//! dependency of the `redis-server` package): it is looked for beside `redis-server`, then on
//! `PATH`.
#![allow(
    clippy::panic,
    reason = "a test harness that cannot do its job fails the test using it, loudly and with the cause"
)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;

use crate::eventually::eventually_ok;
use crate::ports::free_port;
use crate::server::{INSTALL_COMMAND, RedisServer, RedisServerBuilder, find_redis_server};
use crate::tls::TlsCerts;

/// The number of hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// How long the cluster may take to become consistent (after start, a failover, a migration).
const SETTLE_BOUND: Duration = Duration::from_secs(30);

/// Bound on the harness client's connects and answers.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// The CRC16-CCITT (XMODEM) table: polynomial 0x1021, no reflection.
const CRC16_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// CRC16-CCITT in its XMODEM form (initial value 0), the checksum Redis Cluster hashes keys with.
///
/// ```
/// assert_eq!(lock_testkit::cluster::crc16(b"123456789"), 0x31C3);
/// ```
pub fn crc16(data: &[u8]) -> u16 {
    data.iter().fold(0u16, |crc, &byte| {
        (crc << 8) ^ CRC16_TABLE[usize::from((crc >> 8) as u8 ^ byte)]
    })
}

/// The hash slot of `key`, as Redis Cluster computes it: CRC16 of the key modulo 16384, or of
/// the first `{...}` hash tag when it is non-empty.
///
/// ```
/// use lock_testkit::cluster::key_slot;
/// assert_eq!(key_slot("foo"), 12182);
/// assert_eq!(key_slot("{user1000}.following"), key_slot("{user1000}.followers"));
/// assert_eq!(key_slot("{}.x"), lock_testkit::cluster::crc16(b"{}.x") % 16384);
/// ```
pub fn key_slot(key: impl AsRef<[u8]>) -> u16 {
    let key = key.as_ref();
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = key.get(open + 1..)?;
            let len = rest.iter().position(|&b| b == b'}')?;
            (len > 0).then(|| rest.get(..len)).flatten()
        })
        .unwrap_or(key);
    crc16(hashed) % SLOTS
}

/// A node's role at the moment it was asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A primary (`master`): serves its slots.
    Primary,
    /// A replica of a primary.
    Replica,
}

/// One node of a [`RedisCluster`]: its server process and its cluster node id.
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let cluster = lock_testkit::cluster::RedisCluster::start().await;
/// let node = cluster.node(0);
/// assert_eq!(node.url(), format!("redis://127.0.0.1:{}/", node.port()));
/// assert_eq!(node.id().len(), 40);
/// # }
/// ```
#[derive(Debug)]
pub struct ClusterNode {
    server: RedisServer,
    id: String,
}

impl ClusterNode {
    /// The client port.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::cluster::RedisCluster::start().await;
    /// assert_eq!(cluster.node(0).port(), cluster.node(0).server().port());
    /// # }
    /// ```
    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// `redis://127.0.0.1:<port>/`.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::cluster::RedisCluster::start().await;
    /// assert!(cluster.node(0).url().starts_with("redis://127.0.0.1:"));
    /// # }
    /// ```
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// The node id (`CLUSTER MYID`), kept across restarts (its `nodes.conf` stays).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::cluster::RedisCluster::start().await;
    /// let id: String = cluster.node(1).server().query(redis::cmd("CLUSTER").arg("MYID").clone()).await;
    /// assert_eq!(cluster.node(1).id(), id);
    /// # }
    /// ```
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The server process: its helpers (`get`, `set`, `query`...) talk to this node alone.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::cluster::RedisCluster::start().await;
    /// assert!(cluster.node(0).server().is_running());
    /// # }
    /// ```
    pub fn server(&self) -> &RedisServer {
        &self.server
    }

    /// The server process, to [`stop`](RedisServer::stop), [`restart`](RedisServer::restart)
    /// (it rejoins with its `nodes.conf`, empty), [`pause`](RedisServer::pause) or
    /// [`resume`](RedisServer::resume) it.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let mut cluster = lock_testkit::cluster::RedisCluster::start().await;
    /// cluster.node_mut(3).server_mut().pause();
    /// cluster.node_mut(3).server_mut().resume();
    /// # }
    /// ```
    pub fn server_mut(&mut self) -> &mut RedisServer {
        &mut self.server
    }

    /// The node's role now (`ROLE`).
    ///
    /// # Panics
    /// When the node does not answer.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use lock_testkit::cluster::{RedisCluster, Role};
    /// let cluster = RedisCluster::start().await;
    /// let p = cluster.primaries().await[0];
    /// assert_eq!(cluster.node(p).role().await, Role::Primary);
    /// # }
    /// ```
    pub async fn role(&self) -> Role {
        let role = role_of(&self.server)
            .await
            .unwrap_or_else(|e| panic!("ROLE failed on port {}: {e}", self.port()));
        if role == "master" {
            Role::Primary
        } else {
            Role::Replica
        }
    }

    fn is_live(&self) -> bool {
        self.server.is_running() && !self.server.is_paused()
    }
}

/// Options for starting a [`RedisCluster`]; from [`RedisCluster::builder`].
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use lock_testkit::cluster::RedisCluster;
/// let cluster = RedisCluster::builder().primaries(3).replicas_per_primary(0).start().await;
/// assert_eq!(cluster.nodes().len(), 3);
/// # }
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct RedisClusterBuilder {
    primaries: usize,
    replicas_per_primary: usize,
    node_timeout: Duration,
    /// Every node's options (TLS, when asked for).
    base: RedisServerBuilder,
}

impl Default for RedisClusterBuilder {
    fn default() -> Self {
        Self {
            primaries: 3,
            replicas_per_primary: 1,
            node_timeout: Duration::from_millis(1000),
            base: RedisServerBuilder::default(),
        }
    }
}

impl RedisClusterBuilder {
    /// How many primaries share the slots (default 3; `redis-cli` wants at least 3).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::cluster::RedisCluster::builder().primaries(4).start().await;
    /// assert_eq!(cluster.primaries().await.len(), 4);
    /// # }
    /// ```
    pub fn primaries(mut self, n: usize) -> Self {
        self.primaries = n;
        self
    }

    /// How many replicas each primary has (default 1; 0 allowed: no failover then).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::cluster::RedisCluster::builder().replicas_per_primary(2).start().await;
    /// assert_eq!(cluster.nodes().len(), 9);
    /// # }
    /// ```
    pub fn replicas_per_primary(mut self, n: usize) -> Self {
        self.replicas_per_primary = n;
        self
    }

    /// `--cluster-node-timeout` (default 1000 ms): how long a node may be unreachable before
    /// it is failed over. A failover takes about two to three times this.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// let cluster = lock_testkit::cluster::RedisCluster::builder()
    ///     .node_timeout(Duration::from_millis(2000))
    ///     .start()
    ///     .await;
    /// # drop(cluster);
    /// # }
    /// ```
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// Every node speaks TLS with the certificates of `certs`
    /// ([`RedisServerBuilder::tls`]): the cluster bus and replication go over TLS
    /// (`--tls-cluster yes`, `--tls-replication yes`), and `CLUSTER SLOTS` asked over TLS
    /// names the nodes' TLS ports (over the plain ports, which the kit's helpers keep, it
    /// names the plain ones). The code under test is given [`RedisCluster::tls_urls`].
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let certs = lock_testkit::TlsCerts::generate();
    /// let cluster = lock_testkit::cluster::RedisCluster::builder()
    ///     .replicas_per_primary(0)
    ///     .tls(&certs)
    ///     .start()
    ///     .await;
    /// assert!(cluster.tls_urls()[0].starts_with("rediss://"));
    /// # }
    /// ```
    pub fn tls(mut self, certs: &TlsCerts) -> Self {
        self.base = self
            .base
            .tls(certs)
            .args(["--tls-cluster", "yes", "--tls-replication", "yes"]);
        self
    }

    /// Starts the nodes, creates the cluster with `redis-cli --cluster create`, and waits until
    /// every node reports `cluster_state:ok` with all 16384 slots assigned, they all agree on
    /// who serves which slot, and every replica is in sync with its primary.
    ///
    /// # Panics
    /// With fewer than 3 primaries; when `redis-server` or `redis-cli` is missing (the message
    /// names the install command); when the creation fails (the message holds `redis-cli`'s
    /// output); when the cluster is not consistent within 30 s (the message says why).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::cluster::RedisCluster::builder().start().await;
    /// assert_eq!(cluster.urls().len(), 6);
    /// # }
    /// ```
    pub async fn start(self) -> RedisCluster {
        assert!(
            self.primaries >= 3,
            "a Redis Cluster needs at least 3 primaries (redis-cli refuses fewer); got {}",
            self.primaries
        );
        let total = self.primaries * (1 + self.replicas_per_primary);
        let timeout_ms = self.node_timeout.as_millis().to_string();
        let servers: Vec<RedisServer> = (0..total)
            .map(|_| {
                self.base
                    .clone()
                    .args(["--cluster-enabled", "yes"])
                    .args(["--cluster-config-file", "nodes.conf"])
                    .args(["--cluster-node-timeout", timeout_ms.as_str()])
                    // Its own bus port: the default, port + 10000, may be above 65535 or taken.
                    .args(["--cluster-port".to_owned(), free_port().to_string()])
                    .args(["--cluster-replica-validity-factor", "0"])
                    // The topology stays as the test made it.
                    .args(["--cluster-allow-replica-migration", "no"])
                    // Replicas sync at once (the default waits 5 s for more replicas).
                    .args(["--repl-diskless-sync-delay", "0"])
                    .start()
            })
            .collect();
        create_cluster(&servers, self.replicas_per_primary).await;
        let mut nodes = Vec::with_capacity(total);
        for server in servers {
            let id: String = server
                .query(redis::cmd("CLUSTER").arg("MYID").clone())
                .await;
            nodes.push(ClusterNode { server, id });
        }
        let cluster = RedisCluster { nodes };
        cluster
            .settle("the new cluster consistent", |_| Ok(()))
            .await;
        cluster
    }
}

/// A local Redis Cluster; every process is killed (and its directory removed) on drop.
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use redis::AsyncCommands;
/// let cluster = lock_testkit::cluster::RedisCluster::start().await;
/// let mut conn = cluster.client().await;
/// let () = conn.set("k", "v").await.unwrap();
/// let p = cluster.primary_for_key("k").await;
/// assert_eq!(cluster.node(p).server().get("k").await.as_deref(), Some("v"));
/// # }
/// ```
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<ClusterNode>,
}

/// A slot migration begun by [`RedisCluster::begin_slot_migration`] and not yet finished: the
/// source node has the slot `MIGRATING`, the target `IMPORTING`, so the keys already moved are
/// answered with `-ASK` redirects by the source.
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let cluster = lock_testkit::cluster::RedisCluster::start().await;
/// let [from, to, ..] = cluster.primaries().await[..] else { unreachable!() };
/// let m = cluster.begin_slot_migration(cluster.slots_of(from).await[0], from, to).await;
/// assert_eq!((m.from(), m.to()), (from, to));
/// cluster.finish_slot_migration(m).await;
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "finish it with RedisCluster::finish_slot_migration, or the slot stays half-moved"]
pub struct SlotMigration {
    slot: u16,
    from: usize,
    to: usize,
}

impl SlotMigration {
    /// The slot being moved.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::cluster::RedisCluster::start().await;
    /// let [from, to, ..] = cluster.primaries().await[..] else { unreachable!() };
    /// let slot = cluster.slots_of(from).await[0];
    /// let m = cluster.begin_slot_migration(slot, from, to).await;
    /// assert_eq!(m.slot(), slot);
    /// # cluster.finish_slot_migration(m).await;
    /// # }
    /// ```
    pub fn slot(&self) -> u16 {
        self.slot
    }

    /// The index of the source node (the slot's owner until the migration finishes).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::cluster::RedisCluster::start().await;
    /// let [from, to, ..] = cluster.primaries().await[..] else { unreachable!() };
    /// let m = cluster.begin_slot_migration(cluster.slots_of(from).await[0], from, to).await;
    /// assert_eq!(m.from(), from);
    /// # cluster.finish_slot_migration(m).await;
    /// # }
    /// ```
    pub fn from(&self) -> usize {
        self.from
    }

    /// The index of the target node.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::cluster::RedisCluster::start().await;
    /// let [from, to, ..] = cluster.primaries().await[..] else { unreachable!() };
    /// let m = cluster.begin_slot_migration(cluster.slots_of(from).await[0], from, to).await;
    /// assert_eq!(m.to(), to);
    /// # cluster.finish_slot_migration(m).await;
    /// # }
    /// ```
    pub fn to(&self) -> usize {
        self.to
    }
}

impl RedisCluster {
    /// Starts 3 primaries with 1 replica each. See [`RedisClusterBuilder::start`].
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::cluster::RedisCluster::start().await;
    /// assert_eq!(cluster.nodes().len(), 6);
    /// # }
    /// ```
    pub async fn start() -> Self {
        Self::builder().start().await
    }

    /// Options for starting a cluster.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::cluster::RedisCluster::builder().replicas_per_primary(0).start().await;
    /// assert_eq!(cluster.nodes().len(), 3);
    /// # }
    /// ```
    pub fn builder() -> RedisClusterBuilder {
        RedisClusterBuilder::default()
    }

    /// Every node's URL, `redis://127.0.0.1:<port>/`, in node order: the seed list for a
    /// cluster client.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::cluster::RedisCluster::start().await;
    /// let client = redis::cluster::ClusterClient::new(cluster.urls()).unwrap();
    /// # drop(client);
    /// # }
    /// ```
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(ClusterNode::url).collect()
    }

    /// Every node's `rediss://` URL, in node order, of a cluster started with
    /// [`RedisClusterBuilder::tls`].
    ///
    /// # Panics
    /// When the cluster was started without TLS.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let certs = lock_testkit::TlsCerts::generate();
    /// let cluster = lock_testkit::cluster::RedisCluster::builder().tls(&certs).start().await;
    /// assert_eq!(cluster.tls_urls().len(), 6);
    /// # }
    /// ```
    pub fn tls_urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.server.tls_url()).collect()
    }

    /// Every node, in a fixed order: a node's index names it in the other helpers.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::cluster::RedisCluster::start().await;
    /// assert!(cluster.nodes().iter().all(|n| n.server().is_running()));
    /// # }
    /// ```
    pub fn nodes(&self) -> &[ClusterNode] {
        &self.nodes
    }

    /// Node `index`.
    ///
    /// # Panics
    /// When there is no such node.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::cluster::RedisCluster::start().await;
    /// assert_eq!(cluster.node(2).port(), cluster.nodes()[2].port());
    /// # }
    /// ```
    pub fn node(&self, index: usize) -> &ClusterNode {
        self.nodes
            .get(index)
            .unwrap_or_else(|| panic!("no cluster node {index} (there are {})", self.nodes.len()))
    }

    /// Node `index`, to stop, restart, pause or resume its server.
    ///
    /// # Panics
    /// When there is no such node.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let mut cluster = lock_testkit::cluster::RedisCluster::start().await;
    /// cluster.node_mut(0).server_mut().pause();
    /// # cluster.node_mut(0).server_mut().resume();
    /// # }
    /// ```
    pub fn node_mut(&mut self, index: usize) -> &mut ClusterNode {
        let len = self.nodes.len();
        self.nodes
            .get_mut(index)
            .unwrap_or_else(|| panic!("no cluster node {index} (there are {len})"))
    }

    /// Kills node `index` with SIGKILL (a crash). Of a primary, follow with
    /// [`wait_for_failover`](Self::wait_for_failover).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let mut cluster = lock_testkit::cluster::RedisCluster::start().await;
    /// let p = cluster.primary_for_key("k").await;
    /// cluster.kill_node(p);
    /// assert!(!cluster.node(p).server().is_running());
    /// # }
    /// ```
    pub fn kill_node(&mut self, index: usize) {
        self.node_mut(index).server.stop();
    }

    /// A cluster connection (redis-rs `cluster-async`) seeded with every node; commands time
    /// out after 5 s.
    ///
    /// # Panics
    /// When no node can be reached.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::cluster::RedisCluster::start().await;
    /// let mut conn = cluster.client().await;
    /// let v: Option<String> = redis::cmd("GET").arg("k").query_async(&mut conn).await.unwrap();
    /// assert_eq!(v, None);
    /// # }
    /// ```
    pub async fn client(&self) -> ClusterConnection {
        let client = ClusterClientBuilder::new(self.urls())
            .connection_timeout(CLIENT_TIMEOUT)
            .response_timeout(CLIENT_TIMEOUT)
            .build()
            .unwrap_or_else(|e| panic!("cannot build a cluster client: {e}"));
        client
            .get_async_connection()
            .await
            .unwrap_or_else(|e| panic!("cannot connect to the cluster {:?}: {e}", self.urls()))
    }

    /// The nodes that serve slots now, ordered by their first slot.
    ///
    /// # Panics
    /// When no node answers.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::cluster::RedisCluster::start().await;
    /// assert_eq!(cluster.primaries().await.len(), 3);
    /// # }
    /// ```
    pub async fn primaries(&self) -> Vec<usize> {
        let view = self.view().await;
        let mut firsts: BTreeMap<u16, usize> = BTreeMap::new();
        for line in view.iter().filter(|l| l.is_primary()) {
            if let (Some(first), Some(index)) = (line.slots.first(), self.index_of(&line.id)) {
                firsts.insert(first.0, index);
            }
        }
        firsts.into_values().collect()
    }

    /// The replicas of primary `primary` in the cluster's view now.
    ///
    /// # Panics
    /// When no node answers.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::cluster::RedisCluster::start().await;
    /// let p = cluster.primaries().await[0];
    /// assert_eq!(cluster.replicas_of(p).await.len(), 1);
    /// # }
    /// ```
    pub async fn replicas_of(&self, primary: usize) -> Vec<usize> {
        let id = self.node(primary).id.clone();
        let view = self.view().await;
        view.iter()
            .filter(|l| l.master_id.as_deref() == Some(id.as_str()))
            .filter_map(|l| self.index_of(&l.id))
            .collect()
    }

    /// The slots primary `primary` serves now, ascending.
    ///
    /// # Panics
    /// When no node answers.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::cluster::RedisCluster::start().await;
    /// let p = cluster.primary_for_slot(0).await;
    /// assert_eq!(cluster.slots_of(p).await[0], 0);
    /// # }
    /// ```
    pub async fn slots_of(&self, primary: usize) -> Vec<u16> {
        let id = &self.node(primary).id;
        let view = self.view().await;
        view.iter()
            .filter(|l| &l.id == id)
            .flat_map(|l| l.slots.iter().flat_map(|&(a, b)| a..=b))
            .collect()
    }

    /// The index of the primary that serves `slot` now, in the view of the first live node.
    ///
    /// # Panics
    /// When `slot` is not below 16384, when no node answers, or when no node serves it.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::cluster::RedisCluster::start().await;
    /// let p = cluster.primary_for_slot(16383).await;
    /// assert!(cluster.slots_of(p).await.contains(&16383));
    /// # }
    /// ```
    pub async fn primary_for_slot(&self, slot: u16) -> usize {
        assert!(slot < SLOTS, "slot {slot} is not below {SLOTS}");
        let view = self.view().await;
        let owner = view
            .iter()
            .filter(|l| l.is_primary())
            .find(|l| l.slots.iter().any(|&(a, b)| (a..=b).contains(&slot)))
            .unwrap_or_else(|| panic!("no node serves slot {slot}; the view: {view:?}"));
        self.index_of(&owner.id)
            .unwrap_or_else(|| panic!("slot {slot} is served by an unknown node {}", owner.id))
    }

    /// The index of the primary that serves `key` now ([`key_slot`], hash tags included).
    ///
    /// # Panics
    /// As [`primary_for_slot`](Self::primary_for_slot).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::cluster::RedisCluster::start().await;
    /// let p = cluster.primary_for_key("{user1000}.following").await;
    /// assert_eq!(p, cluster.primary_for_key("{user1000}.followers").await);
    /// # }
    /// ```
    pub async fn primary_for_key(&self, key: &str) -> usize {
        self.primary_for_slot(key_slot(key)).await
    }

    /// Waits until the cluster is whole again: every live node (running, not paused) reports
    /// `cluster_state:ok` with all 16384 slots assigned and ok, every slot is served by a live
    /// primary, all live nodes agree on who serves which slot, and every live replica is in
    /// sync with its primary (`master_link_status:up`).
    ///
    /// A killed or paused primary is not live, so after one this waits for its failover too
    /// ([`wait_for_failover`](Self::wait_for_failover) also says which replica took over);
    /// with no replica to take over, it panics.
    ///
    /// # Panics
    /// When that is not so within 30 s (the message says what was still wrong).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let mut cluster = lock_testkit::cluster::RedisCluster::start().await;
    /// let replica = cluster.replicas_of(cluster.primaries().await[0]).await[0];
    /// cluster.kill_node(replica);
    /// cluster.node_mut(replica).server_mut().restart(); // rejoins, empty, and resyncs
    /// cluster.wait_until_ok().await;
    /// # }
    /// ```
    pub async fn wait_until_ok(&self) {
        self.settle("the cluster consistent", |_| Ok(())).await;
    }

    /// After primary `old_primary` was killed (or paused): waits until one of its replicas
    /// serves its slots and the cluster is whole ([`wait_until_ok`](Self::wait_until_ok));
    /// returns the promoted node's index. A failover takes a few seconds (about three times
    /// the node timeout).
    ///
    /// # Panics
    /// When `old_primary` is still live or serves no slot in the cluster's view (call this
    /// right after the kill), or when no replica took over within 30 s.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let mut cluster = lock_testkit::cluster::RedisCluster::start().await;
    /// let old = cluster.primary_for_key("k").await;
    /// let replica = cluster.replicas_of(old).await[0];
    /// cluster.kill_node(old);
    /// assert_eq!(cluster.wait_for_failover(old).await, replica);
    /// assert_eq!(cluster.primary_for_key("k").await, replica);
    /// # }
    /// ```
    pub async fn wait_for_failover(&self, old_primary: usize) -> usize {
        let node = self.node(old_primary);
        assert!(
            !node.is_live(),
            "wait_for_failover: node {old_primary} (port {}) is still running: kill or pause it first",
            node.port()
        );
        let slots = self.slots_of(old_primary).await;
        let Some(&slot) = slots.first() else {
            panic!(
                "wait_for_failover: node {old_primary} (port {}) serves no slot in the cluster's \
                 view: it was not a primary, or its failover is already over (then use wait_until_ok)",
                node.port()
            );
        };
        self.settle(
            &format!("a replica of node {old_primary} serving its slots"),
            |_| Ok(()),
        )
        .await;
        self.primary_for_slot(slot).await
    }

    /// A manual failover (`CLUSTER FAILOVER`) run on replica `replica`: it and its primary
    /// swap roles without losing writes. Waits until the replica reports `role:master` and
    /// the cluster is whole ([`wait_until_ok`](Self::wait_until_ok)).
    ///
    /// # Panics
    /// When `replica` is not a replica, refuses, or is not promoted within 30 s.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use lock_testkit::cluster::Role;
    /// let cluster = lock_testkit::cluster::RedisCluster::start().await;
    /// let old = cluster.primary_for_slot(0).await;
    /// let replica = cluster.replicas_of(old).await[0];
    /// cluster.failover(replica).await;
    /// assert_eq!(cluster.primary_for_slot(0).await, replica);
    /// assert_eq!(cluster.node(old).role().await, Role::Replica);
    /// # }
    /// ```
    pub async fn failover(&self, replica: usize) {
        let node = self.node(replica);
        let () = node
            .server
            .query(redis::cmd("CLUSTER").arg("FAILOVER").clone())
            .await;
        eventually_ok(
            &format!("node {replica} (port {}) promoted", node.port()),
            SETTLE_BOUND,
            async || match role_of(&node.server).await {
                Ok(role) if role == "master" => Ok(()),
                Ok(role) => Err(format!("ROLE says {role}")),
                Err(e) => Err(e),
            },
        )
        .await;
        let id = node.id.clone();
        self.settle(
            &format!("node {replica} serving its former primary's slots"),
            |views| {
                let mine = views
                    .iter()
                    .any(|(_, view)| view.iter().any(|l| l.id == id && !l.slots.is_empty()));
                if mine {
                    Ok(())
                } else {
                    Err(format!("node {replica} serves no slot yet"))
                }
            },
        )
        .await;
    }

    /// Begins moving `slot` from primary `from` to primary `to` and stops there:
    /// `CLUSTER SETSLOT <slot> IMPORTING` on `to`, `MIGRATING` on `from`, no key moved yet.
    /// Now `from` still serves the keys it has and answers `-ASK` for the others (move some
    /// with [`migrate_keys`](Self::migrate_keys)); `to` serves them after `ASKING`. Finish
    /// with [`finish_slot_migration`](Self::finish_slot_migration).
    ///
    /// # Panics
    /// When `from` does not serve `slot`, `to` is `from` or not a primary, or a command fails.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use lock_testkit::cluster::{RedisCluster, key_slot};
    /// let cluster = RedisCluster::start().await;
    /// let from = cluster.primary_for_key("a").await;
    /// let to = cluster.primaries().await.into_iter().find(|&p| p != from).unwrap();
    /// cluster.node(from).server().set("a", "1").await;
    /// let m = cluster.begin_slot_migration(key_slot("a"), from, to).await;
    /// cluster.migrate_keys(&m, &["a"]).await;
    /// // Asked directly, the source now redirects: -ASK <slot> 127.0.0.1:<to's port>.
    /// let err = cluster.node(from).server().try_query::<Option<String>>(redis::cmd("GET").arg("a").clone()).await.unwrap_err();
    /// assert!(err.to_string().to_uppercase().contains("ASK"));
    /// cluster.finish_slot_migration(m).await;
    /// # }
    /// ```
    pub async fn begin_slot_migration(&self, slot: u16, from: usize, to: usize) -> SlotMigration {
        assert!(
            from != to,
            "a slot migration needs two nodes; got {from} twice"
        );
        let owner = self.primary_for_slot(slot).await;
        assert_eq!(
            owner, from,
            "slot {slot} is served by node {owner}, not by node {from}"
        );
        assert!(
            self.primaries().await.contains(&to),
            "node {to} serves no slot: the target of a migration must be a primary"
        );
        let (source, target) = (self.node(from), self.node(to));
        let () = target
            .server
            .query(setslot(slot, "IMPORTING", &source.id))
            .await;
        let () = source
            .server
            .query(setslot(slot, "MIGRATING", &target.id))
            .await;
        SlotMigration { slot, from, to }
    }

    /// Moves `keys` (all of `migration`'s slot) from the source to the target with `MIGRATE`;
    /// missing keys are skipped.
    ///
    /// # Panics
    /// When a key is not in the slot or `MIGRATE` fails.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use lock_testkit::cluster::{RedisCluster, key_slot};
    /// let cluster = RedisCluster::start().await;
    /// let from = cluster.primary_for_key("{t}a").await;
    /// let to = cluster.primaries().await.into_iter().find(|&p| p != from).unwrap();
    /// cluster.node(from).server().set("{t}a", "1").await;
    /// cluster.node(from).server().set("{t}b", "2").await;
    /// let m = cluster.begin_slot_migration(key_slot("t"), from, to).await;
    /// cluster.migrate_keys(&m, &["{t}a"]).await; // half way: {t}b is still on the source
    /// assert_eq!(cluster.node(from).server().get("{t}b").await.as_deref(), Some("2"));
    /// cluster.finish_slot_migration(m).await;
    /// # }
    /// ```
    pub async fn migrate_keys(&self, migration: &SlotMigration, keys: &[&str]) {
        for key in keys {
            assert_eq!(
                key_slot(key),
                migration.slot,
                "key {key:?} is in slot {}, not in the migrating slot {}",
                key_slot(key),
                migration.slot
            );
        }
        let owned: Vec<String> = keys.iter().map(|&k| k.to_owned()).collect();
        self.migrate(migration, &owned).await;
    }

    /// Finishes a migration: moves the keys still on the source (`CLUSTER GETKEYSINSLOT` and
    /// `MIGRATE`), then `CLUSTER SETSLOT <slot> NODE <target>` on the target, the source and
    /// every other live primary, and waits until every live node agrees the target serves
    /// the slot and the cluster is whole.
    ///
    /// # Panics
    /// When a command fails or the cluster does not agree within 30 s.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::cluster::RedisCluster::start().await;
    /// let [from, to, ..] = cluster.primaries().await[..] else { unreachable!() };
    /// let slot = cluster.slots_of(from).await[0];
    /// let m = cluster.begin_slot_migration(slot, from, to).await;
    /// cluster.finish_slot_migration(m).await;
    /// assert_eq!(cluster.primary_for_slot(slot).await, to);
    /// # }
    /// ```
    pub async fn finish_slot_migration(&self, migration: SlotMigration) {
        let SlotMigration { slot, from, to } = migration;
        let source = self.node(from);
        loop {
            let keys: Vec<String> = source
                .server
                .query(
                    redis::cmd("CLUSTER")
                        .arg("GETKEYSINSLOT")
                        .arg(slot)
                        .arg(100)
                        .clone(),
                )
                .await;
            if keys.is_empty() {
                break;
            }
            self.migrate(&migration, &keys).await;
        }
        let target_id = self.node(to).id.clone();
        let others: Vec<usize> = self
            .primaries()
            .await
            .into_iter()
            .filter(|&p| p != from && p != to && self.node(p).is_live())
            .collect();
        for index in [to, from].into_iter().chain(others) {
            let () = self
                .node(index)
                .server
                .query(setslot(slot, "NODE", &target_id))
                .await;
        }
        self.settle(
            &format!("slot {slot} served by node {to} in every view"),
            |views| {
                for (index, view) in views {
                    let owner = view
                        .iter()
                        .filter(|l| l.is_primary())
                        .find(|l| l.slots.iter().any(|&(a, b)| (a..=b).contains(&slot)));
                    if owner.map(|l| l.id.as_str()) != Some(target_id.as_str()) {
                        return Err(format!("node {index} sees slot {slot} elsewhere"));
                    }
                }
                Ok(())
            },
        )
        .await;
    }

    /// Moves `slot` with its keys from primary `from` to primary `to`, all the way:
    /// [`begin_slot_migration`](Self::begin_slot_migration) then
    /// [`finish_slot_migration`](Self::finish_slot_migration).
    ///
    /// # Panics
    /// As those two.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use lock_testkit::cluster::{RedisCluster, key_slot};
    /// let cluster = RedisCluster::start().await;
    /// let from = cluster.primary_for_key("k").await;
    /// let to = cluster.primaries().await.into_iter().find(|&p| p != from).unwrap();
    /// cluster.node(from).server().set("k", "v").await;
    /// cluster.migrate_slot(key_slot("k"), from, to).await;
    /// assert_eq!(cluster.node(to).server().get("k").await.as_deref(), Some("v"));
    /// # }
    /// ```
    pub async fn migrate_slot(&self, slot: u16, from: usize, to: usize) {
        let migration = self.begin_slot_migration(slot, from, to).await;
        self.finish_slot_migration(migration).await;
    }

    async fn migrate(&self, migration: &SlotMigration, keys: &[String]) {
        if keys.is_empty() {
            return;
        }
        let (source, target) = (self.node(migration.from), self.node(migration.to));
        let mut cmd = redis::cmd("MIGRATE");
        cmd.arg("127.0.0.1")
            .arg(target.port())
            .arg("")
            .arg(0)
            .arg(CLIENT_TIMEOUT.as_millis().to_string())
            .arg("REPLACE")
            .arg("KEYS")
            .arg(keys);
        // "OK", or "NOKEY" when none of the keys exists.
        let _: redis::Value = source.server.query(cmd).await;
    }

    fn index_of(&self, id: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.id == id)
    }

    /// `CLUSTER NODES` of the first live node that answers.
    async fn view(&self) -> Vec<NodeLine> {
        let mut errors = Vec::new();
        for node in self.nodes.iter().filter(|n| n.is_live()) {
            match cluster_nodes(&node.server).await {
                Ok(view) => return view,
                Err(e) => errors.push(format!("port {}: {e}", node.port())),
            }
        }
        panic!("no cluster node answers CLUSTER NODES: {errors:?}");
    }

    /// Waits (30 s) until the cluster is whole (see [`wait_until_ok`](Self::wait_until_ok))
    /// and `extra` accepts the live nodes' views.
    async fn settle(
        &self,
        what: &str,
        extra: impl Fn(&[(usize, Vec<NodeLine>)]) -> Result<(), String>,
    ) {
        eventually_ok(what, SETTLE_BOUND, async || {
            let views = self.check_whole().await?;
            extra(&views)
        })
        .await;
    }

    /// `Ok` with every live node's view when the cluster is whole, else why not.
    async fn check_whole(&self) -> Result<Vec<(usize, Vec<NodeLine>)>, String> {
        let total = self.nodes.len().to_string();
        let mut views = Vec::new();
        let mut first_map: Option<(usize, Seen)> = None;
        for (index, node) in self.nodes.iter().enumerate().filter(|(_, n)| n.is_live()) {
            let port = node.port();
            let info: String = node
                .server
                .try_query(redis::cmd("CLUSTER").arg("INFO").clone())
                .await
                .map_err(|e| format!("node {index} (port {port}): CLUSTER INFO: {e}"))?;
            for (field, want) in [
                ("cluster_state", "ok"),
                ("cluster_slots_assigned", "16384"),
                ("cluster_slots_ok", "16384"),
                ("cluster_known_nodes", total.as_str()),
            ] {
                let got = info_field(&info, field);
                if got != Some(want) {
                    return Err(format!(
                        "node {index} (port {port}) says {field}:{}, not {want}",
                        got.unwrap_or("?")
                    ));
                }
            }
            let view = cluster_nodes(&node.server)
                .await
                .map_err(|e| format!("node {index} (port {port}): CLUSTER NODES: {e}"))?;
            let map = slot_map(&view);
            let covered: u32 = map.iter().map(|(a, b, _)| u32::from(b - a) + 1).sum();
            if covered != u32::from(SLOTS) {
                return Err(format!(
                    "node {index} (port {port}) sees {covered} slots served"
                ));
            }
            for (_, _, owner) in &map {
                match self.index_of(owner) {
                    Some(o) if self.node(o).is_live() => {}
                    Some(o) => {
                        return Err(format!(
                            "node {index} (port {port}) sees slots served by node {o}, which is down"
                        ));
                    }
                    None => return Err(format!("node {index} sees an unknown primary {owner}")),
                }
            }
            // Who replicates whom, among the live nodes; none of them marked failed.
            let mut roles = Vec::new();
            for line in &view {
                let Some(i) = self.index_of(&line.id) else {
                    return Err(format!("node {index} sees an unknown node {}", line.id));
                };
                if !self.node(i).is_live() {
                    continue;
                }
                if line.flags.iter().any(|f| f == "fail") {
                    return Err(format!(
                        "node {index} (port {port}) sees node {i} as failed"
                    ));
                }
                let primary = line.flags.iter().any(|f| f == "master");
                roles.push((i, primary, line.master_id.clone()));
            }
            roles.sort();
            let seen = (map, roles);
            match &first_map {
                None => first_map = Some((index, seen)),
                Some((first, expected)) if *expected != seen => {
                    return Err(format!(
                        "node {index} (port {port}) and node {first} disagree on who serves which \
                         slot or who replicates whom"
                    ));
                }
                Some(_) => {}
            }
            let me = view.iter().find(|l| l.flags.iter().any(|f| f == "myself"));
            if me.is_some_and(|l| !l.is_primary()) {
                let replication = node
                    .server
                    .try_query::<String>(redis::cmd("INFO").arg("replication").clone())
                    .await
                    .map_err(|e| format!("node {index} (port {port}): INFO: {e}"))?;
                let link = info_field(&replication, "master_link_status");
                if link != Some("up") {
                    return Err(format!(
                        "replica {index} (port {port}) has master_link_status:{}",
                        link.unwrap_or("?")
                    ));
                }
            }
            views.push((index, view));
        }
        if views.is_empty() {
            return Err("no node is running".to_owned());
        }
        Ok(views)
    }
}

/// What a node sees: who serves which slots, and each live node's (index, is primary, primary id).
type Seen = (Vec<(u16, u16, String)>, Vec<(usize, bool, Option<String>)>);

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone)]
struct NodeLine {
    id: String,
    flags: Vec<String>,
    master_id: Option<String>,
    /// Served slot ranges, inclusive (importing/migrating entries left out).
    slots: Vec<(u16, u16)>,
}

impl NodeLine {
    /// A primary not marked failed (a `fail?`, suspected, one still counts).
    fn is_primary(&self) -> bool {
        self.flags.iter().any(|f| f == "master") && !self.flags.iter().any(|f| f == "fail")
    }

    fn parse(line: &str) -> Option<Self> {
        let mut words = line.split_whitespace();
        let id = words.next()?.to_owned();
        let _addr = words.next()?;
        let flags = words.next()?.split(',').map(str::to_owned).collect();
        let master = words.next()?;
        let master_id = (master != "-").then(|| master.to_owned());
        // ping-sent, pong-recv, config-epoch, link-state.
        let mut words = words.skip(4);
        let mut slots = Vec::new();
        for word in words.by_ref() {
            if word.starts_with('[') {
                continue;
            }
            let range = match word.split_once('-') {
                Some((a, b)) => (a.parse().ok()?, b.parse().ok()?),
                None => {
                    let s = word.parse().ok()?;
                    (s, s)
                }
            };
            slots.push(range);
        }
        Some(NodeLine {
            id,
            flags,
            master_id,
            slots,
        })
    }
}

/// Who serves which slot range, sorted: `(first, last, node id)`.
fn slot_map(view: &[NodeLine]) -> Vec<(u16, u16, String)> {
    let mut map: Vec<(u16, u16, String)> = view
        .iter()
        .filter(|l| l.is_primary())
        .flat_map(|l| l.slots.iter().map(|&(a, b)| (a, b, l.id.clone())))
        .collect();
    map.sort();
    map
}

async fn cluster_nodes(server: &RedisServer) -> Result<Vec<NodeLine>, String> {
    let text: String = server
        .try_query(redis::cmd("CLUSTER").arg("NODES").clone())
        .await
        .map_err(|e| e.to_string())?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| NodeLine::parse(l).ok_or_else(|| format!("cannot parse CLUSTER NODES line {l:?}")))
        .collect()
}

/// The first element of `ROLE`: `master`, `slave` (or `sentinel`).
pub(crate) async fn role_of(server: &RedisServer) -> Result<String, String> {
    let reply: Vec<redis::Value> = server
        .try_query(redis::cmd("ROLE"))
        .await
        .map_err(|e| e.to_string())?;
    match reply.first() {
        Some(value) => redis::from_redis_value_ref(value).map_err(|e| e.to_string()),
        None => Err("ROLE answered nothing".to_owned()),
    }
}

/// The value of `field` in an `INFO`-style text (`field:value` lines).
pub(crate) fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        line.strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(str::trim)
    })
}

fn setslot(slot: u16, state: &str, node_id: &str) -> redis::Cmd {
    redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg(state)
        .arg(node_id)
        .clone()
}

/// `redis-cli`: beside the `redis-server` binary in use, else on `PATH`.
fn find_redis_cli() -> PathBuf {
    let beside = find_redis_server()
        .ok()
        .and_then(|server| server.parent().map(|dir| dir.join("redis-cli")));
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join("redis-cli"));
    beside
        .into_iter()
        .chain(on_path)
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!(
                "redis-cli is not beside redis-server nor on PATH: creating a Redis Cluster needs \
                 it. Install it with `{INSTALL_COMMAND}` (Debian's redis-tools comes with it)."
            )
        })
}

/// `redis-cli --cluster create` over `servers`.
async fn create_cluster(servers: &[RedisServer], replicas: usize) {
    let cli = find_redis_cli();
    let mut cmd = tokio::process::Command::new(&cli);
    cmd.arg("--cluster").arg("create");
    for server in servers {
        cmd.arg(format!("127.0.0.1:{}", server.port()));
    }
    cmd.arg("--cluster-replicas")
        .arg(replicas.to_string())
        .arg("--cluster-yes")
        .stdin(std::process::Stdio::null());
    let output = cmd
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", cli.display()));
    if !output.status.success() {
        panic!(
            "`redis-cli --cluster create` failed ({}):\n{}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_matches_known_values() {
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(crc16(b""), 0);
        assert_eq!(crc16(b"A"), 0x58E5);
    }

    #[test]
    fn key_slots_follow_redis() {
        assert_eq!(key_slot("foo"), 12182);
        assert_eq!(key_slot("bar"), 5061);
        assert_eq!(key_slot("123456789"), 0x31C3 % SLOTS);
        assert_eq!(
            key_slot("{user1000}.following"),
            key_slot("{user1000}.followers")
        );
        assert_eq!(key_slot("{user1000}.following"), key_slot("user1000"));
        // An empty tag hashes the whole key; only the first tag counts.
        assert_eq!(key_slot("foo{}{bar}"), crc16(b"foo{}{bar}") % SLOTS);
        assert_eq!(key_slot("foo{{bar}}zap"), key_slot("{bar"));
        assert_eq!(key_slot("foo{bar}{zap}"), key_slot("bar"));
        assert_eq!(key_slot("{unclosed"), crc16(b"{unclosed") % SLOTS);
    }

    #[test]
    fn parses_cluster_nodes_lines() {
        let line = NodeLine::parse(
            "07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@31004 slave \
             e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected",
        )
        .unwrap();
        assert!(!line.is_primary());
        assert_eq!(
            line.master_id.as_deref(),
            Some("e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca")
        );
        let line = NodeLine::parse(
            "67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.1:30002@31002 myself,master - 0 \
             1426238316232 2 connected 5461-10922 11000 [5460->-abc] [93-<-def]",
        )
        .unwrap();
        assert!(line.is_primary());
        assert_eq!(line.slots, vec![(5461, 10922), (11000, 11000)]);
        let failed = NodeLine::parse("abc :0@0 master,fail - 0 0 1 disconnected").unwrap();
        assert!(!failed.is_primary());
    }

    #[test]
    fn reads_info_fields() {
        let info = "# Cluster\r\ncluster_state:ok\r\ncluster_slots_assigned:16384\r\n";
        assert_eq!(info_field(info, "cluster_state"), Some("ok"));
        assert_eq!(info_field(info, "cluster_slots"), None);
    }
}
