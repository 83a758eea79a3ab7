//! The Markdown report (`BENCHMARKS.md`): the results table (one row per scenario, with the
//! peers, the floor, the ratio and the goal), the diagnostics and the method; and the handoff
//! plot next to it. Each section is written as the Markdown it renders to; each section's rows
//! come from its own figures alone, so `--only SECTION` prints the same rows.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use crate::designs::{Kind, LOCAL_HOLD, LOCAL_TURNS};
use crate::machine::Machine;
#[cfg(feature = "etcd")]
use crate::scenarios::Etcd;
#[cfg(feature = "zookeeper")]
use crate::scenarios::ZooKeeper;
use crate::scenarios::{
    CLUSTER_TASKS, Cluster, Handoff, HandoffFloors, HotFigures, Idempotency, Instructions, Layer,
    Memory, PRIMARIES, Plan, REDLOCK_SERVERS, Redlock, Throughput, Uncontended, Watchdog,
};
use crate::stats::{Latencies, fmt_ns, fmt_rate, group};
use crate::svg::{Marker, Series, cdf_chart};
use crate::{Result, progress};

/// Goals from DESIGN.md.
const UNCONTENDED_X_PING: f64 = 2.2;
const MANY_KEYS_X_PEER: f64 = 1.1;
const HANDOFF_X_FLOOR: f64 = 1.15;
/// The waiter's own part of a handoff (notification reached it → its acquire returned).
const WAKE_NS: u64 = 20_000;
const POLLING_SPEEDUP: f64 = 20.0;
const LOCAL_HANDOFF_X: f64 = 10.0;
const LAYER_REDIS_X_PING: f64 = 2.3;
const MEMORY_NS: u64 = 2_000;
const LAYER_NS: u64 = 5_000;
/// A replay on Redis is one round trip: met while its p50 is at most this many PING p50s
/// (PING measured in the same rounds; the slack is the layer's own work and the script).
const REPLAY_X_PING: f64 = 1.5;
/// Many keys on the cluster: above one server's cycles/s in the same run (issue 16).
const CLUSTER_X_SINGLE: f64 = 1.0;

/// Everything one run measured.
#[derive(Debug)]
pub(crate) struct Results {
    pub(crate) machine: Machine,
    pub(crate) plan: Plan,
    pub(crate) uncontended: (Uncontended, Memory),
    pub(crate) instructions: Instructions,
    pub(crate) many: Throughput,
    /// Ours, seed and rslock, in this order.
    pub(crate) handoffs: [Handoff; 3],
    /// The floors measured beside our handoff.
    pub(crate) handoff_floors: HandoffFloors,
    pub(crate) hot: Vec<HotFigures>,
    pub(crate) watchdog: Watchdog,
    pub(crate) layer: Layer,
    pub(crate) idempotency: Idempotency,
    pub(crate) cluster: Cluster,
    pub(crate) redlock: Redlock,
    #[cfg(feature = "etcd")]
    pub(crate) etcd: Etcd,
    #[cfg(feature = "zookeeper")]
    pub(crate) zookeeper: ZooKeeper,
    pub(crate) elapsed: Duration,
}

/// The verdict cell.
fn met(ok: bool) -> &'static str {
    if ok { "**yes**" } else { "**NO**" }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        f64::NAN
    } else {
        a as f64 / b as f64
    }
}

/// The rows of the results table.
fn results(r: &Results) -> String {
    [
        latency_rows(&r.uncontended.0, &r.uncontended.1),
        instruction_rows(&r.instructions),
        many_rows(&r.many),
        handoff_rows(&r.handoffs, &r.handoff_floors),
        hot_rows(&r.hot),
        watchdog_row(&r.watchdog),
        layer_rows(&r.layer),
        idempotency_rows(&r.idempotency),
        cluster_rows(&r.cluster),
        redlock_rows(&r.redlock),
    ]
    .concat()
}

/// The headline table's rows: of each row of the full table (and of the etcd table) that has
/// a goal, its scenario, ratio, goal and verdict (the same cells, so the tables never
/// disagree).
fn headline(rows: &str) -> String {
    let mut out = String::new();
    for row in rows.lines() {
        let cells: Vec<&str> = row.trim().trim_matches('|').split(" | ").collect();
        // The scenario, then the last three cells: the results table's and the etcd table's.
        if let [scenario, .., ratio, goal, verdict] = cells[..]
            && cells.len() >= 6
        {
            let verdict = verdict.trim();
            if verdict != "—" {
                let _ = writeln!(
                    out,
                    "| {} | {ratio} | {goal} | {verdict} |",
                    scenario.trim()
                );
            }
        }
    }
    out
}

/// PING and SET (the floor), uncontended lock + release on Redis and on memory.
pub(crate) fn latency_rows(u: &Uncontended, m: &Memory) -> String {
    let m = &m.lock_release;
    let ping = u.ping.p50();
    let p = fmt_ns(ping);
    let [ours, seed, rslock] = Kind::ALL.map(|k| {
        let mut designs = u.lock_release.iter();
        let found = designs.find(|(kind, _)| *kind == k);
        found.map(|(_, l)| l.clone()).unwrap_or_default()
    });
    let [x, xs, xr] = [&ours, &seed, &rslock].map(|l| ratio(l.p50(), ping));
    format!(
        "\
| Baseline: PING round trip | redis-rs ConnectionManager: {} | — | — | this is the floor | 1.00× | — | — |
| Baseline: SET round trip | redis-rs ConnectionManager: {} | — | — | PING p50 {p} | {:.2}× PING | — | — |
| Uncontended lock + release (Redis) | {} | {} | {} | 2 round trips; PING p50 {p} | {x:.2}× PING (seed {xs:.2}×, rslock {xr:.2}×) | p50 ≤ {UNCONTENDED_X_PING}× PING and ≤ the best peer's ratio | {} |
| Uncontended lock + release (memory) | {} | n/a | n/a | — | — | p50 < {} | {} |
",
        u.ping.summary(),
        u.set.summary(),
        ratio(u.set.p50(), ping),
        ours.summary(),
        seed.summary(),
        rslock.summary(),
        met(x <= UNCONTENDED_X_PING && x <= xs.min(xr)),
        m.summary(),
        fmt_ns(MEMORY_NS),
        met(m.p50() < MEMORY_NS),
    )
}

/// Client instructions per uncontended lock + release cycle (callgrind), against the seed.
pub(crate) fn instruction_rows(i: &Instructions) -> String {
    let mut s = String::new();
    for shape in &i.shapes {
        let [ours, seed, rslock] = shape.per_cycle;
        let tasks = match shape.tasks {
            1 => "1 task".to_owned(),
            n => format!("{n} tasks x {} keys", shape.keys),
        };
        let x = ratio(ours, seed);
        let _ = writeln!(
            s,
            "| Client instructions per uncontended lock cycle, {tasks} (callgrind) | {} | {} | {} | \
             the same Redis work per cycle (one SET, one EVALSHA); runs of {} and {} cycles, the \
             difference over {} | {x:.2}× the seed (rslock {:.2}×) | ≤ the seed design's | {} |",
            group(ours),
            group(seed),
            group(rslock),
            shape.cycles,
            3 * shape.cycles,
            2 * shape.cycles,
            ratio(rslock, seed),
            met(ours <= seed),
        );
    }
    s
}

