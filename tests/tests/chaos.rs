//! The randomized fault test ("chaos", issue 12).
//!
//! Several `lock-chaos-worker` processes, each with several tasks, lock a few keys on one lock
//! redis-server (fenced keys, reentrant keys: a nested `run` on the same key, plain keys; with
//! waits and without) and, inside every critical section, write to a fence-checking store on a
//! second redis-server that no fault touches. Meanwhile a seeded driver injects faults at
//! random on the lock side: SIGSTOP/SIGCONT of worker processes, CLIENT KILL (normal, pub/sub or
//! both), CLIENT PAUSE (ALL or WRITE), DEBUG SLEEP, a SIGSTOP of the server, a restart without
//! persistence, FLUSHALL. Every attempt is recorded by its worker on `CLOCK_MONOTONIC`
//! (`lock_tests::chaos::Section`), the driver records its faults on the same clock, and the
//! records are checked afterwards:
//!
//! - `two-holders`: no two holders of one key at once, unless data was lost in between. Proven
//!   from the records: A's `is_held()` answered true after B's acquire returned, and B's
//!   `is_held()` answered true at some point (see [`check`]). After a restart or FLUSHALL a
//!   stale holder may still believe it holds until it learns: that is the Redis-only limit,
//!   and then `stale-learned-late` (it learns within its lease) and `fence-serial` (the store
//!   saw the fenced writers one after the other: the stale one's writes rejected, or all before
//!   the new one's) apply; unfenced writes of a stale holder are counted as the documented
//!   limit, not a failure.
//! - `untold-overlap`: two critical sections of one key that overlapped never both end as if
//!   nothing happened (`run` returned `Ok`, or the release `Ok`, and no loss was ever seen).
//! - `fence-backwards`: a fence drawn after another one was returned is larger; no fence is
//!   drawn twice. Across restarts and FLUSHALL too.
//! - `wait-bound`: a wait returns (whatever the result) within its bound plus a tolerance
//!   (`CHAOS_TOLERANCE_MS`, 150 ms), unless its own process was stopped meanwhile.
//! - `no-ttl`: at the end, no key on the lock server lives without a TTL except the documented
//!   ones ([`DOCUMENTED_WITHOUT_TTL`]).
//! - `process`: every worker ends with exit code 0 after `STOP`, within a bound, no panic; no
//!   attempt hangs (15 s bound inside the worker).
//! - `liveness`: once the faults stop, every key is locked again.
//! - `records`: what the workers saw agrees with the store's log.
//!
//! Short run: `cargo test -p lock-tests --test chaos` (30 s of faults). Long run:
//! `CHAOS_SECONDS=600 CHAOS_SEED=42 cargo test -p lock-tests --test chaos -- --nocapture`.
//! Other knobs: `CHAOS_PROCESSES` (3), `CHAOS_TASKS` (4), `CHAOS_KEYS` (3),
//! `CHAOS_TOLERANCE_MS` (150). The seed fixes the fault schedule and every task's choices; the
//! interleaving still depends on timing, so a replay reproduces the conditions, not every
//! event. On a failure the seed, the fault timeline and the offending records are printed.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout,
    reason = "test code: a failed expectation fails the test; the run's report is printed"
)]

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lock_testkit::signal::{Signal, send_signal};
use lock_testkit::{ChildProcess, RedisServer};
use lock_tests::chaos::{Answer, Mode, Rng, Section, WorkerConfig, key_name, now_us, store_keys};
use tokio::task::JoinHandle;

/// The seed when `CHAOS_SEED` is not set.
const DEFAULT_SEED: u64 = 12;

/// Keys that may live without a TTL on the lock server at the end (a suffix of the key name,
/// and why): only the fencing counter (DESIGN: its key has no TTL, so tokens never go backwards
/// while the server keeps its data, whatever its clock does).
const DOCUMENTED_WITHOUT_TTL: &[(&str, &str)] = &[(
    ":fence",
    "the fencing counter: no TTL, so tokens never go backwards (DESIGN)",
)];

/// After the faults: how long the workers keep locking before `STOP` (the liveness check).
const QUIET: Duration = Duration::from_secs(3);

/// How long a worker may take to print `READY`, and to exit after `STOP`.
const READY_BOUND: Duration = Duration::from_secs(30);
const FINISH_BOUND: Duration = Duration::from_secs(45);

/// At most this many examples of one rule are printed in full.
const EXAMPLES: usize = 8;

#[derive(Debug, Clone)]
struct Config {
    seconds: u64,
    seed: u64,
    processes: u32,
    tasks: u32,
    keys: u64,
    tolerance_ms: u64,
}

impl Config {
    fn from_env() -> Config {
        fn var(name: &str, default: u64) -> u64 {
            match std::env::var(name) {
                Ok(v) => v
                    .trim()
                    .parse()
                    .unwrap_or_else(|e| panic!("{name}={v:?}: {e}")),
                Err(_) => default,
            }
        }
        Config {
            seconds: var("CHAOS_SECONDS", 30),
            seed: var("CHAOS_SEED", DEFAULT_SEED),
            processes: u32::try_from(var("CHAOS_PROCESSES", 3)).unwrap(),
            tasks: u32::try_from(var("CHAOS_TASKS", 4)).unwrap(),
            keys: var("CHAOS_KEYS", 3),
            tolerance_ms: var("CHAOS_TOLERANCE_MS", 150),
        }
    }

    fn replay(&self) -> String {
        format!(
            "CHAOS_SEED={} CHAOS_SECONDS={} CHAOS_PROCESSES={} CHAOS_TASKS={} CHAOS_KEYS={} \
             cargo test -p lock-tests --test chaos -- --nocapture",
            self.seed, self.seconds, self.processes, self.tasks, self.keys
        )
    }
}

