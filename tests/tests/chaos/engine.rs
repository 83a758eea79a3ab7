//! The lock servers of a chaos run, per engine, and each engine's fault menu.
//!
//! - One server: CLIENT KILL (normal, pub/sub or both), CLIENT PAUSE (ALL or WRITE), DEBUG
//!   SLEEP, SIGSTOP, a restart without persistence, FLUSHALL (the last two lose data).
//! - Cluster (3 primaries, 1 replica each): CLIENT KILL on a primary, SIGSTOP of a primary
//!   shorter than the node timeout (no failover), `CLUSTER FAILOVER` (lossless), a locked key's
//!   slot moved to another primary with its keys, a primary killed (its replica promoted: may
//!   lose data, the documented limit; the old one restarted empty as a replica).
//! - Sentinel (1 primary, 2 replicas, 3 sentinels): CLIENT KILL on the primary, SIGSTOP of the
//!   primary shorter than `down-after` (no failover), SIGSTOP of a sentinel, `SENTINEL
//!   FAILOVER`, the primary killed (both may lose data: asynchronous replication; the old
//!   primary restarted empty, made a replica by the sentinels).
//! - Redlock (5 servers): on one or two servers at once (a minority), CLIENT KILL, CLIENT
//!   PAUSE, SIGSTOP, or a kill and a restart empty after the documented delay (the longest
//!   lease): no data loss counts, so no two holders are excused.

use std::time::Duration;

use lock_testkit::RedisServer;
use lock_testkit::cluster::{RedisCluster, key_slot};
use lock_testkit::sentinel::RedisSentinelSet;
use lock_tests::chaos::{Engine, MAX_LEASE_MS, key_name};

use crate::faults::{Done, Kind, ms};

/// How long a Sentinel set may take to fail over or resync after a fault. The sentinels demote
/// an old primary that still runs only once it has reported itself primary for a while, and a
/// sentinel whose timer ran late on a loaded machine stops acting for 30 s (TILT mode): a full
/// run once waited past 30 s for the demotion after `SENTINEL FAILOVER`.
const SENTINEL_BOUND: Duration = Duration::from_secs(75);
/// The longest SIGSTOP of a primary that must not start a failover, with a margin: a node is
/// judged down when its last answer is older than the cluster's node timeout or the
/// sentinels' `down-after`, and that answer may be half a node timeout, or a second of
/// sentinel pings, old when the stall begins.
const SHORT_STALL_MS: u64 = 500;
const NODE_TIMEOUT: Duration = Duration::from_millis(1500);
const DOWN_AFTER: Duration = Duration::from_millis(2000);
/// Redlock servers in a run; at most [`REDLOCK_FAULTED`] are faulted at once.
const REDLOCK_SERVERS: usize = 5;
const REDLOCK_FAULTED: u64 = 2;

/// The lock servers of one run.
pub(crate) enum Deployment {
    Redis(RedisServer),
    Cluster(RedisCluster),
    Sentinel(RedisSentinelSet),
    Redlock(Vec<RedisServer>),
}

impl Deployment {
    pub(crate) async fn start(engine: Engine) -> Deployment {
        match engine {
            Engine::Redis => Deployment::Redis(RedisServer::start()),
            Engine::Cluster => Deployment::Cluster(
                RedisCluster::builder()
                    .node_timeout(NODE_TIMEOUT)
                    .start()
                    .await,
            ),
            Engine::Sentinel => Deployment::Sentinel(
                RedisSentinelSet::builder()
                    .down_after(DOWN_AFTER)
                    .failover_timeout(Duration::from_secs(2))
                    .start()
                    .await,
            ),
            Engine::Redlock => {
                Deployment::Redlock((0..REDLOCK_SERVERS).map(|_| RedisServer::start()).collect())
            }
        }
    }