/// Many keys in parallel against the better peer, and Redis server time per cycle.
pub(crate) fn many_rows(t: &Throughput) -> String {
    let mut s = String::new();
    let better = |v: [f64; 3], pick: fn(f64, f64) -> bool| match pick(v[1], v[2]) {
        true => (v[1], Kind::Seed.name()),
        false => (v[2], Kind::Rslock.name()),
    };
    for mk in &t.levels {
        let [ours, seed, rslock] = [0, 1, 2].map(|i| {
            format!(
                "{}; Redis CPU {:.1} µs/cycle; client CPU {:.1} µs/cycle",
                fmt_rate(mk.cycles[i]),
                mk.cpu_us[i],
                mk.client_us[i]
            )
        });
        let set = fmt_rate(mk.redisrs_set);
        let floor = match mk.redis_benchmark {
            Some(b) => format!(
                "context: redis-benchmark SET {} (-c {}); redis-rs SET {set}",
                fmt_rate(b),
                mk.tasks
            ),
            None => format!("context: redis-benchmark not installed; redis-rs SET {set}"),
        };
        let (peer, name) = better(mk.cycles, |a, b| a >= b);
        let x = mk.cycles[0] / peer;
        let _ = writeln!(
            s,
            "| Many keys in parallel, {} tasks (lock cycles/s) | {ours} | {seed} | {rslock} | {floor} | {x:.2}× the better peer ({name}) | ≥ {MANY_KEYS_X_PEER}× the better of seed and rslock | {} |",
            mk.tasks,
            met(x >= MANY_KEYS_X_PEER),
        );
    }
    for p in &t.pinned {
        let [ours, seed, rslock] = p.cycles.map(fmt_rate);
        let (peer, name) = better(p.cycles, |a, b| a >= b);
        let x = p.cycles[0] / peer;
        let _ = writeln!(
            s,
            "| Many keys in parallel, pinned, {} tasks, {}-thread runtime (lock cycles/s) | {ours} | {seed} | {rslock} | redis-server on core 0, each client a process of its own on core 1 (as on separate hosts) | {x:.2}× the better peer ({name}) | ≥ {MANY_KEYS_X_PEER}× the better of seed and rslock | {} |",
            p.tasks,
            p.runtime,
            met(x >= MANY_KEYS_X_PEER),
        );
    }
    let [ours, seed, rslock] = [0, 1, 2].map(|i| {
        let (us, calls) = (t.server_us[i], &t.server_calls[i]);
        format!("{us:.2} µs per cycle (calls per cycle, in-script included: {calls})")
    });
    let (peer, name) = better(t.server_us, |a, b| a <= b);
    let x = t.server_us[0] / peer;
    let _ = writeln!(
        s,
        "| Redis server time per uncontended lock cycle (commandstats usec) | {ours} | {seed} | {rslock} | {} cycles each on fresh keys; the commands the client sent (SET, PTTL, EVALSHA/EVAL), in-script calls counted in their script | {x:.2}× the best peer ({name}) | ≤ the best peer's | {} |",
        group(t.server_n as u64),
        met(t.server_us[0] <= peer),
    );
    s
}

/// The handoff across two processes, the waiter's own part of it, and the speed-up over
/// polling.
pub(crate) fn handoff_rows(h: &[Handoff; 3], f: &HandoffFloors) -> String {
    let [ours, seed, rslock] = h.each_ref().map(|h| match h.discarded {
        0 => h.latencies.summary(),
        n => format!("{}, {n} discarded", h.latencies.summary()),
    });
    let [o, sx, rx] = h.each_ref().map(|h| h.latencies.p50());
    let (sx, rx) = (ratio(sx, o), ratio(rx, o));
    let (ping, woken) = (f.hot_ping.p50(), f.woken.p50());
    let x = ratio(o, woken);
    let wake = &h[0].wake_to_acquired;
    format!(
        "\
| Contended handoff across 2 processes (latency) | {ours} | {seed} | {rslock} | notification floor (SPUBLISH → B's waiting task has the message, no lock): {}; + 1 round trip: p50 {}; PING p50 {} (back to back, between the chunks) | {x:.2}× the notification floor ({:.2}× PING) | p50 ≤ {HANDOFF_X_FLOOR}× the notification floor | {} |
| Handoff: the waiter's own part (notification reached B → B's acquire returned) | {} | n/a | n/a | — | {:.0} % of our handoff p50 | p50 < {} | {} |
| Handoff: speed-up over the polling designs (p50) | 1× | ours is {sx:.0}× faster | ours is {rx:.0}× faster | — | {:.0}× | ≥ {POLLING_SPEEDUP:.0}× faster than both | {} |
",
        f.woken.summary(),
        fmt_ns(f.notified.p50()),
        fmt_ns(ping),
        ratio(o, ping),
        met(x <= HANDOFF_X_FLOOR),
        wake.summary(),
        100.0 * ratio(wake.p50(), o),
        fmt_ns(WAKE_NS),
        met(wake.n() > 0 && wake.p50() < WAKE_NS),
        sx.min(rx),
        met(sx >= POLLING_SPEEDUP && rx >= POLLING_SPEEDUP),
    )
}

/// Hot key: handoffs per design; local hand-off on against off; the wait of a waiter in the
/// other process.
pub(crate) fn hot_rows(hot: &[HotFigures]) -> String {
    let mut s = String::new();
    let mut waiters: Vec<usize> = hot
        .iter()
        .filter(|f| !f.yielding)
        .map(|f| f.waiters)
        .collect();
    waiters.sort_unstable();
    waiters.dedup();
    for processes in [1, 2] {
        let fig = |k: Kind, waiters: usize, local: bool| {
            let mut hot = hot.iter().filter(|f| !f.yielding);
            hot.find(|f| {
                (f.kind, f.processes, f.waiters, f.local_handoff) == (k, processes, waiters, local)
            })
        };
        let p = if processes == 1 { "" } else { "es" };
        for &waiters in &waiters {
            let [ours, seed, rslock] =
                Kind::ALL.map(|k| fig(k, waiters, true).map_or_else(|| "—".to_owned(), handoffs));
            let w = if waiters == 1 { "" } else { "s" };
            let _ = writeln!(
                s,
                "| Hot key, {waiters} waiter{w}, {processes} process{p} | {ours} | {seed} | {rslock} | through Redis: 2 requests per handoff (an acquire or queue attempt + the release) | — | — (the goals are in the rows below) | — |"
            );
            let (Some(on), true) = (fig(Kind::Ours, waiters, true), waiters > 1) else {
                continue;
            };
            if let Some(off) = fig(Kind::Ours, waiters, false) {
                let x = on.handoffs_per_s / off.handoffs_per_s;
                let _ = writeln!(
                    s,
                    "| Hot key, {waiters} waiters, {processes} process{p}: local hand-off on / off | on: {}; off: {} | n/a | n/a | the same scenario with `.local_handoff(false)`, same run | {x:.1}× | ≥ {LOCAL_HANDOFF_X:.0}× the handoffs/s without it | {} |",
                    handoffs(on),
                    handoffs(off),
                    met(x >= LOCAL_HANDOFF_X),
                );
            }
            if processes == 2 {
                let (wait, run) = (&on.remote_wait, on.longest_run);
                let bound = 2 * LOCAL_HOLD.as_nanos() as u64;
                let _ = writeln!(
                    s,
                    "| Hot key, {waiters} waiters, 2 processes: wait of a waiter in the other process | max {} / p99 {} (n={}) per acquisition; longest run of one process: {run} acquisitions (it counts the turns taken before the other process's waiter had queued in Redis too; from then on, at most local_turns) | n/a | n/a | local_turns {LOCAL_TURNS}, local_hold {LOCAL_HOLD:?} | max = {:.2}× local_hold | bounded by local_turns / local_hold: max ≤ 2 × local_hold | {} |",
                    fmt_ns(wait.max()),
                    fmt_ns(wait.p99()),
                    wait.n(),
                    ratio(wait.max(), bound / 2),
                    met(wait.n() > 0 && wait.max() <= bound),
                );
            }
        }
    }
    yielding_rows(hot, &mut s);
    s
}