// ---------------------------------------------------------------------------------------------
// Faults

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// SIGSTOP of one worker process, SIGCONT at `end`.
    StopWorker,
    ClientKill,
    ClientPause,
    DebugSleep,
    /// SIGSTOP of the lock server, SIGCONT at `end`.
    ServerFreeze,
    /// Restart without persistence: the server comes back empty.
    Restart,
    Flushall,
}

impl Kind {
    /// Faults that lose the lock server's data.
    fn data_loss(self) -> bool {
        matches!(self, Kind::Restart | Kind::Flushall)
    }
}

#[derive(Debug, Clone)]
struct Fault {
    kind: Kind,
    /// The worker process, for `StopWorker`.
    proc: Option<u32>,
    what: String,
    start: u64,
    end: u64,
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Sends `signal` to a worker process without blocking the runtime (`kill(1)` runs aside).
async fn signal(pid: u32, signal: Signal) {
    tokio::task::spawn_blocking(move || send_signal(pid, signal))
        .await
        .expect("send a signal");
}

/// Injects faults at random on the lock server and the workers until `until`; returns them.
/// The schedule (kinds, parameters, gaps) depends on the seed alone.
async fn inject(server: &mut RedisServer, pids: &[u32], seed: u64, until: u64) -> Vec<Fault> {
    let mut rng = Rng::new(seed);
    let mut faults = Vec::new();
    let stopped: Vec<Arc<AtomicBool>> = pids.iter().map(|_| Arc::default()).collect();
    let mut background: Vec<JoinHandle<Fault>> = Vec::new();
    loop {
        // Every parameter is drawn each round, in this order, whatever the fault: the schedule
        // does not depend on timing.
        let gap = rng.range(200, 1200);
        let roll = rng.range(0, 100);
        let dur = rng.range(100, 2000);
        let pick = rng.range(0, 1_000_000);
        tokio::time::sleep(ms(gap)).await;
        if now_us() >= until {
            break;
        }
        let start = now_us();
        let fault = |kind, what: String, end| Fault {
            kind,
            proc: None,
            what,
            start,
            end,
        };
        match roll {
            0..30 => {
                let proc = (pick % pids.len() as u64) as usize;
                let pause = dur + 300;
                let flag = stopped[proc].clone();
                if flag.swap(true, Ordering::SeqCst) {
                    continue;
                }
                let pid = pids[proc];
                background.push(tokio::spawn(async move {
                    let start = now_us();
                    signal(pid, Signal::Stop).await;
                    tokio::time::sleep(ms(pause)).await;
                    signal(pid, Signal::Cont).await;
                    flag.store(false, Ordering::SeqCst);
                    Fault {
                        kind: Kind::StopWorker,
                        proc: Some(proc as u32),
                        what: format!("SIGSTOP worker p{proc} for {pause} ms"),
                        start,
                        end: now_us(),
                    }
                }));
            }
            30..48 => {
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
                faults.push(fault(
                    Kind::ClientKill,
                    format!("CLIENT KILL TYPE {} ({killed} closed)", kinds.join("+")),
                    now_us(),
                ));
            }
            48..62 => {
                let mode = if pick.is_multiple_of(2) {
                    "ALL"
                } else {
                    "WRITE"
                };
                let () = server
                    .query(redis::cmd("CLIENT").arg("PAUSE").arg(dur).arg(mode).clone())
                    .await;
                tokio::time::sleep(ms(dur)).await;
                faults.push(fault(
                    Kind::ClientPause,
                    format!("CLIENT PAUSE {dur} {mode}"),
                    now_us(),
                ));
            }
            62..76 => {
                let mut conn = server.client().await;
                let secs = format!("{:.3}", dur as f64 / 1000.0);
                let () = redis::cmd("DEBUG")
                    .arg("SLEEP")
                    .arg(&secs)
                    .query_async(&mut conn)
                    .await
                    .expect("DEBUG SLEEP");
                faults.push(fault(
                    Kind::DebugSleep,
                    format!("DEBUG SLEEP {secs}"),
                    now_us(),
                ));
            }
            76..86 => {
                server.pause();
                tokio::time::sleep(ms(dur)).await;
                server.resume();
                faults.push(fault(
                    Kind::ServerFreeze,
                    format!("SIGSTOP lock server for {dur} ms"),
                    now_us(),
                ));
            }
            86..95 => {
                tokio::task::block_in_place(|| server.restart());
                faults.push(fault(
                    Kind::Restart,
                    "restart without persistence".to_owned(),
                    now_us(),
                ));
            }
            _ => {
                server.flushall().await;
                faults.push(fault(Kind::Flushall, "FLUSHALL".to_owned(), now_us()));
            }
        }
    }
    for b in background {
        faults.push(b.await.expect("worker stop task"));
    }
    faults.sort_by_key(|f| f.start);
    faults
}

// ---------------------------------------------------------------------------------------------
// Worker processes

/// A `lock-chaos-worker` process after `GO`. A task of its own reads its stdout all run long
/// (a record per attempt: a full pipe would stall the worker) until the test says `STOP`.
struct Worker {
    proc: u32,
    pid: u32,
    stop: tokio::sync::oneshot::Sender<()>,
    run: JoinHandle<Finished>,
}

/// What a worker left behind.
struct Finished {
    proc: u32,
    status: Result<std::process::ExitStatus, String>,
    lines: Vec<String>,
    stderr: String,
}

impl Worker {
    /// Starts a worker process; it prints `READY` once connected.
    fn spawn(cfg: &WorkerConfig) -> ChildProcess {
        ChildProcess::spawn(env!("CARGO_BIN_EXE_lock-chaos-worker"), cfg.to_args())
    }

