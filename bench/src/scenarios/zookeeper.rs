//! ZooKeeper: our lock on one standalone server the bench starts (the test kit's
//! `ZooKeeperEnsemble::start_single`), against ZooKeeper's own floors measured in the same run
//! by sessions of the `zookeeper-client` crate lock-core uses, as the etcd section does:
//! - uncontended lock + release against an `exists` read (`check_stat`; a `set_data`, one
//!   write through the server's commit pipeline, as context), in interleaved rounds;
//! - a contended handoff between two `Locker`s (the holder's release call → the waiter's lock
//!   returned) against the floor of a watch event (a `set_data` by one session → another
//!   session's one-shot watch has fired), in interleaved chunks;
//! - the watchdog's traffic for 1,000 locks held on one `Locker`: the server's own
//!   `zk_packets_received` (four-letter `mntr`) before and after the window, and the bytes on
//!   the wire, counted by a test-kit proxy the `Locker` talks through.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use lock_core::{Locker, ZooKeeperBackend};
use lock_testkit::proxy::Proxy;
use lock_testkit::zookeeper::{ZooKeeperEnsemble, find_classpath, find_java};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use zookeeper_client::{Acls, Client, CreateMode};

use super::consensus::{handoff_chunks, held_window, interleaved_rounds};
use super::{Plan, random_between};
use crate::Result;
use crate::stats::Latencies;

/// The session timeout every session of the section asks for.
const SESSION: Duration = Duration::from_secs(10);
/// The lease of the latency scenarios: at most three quarters of the session timeout.
const LEASE: Duration = Duration::from_secs(7);
const WAIT: Duration = Duration::from_secs(15);
/// Keys cycled through by the uncontended loop.
const KEYS: usize = 16;
/// The lock of the handoff scenario (its node name needs no escaping).
const HANDOFF_KEY: &str = "zk-handoff";
/// The nodes the floors read, write and watch.
const READ_NODE: &str = "/bench-read";
const WRITE_NODE: &str = "/bench-write";
const FLOOR_NODE: &str = "/bench-watch-floor";

/// Everything the ZooKeeper section measured.
#[derive(Debug, Clone, Default)]
pub(crate) struct ZooKeeper {
    /// `zk_version` from `mntr`.
    pub(crate) version: String,
    /// An `exists` of one node (the floor).
    pub(crate) exists: Latencies,
    /// A `set_data` of one node (context: one write).
    pub(crate) write: Latencies,
    /// Uncontended lock + release.
    pub(crate) cycle: Latencies,
    /// `LockerStats::backend_calls` per uncontended cycle.
    pub(crate) cycle_calls: f64,
    /// The holder's release call → the waiter on another `Locker` has the lock.
    pub(crate) handoff: Latencies,
    /// The waiter's `LockerStats::backend_calls` per handoff.
    pub(crate) handoff_calls: f64,
    /// A `set_data` call → another session's one-shot watch has fired (the floor).
    pub(crate) watch_event: Latencies,
    pub(crate) watchdog: ZkWatchdog,
}

/// The watchdog's traffic while `locks` locks are held on one `Locker`.
#[derive(Debug, Clone, Default)]
pub(crate) struct ZkWatchdog {
    pub(crate) locks: usize,
    pub(crate) lease: Duration,
    pub(crate) window: Duration,
    /// Renewal calls the `Locker` made in the window (`LockerStats::renewal_calls`).
    pub(crate) renewal_calls: u64,
    /// Packets the server received in the window (`zk_packets_received`): requests and pings
    /// of every session (only the `Locker`'s is open then).
    pub(crate) packets: u64,
    /// TCP bytes between the `Locker` and the server in the window: `(to it, from it)`.
    pub(crate) wire: (u64, u64),
}

impl ZkWatchdog {
    /// The watchdog's period: a third of the lease.
    pub(crate) fn tick(&self) -> Duration {
        self.lease / 3
    }

    /// How many ticks the window holds.
    pub(crate) fn ticks(&self) -> f64 {
        self.window.as_secs_f64() / self.tick().as_secs_f64()
    }
}