/// Hot key with an await between release and lock (ours only): on against off in one
/// process; the other process's waiter's wait in two.
fn yielding_rows(hot: &[HotFigures], s: &mut String) {
    let fig = |processes: usize, local: bool| {
        hot.iter()
            .find(|f| f.yielding && (f.processes, f.local_handoff) == (processes, local))
    };
    if let (Some(on), Some(off)) = (fig(1, true), fig(1, false)) {
        let x = on.handoffs_per_s / off.handoffs_per_s;
        let _ = writeln!(
            s,
            "| Hot key, {} waiters, 1 process, `yield_now().await` between release and lock: local hand-off on / off | on: {}; off: {} | n/a | n/a | the same scenario with `.local_handoff(false)`, same run | {x:.1}× | ≥ {LOCAL_HANDOFF_X:.0}× the handoffs/s without it | {} |",
            on.waiters,
            handoffs(on),
            handoffs(off),
            met(x >= LOCAL_HANDOFF_X),
        );
    }
    if let Some(on) = fig(2, true) {
        let (wait, run) = (&on.remote_wait, on.longest_run);
        let bound = 2 * LOCAL_HOLD.as_nanos() as u64;
        let _ = writeln!(
            s,
            "| Hot key, {} waiters, 2 processes, `yield_now().await` between release and lock: wait of a waiter in the other process | {}; max {} / p99 {} (n={}) per acquisition; longest run of one process: {run} acquisitions | n/a | n/a | local_turns {LOCAL_TURNS}, local_hold {LOCAL_HOLD:?} | max = {:.2}× local_hold | bounded by local_turns / local_hold: max ≤ 2 × local_hold | {} |",
            on.waiters,
            handoffs(on),
            fmt_ns(wait.max()),
            fmt_ns(wait.p99()),
            wait.n(),
            ratio(wait.max(), bound / 2),
            met(wait.n() > 0 && wait.max() <= bound),
        );
    }
}

/// A hot-key cell: handoffs/s, acquisitions/s, Redis work per handoff (and ours' local
/// hand-offs).
fn handoffs(f: &HotFigures) -> String {
    let acq = group(f.acquisitions_per_s.round() as u64);
    if f.handoffs_per_s == 0.0 {
        return format!("0 handoffs/s ({acq} acq/s): the waiters starved for the whole window");
    }
    let local = match f.kind {
        Kind::Ours => format!("; {} local hand-offs", group(f.local_handoffs)),
        _ => String::new(),
    };
    format!(
        "{} handoffs/s ({acq} acq/s); {:.1} cmds, {:.1} req per handoff{local}",
        group(f.handoffs_per_s.round() as u64),
        f.commands_per_handoff,
        f.requests_per_handoff
    )
}

pub(crate) fn watchdog_row(w: &Watchdog) -> String {
    let period = w.lease.as_secs_f64() / 3.0;
    let allowed = ((w.window.as_secs_f64() / period).floor() + 1.0) / w.window.as_secs_f64();
    let (ours, rslock) = (w.ours.evalsha_per_s, w.rslock.evalsha_per_s);
    format!(
        "| Watchdog: {} held locks, renewal traffic | {ours:.2} EVALSHA/s ({} cmds/s incl. in-script); stats().renewal_calls {:.2}/s | n/a (no renewal: the lock just expires) | {rslock:.1} EVALSHA/s ({} cmds/s incl. in-script){} | 1 batched call per lease/3 = {:.2}/s (lease {:?}) | rslock sends {:.0}× more calls | one batched call per lease/3 per Locker | {} |\n",
        group(w.locks as u64),
        group(w.ours.commands_per_s.round() as u64),
        w.ours_renewal_calls_per_s,
        group(w.rslock.commands_per_s.round() as u64),
        match w.rslock_lost {
            0 => String::new(),
            lost => format!("; lost {lost} of its locks: a renewal came too late"),
        },
        1.0 / period,
        w.lease,
        rslock / ours.max(1e-9),
        met(ours <= allowed + 1e-9),
    )
}

pub(crate) fn layer_rows(l: &Layer) -> String {
    let bare = l.bare.p50();
    let over = |lat: &Latencies| lat.p50().saturating_sub(bare);
    let mut s = String::new();
    for (what, lat) in [
        ("distinct keys", &l.memory_distinct),
        ("one hot key", &l.memory_hot),
    ] {
        let _ = writeln!(
            s,
            "| Layer overhead per request (memory, {what}) | {} per request (layered {}) | n/a | n/a | bare service p50 {} | {:.1}× the bare service | overhead < {} | {} |",
            fmt_ns(over(lat)),
            lat.summary(),
            fmt_ns(bare),
            ratio(lat.p50(), bare),
            fmt_ns(LAYER_NS),
            met(over(lat) < LAYER_NS),
        );
    }
    let (redis, ping, cycle) = (&l.redis_distinct, l.redis_ping.p50(), l.redis_cycle.p50());
    let x = ratio(redis.p50(), ping);
    let _ = writeln!(
        s,
        "| Layer overhead per request (Redis, distinct keys) | layered {}; the same locker's lock + release p50 {} (interleaved) | n/a | n/a | 2 round trips; PING p50 {} (interleaved) | {x:.2}× PING (lock + release alone {:.2}×; the layer adds {:+.1} µs) | p50 ≤ {LAYER_REDIS_X_PING}× PING | {} |",
        redis.summary(),
        fmt_ns(cycle),
        fmt_ns(ping),
        ratio(cycle, ping),
        (redis.p50() as f64 - cycle as f64) / 1e3,
        met(x <= LAYER_REDIS_X_PING),
    );
    s
}

/// The "Idempotency" rows: a replayed request on memory (overhead over the bare service) and
/// on Redis (against the PING measured beside it).
pub(crate) fn idempotency_rows(i: &Idempotency) -> String {
    let bare = i.bare.p50();
    let (memory, redis) = (&i.memory_replay, &i.redis_replay);
    let over = memory.p50().saturating_sub(bare);
    let ping = i.ping.p50();
    let x = ratio(redis.p50(), ping);
    format!(
        "\
| Idempotency: replayed request, layer overhead (memory) | {} per request (replayed {}) | n/a | n/a | bare service p50 {} | {:.1}× the bare service | overhead < {} | {} |
| Idempotency: replayed request (Redis) | {}; per replay: requests {}, cmds {} | n/a | n/a | 1 round trip; PING p50 {} (same rounds) | {x:.2}× PING | one round trip: p50 ≤ {REPLAY_X_PING}× PING | {} |
",
        fmt_ns(over),
        memory.summary(),
        fmt_ns(bare),
        ratio(memory.p50(), bare),
        fmt_ns(LAYER_NS),
        met(over < LAYER_NS),
        redis.summary(),
        or_none(&i.redis_requests),
        or_none(&i.redis_commands),
        fmt_ns(ping),
        met(x <= REPLAY_X_PING),
    )
}