    /// Waits for the worker's `READY`.
    async fn wait_ready(proc: u32, child: &mut ChildProcess) {
        match child.next_line(READY_BOUND).await {
            Some(line) if line == "READY" => {}
            other => panic!(
                "worker p{proc} did not get ready: {other:?}; stderr: {}",
                child.stderr()
            ),
        }
    }

    /// Sends `GO`, and reads what the worker prints until [`stop`](Self::stop).
    async fn go(proc: u32, mut child: ChildProcess) -> Worker {
        let pid = child.pid().expect("worker pid");
        child.send("GO").await;
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let run = tokio::spawn(Self::drive(proc, child, stopped));
        Worker {
            proc,
            pid,
            stop,
            run,
        }
    }

    /// Reads the worker's lines until told to stop (or its output ends), sends `STOP`, and waits
    /// for the exit (bounded: a worker that hangs is killed and reported).
    async fn drive(
        proc: u32,
        mut child: ChildProcess,
        mut stopped: tokio::sync::oneshot::Receiver<()>,
    ) -> Finished {
        // No bound on a silence here: the test's own schedule says when to stop.
        let mut open = true;
        while open {
            tokio::select! {
                _ = &mut stopped => break,
                line = child.next_line(Duration::MAX) => open = line.is_some(),
            }
        }
        if open {
            child.send("STOP").await;
        }
        let exited = tokio::time::timeout(FINISH_BOUND, async {
            while child.next_line(Duration::MAX).await.is_some() {}
        })
        .await
        .is_ok();
        if !exited {
            child.kill().await;
        }
        let out = child.finish(FINISH_BOUND).await;
        Finished {
            proc,
            status: if exited {
                Ok(out.status)
            } else {
                Err(format!(
                    "did not exit within {FINISH_BOUND:?} of STOP (killed)"
                ))
            },
            lines: out.lines,
            stderr: out.stderr,
        }
    }

    /// Tells the worker to stop; [`finish`](Self::finish) then waits for it.
    fn stop(self) -> (u32, JoinHandle<Finished>) {
        let _ = self.stop.send(());
        (self.proc, self.run)
    }