    /// The `--lock-url` of the workers: the URLs a locker of this engine is given.
    pub(crate) fn lock_urls(&self) -> String {
        match self {
            Deployment::Redis(server) => server.url(),
            Deployment::Cluster(cluster) => cluster.urls().join(","),
            Deployment::Sentinel(set) => set.sentinel_urls().join(","),
            Deployment::Redlock(servers) => servers
                .iter()
                .map(RedisServer::url)
                .collect::<Vec<_>>()
                .join(","),
        }
    }

    /// Every running data node that serves keys (for the leftover-key check at the end): a
    /// cluster's primaries (a replica redirects `PTTL`), every other server.
    pub(crate) async fn data_nodes(&self) -> Vec<&RedisServer> {
        let all: Vec<&RedisServer> = match self {
            Deployment::Redis(server) => vec![server],
            Deployment::Cluster(cluster) => {
                let primaries = cluster.primaries().await;
                primaries
                    .iter()
                    .map(|&p| cluster.node(p).server())
                    .collect()
            }
            Deployment::Sentinel(set) => set.servers().iter().collect(),
            Deployment::Redlock(servers) => servers.iter().collect(),
        };
        all.into_iter()
            .filter(|s| s.is_running() && !s.is_paused())
            .collect()
    }

    /// One fault of the engine's menu; `roll` is in `30..100` (below is a worker's stop),
    /// `dur` in `100..2000` ms, `pick` chooses the target.
    /// `keys` is the run's number of keys (a slot move picks one).
    pub(crate) async fn fault(&mut self, roll: u64, dur: u64, pick: u64, keys: u64) -> Done {
        match self {
            Deployment::Redis(server) => single(server, roll, dur, pick).await,
            Deployment::Cluster(cluster) => on_cluster(cluster, roll, dur, pick, keys).await,
            Deployment::Sentinel(set) => on_sentinel(set, roll, dur, pick).await,
            Deployment::Redlock(servers) => on_redlock(servers, roll, dur, pick).await,
        }
    }
}

fn done(kind: Kind, what: String, loss: bool) -> Done {
    Done {
        kind,
        what,
        loss,
        slots: None,
    }
}

/// CLIENT KILL of the normal connections, the pub/sub ones, or both (by `pick`).
async fn client_kill(server: &RedisServer, pick: u64) -> String {
    let kinds: &[&str] = match pick % 3 {
        0 => &["normal"],
        1 => &["pubsub"],
        _ => &["normal", "pubsub"],
    };
    let mut killed = 0;
    for kind in kinds {
        killed += server
            .query::<i64>(
                redis::cmd("CLIENT")
                    .arg("KILL")
                    .arg("TYPE")
                    .arg(*kind)
                    .arg("SKIPME")
                    .arg("yes")
                    .clone(),
            )
            .await;
    }
    format!("CLIENT KILL TYPE {} ({killed} closed)", kinds.join("+"))
}

/// CLIENT PAUSE ALL or WRITE (by `pick`) for `dur` ms on every server of `servers`; returns
/// once the pause is over.
async fn client_pause(servers: &[&RedisServer], dur: u64, pick: u64) -> String {
    let mode = if pick.is_multiple_of(2) {
        "ALL"
    } else {
        "WRITE"
    };
    for server in servers {
        let () = server
            .query(redis::cmd("CLIENT").arg("PAUSE").arg(dur).arg(mode).clone())
            .await;
    }
    tokio::time::sleep(ms(dur)).await;
    format!("CLIENT PAUSE {dur} {mode}")
}

/// SIGSTOP of `server` for `dur` ms.
async fn freeze(server: &mut RedisServer, dur: u64) {
    server.pause();
    tokio::time::sleep(ms(dur)).await;
    server.resume();
}