/// Redis Cluster against one server in the same run: many keys in parallel, and uncontended
/// lock + release against a PING through the cluster connection.
pub(crate) fn cluster_rows(c: &Cluster) -> String {
    let mut s = String::new();
    let servers = PRIMARIES + 1;
    let cell = |(rate, cpu): (f64, f64)| {
        let rate = fmt_rate(rate);
        format!("{rate}; Redis CPU {cpu:.1} µs/cycle (all {servers} servers)")
    };
    for l in &c.levels {
        let x = l.ours[0].0 / l.ours[1].0;
        let set_x = l.set[0].0 / l.set[1].0;
        let _ = writeln!(
            s,
            "| Redis Cluster, {PRIMARIES} primaries: many keys in parallel, {} tasks (lock cycles/s) | {} | n/a | n/a (rslock's cluster mode is not built here) | one redis-server, same run: {}; context: redis-rs SET cluster {} vs one server {} ({set_x:.2}×); **{} cores shared by the client and all {servers} servers** | {x:.2}× one server | > {CLUSTER_X_SINGLE:.0}× one server's cycles/s | {} |",
            l.tasks,
            cell(l.ours[0]),
            cell(l.ours[1]),
            fmt_rate(l.set[0].0),
            fmt_rate(l.set[1].0),
            c.cores,
            met(x > CLUSTER_X_SINGLE),
        );
    }
    let (ping, single_ping) = (c.ping.p50(), c.single_ping.p50());
    let x = ratio(c.ours.p50(), ping);
    let _ = writeln!(
        s,
        "| Redis Cluster, {PRIMARIES} primaries: uncontended lock + release | {} | n/a | n/a | PING through a redis-rs cluster connection to the key's primary: {}; context, one redis-server: lock + release p50 {}, PING p50 {} ({:.2}×) | {x:.2}× cluster PING | p50 ≤ {UNCONTENDED_X_PING}× PING | {} |",
        c.ours.summary(),
        c.ping.summary(),
        fmt_ns(c.single_ours.p50()),
        fmt_ns(single_ping),
        ratio(c.single_ours.p50(), single_ping),
        met(x <= UNCONTENDED_X_PING),
    );
    s
}

/// Redlock on independent servers against one PING round trip, beside rslock's Redlock.
pub(crate) fn redlock_rows(r: &Redlock) -> String {
    let ping = r.ping.p50();
    let [x, xr] = [&r.ours, &r.rslock].map(|l| ratio(l.p50(), ping));
    format!(
        "| Redlock, {REDLOCK_SERVERS} servers: uncontended lock + release | {} | n/a | {} | PING to one server: {}; one PING to each of the {REDLOCK_SERVERS} at once: p50 {} ({:.2}× PING) | {x:.2}× PING (rslock {xr:.2}×) | p50 ≤ {UNCONTENDED_X_PING}× PING and ≤ rslock's ratio | {} |\n",
        r.ours.summary(),
        r.rslock.summary(),
        r.ping.summary(),
        fmt_ns(r.ping_all.p50()),
        ratio(r.ping_all.p50(), ping),
        met(x <= UNCONTENDED_X_PING && x <= xr),
    )
}

/// The etcd table's rows: Range and Put (the floors), uncontended lock + release, the handoff
/// against a watch event, and the watchdog's traffic per tick (beside the Redis watchdog's,
/// when the same run measured it). Columns: scenario, ours, floor, ratio, goal, met?
#[cfg(feature = "etcd")]
pub(crate) fn etcd_rows(e: &Etcd, redis: Option<&Watchdog>) -> String {
    let (range, put) = (e.range.p50(), e.put.p50());
    let r = fmt_ns(range);
    let cycle = e.cycle.p50();
    let (handoff, event) = (e.handoff.p50(), e.watch_event.p50());
    let w = &e.watchdog;
    let ticks = w.ticks();
    let per_tick = |n: u64| n as f64 / ticks;
    let requests = w
        .requests
        .iter()
        .map(|(method, &n)| format!("{method} {:.2}", per_tick(n)));
    let requests = requests.collect::<Vec<_>>().join(", ");
    let keepalives = w.requests.get("LeaseKeepAlive").copied().unwrap_or(0);
    // As the Redis row: one per tick, plus one when the window catches a tick at each end.
    let allowed = ticks.floor() + 1.0;
    let redis = match redis {
        Some(r) => {
            let calls = r.ours.evalsha_per_s * r.lease.as_secs_f64() / 3.0;
            let x = per_tick(w.total_requests()) / calls.max(1e-9);
            format!(
                "; Redis, same run ({} locks, lease {:?}): {calls:.2} EVALSHA per tick, so etcd takes {x:.1}× the requests",
                group(r.locks as u64),
                r.lease,
            )
        }
        None => String::new(),
    };
    format!(
        "\
| etcd: Range round trip (linearizable read) | etcd-client: {} | this is the floor | 1.00× | — | — |
| etcd: Put round trip (one Raft write) | etcd-client: {} | Range p50 {r} | {:.2}× Range | — | — |
| etcd: uncontended lock + release | {}; {:.2} requests per cycle | Range p50 {r}; Put p50 {} | {:.2}× Range ({:.2}× Put) | the ratio to etcd's own round trip | — |
| etcd: contended handoff between two Lockers (latency) | {}; the waiter's requests per handoff {:.2} | watch event (a Put → a watcher on another client has it): {} | {:.2}× the watch event ({:.2}× Range) | against the floor of a watch event | — |
| etcd: watchdog, {} held locks on one Locker, traffic per tick | per tick ({}, lease {:?}): {requests} requests ({:.2} in all), {} renewal calls in {:.1} ticks; on the wire {} B to etcd, {} B back (protobuf bodies: {} B / {} B) | one LeaseKeepAlive per tick{redis} | {:.2} keepalives per tick | one keepalive per tick for all held locks | {} |
",
        e.range.summary(),
        e.put.summary(),
        ratio(put, range),
        e.cycle.summary(),
        e.cycle_calls,
        fmt_ns(put),
        ratio(cycle, range),
        ratio(cycle, put),
        e.handoff.summary(),
        e.handoff_calls,
        e.watch_event.summary(),
        ratio(handoff, event),
        ratio(handoff, range),
        group(w.locks as u64),
        fmt_ns(w.tick().as_nanos() as u64),
        w.lease,
        per_tick(w.total_requests()),
        w.renewal_calls,
        ticks,
        group(per_tick(w.wire.0).round() as u64),
        group(per_tick(w.wire.1).round() as u64),
        group(per_tick(w.payload.0).round() as u64),
        group(per_tick(w.payload.1).round() as u64),
        per_tick(keepalives),
        met(keepalives > 0 && keepalives as f64 <= allowed),
    )
}