    /// What a stopped worker left behind (its driver failing, e.g. `STOP` not written, is
    /// reported as its status).
    async fn finish(proc: u32, run: JoinHandle<Finished>) -> Finished {
        match run.await {
            Ok(finished) => finished,
            Err(e) => Finished {
                proc,
                status: Err(format!("its driver failed: {e}")),
                lines: Vec::new(),
                stderr: String::new(),
            },
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The checks

/// Everything the checks read.
struct Input<'a> {
    sections: &'a [Section],
    faults: &'a [Fault],
    /// Per lock key, the store's log of accepted writes (`"<id> <fence>"`), in order.
    logs: &'a HashMap<String, Vec<String>>,
    tolerance_us: u64,
    /// When the faults stopped (for the liveness check); `None` to skip it.
    quiet_start: Option<u64>,
    keys: &'a [String],
}

#[derive(Debug)]
struct Violation {
    rule: &'static str,
    detail: String,
    /// Names of the sections involved (`p0t1n7`).
    sections: Vec<String>,
}

#[derive(Debug, Default)]
struct Report {
    violations: Vec<Violation>,
    /// What was seen, counted by name.
    counts: BTreeMap<String, u64>,
    /// The largest time past its bound of a wait (not excused), in µs.
    worst_wait_over_us: i64,
}

impl Report {
    fn violation(&mut self, rule: &'static str, detail: String, sections: &[&Section]) {
        self.violations.push(Violation {
            rule,
            detail,
            sections: sections.iter().map(|s| s.name()).collect(),
        });
    }

    fn count(&mut self, what: &str) {
        *self.counts.entry(what.to_owned()).or_default() += 1;
    }

    fn rules(&self) -> BTreeMap<&'static str, usize> {
        let mut m = BTreeMap::new();
        for v in &self.violations {
            *m.entry(v.rule).or_default() += 1;
        }
        m
    }
}

/// The time the process `proc` spent stopped by the driver within `[from, to]`, in µs.
fn stopped_within(faults: &[Fault], proc: u32, from: u64, to: u64) -> u64 {
    faults
        .iter()
        .filter(|f| f.kind == Kind::StopWorker && f.proc == Some(proc))
        .map(|f| f.end.min(to).saturating_sub(f.start.max(from)))
        .sum()
}

/// When the holder stopped believing it held: told of the loss, or its body ended.
fn learned(s: &Section) -> u64 {
    let end = s.end.unwrap_or(s.ret);
    s.told.map_or(end, |t| t.min(end))
}

/// A section that ended as if nothing happened: acquired, never told of a loss, `run`
/// returned `Ok` or the guard's release did.
fn clean(s: &Section) -> bool {
    s.acq.is_some()
        && s.told.is_none()
        && s.result == "ok"
        && s.release.as_deref().is_none_or(|r| r == "ok")
}

/// Runs every check over the records. The argument behind `two-holders`, without data loss:
/// A acquired (on the server) at some point in `[A.call, A.acq]`, B in `[B.call, B.acq]`, and
/// `A.acq <= B.acq`. A `true` from `is_held()` at `t` means the lease's local deadline, which
/// is never later than the server's expiry of that lock, is after `t`, and the lock is not
/// released before the body ends. If A's `is_held()` was true at some `t >= B.acq`, A's lock
/// lived on the server from A's acquisition to past `t`; if B's `is_held()` was true at all
/// (at some `tb >= B.acq >= A.acq`), B's lived from B's acquisition to past `tb`. Whichever
/// acquired second did so while the other's lock lived: two holders.
fn check(input: &Input<'_>) -> Report {
    let mut r = Report::default();

    // Which writes the store accepted, and where in its log.
    let mut accepted: HashMap<&str, usize> = HashMap::new();
    for entries in input.logs.values() {
        for (i, e) in entries.iter().enumerate() {
            let id = e.split(' ').next().unwrap_or_default();
            accepted.insert(id, i + 1);
        }
    }

    // records: results as expected, the workers' view agrees with the store.
    for s in input.sections {
        r.count(&format!("attempt result {}", s.result));
        if s.acq.is_some() {
            r.count("acquired");
        }
        if let Some(how) = &s.how {
            r.count(&format!("told by {how}"));
        }
        match s.result.as_str() {
            "ok" | "Busy" | "Timeout" | "Backend" => {}
            "LeaseLost" if s.acq.is_some() => {}
            "HUNG" => r.violation(
                "process",
                format!(
                    "{}: the attempt did not end within the worker's bound",
                    s.name()
                ),
                &[s],
            ),
            other => r.violation(
                "records",
                format!("{}: unexpected result {other}", s.name()),
                &[s],
            ),
        }
        if let Some(rel) = s.release.as_deref()
            && !matches!(rel, "ok" | "LeaseLost" | "Backend")
        {
            r.violation(
                "records",
                format!("{}: unexpected release result {rel}", s.name()),
                &[s],
            );
        }
        if let Some(inner) = s.inner.as_deref()
            && !matches!(inner, "ok" | "LeaseLost")
        {
            r.violation(
                "records",
                format!(
                    "{}: the nested reentrant run answered {inner} (it never waits)",
                    s.name()
                ),
                &[s],
            );
        }
        for w in &s.writes {
            let in_log = accepted.contains_key(w.id.as_str());
            r.count(if in_log {
                "writes accepted"
            } else {
                "writes rejected or lost"
            });
            let mismatch = match w.answer {
                Answer::Accepted => !in_log,
                Answer::Rejected => in_log,
                Answer::Failed | Answer::Unknown => false,
            };
            if mismatch {
                r.violation(
                    "records",
                    format!(
                        "{}: write {} answered {:?} but the store's log {} it",
                        s.name(),
                        w.id,
                        w.answer,
                        if in_log { "holds" } else { "lacks" }
                    ),
                    &[s],
                );
            }
        }
    }

    // Per key, the sections that held the lock, by the time they held it.
    let mut held: BTreeMap<&str, Vec<&Section>> = BTreeMap::new();
    for s in input.sections.iter().filter(|s| s.acq.is_some()) {
        held.entry(s.key.as_str()).or_default().push(s);
    }
    for list in held.values_mut() {
        list.sort_by_key(|s| (s.acq, s.call));
    }
    let acq = |s: &Section| s.acq.unwrap_or_default();

    for (key, list) in &held {
        for (i, a) in list.iter().enumerate() {
            let a_end = a.end.unwrap_or(a.ret);
            let a_last_check = a.writes.iter().map(|w| w.check).max();
            for b in &list[i + 1..] {
                let b_acq = acq(b);
                let overlaps = b_acq < a_end;
                let believed_late = a_last_check.is_some_and(|t| t >= b_acq);
                if !overlaps && !believed_late {
                    // Sorted by acq: no later section overlaps A either.
                    break;
                }
                if overlaps && clean(a) && clean(b) {
                    r.violation(
                        "untold-overlap",
                        format!(
                            "{key}: {} and {} overlapped ({} acquired before {} ended) and both \
                             ended as if nothing happened (run/release Ok, no loss seen)",
                            a.name(),
                            b.name(),
                            b.name(),
                            a.name()
                        ),
                        &[a, b],
                    );
                }
                // A's writes checked (is_held() true) after B held, and B's writes (each one
                // checked true): both held at once.
                let a_late: Vec<_> = a.writes.iter().filter(|w| w.check >= b_acq).collect();
                if a_late.is_empty() || b.writes.is_empty() {
                    if overlaps {
                        r.count(
                            "overlaps without a proven second holder (frozen, told, or silent)",
                        );
                    }
                    continue;
                }
                let loss = input
                    .faults
                    .iter()
                    .find(|f| f.kind.data_loss() && f.start >= a.call && f.start <= b_acq);
                let Some(loss) = loss else {
                    r.violation(
                        "two-holders",
                        format!(
                            "{key}: {} believed it held (is_held() true) after {} acquired, and \
                             {} believed it held too; no data loss in between",
                            a.name(),
                            b.name(),
                            b.name()
                        ),
                        &[a, b],
                    );
                    continue;
                };
                r.count("two holders after data loss (the documented Redis limit)");
                // The stale holder learns within its lease of the loss.
                let lease_us = a.lease_ms * 1000;
                let bound = loss.start
                    + lease_us
                    + input.tolerance_us
                    + stopped_within(input.faults, a.proc, loss.start, loss.start + lease_us);
                if learned(a) > bound {
                    r.violation(
                        "stale-learned-late",
                        format!(
                            "{key}: {} still believed it held {} ms after the data loss ({}), \
                             past its lease of {} ms",
                            a.name(),
                            (learned(a) - loss.start) / 1000,
                            loss.what,
                            a.lease_ms
                        ),
                        &[a, b],
                    );
                }
                if a.mode.fenced() {
                    let pos = |ws: &[&lock_tests::chaos::Write]| -> Vec<usize> {
                        ws.iter()
                            .filter_map(|w| accepted.get(w.id.as_str()).copied())
                            .collect()
                    };
                    let a_pos = pos(&a_late);
                    let b_all: Vec<_> = b.writes.iter().collect();
                    let b_pos = pos(&b_all);
                    if a_pos.is_empty() || b_pos.is_empty() {
                        r.count("stale fenced holder after data loss: its writes rejected");
                        continue;
                    }
                    let (lo, hi) = match a.fence.cmp(&b.fence) {
                        std::cmp::Ordering::Less => (&a_pos, &b_pos),
                        std::cmp::Ordering::Greater => (&b_pos, &a_pos),
                        std::cmp::Ordering::Equal => {
                            r.violation(
                                "fence-serial",
                                format!(
                                    "{key}: {} and {} held at once with the same fence {:?}, \
                                     and the store accepted writes of both",
                                    a.name(),
                                    b.name(),
                                    a.fence
                                ),
                                &[a, b],
                            );
                            continue;
                        }
                    };
                    let serial = lo.iter().max() < hi.iter().min();
                    if serial {
                        r.count("stale fenced holder after data loss: writes serialized by fence");
                    } else {
                        r.violation(
                            "fence-serial",
                            format!(
                                "{key}: the store interleaved the accepted writes of {} (fence \
                                 {:?}) and {} (fence {:?})",
                                a.name(),
                                a.fence,
                                b.name(),
                                b.fence
                            ),
                            &[a, b],
                        );
                    }
                } else {
                    r.count("stale unfenced holder wrote after data loss (documented limit)");
                }
            }
        }
    }

    // fence-backwards: a fence drawn after another was returned is larger; none twice.
    for (key, list) in &held {
        let mut fenced: Vec<&Section> =
            list.iter().copied().filter(|s| s.fence.is_some()).collect();
        fenced.sort_by_key(|s| s.acq);
        let mut seen: HashMap<u64, &Section> = HashMap::new();
        for s in &fenced {
            let f = s.fence.unwrap_or_default();
            if let Some(first) = seen.insert(f, s) {
                r.violation(
                    "fence-backwards",
                    format!(
                        "{key}: fence {f} was drawn twice, by {} and {}{}",
                        first.name(),
                        s.name(),
                        losses_between(input.faults, acq(first), acq(s))
                    ),
                    &[first, s],
                );
            }
        }
        // Prefix maxima over the sections in acquisition order: for B, every A whose acquire
        // returned before B's request was made drew its fence first.
        let mut best: Vec<(u64, &Section)> = Vec::with_capacity(fenced.len());
        for s in &fenced {
            let f = s.fence.unwrap_or_default();
            let prev = best.last().copied();
            best.push(match prev {
                Some((pf, ps)) if pf >= f => (pf, ps),
                _ => (f, s),
            });
        }
        for b in &fenced {
            let before = fenced.partition_point(|a| acq(a) < b.call);
            if before == 0 {
                continue;
            }
            let (max_f, a) = best[before - 1];
            let fb = b.fence.unwrap_or_default();
            if max_f >= fb && a.name() != b.name() {
                r.violation(
                    "fence-backwards",
                    format!(
                        "{key}: {} drew fence {fb} after {} had returned fence {max_f}{}",
                        b.name(),
                        a.name(),
                        losses_between(input.faults, acq(a), acq(b))
                    ),
                    &[a, b],
                );
            }
        }
    }

    // wait-bound: every wait returns within its bound, whatever the server does.
    let mut worst = i64::MIN;
    for s in input.sections {
        let Some(wait_ms) = s.wait_ms else { continue };
        let back = s.acq.unwrap_or(s.ret);
        let took = back.saturating_sub(s.call);
        if stopped_within(input.faults, s.proc, s.call, back) > 0 {
            r.count("waits not checked: their process was stopped");
            continue;
        }
        let over = took as i64 - (wait_ms * 1000) as i64;
        worst = worst.max(over);
        if over > input.tolerance_us as i64 {
            r.violation(
                "wait-bound",
                format!(
                    "{}: wait({wait_ms} ms) returned {} after {} ms ({} ms past the bound){}",
                    s.name(),
                    if s.acq.is_some() {
                        "the lock"
                    } else {
                        s.result.as_str()
                    },
                    took / 1000,
                    over / 1000,
                    overlapping_faults(input.faults, s.proc, s.call, back)
                ),
                &[s],
            );
        }
    }
    r.worst_wait_over_us = worst;

    // liveness: every key is locked again once the faults stopped.
    if let Some(quiet) = input.quiet_start {
        for key in input.keys {
            let again = input
                .sections
                .iter()
                .any(|s| s.key == *key && s.acq.is_some_and(|a| a >= quiet));
            if !again {
                r.violation(
                    "liveness",
                    format!("{key}: not locked by anyone after the faults stopped"),
                    &[],
                );
            }
        }
    }
    r
}

/// The data losses between `from` and `to`, for messages.
fn losses_between(faults: &[Fault], from: u64, to: u64) -> String {
    let losses: Vec<&str> = faults
        .iter()
        .filter(|f| f.kind.data_loss() && f.start >= from.min(to) && f.start <= to.max(from))
        .map(|f| f.what.as_str())
        .collect();
    if losses.is_empty() {
        String::new()
    } else {
        format!(" (in between: {})", losses.join(", "))
    }
}

/// The faults active during `[from, to]` that can concern process `proc` (the stops of other
/// worker processes cannot), for messages.
fn overlapping_faults(faults: &[Fault], proc: u32, from: u64, to: u64) -> String {
    let during: Vec<&str> = faults
        .iter()
        .filter(|f| f.start <= to && f.end >= from)
        .filter(|f| f.kind != Kind::StopWorker || f.proc == Some(proc))
        .map(|f| f.what.as_str())
        .collect();
    if during.is_empty() {
        String::new()
    } else {
        format!("; faults meanwhile: {}", during.join(", "))
    }
}

// ---------------------------------------------------------------------------------------------
// Reporting

/// Milliseconds since `t0`, signed, with one decimal.
fn rel(t0: u64, t: u64) -> String {
    format!("{:+.1}", (t as f64 - t0 as f64) / 1000.0)
}

fn describe(s: &Section, t0: u64, accepted: &HashMap<&str, usize>) -> String {
    let opt = |t: Option<u64>| t.map_or_else(|| "-".to_owned(), |t| rel(t0, t));
    let mut out = format!(
        "{} key={} mode={} api={} wait={} lease={}ms call={} acq={} fence={} end={} ret={} \
         told={}{} result={} release={} inner={}",
        s.name(),
        s.key,
        s.mode.as_str(),
        s.api,
        s.wait_ms
            .map_or_else(|| "no_wait".to_owned(), |w| format!("{w}ms")),
        s.lease_ms,
        rel(t0, s.call),
        opt(s.acq),
        s.fence.map_or_else(|| "-".to_owned(), |f| f.to_string()),
        opt(s.end),
        rel(t0, s.ret),
        opt(s.told),
        s.how
            .as_deref()
            .map_or_else(String::new, |h| format!("({h})")),
        s.result,
        s.release.as_deref().unwrap_or("-"),
        s.inner.as_deref().unwrap_or("-"),
    );
    for w in &s.writes {
        let _ = write!(
            out,
            "\n      write {} checked {} answered {} {:?}, store: {}",
            w.id,
            rel(t0, w.check),
            opt(w.done),
            w.answer,
            accepted
                .get(w.id.as_str())
                .map_or_else(|| "not in the log".to_owned(), |p| format!("accepted #{p}"))
        );
    }
    if !s.msg.is_empty() {
        let _ = write!(out, "\n      msg: {}", s.msg);
    }
    out
}

fn print_report(
    cfg: &Config,
    t0: u64,
    input: &Input<'_>,
    report: &Report,
    extra: &[(String, String)],
) {
    println!("\n=== chaos report: seed {} ===", cfg.seed);
    println!("replay: {}", cfg.replay());
    let mut kinds: BTreeMap<Kind, usize> = BTreeMap::new();
    for f in input.faults {
        *kinds.entry(f.kind).or_default() += 1;
    }
    println!("faults: {} {kinds:?}", input.faults.len());
    println!("sections: {}", input.sections.len());
    for (what, n) in &report.counts {
        println!("  {n:>6}  {what}");
    }
    println!(
        "worst wait past its bound (unexcused waits): {:.1} ms (tolerance {} ms)",
        report.worst_wait_over_us as f64 / 1000.0,
        cfg.tolerance_ms
    );
    let rules = report.rules();
    if rules.is_empty() && extra.is_empty() {
        println!("no violations");
        return;
    }
    println!(
        "\nVIOLATIONS: {rules:?}{}",
        if extra.is_empty() {
            ""
        } else {
            " + others below"
        }
    );
    println!("\nfault timeline (ms since the start):");
    for f in input.faults {
        println!("  {} .. {}  {}", rel(t0, f.start), rel(t0, f.end), f.what);
    }
    let mut accepted: HashMap<&str, usize> = HashMap::new();
    for entries in input.logs.values() {
        for (i, e) in entries.iter().enumerate() {
            accepted.insert(e.split(' ').next().unwrap_or_default(), i + 1);
        }
    }
    let by_name: HashMap<String, &Section> = input.sections.iter().map(|s| (s.name(), s)).collect();
    let mut shown: BTreeMap<&str, usize> = BTreeMap::new();
    for v in &report.violations {
        let n = shown.entry(v.rule).or_default();
        *n += 1;
        if *n > EXAMPLES {
            continue;
        }
        println!("\n[{}] {}", v.rule, v.detail);
        for name in &v.sections {
            if let Some(s) = by_name.get(name) {
                println!("    {}", describe(s, t0, &accepted));
            }
        }
    }
    for (rule, n) in &rules {
        if *n > EXAMPLES {
            println!("\n[{rule}] ... and {} more", n - EXAMPLES);
        }
    }
    for (rule, detail) in extra {
        println!("\n[{rule}] {detail}");
    }
}

// ---------------------------------------------------------------------------------------------
// The run

/// The short run in the suite; the long run is the same test with `CHAOS_SECONDS` etc.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_faults_never_give_two_holders_nor_backward_fences_nor_late_waits() {
    let cfg = Config::from_env();
    println!(
        "chaos: seed {} ({}), {} s of faults, {} processes x {} tasks, {} keys; replay: {}",
        cfg.seed,
        if std::env::var("CHAOS_SEED").is_ok() {
            "CHAOS_SEED"
        } else {
            "default"
        },
        cfg.seconds,
        cfg.processes,
        cfg.tasks,
        cfg.keys,
        cfg.replay()
    );
    let mut lock_server = RedisServer::start();
    let store = RedisServer::start();
    let keys: Vec<String> = (0..cfg.keys).map(key_name).collect();