/// The menu on one server (as before the engines were added: the same rolls).
async fn single(server: &mut RedisServer, roll: u64, dur: u64, pick: u64) -> Done {
    match roll {
        0..48 => done(Kind::ClientKill, client_kill(server, pick).await, false),
        48..62 => done(
            Kind::ClientPause,
            client_pause(&[server], dur, pick).await,
            false,
        ),
        62..76 => {
            let mut conn = server.client().await;
            let secs = format!("{:.3}", dur as f64 / 1000.0);
            let () = redis::cmd("DEBUG")
                .arg("SLEEP")
                .arg(&secs)
                .query_async(&mut conn)
                .await
                .expect("DEBUG SLEEP");
            done(Kind::DebugSleep, format!("DEBUG SLEEP {secs}"), false)
        }
        76..86 => {
            freeze(server, dur).await;
            done(
                Kind::ServerFreeze,
                format!("SIGSTOP lock server for {dur} ms"),
                false,
            )
        }
        86..95 => {
            tokio::task::block_in_place(|| server.restart());
            done(
                Kind::Restart,
                "restart without persistence".to_owned(),
                true,
            )
        }
        _ => {
            server.flushall().await;
            done(Kind::Flushall, "FLUSHALL".to_owned(), true)
        }
    }
}

/// The menu on a Redis Cluster.
async fn on_cluster(cluster: &mut RedisCluster, roll: u64, dur: u64, pick: u64, keys: u64) -> Done {
    let primaries = cluster.primaries().await;
    let p = primaries[(pick % primaries.len() as u64) as usize];
    match roll {
        0..45 => {
            let what = client_kill(cluster.node(p).server(), pick).await;
            done(
                Kind::ClientKill,
                format!("{what} on primary node {p}"),
                false,
            )
        }
        45..60 => {
            let d = dur.min(SHORT_STALL_MS);
            freeze(cluster.node_mut(p).server_mut(), d).await;
            done(
                Kind::ServerFreeze,
                format!("SIGSTOP primary node {p} for {d} ms (no failover)"),
                false,
            )
        }
        60..72 => {
            let replicas = cluster.replicas_of(p).await;
            let Some(&r) = replicas.get((pick / 7) as usize % replicas.len().max(1)) else {
                return done(
                    Kind::Failover,
                    format!("no CLUSTER FAILOVER: primary node {p} has no replica"),
                    false,
                );
            };
            cluster.failover(r).await;
            done(
                Kind::Failover,
                format!("CLUSTER FAILOVER: node {r} replaces primary node {p} (lossless)"),
                false,
            )
        }
        72..84 => {
            // The slot of one of the run's keys (held or about to be), to another primary.
            let key = key_name((pick / 3) % keys.max(1));
            let slot = key_slot(&key);
            let from = cluster.primary_for_slot(slot).await;
            let others: Vec<usize> = primaries.iter().copied().filter(|&q| q != from).collect();
            let to = others[(pick / 11) as usize % others.len()];
            cluster.migrate_slot(slot, from, to).await;
            done(
                Kind::SlotMove,
                format!("slot {slot} of {key} moved from node {from} to node {to}"),
                false,
            )
        }
        _ => {
            // Only this shard's keys may be lost: the checks excuse no other key.
            let slots = cluster.slots_of(p).await;
            cluster.kill_node(p);
            let promoted = cluster.wait_for_failover(p).await;
            tokio::task::block_in_place(|| cluster.node_mut(p).server_mut().restart());
            cluster.wait_until_ok().await;
            Done {
                slots: Some(slots),
                ..done(
                    Kind::PrimaryKill,
                    format!(
                        "primary node {p} killed, node {promoted} promoted, node {p} back \
                         empty as a replica"
                    ),
                    true,
                )
            }
        }
    }
}

