//! The scenarios, the plan of a quick or full run, and the run itself.

#[cfg(any(feature = "etcd", feature = "zookeeper"))]
mod consensus;
#[cfg(feature = "etcd")]
mod etcd;
mod handoff;
mod hot;
mod idempotency;
mod instructions;
mod latency;
mod layer;
mod scaleout;
mod throughput;
mod watchdog;
#[cfg(feature = "zookeeper")]
mod zookeeper;

use std::future::Future as _;
use std::task::Poll;
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};

use crate::designs::{Design, Kind};
use crate::machine::Machine;
use crate::report::{self, Results};
use crate::server::Target;
use crate::stats::CommandStats;
use crate::{Options, Result, progress};

#[cfg(any(feature = "etcd", feature = "zookeeper"))]
pub(crate) use consensus::CHUNKS;
#[cfg(feature = "etcd")]
pub(crate) use etcd::Etcd;
pub(crate) use handoff::{Handoff, HandoffFloors};
pub(crate) use hot::HotFigures;
pub(crate) use idempotency::Idempotency;
pub(crate) use instructions::Instructions;
pub(crate) use latency::{Memory, Uncontended};
pub(crate) use layer::Layer;
pub(crate) use scaleout::{CLUSTER_TASKS, Cluster, PRIMARIES, REDLOCK_SERVERS, Redlock};
pub(crate) use throughput::Throughput;
pub(crate) use watchdog::Watchdog;
#[cfg(feature = "zookeeper")]
pub(crate) use zookeeper::ZooKeeper;

/// Sample counts and durations of one run.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) quick: bool,
    /// Sequential latency samples per measured operation (PING, SET, lock + release).
    pub(crate) latency_n: usize,
    /// Latency measurements are split in this many rounds, each measuring every operation in
    /// turn, so a burst of background load hits all of them alike.
    pub(crate) rounds: usize,
    pub(crate) warmup: usize,
    pub(crate) memory_n: usize,
    pub(crate) concurrency: Vec<usize>,
    pub(crate) throughput_warm: Duration,
    /// Measured time per contender, split in `throughput_passes` windows.
    pub(crate) throughput_run: Duration,
    pub(crate) throughput_passes: usize,
    /// `redis-benchmark -n` for `c` clients.
    pub(crate) benchmark_requests: fn(usize) -> usize,
    /// Handoff samples per design (ours, seed, rslock) and warm-up rounds.
    pub(crate) handoff_n: [usize; 3],
    pub(crate) handoff_warm: usize,
    /// The holder keeps the lock for a random time in this range after the waiter started, so
    /// a polling waiter is at a random phase of its sleep when the release comes.
    pub(crate) hold: (Duration, Duration),
    pub(crate) waiters: Vec<usize>,
    pub(crate) hot_warm: Duration,
    pub(crate) hot_run: Duration,
    pub(crate) watchdog_locks: usize,
    pub(crate) watchdog_lease: Duration,
    pub(crate) watchdog_window: Duration,
    pub(crate) layer_n: usize,
    /// Instruction counts (callgrind): (tasks, keys each, cycles of the shorter run).
    pub(crate) instruction_shapes: Vec<(usize, usize, usize)>,
    /// etcd: samples per measured operation of the uncontended rounds (Range, Put, lock +
    /// release), and handoffs (and watch events) in all.
    #[cfg(feature = "etcd")]
    pub(crate) etcd_latency_n: usize,
    #[cfg(feature = "etcd")]
    pub(crate) etcd_handoff_n: usize,
    /// ZooKeeper: as `etcd_latency_n` and `etcd_handoff_n`.
    #[cfg(feature = "zookeeper")]
    pub(crate) zk_latency_n: usize,
    #[cfg(feature = "zookeeper")]
    pub(crate) zk_handoff_n: usize,
}