    let mut children: Vec<ChildProcess> = (0..cfg.processes)
        .map(|proc| {
            Worker::spawn(&WorkerConfig {
                lock_url: lock_server.url(),
                store_url: store.url(),
                proc,
                tasks: cfg.tasks,
                keys: cfg.keys,
                seed: cfg.seed,
            })
        })
        .collect();
    for (proc, child) in (0..).zip(&mut children) {
        Worker::wait_ready(proc, child).await;
    }
    let t0 = now_us();
    let mut workers = Vec::new();
    for (proc, child) in (0..).zip(children) {
        workers.push(Worker::go(proc, child).await);
    }
    let pids: Vec<u32> = workers.iter().map(|w| w.pid).collect();
    let faults = inject(
        &mut lock_server,
        &pids,
        cfg.seed,
        t0 + cfg.seconds * 1_000_000,
    )
    .await;
    let quiet_start = now_us();
    tokio::time::sleep(QUIET).await;
    let stopping: Vec<_> = workers.into_iter().map(Worker::stop).collect();
    let mut finished = Vec::new();
    for (proc, run) in stopping {
        finished.push(Worker::finish(proc, run).await);
    }
    let elapsed = Duration::from_micros(now_us() - t0);

    // Everything the workers said.
    let mut sections = Vec::new();
    let mut extra: Vec<(String, String)> = Vec::new();
    for f in &finished {
        let mut done = false;
        for line in &f.lines {
            if line.starts_with("SEC ") {
                match Section::parse(line) {
                    Ok(s) => sections.push(s),
                    Err(e) => extra.push(("records".into(), format!("p{}: {e}", f.proc))),
                }
            } else if line.starts_with("DONE") {
                done = true;
            } else if line != "READY" {
                extra.push(("process".into(), format!("p{} said: {line}", f.proc)));
            }
        }
        match &f.status {
            Ok(s) if s.success() && done => {}
            Ok(s) => extra.push((
                "process".into(),
                format!("p{} exited with {s} (DONE printed: {done})", f.proc),
            )),
            Err(e) => extra.push(("process".into(), format!("p{}: {e}", f.proc))),
        }
        if f.stderr.contains("panicked") {
            extra.push((
                "process".into(),
                format!("p{} panicked; its stderr:\n{}", f.proc, f.stderr),
            ));
        }
    }