/// The menu on a Sentinel set.
async fn on_sentinel(set: &mut RedisSentinelSet, roll: u64, dur: u64, pick: u64) -> Done {
    let port = set.primary().port();
    // A failover the schedule did not make would lose data the checks do not know of.
    let named = set.primary_port().await;
    assert_eq!(
        named, port,
        "harness: the sentinels failed over on their own (a stall too long for down-after?)"
    );
    match roll {
        0..45 => {
            let what = client_kill(set.primary(), pick).await;
            done(Kind::ClientKill, format!("{what} on the primary"), false)
        }
        45..60 => {
            let d = dur.min(SHORT_STALL_MS);
            freeze(set.primary_mut(), d).await;
            done(
                Kind::ServerFreeze,
                format!("SIGSTOP primary {port} for {d} ms (no failover)"),
                false,
            )
        }
        60..72 => {
            let i = (pick / 3) as usize % set.sentinels().len();
            freeze(set.sentinel_mut(i), dur).await;
            done(
                Kind::SentinelFreeze,
                format!("SIGSTOP sentinel {i} for {dur} ms"),
                false,
            )
        }
        72..86 => {
            set.failover().await;
            // Until the sentinels demote the old primary (seconds): a replica in sync is
            // there for the next failover.
            set.wait_until_in_sync(SENTINEL_BOUND).await;
            done(
                Kind::Failover,
                format!(
                    "SENTINEL FAILOVER: {} replaces primary {port}",
                    set.primary().port()
                ),
                true,
            )
        }
        _ => {
            let old = set.kill_primary();
            let new = set.wait_for_new_primary(old, SENTINEL_BOUND).await;
            let index = set
                .servers()
                .iter()
                .position(|s| s.port() == old)
                .expect("the killed primary is one of the set");
            tokio::task::block_in_place(|| set.server_mut(index).restart());
            // It comes back empty, as a primary: made a replica at once (the sentinels would
            // do it too, but only after tens of seconds).
            let () = set.servers()[index]
                .query(redis::cmd("REPLICAOF").arg("127.0.0.1").arg(new).clone())
                .await;
            set.wait_until_in_sync(SENTINEL_BOUND).await;
            done(
                Kind::PrimaryKill,
                format!("primary {old} killed, {new} promoted, {old} back empty as a replica"),
                true,
            )
        }
    }
}

/// The menu on Redlock's servers: each fault hits one or two of the five (never a majority).
async fn on_redlock(servers: &mut [RedisServer], roll: u64, dur: u64, pick: u64) -> Done {
    let n = servers.len();
    let first = (pick / 2) as usize % n;
    let mut hit = vec![first];
    if (pick % REDLOCK_FAULTED) == 1 {
        hit.push((first + 1 + (pick / 10) as usize % (n - 1)) % n);
    }
    let names = hit
        .iter()
        .map(|i| format!("server {i}"))
        .collect::<Vec<_>>()
        .join(" and ");
    match roll {
        0..48 => {
            let mut whats = Vec::new();
            for &i in &hit {
                whats.push(client_kill(&servers[i], pick / 3).await);
            }
            done(
                Kind::ClientKill,
                format!("{} on {names}", whats.join(", ")),
                false,
            )
        }
        48..62 => {
            let targets: Vec<&RedisServer> = hit.iter().map(|&i| &servers[i]).collect();
            let what = client_pause(&targets, dur, pick / 3).await;
            done(Kind::ClientPause, format!("{what} on {names}"), false)
        }
        62..80 => {
            for &i in &hit {
                servers[i].pause();
            }
            tokio::time::sleep(ms(dur)).await;
            for &i in &hit {
                servers[i].resume();
            }
            done(
                Kind::ServerFreeze,
                format!("SIGSTOP {names} for {dur} ms"),
                false,
            )
        }
        _ => {
            for &i in &hit {
                servers[i].stop();
            }
            // Redlock's restart rule: down for at least the longest lease.
            let down = dur.max(MAX_LEASE_MS + 200);
            tokio::time::sleep(ms(down)).await;
            tokio::task::block_in_place(|| {
                for &i in &hit {
                    servers[i].restart();
                }
            });
            done(
                Kind::ServerKill,
                format!("{names} killed, restarted empty after {down} ms"),
                false,
            )
        }
    }
}