impl Plan {
    pub(crate) fn new(quick: bool) -> Self {
        let ms = Duration::from_millis;
        let full = Plan {
            quick,
            latency_n: 5_000,
            rounds: 25,
            warmup: 300,
            memory_n: 300_000,
            concurrency: vec![16, 64, 256],
            throughput_warm: ms(150),
            throughput_run: ms(2_000),
            throughput_passes: 4,
            benchmark_requests: |c| (c * 500).max(150_000),
            handoff_n: [800, 300, 100],
            handoff_warm: 20,
            hold: (ms(2), ms(12)),
            waiters: vec![1, 10, 100],
            hot_warm: ms(300),
            hot_run: ms(2_000),
            watchdog_locks: 1000,
            watchdog_lease: ms(3_000),
            watchdog_window: ms(6_000),
            layer_n: 200_000,
            instruction_shapes: vec![(1, 1, 2_000), (16, 4, 3_200), (64, 4, 6_400)],
            #[cfg(feature = "etcd")]
            etcd_latency_n: 2_000,
            #[cfg(feature = "etcd")]
            etcd_handoff_n: 400,
            #[cfg(feature = "zookeeper")]
            zk_latency_n: 2_000,
            #[cfg(feature = "zookeeper")]
            zk_handoff_n: 400,
        };
        if !quick {
            return full;
        }
        Plan {
            latency_n: 120,
            rounds: 2,
            warmup: 20,
            memory_n: 5_000,
            throughput_warm: ms(20),
            throughput_run: ms(60),
            throughput_passes: 2,
            benchmark_requests: |c| (c * 10).max(2_000),
            handoff_n: [20, 10, 3],
            handoff_warm: 2,
            hot_warm: ms(30),
            hot_run: ms(100),
            watchdog_lease: ms(1_000),
            watchdog_window: ms(700),
            layer_n: 2_000,
            instruction_shapes: vec![(1, 1, 40)],
            #[cfg(feature = "etcd")]
            etcd_latency_n: 40,
            #[cfg(feature = "etcd")]
            etcd_handoff_n: 10,
            #[cfg(feature = "zookeeper")]
            zk_latency_n: 40,
            #[cfg(feature = "zookeeper")]
            zk_handoff_n: 10,
            ..full
        }
    }
}

/// One operation of the latency and throughput loops.
#[derive(Clone)]
pub(crate) enum Op {
    /// redis-rs PING (the floor).
    Ping(ConnectionManager),
    /// One PING to each server at once, all awaited (the floor of a call fanned out to them).
    PingAll(Vec<ConnectionManager>),
    /// redis-rs SET of `bench:<key>` (the floor).
    Set(ConnectionManager),
    /// PING through a redis-rs cluster connection, to the primary that serves our lock on the
    /// key (the slot of `lock:{key}`); without a route redis-rs sends PING to every primary.
    ClusterPing(ClusterConnection),
    /// SET of `bench:<key>` through a redis-rs cluster connection (routed by the key).
    ClusterSet(ClusterConnection),
    /// Lock + release through a design.
    Cycle(Design),
}

impl Op {
    async fn once(&self, key: &str) -> Result<()> {
        match self {
            Op::Ping(conn) => ping(conn.clone()).await?,
            Op::PingAll(conns) => {
                // Polled together on this task, as a fan-out without spawning (the first error
                // is kept).
                let mut pings: Vec<_> = conns.iter().map(|c| Box::pin(ping(c.clone()))).collect();
                let mut failed = None;
                std::future::poll_fn(|cx| {
                    pings.retain_mut(|p| match p.as_mut().poll(cx) {
                        Poll::Pending => true,
                        Poll::Ready(r) => {
                            failed = failed.take().or(r.err());
                            false
                        }
                    });
                    if pings.is_empty() {
                        Poll::Ready(())
                    } else {
                        Poll::Pending
                    }
                })
                .await;
                failed.map_or(Ok(()), Err)?;
            }
            Op::Set(conn) => set(&mut conn.clone(), key).await?,
            Op::ClusterPing(conn) => {
                let route = Route::with_key(format!("lock:{{{key}}}"), SlotAddr::Master);
                let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                let ping = redis::cmd("PING");
                conn.clone().route_command(ping, route).await?;
            }
            Op::ClusterSet(conn) => set(&mut conn.clone(), key).await?,
            Op::Cycle(d) => {
                d.release(d.lock(key, Duration::from_secs(5)).await?)
                    .await?
            }
        }
        Ok(())
    }
}

async fn ping(mut conn: ConnectionManager) -> redis::RedisResult<()> {
    redis::cmd("PING").query_async::<String>(&mut conn).await?;
    Ok(())
}

async fn set(conn: &mut impl redis::aio::ConnectionLike, key: &str) -> redis::RedisResult<()> {
    let mut set = redis::cmd("SET");
    set.arg(format!("bench:{key}")).arg("x");
    set.query_async::<String>(conn).await?;
    Ok(())
}