    // The store's logs, and what the lock server keeps without a TTL.
    let mut logs = HashMap::new();
    for key in &keys {
        let (_, log) = store_keys(key);
        let entries: Vec<String> = store
            .query(redis::cmd("LRANGE").arg(&log).arg(0).arg(-1).clone())
            .await;
        logs.insert(key.clone(), entries);
    }
    for key in lock_server.keys("*").await {
        if lock_server.pttl(&key).await != -1 {
            continue;
        }
        match DOCUMENTED_WITHOUT_TTL
            .iter()
            .find(|(suffix, _)| key.ends_with(suffix))
        {
            Some((_, why)) => println!("without a TTL at the end, documented: {key} ({why})"),
            None => extra.push((
                "no-ttl".into(),
                format!("{key} lives on the lock server without a TTL"),
            )),
        }
    }

    let input = Input {
        sections: &sections,
        faults: &faults,
        logs: &logs,
        tolerance_us: cfg.tolerance_ms * 1000,
        quiet_start: Some(quiet_start),
        keys: &keys,
    };
    let report = check(&input);
    print_report(&cfg, t0, &input, &report, &extra);
    println!("wall time from GO to the last exit: {elapsed:?}");
    assert!(
        report.violations.is_empty() && extra.is_empty(),
        "chaos seed {}: violations {:?}{}; replay: {}",
        cfg.seed,
        report.rules(),
        if extra.is_empty() {
            String::new()
        } else {
            format!(" and {} more (see the report)", extra.len())
        },
        cfg.replay()
    );
    assert!(
        report.counts.get("acquired").copied().unwrap_or(0) > 0,
        "nothing was ever acquired: the run checked nothing"
    );
}

// ---------------------------------------------------------------------------------------------
// The checks themselves, on made-up records: each rule fires on what it must catch, and stays
// quiet on what a correct library does under faults.

#[cfg(test)]
mod checker {
    use super::*;
    use lock_tests::chaos::Write;