/// The ZooKeeper table's rows: exists and set_data (the floors), uncontended lock + release,
/// the handoff against a watch event, and the watchdog's packets per tick. Columns as the etcd
/// table's.
#[cfg(feature = "zookeeper")]
pub(crate) fn zookeeper_rows(z: &ZooKeeper) -> String {
    let (exists, write) = (z.exists.p50(), z.write.p50());
    let e = fmt_ns(exists);
    let cycle = z.cycle.p50();
    let (handoff, event) = (z.handoff.p50(), z.watch_event.p50());
    let w = &z.watchdog;
    let ticks = w.ticks();
    let per_tick = |n: u64| n as f64 / ticks;
    // One multi-read per tick (one more when the window catches a tick at each end), plus
    // the client's pings: at most one per third of the 10 s session timeout.
    let pings = w.window.as_secs_f64() / (10.0 / 3.0) + 1.0;
    let allowed = ticks.floor() + 1.0 + pings.floor();
    format!(
        "\
| ZooKeeper: exists round trip (read) | zookeeper-client: {} | this is the floor | 1.00× | — | — |
| ZooKeeper: set_data round trip (one write) | zookeeper-client: {} | exists p50 {e} | {:.2}× exists | — | — |
| ZooKeeper: uncontended lock + release | {}; {:.2} requests per cycle | exists p50 {e}; set_data p50 {} | {:.2}× exists ({:.2}× set_data) | the ratio to ZooKeeper's own round trip | — |
| ZooKeeper: contended handoff between two Lockers (latency) | {}; the waiter's requests per handoff {:.2} | watch event (a set_data → another session's one-shot watch fires): {} | {:.2}× the watch event ({:.2}× exists) | against the floor of a watch event | — |
| ZooKeeper: watchdog, {} held locks on one Locker, traffic per tick | per tick ({}, lease {:?}): {:.2} packets received by the server (zk_packets_received), {} renewal calls in {:.1} ticks; on the wire {} B to ZooKeeper, {} B back | one multi-read per tick, plus the session's pings | {:.2} packets per tick | one request per tick for all held locks | {} |
",
        z.exists.summary(),
        z.write.summary(),
        ratio(write, exists),
        z.cycle.summary(),
        z.cycle_calls,
        fmt_ns(write),
        ratio(cycle, exists),
        ratio(cycle, write),
        z.handoff.summary(),
        z.handoff_calls,
        z.watch_event.summary(),
        ratio(handoff, event),
        ratio(handoff, exists),
        group(w.locks as u64),
        fmt_ns(w.tick().as_nanos() as u64),
        w.lease,
        per_tick(w.packets),
        w.renewal_calls,
        ticks,
        group(per_tick(w.wire.0).round() as u64),
        group(per_tick(w.wire.1).round() as u64),
        per_tick(w.packets),
        met(w.renewal_calls > 0 && w.packets as f64 <= allowed),
    )
}

/// The report's ZooKeeper section: what is measured, the table, how to read it and rerun it,
/// and (with etcd measured too) the three backends side by side.
#[cfg(feature = "zookeeper")]
fn zookeeper_section(r: &Results, rows: &str) -> String {
    let z = &r.zookeeper;
    let w = &z.watchdog;
    let p = &r.plan;
    let per_tick = |n: u64| n as f64 / w.ticks();
    format!(
        "\
One ZooKeeper {} standalone server started by the bench (the test kit's
`ZooKeeperEnsemble::start_single`: loopback port, data in a temporary directory), on the same
{} cores as the bench and every other server of the run. Ours is
`Locker::builder(ZooKeeperBackend::builder(..).session_timeout(10 s).connect())` with a 7 s
lease (at most three quarters of the session timeout); its floors are measured in this process
with sessions of `zookeeper-client` (the client lock-core uses), on the same server, in the
same run.

| Scenario | ours (lock-core) | ZooKeeper's floor, same run | ratio | goal | met? |
|---|---|---|---|---|---|
{rows}
- **Uncontended**: as etcd's, over 16 keys in {rounds} interleaved rounds of {per_round}: an
  `exists` of one node (the read floor), a `set_data` of one node (one write), then lock +
  release: the contender node created, then deleted (two writes).
- **Handoff**: as etcd's: B's contender node is seen in the lock's container by a children
  watch before the random {h0:?}-{h1:?} hold and A's release. The floor: a `set_data` by one
  session → another session's one-shot `exists` watch has fired, after the same random idle.
  Both in {chunks} interleaved chunks, {n} samples each. B is woken by its watch on the node
  just ahead of it (Curator's recipe).
- **Watchdog**: {locks} locks held on one `Locker` with a {lease:?} lease for {window:?}, as
  etcd's. The packets are the difference of the server's own `zk_packets_received` (four-letter
  `mntr`) before and after: every request and ping of every session, and only the `Locker`'s
  session is open then. The backend renews all held locks with one multi-read per tick
  (`getData` of each contender node, up to 1,000 per request), and the client pings when the
  session has been idle for a third of its timeout.
- **Reading them**: an uncontended lock + release costs {cycle_x:.1} `exists` round trips
  ({cycle_w:.1} `set_data`s): its contender node is created and deleted, two writes. A waiter is woken by the delete of the
  node ahead of it, so its handoff is {handoff_x:.2}× the watch event. The watchdog sends
  {packets:.2} packets per tick for {locks} locks ({bytes} bytes on the wire): one request
  whatever the number of locks, as on Redis, where etcd needs one per 128 locks.
- Rerun: `cargo run --release -p lock-bench --features zookeeper -- --only zookeeper` prints
  these rows (a partial run), or the full run with `--features zookeeper` writes this file;
  Java and ZooKeeper's jars must be where the test kit finds them.
{summary}",
        z.version.split(',').next().unwrap_or_default(),
        r.machine.nproc,
        rounds = p.rounds,
        per_round = p.zk_latency_n / p.rounds,
        h0 = p.hold.0,
        h1 = p.hold.1,
        chunks = crate::scenarios::CHUNKS,
        n = z.handoff.n(),
        locks = group(w.locks as u64),
        lease = w.lease,
        window = w.window,
        cycle_x = ratio(z.cycle.p50(), z.exists.p50()),
        cycle_w = ratio(z.cycle.p50(), z.write.p50()),
        handoff_x = ratio(z.handoff.p50(), z.watch_event.p50()),
        packets = per_tick(w.packets),
        bytes = group(per_tick(w.wire.0 + w.wire.1).round() as u64),
        summary = backends_side_by_side(r),
    )
}