/// A session of the crate lock-core uses, asking for the section's session timeout.
async fn raw_client(hosts: &str) -> Result<Client> {
    let connect = Client::connector()
        .with_session_timeout(SESSION)
        .connect(hosts);
    let client = tokio::time::timeout(Duration::from_secs(10), connect).await;
    Ok(client.map_err(|_| "ZooKeeper: no session within 10 s")??)
}

async fn locker(hosts: &str, lease: Duration) -> Result<Locker> {
    let backend = ZooKeeperBackend::builder(hosts)
        .session_timeout(SESSION)
        .connect()
        .await?;
    Ok(Locker::builder(backend).lease(lease).build())
}

/// Runs the ZooKeeper section on one standalone server the bench starts.
pub(crate) async fn zookeeper(plan: &Plan) -> Result<ZooKeeper> {
    // The kit panics when Java or ZooKeeper's jars are missing; a CLI says so instead.
    find_java()?;
    find_classpath()?;
    let server = ZooKeeperEnsemble::start_single().await;
    let (hosts, addr) = (server.connect_string(), server.client_addr(0));
    let version = mntr(addr).await?.remove("zk_version").unwrap_or_default();
    crate::progress(&format!("  ZooKeeper {version} at {hosts}"));
    let mut figures = uncontended(plan, &hosts).await?;
    handoff(plan, &hosts, &mut figures).await?;
    figures.watchdog = watchdog(plan, addr).await?;
    figures.version = version;
    Ok(figures)
}

/// exists, set_data and lock + release, in `plan.rounds` interleaved rounds after a warm-up.
async fn uncontended(plan: &Plan, hosts: &str) -> Result<ZooKeeper> {
    crate::progress("  uncontended lock + release against exists and set_data");
    let raw = raw_client(hosts).await?;
    let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
    for node in [READ_NODE, WRITE_NODE] {
        raw.create(node, b"x", &persistent).await?;
    }
    let locker = locker(hosts, LEASE).await?;
    let keys: Vec<String> = (0..KEYS).map(|i| format!("uc:{i}")).collect();
    let read = async || Ok(raw.check_stat(READ_NODE).await?);
    let write = async || Ok(raw.set_data(WRITE_NODE, b"x", None).await?);
    let n = plan.zk_latency_n;
    let ([exists, write, cycle], cycle_calls) =
        interleaved_rounds(plan, n, &locker, &keys, read, write).await?;
    Ok(ZooKeeper {
        exists,
        write,
        cycle,
        cycle_calls,
        ..ZooKeeper::default()
    })
}

/// The handoff between two lockers and the watch-event floor, in `CHUNKS` interleaved chunks.
async fn handoff(plan: &Plan, hosts: &str, figures: &mut ZooKeeper) -> Result<()> {
    crate::progress("  handoff between two lockers against a watch event");
    let (a, b) = (locker(hosts, LEASE).await?, locker(hosts, LEASE).await?);
    // The observer of the handoff's queue, and the floor's writer and watcher: one session
    // each, as the waiter's locker has its own.
    let observer = raw_client(hosts).await?;
    let (writer, watcher) = (raw_client(hosts).await?, raw_client(hosts).await?);
    let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
    writer.create(FLOOR_NODE, b"x", &persistent).await?;
    // The lock's container node: the backend's default root, then the key's store name
    // (prefix and hash tag; none of its characters is escaped).
    let queue = format!("/lock-core/{}{{{HANDOFF_KEY}}}", lock_core::DEFAULT_PREFIX);
    let handoff = async || handoff_once(plan, &a, &b, &observer, &queue).await;
    let event = async || {
        let (_, watch) = watcher.check_and_watch_stat(FLOOR_NODE).await?;
        let fired = tokio::spawn(async move {
            watch.changed().await;
            Instant::now()
        });
        tokio::time::sleep(random_between(plan.hold.0, plan.hold.1)).await;
        let t = Instant::now();
        writer.set_data(FLOOR_NODE, b"x", None).await?;
        let heard = tokio::time::timeout(WAIT, fired)
            .await
            .map_err(|_| "ZooKeeper: the floor's watch did not fire within 15 s")??;
        Ok(heard.saturating_duration_since(t))
    };
    let n = plan.zk_handoff_n;
    let (handoffs, events, calls) = handoff_chunks(plan, n, &b, handoff, event).await?;
    (figures.handoff, figures.watch_event) = (handoffs, events);
    figures.handoff_calls = calls;
    Ok(())
}