    const MS: u64 = 1000;

    fn held(proc: u32, n: u64, mode: Mode, acq: u64, end: u64, fence: Option<u64>) -> Section {
        let mut s = Section::new(proc, 0, n, "chaos:k0", mode, "run", Some(1000), 1000);
        s.call = acq - 5 * MS;
        s.acq = Some(acq);
        s.end = Some(end);
        s.ret = end + MS;
        s.fence = fence;
        s.result = "ok".into();
        s
    }

    fn write(s: &mut Section, at: u64, answer: Answer) {
        s.writes.push(Write {
            id: format!("{}w{}", s.name(), s.writes.len()),
            check: at,
            done: Some(at + MS),
            answer,
        });
    }

    fn run(sections: &[Section], faults: &[Fault]) -> Report {
        // The store's log: every write the records say was accepted, in check order.
        let mut all: Vec<&Write> = sections
            .iter()
            .flat_map(|s| &s.writes)
            .filter(|w| w.answer == Answer::Accepted)
            .collect();
        all.sort_by_key(|w| w.check);
        let logs = HashMap::from([(
            "chaos:k0".to_owned(),
            all.iter().map(|w| format!("{} -", w.id)).collect(),
        )]);
        check(&Input {
            sections,
            faults,
            logs: &logs,
            tolerance_us: 150 * MS,
            quiet_start: None,
            keys: &[],
        })
    }

    fn restart_at(t: u64) -> Fault {
        Fault {
            kind: Kind::Restart,
            proc: None,
            what: "restart".into(),
            start: t,
            end: t + 50 * MS,
        }
    }

    fn rules(r: &Report) -> Vec<&'static str> {
        r.rules().into_keys().collect()
    }

    #[test]
    fn one_holder_after_another_is_fine() {
        let mut a = held(0, 1, Mode::Plain, 1000 * MS, 1200 * MS, None);
        write(&mut a, 1010 * MS, Answer::Accepted);
        let mut b = held(1, 1, Mode::Plain, 1300 * MS, 1400 * MS, None);
        b.call = 1100 * MS;
        write(&mut b, 1310 * MS, Answer::Accepted);
        assert!(run(&[a, b], &[]).violations.is_empty());
    }