/// Redis, etcd and ZooKeeper side by side, from this run's figures (p50s).
#[cfg(all(feature = "zookeeper", feature = "etcd"))]
fn backends_side_by_side(r: &Results) -> String {
    let (u, e, z) = (&r.uncontended.0, &r.etcd, &r.zookeeper);
    let ours = u.lock_release.iter().find(|(k, _)| *k == Kind::Ours);
    let redis_cycle = ours.map_or(0, |(_, l)| l.p50());
    let (redis_handoff, redis_floor) =
        (r.handoffs[0].latencies.p50(), r.handoff_floors.woken.p50());
    let rw = &r.watchdog;
    let redis_calls = rw.ours.evalsha_per_s * rw.lease.as_secs_f64() / 3.0;
    let (ew, zw) = (&e.watchdog, &z.watchdog);
    let etcd_requests = ew.total_requests() as f64 / ew.ticks();
    let zk_packets = zw.packets as f64 / zw.ticks();
    let cell = |ns: u64, floor: u64| format!("{} ({:.2}×)", fmt_ns(ns), ratio(ns, floor));
    format!(
        "
### Redis, etcd and ZooKeeper side by side (this run, p50)

| | Redis | etcd | ZooKeeper |
|---|---|---|---|
| read round trip (the floor) | PING {} | linearizable Range {} | exists {} |
| uncontended lock + release (× that floor) | {} | {} | {} |
| contended handoff (× the store's notification floor) | {} | {} | {} |
| watchdog requests per tick, 1,000 held locks | {redis_calls:.2} | {etcd_requests:.2} | {zk_packets:.2} (pings included) |

The Redis handoff is across two processes against a notification reaching the waiting task;
etcd's and ZooKeeper's are between two `Locker`s of one process against a watch event.
",
        fmt_ns(u.ping.p50()),
        fmt_ns(e.range.p50()),
        fmt_ns(z.exists.p50()),
        cell(redis_cycle, u.ping.p50()),
        cell(e.cycle.p50(), e.range.p50()),
        cell(z.cycle.p50(), z.exists.p50()),
        cell(redis_handoff, redis_floor),
        cell(e.handoff.p50(), e.watch_event.p50()),
        cell(z.handoff.p50(), z.watch_event.p50()),
    )
}

#[cfg(all(feature = "zookeeper", not(feature = "etcd")))]
fn backends_side_by_side(_: &Results) -> String {
    String::new()
}

/// The report's etcd section: what is measured, the table, how to read it and rerun it.
#[cfg(feature = "etcd")]
fn etcd_section(r: &Results, rows: &str) -> String {
    let e = &r.etcd;
    let w = &e.watchdog;
    let p = &r.plan;
    format!(
        "\
One etcd {} member started by the bench (the test kit's `EtcdCluster::start_single`: loopback
ports, data on tmpfs, heartbeat 25 ms, election timeout 250 ms), on the same {} cores as the
bench and every other server of the run. Ours is `Locker::builder(EtcdBackend::connect(..))`
with lock-core's defaults; its floors are measured in this process with `etcd-client` (the
client lock-core uses, with its connection options), on the same member, in the same run.

| Scenario | ours (lock-core) | etcd's floor, same run | ratio | goal | met? |
|---|---|---|---|---|---|
{rows}
- **Uncontended**: one task locks and releases (lease 30 s, watchdog on) over 16 keys, in
  {rounds} interleaved rounds (each measures a linearizable `Range` of one key, a `Put` of one
  key, then lock + release, {per_round} each) after a warm-up round. A lock + release is two
  Raft writes (the contender key created in a transaction, then deleted), so about 2× a `Put`
  is its floor; the `Range` is etcd's cheapest round trip. *Requests per cycle* is
  `LockerStats::backend_calls`.
- **Handoff**: locker A holds the lock; locker B (another `Locker`, its own client) waits for
  it; once B's contender key is in etcd (seen by a watch on the lock's queue) and a random
  {h0:?}-{h1:?} hold has passed, A releases. Latency = A's release call → B's lock returned
  (one process, one clock). The floor: a `Put` call → a watcher on a client of its own has
  the event, after the same random idle. Both in {chunks} interleaved chunks, {n} samples
  each. B is woken by the watch on the key ahead of it, as in etcd's own mutex recipe; its
  requests per handoff are its lock and its release (`LockerStats::backend_calls`).
