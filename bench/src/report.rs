//! The Markdown report (`BENCHMARKS.md`): the results table (one row per scenario, with the
//! peers, the floor, the ratio and the goal), the diagnostics and the method; and the handoff
//! plot next to it. Each section is written as the Markdown it renders to.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use crate::designs::Kind;
use crate::machine::Machine;
use crate::scenarios::{
    Handoff, HandoffFloors, HotFigures, Idempotency, Layer, ManyKeys, Memory, Plan, Uncontended,
    Watchdog,
};
use crate::stats::{Latencies, fmt_ns, fmt_rate, group};
use crate::svg::{Marker, Series, cdf_chart};
use crate::{Result, progress};

/// Goals from DESIGN.md.
const UNCONTENDED_X_PING: f64 = 2.2;
const HANDOFF_X_PING: f64 = 2.5;
const MANY_KEYS_SHARE: f64 = 0.40;
const POLLING_SPEEDUP: f64 = 20.0;
const MEMORY_NS: u64 = 2_000;
const LAYER_NS: u64 = 5_000;
/// A replay on Redis is one round trip: met while its p50 is at most this many PING p50s
/// (PING measured in the same rounds; the slack is the layer's own work and the script).
const REPLAY_X_PING: f64 = 1.5;

/// Everything one run measured.
#[derive(Debug)]
pub(crate) struct Results {
    pub(crate) machine: Machine,
    pub(crate) plan: Plan,
    pub(crate) uncontended: Uncontended,
    pub(crate) memory: Memory,
    pub(crate) many: Vec<ManyKeys>,
    /// Ours, seed and rslock, in this order.
    pub(crate) handoffs: [Handoff; 3],
    /// The floors measured beside our handoff.
    pub(crate) handoff_floors: HandoffFloors,
    pub(crate) hot: Vec<HotFigures>,
    pub(crate) watchdog: Watchdog,
    pub(crate) layer: Layer,
    pub(crate) idempotency: Idempotency,
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
    let (u, m) = (&r.uncontended, &r.memory.lock_release);
    let ping = u.ping.p50();
    let p = fmt_ns(ping);
    let [ours, seed, rslock] = Kind::ALL.map(|k| {
        let mut designs = u.lock_release.iter();
        designs
            .find(|(kind, _)| *kind == k)
            .map(|(_, l)| l.clone())
            .unwrap_or_default()
    });
    let [x, xs, xr] = [&ours, &seed, &rslock].map(|l| ratio(l.p50(), ping));
    let mut s = format!(
        "\
| Baseline: PING round trip | redis-rs ConnectionManager: {} | — | — | this is the floor | 1.00× | — | — |
| Baseline: SET round trip | redis-rs ConnectionManager: {} | — | — | PING p50 {p} | {:.2}× PING | — | — |
| Uncontended lock + release (Redis) | {} | {} | {} | 2 round trips; PING p50 {p} | {x:.2}× PING (seed {xs:.2}×, rslock {xr:.2}×) | p50 ≤ {UNCONTENDED_X_PING}× PING | {} |
| Uncontended lock + release (memory) | {} | n/a | n/a | — | — | p50 < {} | {} |
",
        u.ping.summary(),
        u.set.summary(),
        ratio(u.set.p50(), ping),
        ours.summary(),
        seed.summary(),
        rslock.summary(),
        met(x <= UNCONTENDED_X_PING),
        m.summary(),
        fmt_ns(MEMORY_NS),
        met(m.p50() < MEMORY_NS),
    );
    for mk in &r.many {
        let [ours, seed, rslock] = Kind::ALL.map(|k| {
            let mut cycles = mk.cycles.iter();
            cycles.find(|(kind, _)| *kind == k).map_or(0.0, |c| c.1)
        });
        let (set, of_set) = (fmt_rate(mk.redisrs_set), 100.0 * ours / mk.redisrs_set);
        let (floor, x, ok) = match mk.redis_benchmark {
            Some(b) => (
                format!(
                    "redis-benchmark SET {} (-c {}); redis-rs SET {set}",
                    fmt_rate(b),
                    mk.tasks
                ),
                format!(
                    "{:.0} % of redis-benchmark SET ({of_set:.0} % of redis-rs SET)",
                    100.0 * ours / b
                ),
                met(ours / b >= MANY_KEYS_SHARE),
            ),
            None => (
                format!("redis-benchmark not installed; redis-rs SET {set}"),
                format!("{of_set:.0} % of redis-rs SET"),
                "—",
            ),
        };
        let _ = writeln!(
            s,
            "| Many keys in parallel, {} tasks (lock cycles/s) | {} | {} | {} | {floor} | {x} | ≥ {:.0} % of redis-benchmark SET | {ok} |",
            mk.tasks,
            fmt_rate(ours),
            fmt_rate(seed),
            fmt_rate(rslock),
            MANY_KEYS_SHARE * 100.0,
        );
    }
    handoff_rows(r, &mut s, &p);
    hot_rows(r, &mut s);
    let w = &r.watchdog;
    let period = w.lease.as_secs_f64() / 3.0;
    let allowed = ((w.window.as_secs_f64() / period).floor() + 1.0) / w.window.as_secs_f64();
    let (ours, rslock) = (w.ours.evalsha_per_s, w.rslock.evalsha_per_s);
    let l = &r.layer;
    let bare = l.bare.p50();
    let over = |lat: &Latencies| lat.p50().saturating_sub(bare);
    let (distinct, hot, redis) = (&l.memory_distinct, &l.memory_hot, &l.redis_distinct);
    let _ = write!(
        s,
        "\
| Watchdog: {} held locks, renewal traffic | {ours:.2} EVALSHA/s ({} cmds/s incl. in-script); stats().renewal_calls {:.2}/s | n/a (no renewal: the lock just expires) | {rslock:.1} EVALSHA/s ({} cmds/s incl. in-script) | 1 batched call per lease/3 = {:.2}/s (lease {:?}) | rslock sends {:.0}× more calls | one batched call per lease/3 per Locker | {} |
| Layer overhead per request (memory, distinct keys) | {} per request (layered {}) | n/a | n/a | bare service p50 {} | {:.1}× the bare service | overhead < {} | {} |
| Layer overhead per request (memory, one hot key) | {} per request (layered {}) | n/a | n/a | bare service p50 {} | {:.1}× the bare service | overhead < {} | {} |
| Layer overhead per request (Redis, distinct keys) | {} per request (layered {}) | n/a | n/a | 2 round trips; PING p50 {p} | {:.2}× PING | — (the lock's own two round trips) | — |
",
        group(w.locks as u64),
        group(w.ours.commands_per_s.round() as u64),
        w.ours_renewal_calls_per_s,
        group(w.rslock.commands_per_s.round() as u64),
        1.0 / period,
        w.lease,
        rslock / ours.max(1e-9),
        met(ours <= allowed + 1e-9),
        fmt_ns(over(distinct)),
        distinct.summary(),
        fmt_ns(bare),
        ratio(distinct.p50(), bare),
        fmt_ns(LAYER_NS),
        met(over(distinct) < LAYER_NS),
        fmt_ns(over(hot)),
        hot.summary(),
        fmt_ns(bare),
        ratio(hot.p50(), bare),
        fmt_ns(LAYER_NS),
        met(over(hot) < LAYER_NS),
        fmt_ns(over(redis)),
        redis.summary(),
        ratio(over(redis), ping),
    );
    s.push_str(&idempotency_rows(&r.idempotency));
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

fn or_none(s: &str) -> &str {
    if s.is_empty() { "none" } else { s }
}

fn handoff_rows(r: &Results, s: &mut String, latency_ping: &str) {
    let [ours, seed, rslock] = r.handoffs.each_ref().map(|h| match h.discarded {
        0 => h.latencies.summary(),
        n => format!("{}, {n} discarded", h.latencies.summary()),
    });
    let [o, sx, rx] = r.handoffs.each_ref().map(|h| h.latencies.p50());
    let (sx, rx) = (ratio(sx, o), ratio(rx, o));
    let f = &r.handoff_floors;
    // The PING measured between the handoff chunks: the round trip drifts over a run on a
    // shared machine, and the latency section's PING was taken minutes earlier.
    let (beside, idle, woken) = (f.hot_ping.p50(), f.idle_ping.p50(), f.woken.p50());
    let x = ratio(o, beside);
    let _ = write!(
        s,
        "\
| Contended handoff across 2 processes (latency) | {ours} | {seed} | {rslock} | A's release round trip, B told by the message; PING p50 {} (back-to-back, between the handoff chunks; {latency_ping} in the latency section); PING after a {:?}-{:?} idle like the holder's: p50 {}; notification floor without a lock (SPUBLISH → B's waiting task has the message): {}; the same + 1 round trip (a waiter that must then acquire): {} | {x:.2}× PING ({:.2}× the idle PING, {:.2}× the notification floor) | p50 ≤ {HANDOFF_X_PING}× PING | {} |
| Handoff: speed-up over the polling designs (p50) | 1× | ours is {sx:.0}× faster | ours is {rx:.0}× faster | — | {:.0}× | ≥ {POLLING_SPEEDUP:.0}× faster than both | {} |
",
        fmt_ns(beside),
        r.plan.hold.0,
        r.plan.hold.1,
        fmt_ns(idle),
        f.woken.summary(),
        f.notified.summary(),
        ratio(o, idle),
        ratio(o, woken),
        met(x <= HANDOFF_X_PING),
        sx.min(rx),
        met(sx >= POLLING_SPEEDUP && rx >= POLLING_SPEEDUP),
    );
}

fn hot_rows(r: &Results, s: &mut String) {
    for processes in [1, 2] {
        let fig = |k: Kind, waiters: usize| {
            let mut hot = r.hot.iter();
            hot.find(|f| f.kind == k && f.processes == processes && f.waiters == waiters)
        };
        let reference = fig(Kind::Ours, 1).map(|f| f.requests_per_handoff);
        for &waiters in &r.plan.waiters {
            let [ours, seed, rslock] = Kind::ALL.map(|k| match fig(k, waiters) {
                None => "—".to_owned(),
                Some(f) => {
                    let acq = group(f.acquisitions_per_s.round() as u64);
                    match f.handoffs_per_s == 0.0 {
                        true => format!(
                            "0 handoffs/s ({acq} acq/s): the waiters starved for the whole window"
                        ),
                        false => format!(
                            "{} handoffs/s ({acq} acq/s); {:.1} cmds, {:.1} req per handoff",
                            group(f.handoffs_per_s.round() as u64),
                            f.commands_per_handoff,
                            f.requests_per_handoff
                        ),
                    }
                }
            });
            let req = fig(Kind::Ours, waiters).map_or(f64::NAN, |f| f.requests_per_handoff);
            let (x, goal, ok) = match reference {
                Some(base) if waiters > 1 => (
                    format!("{:.2}× the 1-waiter requests/handoff", req / base),
                    "Redis work per handoff independent of waiters (≤ 1.5× the 1-waiter figure)",
                    met(req <= 1.5 * base),
                ),
                _ => (
                    format!("{:.2}× the floor", req / 2.0),
                    "reference for the rows below",
                    "—",
                ),
            };
            let w = if waiters == 1 { "" } else { "s" };
            let p = if processes == 1 { "" } else { "es" };
            let _ = writeln!(
                s,
                "| Hot key, {waiters} waiter{w}, {processes} process{p} | {ours} | {seed} | {rslock} | 2 requests per handoff (an acquire or queue attempt + the release) | {x} | {goal} | {ok} |"
            );
        }
    }
}

fn diagnostics(r: &Results) -> String {
    let (u, m, f, h) = (&r.uncontended, &r.memory, &r.handoff_floors, &r.handoffs[0]);
    let [ping, set, acquire, release] = u.server_us;
    let mut s = format!(
        "\
| measurement | figure |
|---|---|
| Redis: ours, acquire only | {} |
| Redis: ours, release only | {} |
| Redis: ours, lock + release with `.watchdog(false)` | {} |
| handoff: PING from A after the holder's random idle (no lock involved) | {} |
| handoff: back-to-back PING from A between the handoff chunks (the handoff goal's PING) | {} |
| handoff floor: SPUBLISH from A → B's waiting task has the message (no lock) | {} |
| handoff (ours): A's release round trip | {} |
| handoff (ours): A sends release → notification reaches process B | {} |
| handoff (ours): notification reached B → B's acquire returned | {} |
| Redis server time (commandstats usec, all commands incl. in-script): per PING / per SET / per acquire of ours / per release of ours | {ping:.2} / {set:.2} / {acquire:.2} / {release:.2} µs |
",
        u.ours_acquire.summary(),
        u.ours_release.summary(),
        u.ours_no_watchdog.summary(),
        f.idle_ping.summary(),
        f.hot_ping.summary(),
        f.woken.summary(),
        h.release_rtt.summary(),
        h.delivery.summary(),
        h.wake_to_acquired.summary(),
    );
    for f in r.hot.iter().filter(|f| f.kind == Kind::Ours) {
        let _ = writeln!(
            s,
            "| hot key (ours), {} waiter(s), {} process(es): commands per handoff by name (in-script calls included) | {} |",
            f.waiters, f.processes, f.breakdown
        );
    }
    let _ = write!(
        s,
        "\
| layer on Redis: requests per layered request by command | {} |
| memory: acquire only | {} |
| memory: release only | {} |
| memory: lock + release with `.watchdog(false)` | {} |
",
        r.layer.redis_requests,
        m.acquire.summary(),
        m.release.summary(),
        m.no_watchdog.summary(),
    );
    for mk in &r.many {
        let (tasks, rate) = (mk.tasks, fmt_rate(mk.ours_no_watchdog));
        let _ = writeln!(
            s,
            "| many keys, {tasks} tasks: ours with `.watchdog(false)` | {rate} |"
        );
    }
    s
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
  (watchdog on). The memory backend runs the same loop on `Locker::memory()`.
- **Many keys**: `c` tasks on one locker (ours: one `Locker`, one connection), each locking and
  releasing its own 4 keys in a loop; each contender runs {passes} windows of {run:?}/{passes}
  (after {warm:?} of warm-up each), in turn, and the median window is reported. The floor is
  `redis-benchmark -t set -c c` (c connections, no pipelining; mean of a run before and one
  after the windows) and redis-rs SET with `c` tasks on one connection.
- **Handoff across 2 processes**: the bench (A) holds the key and tells a child process (B, this
  binary in a hidden child mode) to wait for it; A releases after a random {h0:?}-{h1:?} hold (so a
  polling waiter is at a random phase of its sleep). Latency = B's acquire returned − the instant
  before A sent its release, both read from `CLOCK_MONOTONIC` (one system-wide clock on Linux;
  error: two ~30 ns clock reads plus NTP slew ≤ 500 ppm, i.e. < 0.1 µs on these figures). A
  sample where B had not started waiting before A released is discarded and counted.
  rslock waits with its default retry loop (`acquire`: 3 tries 0-200 ms apart, looped).
  The PING the handoff goal is a ratio to is a burst of back-to-back PINGs between the chunks
  (as many as handoffs), because the machine's round trip drifts over a run and the latency
  section's PING was taken minutes before. Two more floors are measured in the same chunks,
  because a handoff starts from idle processes while a PING loop runs hot: a PING sent after
  the same random idle, and the
  *notification floor without any lock* (A sends SPUBLISH after the idle; B, a redis-rs RESP3
  subscriber, has the message in its waiting task; then it does one PING round trip, the floor
  of a waiter that must acquire after being woken). Ours needs no round trip after the
  message: the release hands the lock to B's queued waiter inside the script. A separate pass
  of ours (half as many samples, after the chunks) runs an independent observer subscription
  to the lock's release channel in B, which splits the handoff into delivery (A's release
  sent → notification in B) and wake-up (notification → B's acquire returned) in the
  diagnostics; the main figures are taken without it, since a second subscriber in B adds
  wake-ups of its own.
- **Hot key**: W+1 tasks lock/release one key in a loop ({hot:?} measured after {hot_warm:?});
  with 2 processes the tasks are split between the bench and a child. A *handoff* is an
  acquisition by a different task than the previous one (acquisitions from both processes are
  merged on the shared clock); a polling design's releaser often takes the lock straight back,
  which counts as an acquisition only. *cmds* = every call in `INFO commandstats` (commands run
  inside Lua scripts included, the bench's own INFO excluded); *req* = requests a client sent,
  i.e. round trips: for the peers from `INFO commandstats` (EVALSHA, SET, PING, …); for ours from
  lock-core's own count (`LockerStats::backend_calls`, both processes: acquire attempts,
  releases, renewals; a pipelined `SET NX GET` + `PTTL` is one), because its scripts run SET
  inside, which commandstats cannot tell apart from a client's SET.
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
- **Server time** (diagnostics): `INFO commandstats` usec per call, each operation measured
  alone between two snapshots (PING, SET, our acquires on fresh keys, then their releases).
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
        lease = p.watchdog_lease,
        window = p.watchdog_window,
    )
}

pub(crate) fn render(r: &Results, svg_name: &str) -> String {
    let m = &r.machine;
    let mode = match r.plan.quick {
        true => "quick (CI smoke run: figures NOT meaningful)",
        false => "full",
    };
    format!(
        "\
# Benchmarks

Measured by `cargo run --release -p lock-bench --bin lock-bench` ({mode} mode). Every figure is taken on the same Redis in the same run; ratios compare with the round trip measured then. Goals come from `DESIGN.md` (\"Performance goals\").

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

## Results

| Scenario | ours (lock-core) | seed: SET NX + 10 ms sleep | rslock 0.10 | floor | ratio | goal | met? |
|---|---|---|---|---|---|---|---|
{}
## Handoff latency distributions

![handoff latency CDFs: ours vs seed polling vs rslock]({svg_name})

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
        results(r),
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
            format!("goal {HANDOFF_X_PING}× PING"),
            (ping as f64 * HANDOFF_X_PING) as u64,
        ),
        (
            format!("notification floor, no lock: p50 {}", fmt_ns(woken)),
            woken,
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