/// Runs every scenario against one Redis and writes the report and the plot.
pub(crate) async fn run_all(options: &Options) -> Result<()> {
    let started = std::time::Instant::now();
    let plan = Plan::new(options.quick);
    // Fail now, not after minutes of measuring, if the report cannot be written.
    let dir = match options.out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    if !dir.is_dir() {
        let (out, dir) = (options.out.display(), dir.display());
        return Err(format!("cannot write the report to {out}: {dir} is not a directory").into());
    }
    let mut machine = Machine::probe();
    let target = Target::open(options.redis_url.as_deref())?;
    let mut stats_conn = target.manager().await?;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut stats_conn)
        .await?;
    let version = info.lines().find_map(|l| l.strip_prefix("redis_version:"));
    machine.redis_version = version.map_or_else(|| "unknown".to_owned(), |v| v.trim().to_owned());
    machine.redis_where = match &target.started {
        Some(s) => format!(
            "started by the bench on 127.0.0.1:{} (no RDB/AOF, temporary dir)",
            s.port()
        ),
        None => "given by --redis-url/REDIS_URL (shared: other clients may add load)".to_owned(),
    };
    let mode = if plan.quick { "quick" } else { "full" };
    let (version, url) = (&machine.redis_version, &target.url);
    progress(&format!("{mode} mode; Redis {version} at {url}"));
    // Sanity: commandstats must be readable, the call-count figures depend on it.
    CommandStats::fetch(&mut stats_conn).await?;

    if let Some(section) = &options.only {
        return run_only(section, &plan, &target, &machine).await;
    }

    let uncontended = latency(&plan, &target).await?;
    let instructions = instructions(&plan, &target).await?;
    let many = throughput(&plan, &target).await?;
    let (handoffs, handoff_floors) = handoffs(&plan, &target).await?;
    let hot = hot(&plan, &target).await?;
    let watchdog = watchdog(&plan, &target).await?;
    let layer = layer(&plan, &target).await?;
    let idempotency = idempotency(&plan, &target).await?;
    let cluster = cluster(&plan).await?;
    let redlock = redlock(&plan).await?;
    #[cfg(feature = "etcd")]
    let etcd = etcd(&plan).await?;
    #[cfg(feature = "zookeeper")]
    let zookeeper = zookeeper(&plan).await?;

    machine.load_end = crate::machine::load_average();
    let elapsed = started.elapsed();
    let results = Results {
        machine,
        plan,
        uncontended,
        instructions,
        many,
        handoffs,
        handoff_floors,
        hot,
        watchdog,
        layer,
        idempotency,
        cluster,
        redlock,
        #[cfg(feature = "etcd")]
        etcd,
        #[cfg(feature = "zookeeper")]
        zookeeper,
        elapsed,
    };
    report::write(&results, &options.out)
}

// One function per section, shared by the full run and `--only`.

async fn latency(plan: &Plan, target: &Target) -> Result<(Uncontended, Memory)> {
    progress("latency: PING, SET, uncontended lock + release (Redis)");
    let redis = latency::redis_latencies(plan, target).await?;
    progress("latency: uncontended lock + release (memory)");
    Ok((redis, latency::memory_latencies(plan).await?))
}

async fn instructions(plan: &Plan, target: &Target) -> Result<Instructions> {
    progress("client instructions per uncontended lock cycle (callgrind)");
    instructions::instructions(plan, target).await
}

async fn throughput(plan: &Plan, target: &Target) -> Result<Throughput> {
    progress("throughput: many keys in parallel");
    throughput::many_keys(plan, target).await
}

async fn handoffs(plan: &Plan, target: &Target) -> Result<([Handoff; 3], HandoffFloors)> {
    progress("handoff across two processes");
    let (ours, floors) = handoff::ours_and_floors(plan, target).await?;
    let seed = handoff::peer(plan, target, Kind::Seed, plan.handoff_n[1]).await?;
    let rslock = handoff::peer(plan, target, Kind::Rslock, plan.handoff_n[2]).await?;
    Ok(([ours, seed, rslock], floors))
}

async fn hot(plan: &Plan, target: &Target) -> Result<Vec<HotFigures>> {
    progress("hot key with waiters");
    hot::hot_keys(plan, target, &mut target.manager().await?).await
}

async fn watchdog(plan: &Plan, target: &Target) -> Result<Watchdog> {
    progress("watchdog cost");
    watchdog::watchdog(plan, target, &mut target.manager().await?).await
}

async fn layer(plan: &Plan, target: &Target) -> Result<Layer> {
    progress("layer overhead");
    layer::layer(plan, target).await
}

async fn idempotency(plan: &Plan, target: &Target) -> Result<Idempotency> {
    progress("idempotency replay");
    idempotency::idempotency(plan, target).await
}

async fn cluster(plan: &Plan) -> Result<Cluster> {
    progress("Redis Cluster (3 primaries) beside one server");
    scaleout::cluster(plan).await
}

async fn redlock(plan: &Plan) -> Result<Redlock> {
    progress("Redlock on 5 servers");
    scaleout::redlock(plan).await
}

#[cfg(feature = "etcd")]
async fn etcd(plan: &Plan) -> Result<Etcd> {
    progress("etcd: one member");
    etcd::etcd(plan).await
}

#[cfg(feature = "zookeeper")]
async fn zookeeper(plan: &Plan) -> Result<ZooKeeper> {
    progress("ZooKeeper: one standalone server");
    zookeeper::zookeeper(plan).await
}