- **Watchdog**: {locks} locks held on one `Locker` with a {lease:?} lease (the watchdog's tick
  is a third of it) for {window:?}, starting half a tick after a renewal. The requests are the
  difference of etcd's own `grpc_server_msg_received_total` (by method: each keepalive is one
  `LeaseKeepAlive` stream message) read from its `/metrics` before and after; the bytes on the
  wire are what a test-kit proxy between the `Locker` and etcd forwarded (HTTP/2 frames and
  headers included), the protobuf bodies are etcd's
  `etcd_network_client_grpc_{{received,sent}}_bytes_total`. Per tick the backend sends one
  keepalive per lease length in use and reads the held keys (each lock gets its own verdict)
  in transactions of at most 128 reads (etcd's `--max-txn-ops`): 1 + ⌈{locks}/128⌉ = {floor}
  requests for {locks} locks; and at most once a third of the etcd lease (a second longer than
  the lock's) its orphan sweep lists the lease's keys with one `LeaseTimeToLive`.
- **Reading them**: an uncontended lock + release costs {cycle_x:.1} `Range` round trips
  ({cycle_put:.1} `Put`s; on Redis in this run {redis_x:.2} PINGs): both of its requests are
  writes through Raft. A waiter is woken by the watch event of the key ahead of it and holds
  the lock then, so its handoff is {handoff_x:.2}× that event: the event is the whole floor.
  The keepalive stays one per tick whatever the number of locks, but the per-lock reads grow
  with it: {requests:.1} requests and {bytes} bytes on the wire per tick for {locks} locks,
  where the Redis watchdog sends one call.
- Rerun: `cargo run --release -p lock-bench --features etcd -- --only etcd` prints these rows
  (a partial run), or the full run with `--features etcd` writes this file; `etcd` and
  `protoc` must be installed (the README's test command installs them).
",
        e.version,
        r.machine.nproc,
        rounds = p.rounds,
        per_round = p.etcd_latency_n / p.rounds,
        h0 = p.hold.0,
        h1 = p.hold.1,
        chunks = crate::scenarios::CHUNKS,
        n = e.handoff.n(),
        locks = group(w.locks as u64),
        floor = 1 + w.locks.div_ceil(128),
        lease = w.lease,
        window = w.window,
        cycle_x = ratio(e.cycle.p50(), e.range.p50()),
        cycle_put = ratio(e.cycle.p50(), e.put.p50()),
        redis_x = {
            let u = &r.uncontended.0;
            let ours = u.lock_release.iter().find(|(k, _)| *k == Kind::Ours);
            ratio(ours.map_or(0, |(_, l)| l.p50()), u.ping.p50())
        },
        handoff_x = ratio(e.handoff.p50(), e.watch_event.p50()),
        requests = w.total_requests() as f64 / w.ticks(),
        bytes = group(((w.wire.0 + w.wire.1) as f64 / w.ticks()).round() as u64),
    )
}

fn or_none(s: &str) -> &str {
    if s.is_empty() { "none" } else { s }
}

fn diagnostics(r: &Results) -> String {
    let ((u, m), h) = (&r.uncontended, &r.handoffs[0]);
    format!(
        "\
| measurement | figure |
|---|---|
| Redis: ours, acquire only | {} |
| Redis: ours, release only | {} |
| handoff (ours): A's release round trip | {} |
| handoff (ours): A sends release → notification reaches process B | {} |
| layer on Redis: requests per layered request by command | {} |
| memory: acquire only | {} |
| memory: release only | {} |
",
        u.ours_acquire.summary(),
        u.ours_release.summary(),
        h.release_rtt.summary(),
        h.delivery.summary(),
        r.layer.redis_requests,
        m.acquire.summary(),
        m.release.summary(),
    )
}

fn method(r: &Results) -> String {
    let p = &r.plan;
    format!(
        "\
- **Same client, same Redis, same run.** The floor (PING, SET) is measured with redis-rs's
  `ConnectionManager`, configured as lock-core configures its own; the seed design uses the
  same; rslock uses its own redis-rs multiplexed connection. Latencies are measured in {rounds}
  interleaved rounds (each round measures every operation in turn) after a warm-up round, so
  background load hits all of them alike. p50/p99 are nearest-rank over the `n` samples shown
  (kept in an HDR histogram: 3 significant digits).
- **Uncontended**: one task, lock then release, cycling over 16 keys; ours with its defaults
  (watchdog on). Met when ours' p50 is at most {UNCONTENDED_X_PING}× PING and at most the best
  peer's ratio to the same PING. The memory backend runs the same loop on a memory `Locker`.
- **Many keys, pinned**: the same loop with the redis-server's threads on core 0 and each
  design's client a process of its own (`lock-bench --rate`, started under `taskset -c 1`) on
  core 1, as on separate hosts, so that the client's cost decides its rate; on a
  current-thread and on a multi-thread tokio runtime, in {passes} windows of
  {run:?}/{passes} per design after {warm:?} of warm-up, the designs in turn; the median window.
  The server's affinity is given back to every core afterwards. Only on a server the bench
  started (a given one cannot be pinned).
- **Client instructions per cycle**: `valgrind --tool=callgrind` counts the instructions of the
  client process (every thread; not the redis-server), which is the same count however busy
  the machine is. Each design runs `lock-bench --cycles DESIGN N TASKS KEYS` (uncontended lock +
  release cycles on a current-thread runtime, each task on keys of its own, the seed design and
  rslock as in the other rows, ours with its defaults) twice, with N and 3N cycles: the
  difference over 2N cancels start-up, connecting and the warm-up. To reproduce, or to read the
  profiles with `callgrind_annotate`: `bash bench/callgrind.sh` (it keeps them under
  `target/callgrind/`). Met when ours is at most the seed design's count in the same shape.
- **Many keys**: `c` tasks on one locker (ours: one `Locker`, one connection), each locking and
  releasing its own 4 keys in a loop; each contender runs {passes} windows of {run:?}/{passes}
  (after {warm:?} of warm-up each), in turn, and the median window is reported. The goal is a
  ratio to the better of seed and rslock in the same windows; `redis-benchmark -t set -c c`
  (c connections, no pipelining; mean of a run before and one after the windows) and
  redis-rs SET with `c` tasks on one connection are context. *Redis CPU* = the delta of
  `INFO cpu` `used_cpu_sys` + `used_cpu_user` over the measured window ÷ the cycles in it
  (median window); *client CPU* = the same for the bench process itself (user + sys of all
  its threads, `/proc/self/stat`, in 10 ms ticks): with the client and Redis on the same
  cores, a design's cycles/s is bounded by the two together.
- **Server time per lock cycle**: each design locks and releases {server_n} fresh keys (never
  used before), one at a time, in {rounds} interleaved rounds between `INFO commandstats`
  snapshots; the figure is the usec of the commands the client sent (`SET`, ours' pipelined
  `PTTL`, `EVALSHA`/`EVAL`) ÷ cycles. A script's usec already includes the calls it makes,
  which commandstats also lists under their own names (`GET`, `DEL`, `LINDEX`): those are not
  added again.
- **Handoff across 2 processes**: the bench (A) holds the key and tells a child process (B, this
  binary in a hidden child mode) to wait for it; A releases after a random {h0:?}-{h1:?} hold (so a
  polling waiter is at a random phase of its sleep). Latency = B's acquire returned − the instant
  before A sent its release, both read from `CLOCK_MONOTONIC` (one system-wide clock on Linux;
  error: two ~30 ns clock reads plus NTP slew ≤ 500 ppm, i.e. < 0.1 µs on these figures). A
  sample where B had not started waiting before A released is discarded and counted.
  rslock waits with its default retry loop (`acquire`: 3 tries 0-200 ms apart, looped).
  The goal is a ratio to the *notification floor*, measured in chunks interleaved with ours:
  A sends SPUBLISH after the same random idle, and B, a redis-rs RESP3 subscriber, has the
  message in its waiting task (no lock at all); *+ 1 round trip* is that plus one PING, the
  floor of a waiter that must acquire after being woken. Ours needs no round trip after the
  message: the release hands the lock to B's queued waiter inside the script. The floor has
  as many samples as ours; PINGs are taken in the same chunks, back to back (context). *The waiter's own part*
  comes from a separate pass of ours (half as many samples, after the chunks) with an
  independent observer subscription to the lock's release channel in B: notification
  reached B (observer) → B's acquire returned; the same pass splits off the delivery (A's
  release sent → notification in B, diagnostics). The main figures are taken without the
  observer, since a second subscriber in B adds wake-ups of its own.
- **Hot key**: W+1 tasks lock/release one key in a loop ({hot:?} measured after {hot_warm:?});
  with 2 processes the tasks are split between the bench and a child. A *handoff* is an
  acquisition by a different task than the previous one (acquisitions from both processes are
  merged on the shared clock; a local hand-off counts); a polling design's releaser often
  takes the lock straight back, which counts as an acquisition only. *cmds* = every call in
  `INFO commandstats` (commands run inside Lua scripts included, the bench's own INFO
  excluded); *req* = requests a client sent, i.e. round trips: for the peers from `INFO
  commandstats` (EVALSHA, SET, PING, …); for ours from lock-core's own count
  (`LockerStats::backend_calls`, both processes), because its scripts run SET inside, which
  commandstats cannot tell apart from a client's SET. *local hand-offs* =
  `LockerStats::local_handoffs` over the window, both processes. Ours runs with local
  hand-off on (`local_turns` {turns}, `local_hold` {hold:?}, lock-core's defaults, set
  explicitly); with one process and W > 1 the same scenario runs again right after with
  `.local_handoff(false)`, and *on / off* is the ratio of the two handoffs/s. With 2 processes,
  each child task reads the shared clock just before its lock call and when it returns: the
  *wait of a waiter in the other process* is that span per acquisition in the window (max and
  p99); *longest run* is the most acquisitions in a row by tasks of one process. Met when the
  max wait is at most 2 × `local_hold` (the other process's turn, then its own local queue
  ahead of it) and no run is longer than `local_turns` + 1 (the backend acquisition, then
  `local_turns` local turns).
- **Watchdog**: {locks} locks held with a {lease:?} lease for {window:?}; Redis calls counted with
  `INFO commandstats` over the window (all acquired before it starts); ours also from
  `locker.stats().renewal_calls`. rslock renews through `LockManager::using` (one call per lock
  when its validity is 500 ms from running out).
- **Idempotency replay**: lock-tower's `IdempotencyLayer` (`.ttl(10 min)`, `.wait(5 s)`) in
  front of a handler that counts its runs; `POST /payments` with a 6-byte body and an
  `Idempotency-Key` cycling over 256 keys, each answered once before the clock starts, so every
  timed request is a replay (checked: `Idempotent-Replayed: true` on every answer, the handler
  ran once per key). One request at a time, its body read to the end. Memory: p50 of `n`
  replays after a tenth as warm-up; overhead = p50 replayed − p50 of the bare handler on the
  same requests, as the layer rows. Redis: replays and back-to-back PINGs in {rounds}
  interleaved rounds; the goal *one round trip* is met when the replay's p50 is at most
  {REPLAY_X_PING}× the PING p50 of the same rounds (a replay is one `EVALSHA` reading the
  record; the slack covers the layer's hashing and the script's work, while a second round
  trip would be ≥ 2×). Requests and commands per replay are `INFO commandstats` deltas around
  the replay rounds only (*cmds* includes calls inside the script).
- **Layer on Redis**: the same `LockLayer` on a Redis `Locker`, key after key: a layered
  request on a distinct key, the same locker's bare lock + release on that key, a PING, so
  the three p50s are comparable; the goal is the layered p50 over the PING p50. Requests per
  layered request: `INFO commandstats` around the warm-up requests.
- **Redis Cluster**: the bench starts {PRIMARIES} primaries (no replicas) with the test kit's
  `RedisCluster` and one more redis-server (same options, no cluster mode), all on this
  machine: **its {nproc} cores run the bench's client and every server at once**, so 3 shards
  cannot have 3 times the CPU of one; the figures show what sharding costs and gives here, not
  on separate hosts. Ours is `Locker::redis_cluster(&urls)` against `Locker::redis(url)`
  (both lock-core's defaults: lease 30 s, watchdog on). Many keys: the many-keys loop above at
  {tasks:?} tasks (keys `mk:<task>:<i>`, spread over the 16384 slots by their hash tag), the
  contenders in turn for {passes} windows each, median window; *Redis CPU* is summed over
  every server of the section (the idle ones add their idle ticks). redis-rs SET with the same
  tasks on one cluster connection against one `ConnectionManager` is context: the ratio the
  client and servers give without a lock. Uncontended: one task, lock then release over 16
  keys, in {rounds} interleaved rounds with a PING through a redis-rs cluster connection
  (RESP2, as lock-core's command connection) routed to the primary that serves the key's slot
  (unrouted, redis-rs sends PING to every primary), and the same two on the one server.
- **Redlock**: {servers} independent redis-servers started by the bench (no persistence: a
  bench, not a deployment; see the guide's Redlock chapter on restarts). Ours is `Locker::redlock(&urls)`
  (lock-core's defaults); rslock's is `LockManager::new(urls)` on the same servers (lease 30 s),
  both lock then release over 16 keys in {rounds} interleaved rounds with a PING to one server
  (the goal's round trip) and one PING to each server at once, polled together on one task
  (context: the floor of one fanned-out round).
- Speed claims live here, never in tests; CI only runs `--quick` to keep the harness alive (quick
  figures are not meaningful).
",
        rounds = p.rounds,
        run = p.throughput_run,
        passes = p.throughput_passes,
        warm = p.throughput_warm,
        h0 = p.hold.0,
        h1 = p.hold.1,
        hot = p.hot_run,
        hot_warm = p.hot_warm,
        locks = p.watchdog_locks,
        server_n = r.many.server_n,
        turns = LOCAL_TURNS,
        hold = LOCAL_HOLD,
        lease = p.watchdog_lease,
        window = p.watchdog_window,
        nproc = r.machine.nproc,
        tasks = CLUSTER_TASKS,
        servers = REDLOCK_SERVERS,
    )
}

pub(crate) fn render(r: &Results, svg_name: &str) -> String {
    let m = &r.machine;
    let rows = results(r);
    #[cfg(feature = "etcd")]
    let (etcd, etcd_headline) = {
        let rows = etcd_rows(&r.etcd, Some(&r.watchdog));
        (etcd_section(r, &rows), headline(&rows))
    };
    #[cfg(not(feature = "etcd"))]
    let (etcd, etcd_headline) = (
        "Not measured: this binary was built without the `etcd` feature (`--features etcd`).\n"
            .to_owned(),
        String::new(),
    );
    #[cfg(feature = "zookeeper")]
    let (zookeeper, zk_headline) = {
        let rows = zookeeper_rows(&r.zookeeper);
        (zookeeper_section(r, &rows), headline(&rows))
    };
    #[cfg(not(feature = "zookeeper"))]
    let (zookeeper, zk_headline) = (
        "Not measured: this binary was built without the `zookeeper` feature \
         (`--features zookeeper`).\n"
            .to_owned(),
        String::new(),
    );
    let features = match (cfg!(feature = "etcd"), cfg!(feature = "zookeeper")) {
        (true, true) => " --features etcd,zookeeper",
        (true, false) => " --features etcd",
        (false, true) => " --features zookeeper",
        (false, false) => "",
    };
    let mode = match r.plan.quick {
        true => "quick (CI smoke run: figures NOT meaningful)",
        false => "full",
    };
    format!(
        "\
# Benchmarks

Measured by `cargo run --release -p lock-bench --bin lock-bench{features}` ({mode} mode). Every figure is taken on the same Redis in the same run; ratios compare with the round trip measured then. Goals come from `DESIGN.md` (\"Performance goals\").

## Machine

| | |
|---|---|
| CPU | {} × {} (nproc) |
| OS | {} |
| redis-server | {} — {} |
| rustc | {} |
| source | {} |
| mode | {mode} |
| date | {} |
| load average (1/5/15 min) | start {} — end {} (the machine is shared; other builds may run) |
| run time | {:.1} s |

## Headline

Each goal of DESIGN.md, the ratio this run measured, and the verdict. The figures behind each
row are in All figures below; analyses of where the time goes, run by run, are in
[bench/NOTES.md](bench/NOTES.md). This file is written by the bench, never by hand.

| Scenario | ratio | goal | verdict |
|---|---|---|---|
{}{etcd_headline}{zk_headline}
## Handoff latency distributions

![handoff latency CDFs: ours vs seed polling vs rslock]({svg_name})

## All figures

| Scenario | ours (lock-core) | seed: SET NX + 10 ms sleep | rslock 0.10 | floor | ratio | goal | met? |
|---|---|---|---|---|---|---|---|
{}
## etcd

{etcd}
## ZooKeeper

{zookeeper}
## Diagnostics (where the time goes)

{}
## Method

{}",
        m.cpu,
        m.nproc,
        m.kernel,
        m.redis_version,
        m.redis_where,
        m.rustc,
        m.tree,
        m.date,
        m.load_start,
        m.load_end,
        r.elapsed.as_secs_f64(),
        headline(&rows),
        rows,
        diagnostics(r),
        method(r),
    )
}

/// Writes the report to `out` (and stdout) and the handoff plot next to it, as
/// `<stem>-handoff.svg`.
pub(crate) fn write(r: &Results, out: &Path) -> Result<()> {
    let stem = out
        .file_stem()
        .map_or_else(|| "BENCHMARKS".into(), |s| s.to_string_lossy());
    let svg_name = format!("{stem}-handoff.svg");
    let svg = out.with_file_name(&svg_name);
    let markdown = render(r, &svg_name);
    std::fs::write(out, &markdown).map_err(|e| format!("cannot write {}: {e}", out.display()))?;
    {
        use std::io::Write as _;
        let mut stdout = std::io::stdout().lock();
        let _ = stdout.write_all(markdown.as_bytes());
        let _ = stdout.flush();
    }
    let names = [
        "ours (lock-core)",
        "seed: SET NX + 10 ms sleep",
        "rslock 0.10 (default retry loop)",
    ];
    let colors = ["#1f77b4", "#d62728", "#2ca02c"];
    let series = r
        .handoffs
        .each_ref()
        .map(|h| &h.latencies)
        .into_iter()
        .zip(names.into_iter().zip(colors));
    let series: Vec<Series<'_>> = series
        .map(|(l, (name, color))| {
            let (p50, p99, n) = (fmt_ns(l.p50()), fmt_ns(l.p99()), l.n());
            let label = format!("{name}: p50 {p50}, p99 {p99} (n={n})");
            Series {
                label,
                color,
                cdf: l.cdf(),
            }
        })
        .collect();
    // The PING taken between the handoff chunks, as the handoff row's ratio uses.
    let (ping, woken) = (
        r.handoff_floors.hot_ping.p50(),
        r.handoff_floors.woken.p50(),
    );
    let markers = [
        (format!("PING p50 {}", fmt_ns(ping)), ping),
        (
            format!("notification floor, no lock: p50 {}", fmt_ns(woken)),
            woken,
        ),
        (
            format!("goal {HANDOFF_X_FLOOR}× the notification floor"),
            (woken as f64 * HANDOFF_X_FLOOR) as u64,
        ),
    ];
    let markers = markers.map(|(label, at_ns)| Marker { label, at_ns });
    let mode = if r.plan.quick { "quick" } else { "full" };
    let title = format!(
        "Contended handoff across two processes ({mode} mode, {})",
        r.machine.date
    );
    std::fs::write(&svg, cdf_chart(&title, &series, &markers))
        .map_err(|e| format!("cannot write {}: {e}", svg.display()))?;
    progress(&format!("wrote {} and {}", out.display(), svg.display()));
    Ok(())
}
