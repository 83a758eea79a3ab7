//! Scale-out engines, each beside a floor taken in the same run: a local Redis Cluster (3
//! primaries) against one redis-server (many keys in parallel; uncontended lock + release
//! against a PING through a cluster connection), and Redlock on 5 independent servers against
//! one PING round trip, beside rslock's Redlock on the same servers.

use std::time::Duration;

use lock_core::Locker;
use lock_testkit::cluster::RedisCluster;

use super::{Op, Plan, latency, throughput};
use crate::designs::Design;
use crate::server::Target;
use crate::stats::Latencies;
use crate::{Result, progress};

/// Primaries of the cluster (no replicas: the bench never fails a node over, and a replica
/// would only take CPU from the 2 cores the client and the primaries share).
pub(crate) const PRIMARIES: usize = 3;
/// Tasks of the many-keys windows on the cluster.
pub(crate) const CLUSTER_TASKS: [usize; 2] = [64, 256];
/// Independent servers of the Redlock section.
pub(crate) const REDLOCK_SERVERS: usize = 5;
/// rslock's lease (ours uses lock-core's default, also 30 s).
const LEASE: Duration = Duration::from_secs(30);

/// One concurrency level of many keys in parallel: `[ops/s, Redis CPU µs per op]` on the
/// cluster and on the one server.
#[derive(Debug, Clone, Default)]
pub(crate) struct ClusterLevel {
    pub(crate) tasks: usize,
    /// Ours' lock + release cycles.
    pub(crate) ours: [(f64, f64); 2],
    /// redis-rs SET, with `tasks` tasks on one connection (context: what the servers and the
    /// client do without a lock).
    pub(crate) set: [(f64, f64); 2],
}

/// The cluster section.
#[derive(Debug, Clone, Default)]
pub(crate) struct Cluster {
    /// The cores the client and every server of the section share.
    pub(crate) cores: usize,
    pub(crate) levels: Vec<ClusterLevel>,
    /// Interleaved: PING through the cluster connection (to the key's primary), ours on the
    /// cluster, PING on the one server, ours on the one server.
    pub(crate) ping: Latencies,
    pub(crate) ours: Latencies,
    pub(crate) single_ping: Latencies,
    pub(crate) single_ours: Latencies,
}

/// The Redlock section (interleaved rounds).
#[derive(Debug, Clone, Default)]
pub(crate) struct Redlock {
    /// PING to one of the servers.
    pub(crate) ping: Latencies,
    /// One PING to each of the servers at once.
    pub(crate) ping_all: Latencies,
    pub(crate) ours: Latencies,
    pub(crate) rslock: Latencies,
}

/// Starts the cluster; a missing `redis-cli` or a failed creation (the kit panics, with a
/// message naming the cause) is an error. The kit's start is not `Send`: it runs on a runtime
/// of its own, on a blocking thread.
async fn start_cluster() -> Result<RedisCluster> {
    let start = || -> std::io::Result<RedisCluster> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let builder = RedisCluster::builder().primaries(PRIMARIES);
        Ok(runtime.block_on(builder.replicas_per_primary(0).start()))
    };
    let started = tokio::task::spawn_blocking(start).await.map_err(|e| {
        let why = e.try_into_panic().ok().and_then(|p| {
            let text = p.downcast_ref::<String>().cloned();
            text.or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        });
        let why = why.unwrap_or_else(|| "cancelled".to_owned());
        format!("cannot start a Redis Cluster: {why}")
    })?;
    Ok(started?)
}

pub(crate) async fn cluster(plan: &Plan) -> Result<Cluster> {
    let cluster = start_cluster().await?;
    let single = Target::open(None)?;
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let ours = Design::Ours(Locker::redis_cluster(&urls).await?);
    let single_ours = Design::Ours(Locker::redis(&single.url).await?);
    let (conn, single_conn) = (cluster.client().await, single.manager().await?);
    // Every server of the section, for the CPU figures (an idle one adds its idle ticks).
    let mut info = vec![single.manager().await?];
    for url in &urls {
        info.push(Target::open(Some(url))?.manager().await?);
    }

    progress("  uncontended lock + release on the cluster and on one server, PINGs");
    let ops = [
        Op::ClusterPing(conn.clone()),
        Op::Cycle(ours.clone()),
        Op::Ping(single_conn.clone()),
        Op::Cycle(single_ours.clone()),
    ];
    let [ping, ours_lat, single_ping, single_lat] =
        <[Latencies; 4]>::try_from(latency::interleaved(plan, &ops).await?)
            .map_err(|_| "one latency per operation")?;

    let contenders = [
        Op::Cycle(ours),
        Op::Cycle(single_ours),
        Op::ClusterSet(conn),
        Op::Set(single_conn),
    ];
    let mut levels = Vec::new();
    for tasks in CLUSTER_TASKS {
        progress(&format!(
            "  many keys, {tasks} tasks: cluster and one server"
        ));
        let passes = throughput::passes(plan, &contenders, tasks, &mut info).await?;
        let m: Vec<(f64, f64)> = passes.iter().map(|w| (w.rate, w.server_us)).collect();
        levels.push(ClusterLevel {
            tasks,
            ours: [m[0], m[1]],
            set: [m[2], m[3]],
        });
    }
    Ok(Cluster {
        cores: std::thread::available_parallelism().map_or(1, usize::from),
        levels,
        ping,
        ours: ours_lat,
        single_ping,
        single_ours: single_lat,
    })
}

pub(crate) async fn redlock(plan: &Plan) -> Result<Redlock> {
    let servers: Vec<Target> = (0..REDLOCK_SERVERS)
        .map(|_| Target::open(None))
        .collect::<Result<_>>()?;
    let urls: Vec<&str> = servers.iter().map(|s| s.url.as_str()).collect();
    let mut conns = Vec::new();
    for s in &servers {
        conns.push(s.manager().await?);
    }
    let ours = Design::Ours(Locker::redlock(&urls).await?);
    let rslock = Design::Rslock(rslock::LockManager::new(urls.clone()), LEASE);
    let ops = [
        Op::Ping(conns[0].clone()),
        Op::PingAll(conns),
        Op::Cycle(ours),
        Op::Cycle(rslock),
    ];
    let [ping, ping_all, ours, rslock] =
        <[Latencies; 4]>::try_from(latency::interleaved(plan, &ops).await?)
            .map_err(|_| "one latency per operation")?;
    Ok(Redlock {
        ping,
        ping_all,
        ours,
        rslock,
    })
}