/// One handoff: A holds the lock, B starts waiting on it; once B's contender node is in the
/// lock's container (seen by a children watch) and a random hold has passed, A releases. The
/// sample is A's release call → B's lock returned.
async fn handoff_once(
    plan: &Plan,
    a: &Locker,
    b: &Locker,
    observer: &Client,
    queue: &str,
) -> Result<Duration> {
    let held = a.lock(HANDOFF_KEY).await?;
    let waiter = b.clone();
    let waiting = tokio::spawn(async move {
        let guard = waiter.lock(HANDOFF_KEY).wait(WAIT).await;
        (Instant::now(), guard)
    });
    // A's node is in the container while A holds, so it exists; wait for B's beside it.
    loop {
        let (children, _, watch) = observer.get_and_watch_children(queue).await?;
        // Contender nodes are `q-`, `f-` (fair waiters) or `t-` (single attempts).
        let contender = |c: &&String| ["q-", "f-", "t-"].iter().any(|k| c.starts_with(k));
        if children.iter().filter(contender).count() >= 2 {
            break;
        }
        tokio::time::timeout(WAIT, watch.changed())
            .await
            .map_err(|_| "ZooKeeper: the waiter's node did not appear within 15 s")?;
    }
    // B is between its node's creation and its watch of A's node; the hold lets it get there,
    // as a waiter of a real lock usually has.
    tokio::time::sleep(random_between(plan.hold.0, plan.hold.1)).await;
    let t = Instant::now();
    held.release().await?;
    let (at, guard) = waiting.await?;
    guard?.release().await?;
    Ok(at.saturating_duration_since(t))
}

/// 1,000 locks held on one `Locker` (through a counting proxy) while the watchdog renews
/// them; the server's packet counter and the proxy's bytes over whole ticks.
async fn watchdog(plan: &Plan, addr: SocketAddr) -> Result<ZkWatchdog> {
    let n = plan.watchdog_locks;
    let lease = plan.watchdog_lease.min(LEASE);
    crate::progress(&format!("  watchdog: {n} locks, lease {lease:?}"));
    let proxy = Proxy::start(addr).await;
    let locker = locker(&proxy.addr().to_string(), lease).await?;
    let window = held_window(plan, &locker, &proxy, "ZooKeeper watchdog", async || {
        packets(addr).await
    })
    .await?;
    Ok(ZkWatchdog {
        locks: n,
        lease,
        window: plan.watchdog_window,
        renewal_calls: window.renewal_calls,
        packets: window.after.saturating_sub(window.before),
        wire: window.wire,
    })
}

/// `zk_packets_received` from `mntr`.
async fn packets(addr: SocketAddr) -> Result<u64> {
    let m = mntr(addr).await?;
    let n = m.get("zk_packets_received").and_then(|v| v.parse().ok());
    Ok(n.ok_or("ZooKeeper: no zk_packets_received in mntr")?)
}

/// The four-letter `mntr` command: `key<TAB>value` lines (the server closes the connection).
async fn mntr(addr: SocketAddr) -> Result<BTreeMap<String, String>> {
    let ask = async {
        let mut conn = tokio::net::TcpStream::connect(addr).await?;
        conn.write_all(b"mntr").await?;
        let mut answer = String::new();
        conn.read_to_string(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    let answer = tokio::time::timeout(Duration::from_secs(10), ask)
        .await
        .map_err(|_| "ZooKeeper: mntr did not answer within 10 s")??;
    Ok(parse_mntr(&answer))
}

fn parse_mntr(text: &str) -> BTreeMap<String, String> {
    let fields = text.lines().filter_map(|l| l.split_once('\t'));
    fields
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_version_and_packets_from_mntr() {
        let text = "zk_version\t3.8.0-abc, built on 2023-01-01\nzk_packets_received\t1234\nzk_avg_latency\t0.5\n";
        let m = super::parse_mntr(text);
        assert_eq!(m["zk_version"], "3.8.0-abc, built on 2023-01-01");
        assert_eq!(m["zk_packets_received"], "1234");
    }
}