    #[test]
    fn two_writers_without_data_loss_are_two_holders() {
        let mut a = held(0, 1, Mode::Plain, 1000 * MS, 1500 * MS, None);
        write(&mut a, 1400 * MS, Answer::Accepted);
        a.told = Some(1450 * MS);
        let mut b = held(1, 1, Mode::Plain, 1300 * MS, 1600 * MS, None);
        write(&mut b, 1310 * MS, Answer::Accepted);
        assert_eq!(rules(&run(&[a, b], &[])), ["two-holders"]);
    }

    #[test]
    fn a_frozen_holder_that_writes_nothing_after_is_not_a_second_holder() {
        // A is stopped past its lease; B takes the key; A wakes, sees is_held() false.
        let mut a = held(0, 1, Mode::Plain, 1000 * MS, 3000 * MS, None);
        write(&mut a, 1010 * MS, Answer::Accepted);
        a.tell(3000 * MS, "is_held");
        a.result = "LeaseLost".into();
        let mut b = held(1, 1, Mode::Plain, 2100 * MS, 2200 * MS, None);
        write(&mut b, 2110 * MS, Answer::Accepted);
        assert!(run(&[a, b], &[]).violations.is_empty());
    }

    #[test]
    fn overlapping_sections_that_both_end_ok_are_caught() {
        let a = held(0, 1, Mode::Plain, 1000 * MS, 1500 * MS, None);
        let b = held(1, 1, Mode::Plain, 1300 * MS, 1600 * MS, None);
        assert_eq!(
            rules(&run(&[a, b], &[restart_at(1100 * MS)])),
            ["untold-overlap"]
        );
    }

    #[test]
    fn a_stale_unfenced_writer_after_a_restart_is_the_documented_limit_if_it_learns_in_time() {
        let mut a = held(0, 1, Mode::Plain, 1000 * MS, 1500 * MS, None);
        write(&mut a, 1400 * MS, Answer::Accepted);
        a.tell(1500 * MS, "lost");
        let mut b = held(1, 1, Mode::Plain, 1300 * MS, 1600 * MS, None);
        write(&mut b, 1310 * MS, Answer::Accepted);
        let ok = run(&[a.clone(), b.clone()], &[restart_at(1100 * MS)]);
        assert!(ok.violations.is_empty(), "{:?}", ok.violations);
        assert_eq!(
            ok.counts
                .get("stale unfenced holder wrote after data loss (documented limit)"),
            Some(&1)
        );
        // Told 3 s after the restart, with a 1 s lease: too late.
        a.told = Some(4200 * MS);
        a.end = Some(4200 * MS);
        b.end = Some(4300 * MS);
        write(&mut a, 4100 * MS, Answer::Accepted);
        assert_eq!(
            rules(&run(&[a, b], &[restart_at(1100 * MS)])),
            ["stale-learned-late"]
        );
    }

    #[test]
    fn fences_that_go_backwards_or_repeat_are_caught() {
        let a = held(0, 1, Mode::Fenced, 1000 * MS, 1100 * MS, Some(7));
        let mut b = held(1, 1, Mode::Fenced, 1300 * MS, 1400 * MS, Some(1));
        b.call = 1200 * MS;
        let r = run(&[a.clone(), b], &[restart_at(1150 * MS)]);
        assert_eq!(rules(&r), ["fence-backwards"]);
        let mut c = held(1, 2, Mode::Fenced, 1300 * MS, 1400 * MS, Some(7));
        c.call = 1200 * MS;
        assert_eq!(rules(&run(&[a, c], &[])), ["fence-backwards"]);
    }

    #[test]
    fn a_stale_fenced_writer_is_fine_when_the_store_rejects_it() {
        let mut a = held(0, 1, Mode::Fenced, 1000 * MS, 1500 * MS, Some(3));
        write(&mut a, 1010 * MS, Answer::Accepted);
        write(&mut a, 1400 * MS, Answer::Rejected);
        a.tell(1500 * MS, "run");
        a.result = "LeaseLost".into();
        let mut b = held(1, 1, Mode::Fenced, 1300 * MS, 1600 * MS, Some(4));
        b.call = 1200 * MS;
        write(&mut b, 1310 * MS, Answer::Accepted);
        let r = run(&[a.clone(), b.clone()], &[restart_at(1100 * MS)]);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        // The same writes accepted with one fence: the store could not tell them apart.
        a.fence = Some(4);
        a.writes[1].answer = Answer::Accepted;
        b.writes[0].check = 1350 * MS;
        a.writes[1].check = 1400 * MS;
        let r = run(&[a, b], &[restart_at(1100 * MS)]);
        assert!(rules(&r).contains(&"fence-serial"), "{:?}", r.violations);
    }

    #[test]
    fn a_wait_past_its_bound_is_caught_unless_its_process_was_stopped() {
        let mut s = Section::new(0, 0, 1, "chaos:k0", Mode::Plain, "run", Some(1000), 1000);
        s.call = 1000 * MS;
        s.ret = 2400 * MS;
        s.result = "Timeout".into();
        assert_eq!(rules(&run(std::slice::from_ref(&s), &[])), ["wait-bound"]);
        let stop = Fault {
            kind: Kind::StopWorker,
            proc: Some(0),
            what: "SIGSTOP".into(),
            start: 1500 * MS,
            end: 2000 * MS,
        };
        assert!(run(&[s], &[stop]).violations.is_empty());
    }
}