/// `--only SECTION`: measures that section alone and prints its table rows on stdout, then a
/// note saying where they come from (a partial run: the report is not written).
async fn run_only(section: &str, plan: &Plan, target: &Target, machine: &Machine) -> Result<()> {
    let (rows, floors) = match section {
        "latency" => {
            let (u, m) = latency(plan, target).await?;
            (report::latency_rows(&u, &m), "PING, SET")
        }
        "instructions" => {
            let i = instructions(plan, target).await?;
            (
                report::instruction_rows(&i),
                "none: the seed design and rslock, counted alike",
            )
        }
        "throughput" => {
            let t = throughput(plan, target).await?;
            (report::many_rows(&t), "redis-benchmark SET, redis-rs SET")
        }
        "handoff" => {
            let (h, f) = handoffs(plan, target).await?;
            let floors = "PING, the notification floor";
            (report::handoff_rows(&h, &f), floors)
        }
        "hot" => {
            let h = hot(plan, target).await?;
            (
                report::hot_rows(&h),
                "the same scenarios without local hand-off",
            )
        }
        "watchdog" => {
            let w = watchdog(plan, target).await?;
            (report::watchdog_row(&w), "none")
        }
        "layer" => {
            let l = layer(plan, target).await?;
            (
                report::layer_rows(&l),
                "bare service, PING, bare lock + release",
            )
        }
        "idempotency" => {
            let i = idempotency(plan, target).await?;
            (report::idempotency_rows(&i), "bare service, PING")
        }
        "cluster" => {
            let c = cluster(plan).await?;
            (
                report::cluster_rows(&c),
                "one redis-server, PING (cluster and one server)",
            )
        }
        "redlock" => {
            let r = redlock(plan).await?;
            (report::redlock_rows(&r), "PING to one server and to all 5")
        }
        #[cfg(feature = "etcd")]
        "etcd" => {
            let e = etcd(plan).await?;
            let floors = "Range, Put and the watch event, on that member";
            (report::etcd_rows(&e, None), floors)
        }
        #[cfg(feature = "zookeeper")]
        "zookeeper" => {
            let z = zookeeper(plan).await?;
            let floors = "exists, set_data and the watch event, on that server";
            (report::zookeeper_rows(&z), floors)
        }
        other => return Err(format!("unknown section `{other}` (known: {SECTIONS})").into()),
    };
    let n = rows.lines().count();
    let mode = if plan.quick { "quick" } else { "full" };
    let (version, tree, date) = (&machine.redis_version, &machine.tree, &machine.date);
    // The scale-out sections start their own servers whatever the target, and the etcd
    // section its own etcd member.
    let server = match (section, &target.started) {
        ("etcd", _) => "its own etcd member".to_owned(),
        ("zookeeper", _) => "its own ZooKeeper server".to_owned(),
        ("cluster" | "redlock", _) | (_, Some(_)) => format!("its own redis-server {version}"),
        (_, None) => format!("the given redis-server {version}"),
    };
    let rows_come = if n == 1 { "row comes" } else { "rows come" };
    let note = format!(
        "\nThe {n} *{section}* {rows_come} from a **partial run** (`lock-bench --only {section}`, \
         {mode}-mode sample counts, {server}, same machine) on {date} at \
         {tree}, load average (1/5/15 min) {} at its start and {} at its end; every other row is \
         from the full run dated above. Their floors ({floors}) were measured in that partial \
         run.\n",
        machine.load_start,
        crate::machine::load_average(),
    );
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(rows.as_bytes())?;
    stdout.write_all(note.as_bytes())?;
    stdout.flush()?;
    Ok(())
}

/// The sections `--only` can run: the Redis ones, then etcd and ZooKeeper when built with
/// their features.
#[cfg(all(not(feature = "etcd"), not(feature = "zookeeper")))]
pub(crate) const SECTIONS: &str = REDIS_SECTIONS;
#[cfg(all(feature = "etcd", not(feature = "zookeeper")))]
pub(crate) const SECTIONS: &str = concat!(redis_sections!(), " etcd");
#[cfg(all(not(feature = "etcd"), feature = "zookeeper"))]
pub(crate) const SECTIONS: &str = concat!(redis_sections!(), " zookeeper");
#[cfg(all(feature = "etcd", feature = "zookeeper"))]
pub(crate) const SECTIONS: &str = concat!(redis_sections!(), " etcd zookeeper");
#[cfg(all(not(feature = "etcd"), not(feature = "zookeeper")))]
const REDIS_SECTIONS: &str = redis_sections!();
macro_rules! redis_sections {
    () => {
        "latency instructions throughput handoff hot watchdog layer idempotency cluster redlock"
    };
}
use redis_sections;

/// A uniformly random duration in `[lo, hi]`.
pub(crate) fn random_between(lo: Duration, hi: Duration) -> Duration {
    let r = getrandom::u32().unwrap_or(0);
    lo + (hi.saturating_sub(lo)).mul_f64(f64::from(r) / f64::from(u32::MAX))
}
