//! The Markdown report (`BENCHMARKS.md`) and the handoff plot next to it.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::designs::Kind;
use crate::machine::Machine;
use crate::scenarios::{
    Handoff, HandoffFloors, HotFigures, Layer, ManyKeys, Memory, Plan, Uncontended, Watchdog,
};
use crate::stats::{Latencies, fmt_ns, fmt_rate};
use crate::svg::{Marker, Series, cdf_chart};
use crate::{Result, progress};

mod table;

use table::{HANDOFF_X_PING, PEER_HEADER, rows};

/// Everything one run measured.
#[derive(Debug)]
pub(crate) struct Results {
    pub(crate) machine: Machine,
    pub(crate) plan: Plan,
    pub(crate) uncontended: Uncontended,
    pub(crate) memory: Memory,
    pub(crate) many: Vec<ManyKeys>,
    pub(crate) handoffs: Vec<Handoff>,
    /// The floors measured beside our handoff.
    pub(crate) handoff_floors: HandoffFloors,
    pub(crate) hot: Vec<HotFigures>,
    pub(crate) watchdog: Watchdog,
    pub(crate) layer: Layer,
    pub(crate) elapsed: Duration,
}

fn diagnostics(r: &Results) -> String {
    let u = &r.uncontended;
    let m = &r.memory;
    let mut s = String::new();
    let line = |s: &mut String, what: &str, l: &Latencies| {
        let _ = writeln!(s, "| {what} | {} |", l.summary());
    };
    s.push_str("| measurement | figure |\n|---|---|\n");
    line(&mut s, "Redis: ours, acquire only", &u.ours_acquire);
    line(&mut s, "Redis: ours, release only", &u.ours_release);
    line(
        &mut s,
        "Redis: ours, lock + release with `.watchdog(false)`",
        &u.ours_no_watchdog,
    );
    if let Some(h) = r.handoffs.iter().find(|h| h.kind == Kind::Ours) {
        line(
            &mut s,
            "handoff: PING from A after the holder's random idle (no lock involved)",
            &r.handoff_floors.idle_ping,
        );
        line(
            &mut s,
            "handoff: back-to-back PING from A between the handoff chunks (the handoff goal's PING)",
            &r.handoff_floors.hot_ping,
        );
        line(
            &mut s,
            "handoff floor: SPUBLISH from A → B's waiting task has the message (no lock)",
            &r.handoff_floors.woken,
        );
        line(
            &mut s,
            "handoff (ours): A's release round trip",
            &h.release_rtt,
        );
        line(
            &mut s,
            "handoff (ours): A sends release → notification reaches process B",
            &h.delivery,
        );
        line(
            &mut s,
            "handoff (ours): notification reached B → B's acquire returned",
            &h.wake_to_acquired,
        );
    }
    let [ping_us, set_us, acq_us, rel_us] = u.server_us;
    let _ = writeln!(
        s,
        "| Redis server time (commandstats usec, all commands incl. in-script): per PING / per SET / per acquire of ours / per release of ours | {ping_us:.2} / {set_us:.2} / {acq_us:.2} / {rel_us:.2} µs |"
    );
    for f in r.hot.iter().filter(|f| f.kind == Kind::Ours) {
        let _ = writeln!(
            s,
            "| hot key (ours), {} waiter(s), {} process(es): commands per handoff by name (in-script calls included) | {} |",
            f.waiters, f.processes, f.breakdown
        );
    }
    let _ = writeln!(
        s,
        "| layer on Redis: requests per layered request by command | {} |",
        r.layer.redis_requests
    );
    line(&mut s, "memory: acquire only", &m.acquire);
    line(&mut s, "memory: release only", &m.release);
    line(
        &mut s,
        "memory: lock + release with `.watchdog(false)`",
        &m.no_watchdog,
    );
    for mk in &r.many {
        let _ = writeln!(
            s,
            "| many keys, {} tasks: ours with `.watchdog(false)` | {} |",
            mk.tasks,
            fmt_rate(mk.ours_no_watchdog)
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
  background load hits all of them alike. p50/p99 are nearest-rank over the `n` samples shown.
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

/// The SVG path next to `out`: `<stem>-handoff.svg`.
pub(crate) fn svg_path(out: &Path) -> PathBuf {
    let stem = out
        .file_stem()
        .map_or_else(|| "BENCHMARKS".into(), |s| s.to_string_lossy().into_owned());
    out.with_file_name(format!("{stem}-handoff.svg"))
}

pub(crate) fn render(r: &Results, svg_name: &str) -> String {
    let m = &r.machine;
    let mode = if r.plan.quick {
        "quick (CI smoke run: figures NOT meaningful)"
    } else {
        "full"
    };
    let mut s = String::new();
    let _ = writeln!(s, "# Benchmarks\n");
    let _ = writeln!(
        s,
        "Measured by `cargo run --release -p lock-bench --bin lock-bench` ({mode} mode). \
         Every figure is taken on the same Redis in the same run; ratios compare with the \
         round trip measured then. Goals come from `DESIGN.md` (\"Performance goals\").\n"
    );
    let _ = writeln!(s, "## Machine\n");
    let _ = writeln!(s, "| | |\n|---|---|");
    let _ = writeln!(s, "| CPU | {} × {} (nproc) |", m.cpu, m.nproc);
    let _ = writeln!(s, "| OS | {} |", m.kernel);
    let _ = writeln!(
        s,
        "| redis-server | {} — {} |",
        m.redis_version, m.redis_where
    );
    let _ = writeln!(s, "| rustc | {} |", m.rustc);
    let _ = writeln!(s, "| source | {} |", m.tree);
    let _ = writeln!(s, "| mode | {mode} |");
    let _ = writeln!(s, "| date | {} |", m.date);
    let _ = writeln!(
        s,
        "| load average (1/5/15 min) | start {} — end {} (the machine is shared; other builds may run) |",
        m.load_start, m.load_end
    );
    let _ = writeln!(s, "| run time | {:.1} s |\n", r.elapsed.as_secs_f64());
    let _ = writeln!(s, "## Results\n");
    let _ = writeln!(s, "{PEER_HEADER}");
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|");
    for row in rows(r) {
        let _ = writeln!(s, "{}", row.render());
    }
    let _ = writeln!(s, "\n## Handoff latency distributions\n");
    let _ = writeln!(
        s,
        "![handoff latency CDFs: ours vs seed polling vs rslock]({svg_name})\n"
    );
    let _ = writeln!(s, "## Diagnostics (where the time goes)\n");
    s.push_str(&diagnostics(r));
    let _ = writeln!(s, "\n## Method\n");
    s.push_str(&method(r));
    s
}

pub(crate) fn write(r: &Results, out: &Path) -> Result<()> {
    let svg = svg_path(out);
    let svg_name = svg
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let markdown = render(r, &svg_name);
    std::fs::write(out, &markdown).map_err(|e| format!("cannot write {}: {e}", out.display()))?;
    {
        use std::io::Write as _;
        let mut stdout = std::io::stdout().lock();
        let _ = stdout.write_all(markdown.as_bytes());
        let _ = stdout.flush();
    }
    // The PING taken between the handoff chunks, as the handoff row's ratio uses.
    let ping = r.handoff_floors.hot_ping.p50();
    let colors = ["#1f77b4", "#d62728", "#2ca02c"];
    let series: Vec<Series<'_>> = r
        .handoffs
        .iter()
        .zip(colors)
        .map(|(h, color)| Series {
            label: format!(
                "{}: p50 {}, p99 {} (n={})",
                match h.kind {
                    Kind::Ours => "ours (lock-core)",
                    Kind::Seed => "seed: SET NX + 10 ms sleep",
                    Kind::Rslock => "rslock 0.10 (default retry loop)",
                },
                fmt_ns(h.latencies.p50()),
                fmt_ns(h.latencies.p99()),
                h.latencies.n()
            ),
            color,
            sorted_ns: h.latencies.sorted(),
        })
        .collect();
    let markers = [
        Marker {
            label: format!("PING p50 {}", fmt_ns(ping)),
            at_ns: ping,
        },
        Marker {
            label: format!("goal {HANDOFF_X_PING}× PING"),
            at_ns: (ping as f64 * HANDOFF_X_PING) as u64,
        },
        Marker {
            label: format!(
                "notification floor, no lock: p50 {}",
                fmt_ns(r.handoff_floors.woken.p50())
            ),
            at_ns: r.handoff_floors.woken.p50(),
        },
    ];
    let title = format!(
        "Contended handoff across two processes ({} mode, {})",
        if r.plan.quick { "quick" } else { "full" },
        r.machine.date
    );
    std::fs::write(&svg, cdf_chart(&title, &series, &markers))
        .map_err(|e| format!("cannot write {}: {e}", svg.display()))?;
    progress(&format!("wrote {} and {}", out.display(), svg.display()));
    Ok(())
}
