//! `lock-chaos-worker`: one OS process of the randomized fault test (`tests/tests/chaos/`).
//!
//! ```text
//! lock-chaos-worker --engine E --lock-url U --store-url S --proc P --tasks T --keys K --seed N
//! ```
//!
//! Connects a `Locker` to the lock servers of engine `E` (`redis`, `cluster`, `sentinel` or
//! `redlock`; `U` is a comma-separated list of URLs: the server, the cluster's nodes, the
//! sentinels, the Redlock servers; the engine's default options, as a user would) and a
//! connection to the fence-checking store, prints `READY`, and waits for `GO` on stdin. Then
//! `T` tasks loop until `STOP` (or the end of stdin): each draws a key, an API (`run` or a
//! guard), a wait (or `no_wait`) and a lease from its seeded generator, locks the key as its
//! mode says (fenced; reentrant: a nested `run` on the same key inside the outer lock; plain;
//! nested: reentrant without a fence, on Redlock), and inside the critical section writes to
//! the store a few times, each write preceded by `is_held()`; one section in six then stays
//! in its body for one to two leases (renewed meanwhile). Every attempt ends with one `SEC ...` line on stdout
//! (`lock_tests::chaos::Section`). At the end it prints `DONE sections=<n>` and exits 0; a
//! task that panicked prints `PANIC ...` (exit 3), tasks that do not finish within 30 s print
//! `HANG` (exit 4). A thread outside the runtime prints `LAG <µs> <ms>` whenever it woke more
//! than 50 ms late (the process was not scheduled). Each attempt is bounded too (15 s): one that is not over by then is
//! recorded with `result=HUNG`.

#![forbid(unsafe_code)]
#![allow(
    clippy::print_stdout,
    reason = "the worker talks to the test that spawned it through stdout lines"
)]

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use lock_core::{LockError, LockInfo, Locker, RedisBackend, current_lock};
use lock_testkit::process::say;
use lock_testkit::sentinel::MASTER_NAME;
use lock_tests::chaos::{
    Answer, Engine, FENCE_STORE, MAX_LEASE_MS, Mode, Rng, Section, WorkerConfig, Write, key_name,
    now_us, store_keys,
};
use lock_tests::worker::error_kind;
use redis::Script;
use redis::aio::MultiplexedConnection;
use tokio::io::{AsyncBufReadExt, BufReader};

/// A bound on one attempt (acquire, body, release): far above anything a correct library
/// needs under the injected faults (waits up to 1.5 s, leases up to 2 s, pauses up to 2.5 s).
const SECTION_BOUND: Duration = Duration::from_secs(15);

/// A bound on the tasks' ending after `STOP`.
const FINISH_BOUND: Duration = Duration::from_secs(30);

/// Everything a task needs.
#[derive(Clone)]
struct Ctx {
    locker: Locker,
    store: MultiplexedConnection,
    script: Arc<Script>,
}

/// One attempt's shared record: the body may be cancelled half-way, the record stays.
type Rec = Arc<Mutex<Section>>;

fn with<T>(rec: &Rec, f: impl FnOnce(&mut Section) -> T) -> T {
    f(&mut rec.lock().unwrap_or_else(PoisonError::into_inner))
}

/// What a task draws for one attempt.
struct Plan {
    key: String,
    mode: Mode,
    run: bool,
    wait: Option<Duration>,
    lease: Duration,
    /// The pause after each write, in ms.
    gaps: Vec<u64>,
    /// How long the body stays after its writes, in ms (renewals happen meanwhile).
    linger: u64,
}

impl Plan {
    fn draw(rng: &mut Rng, engine: Engine, keys: u64) -> Plan {
        let k = rng.range(0, keys);
        let wait = (!rng.chance(25)).then(|| Duration::from_millis(rng.range(100, 1500)));
        let lease_ms = rng.range(800, MAX_LEASE_MS + 1);
        let run = rng.chance(50);
        let writes = rng.range(1, 5);
        let gaps = (0..writes).map(|_| rng.range(10, 120)).collect();
        let linger = rng.range(lease_ms, 2 * lease_ms);
        let linger = if rng.chance(16) { linger } else { 0 };
        Plan {
            key: key_name(k),
            mode: engine.mode_of(k),
            run,
            wait,
            lease: Duration::from_millis(lease_ms),
            gaps,
            linger,
        }
    }
}

/// Aborts the task when dropped (the loss watcher ends with its critical section).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Records when `info.lost()` resolves.
fn watch_loss(info: &LockInfo, rec: &Rec) -> AbortOnDrop {
    let (info, rec) = (info.clone(), rec.clone());
    AbortOnDrop(tokio::spawn(async move {
        info.lost().await;
        let at = now_us();
        with(&rec, |s| s.tell(at, "lost"));
    }))
}

/// The holder's work: for each planned write, check `is_held()`, then write to the store with
/// the lock's fence (if any), then pause. Stops at the first `is_held() == false`.
async fn body(ctx: &Ctx, info: &LockInfo, rec: &Rec, gaps: &[u64], first: usize) {
    let mut store = ctx.store.clone();
    let (fence_key, log_key) = store_keys(info.key());
    let fence = info
        .fence()
        .map_or_else(|| "-".to_owned(), |f| f.to_string());
    for (i, gap) in gaps.iter().enumerate() {
        let check = now_us();
        if !info.is_held() {
            with(rec, |s| s.tell(check, "is_held"));
            return;
        }
        let (id, index) = with(rec, |s| {
            let id = format!("{}w{}", s.name(), first + i);
            s.writes.push(Write {
                id: id.clone(),
                check,
                done: None,
                answer: Answer::Unknown,
            });
            (id, s.writes.len() - 1)
        });
        let answer: redis::RedisResult<i64> = ctx
            .script
            .key(&fence_key)
            .key(&log_key)
            .arg(&fence)
            .arg(&id)
            .invoke_async(&mut store)
            .await;
        let done = now_us();
        with(rec, |s| {
            if let Some(w) = s.writes.get_mut(index) {
                w.done = Some(done);
                w.answer = match &answer {
                    Ok(n) if *n > 0 => Answer::Accepted,
                    Ok(_) => Answer::Rejected,
                    Err(_) => Answer::Failed,
                };
            }
            if let Err(e) = &answer {
                s.note(&format!("store write {id}: {e}"));
            }
        });
        tokio::time::sleep(Duration::from_millis(*gap)).await;
    }
}

/// Marks the body's start (the lock is held) and its fence.
fn acquired(rec: &Rec, info: &LockInfo) {
    let at = now_us();
    with(rec, |s| {
        s.acq = Some(at);
        s.fence = info.fence();
    });
}

fn ended(rec: &Rec) {
    let at = now_us();
    with(rec, |s| s.end = Some(at));
}

/// The body of a section in the `run` API: reentrant mode writes once, then nests a `run` on
/// the same key for the other writes.
async fn run_body(ctx: &Ctx, plan: &Plan, rec: &Rec) {
    let Some(info) = current_lock() else {
        with(rec, |s| s.note("no current_lock() inside run"));
        return;
    };
    acquired(rec, &info);
    let _watch = watch_loss(&info, rec);
    if plan.mode.nests() {
        nested(ctx, plan, rec, &info).await;
    } else {
        body(ctx, &info, rec, &plan.gaps, 0).await;
    }
    linger(ctx, plan, rec, &info).await;
    ended(rec);
}

/// Stays in the body for the plan's linger (a section that spans leases: renewed meanwhile),
/// then writes once more (after `is_held()`, as every write).
async fn linger(ctx: &Ctx, plan: &Plan, rec: &Rec, info: &LockInfo) {
    if plan.linger > 0 {
        tokio::time::sleep(Duration::from_millis(plan.linger)).await;
        body(ctx, info, rec, &[0], plan.gaps.len()).await;
    }
}

/// The first write under the outer lock, the rest inside a nested `run` on the same key.
async fn nested(ctx: &Ctx, plan: &Plan, rec: &Rec, outer: &LockInfo) {
    let (first, rest) = plan.gaps.split_at(1);
    body(ctx, outer, rec, first, 0).await;
    let inner = ctx
        .locker
        .lock(&plan.key)
        .run(async {
            match current_lock() {
                Some(info) => body(ctx, &info, rec, rest, 1).await,
                None => with(rec, |s| s.note("no current_lock() inside the nested run")),
            }
        })
        .await;
    let at = now_us();
    with(rec, |s| match &inner {
        Ok(()) => s.inner = Some("ok".to_owned()),
        Err(e) => {
            s.inner = Some(error_kind(e).to_owned());
            s.note(&format!("inner: {e}"));
            if matches!(e, LockError::LeaseLost { .. }) {
                s.tell(at, "inner");
            }
        }
    });
}

async fn section(ctx: &Ctx, plan: &Plan, rec: &Rec) {
    let mut req = ctx.locker.lock(&plan.key).lease(plan.lease);
    if plan.mode.fenced() {
        req = req.fenced();
    }
    req = match plan.wait {
        Some(w) => req.wait(w),
        None => req.no_wait(),
    };
    with(rec, |s| s.call = now_us());
    if plan.run {
        let result = req.run(run_body(ctx, plan, rec)).await;
        let at = now_us();
        with(rec, |s| {
            s.ret = at;
            match &result {
                Ok(()) => s.result = "ok".to_owned(),
                Err(e) => {
                    s.result = error_kind(e).to_owned();
                    s.note(&e.to_string());
                    if s.acq.is_some() {
                        if matches!(e, LockError::LeaseLost { .. }) {
                            s.tell(at, "run");
                        }
                        if s.end.is_none() {
                            // The body was cancelled.
                            s.end = Some(at);
                        }
                    }
                }
            }
        });
        return;
    }
    let guard = match req.await {
        Ok(g) => g,
        Err(e) => {
            let at = now_us();
            with(rec, |s| {
                s.ret = at;
                s.result = error_kind(&e).to_owned();
                s.note(&e.to_string());
            });
            return;
        }
    };
    let info = guard.info();
    acquired(rec, &info);
    {
        let _watch = watch_loss(&info, rec);
        if plan.mode.nests() {
            guard.scope(nested(ctx, plan, rec, &info)).await;
        } else {
            body(ctx, &info, rec, &plan.gaps, 0).await;
        }
        linger(ctx, plan, rec, &info).await;
        ended(rec);
    }
    let released = guard.release().await;
    let at = now_us();
    with(rec, |s| {
        s.ret = at;
        s.result = "ok".to_owned();
        match &released {
            Ok(()) => s.release = Some("ok".to_owned()),
            Err(e) => {
                s.release = Some(error_kind(e).to_owned());
                s.note(&format!("release: {e}"));
                if matches!(e, LockError::LeaseLost { .. }) {
                    s.tell(at, "release");
                }
            }
        }
    });
}

async fn task(
    ctx: Ctx,
    cfg: Arc<WorkerConfig>,
    id: u32,
    stop: Arc<AtomicBool>,
    count: Arc<AtomicU64>,
) {
    let mut rng =
        Rng::new(cfg.seed ^ (u64::from(cfg.proc) << 40) ^ (u64::from(id) << 20) ^ 0x00C0_FFEE);
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let plan = Plan::draw(&mut rng, cfg.engine, cfg.keys);
        let rec: Rec = Arc::new(Mutex::new(Section::new(
            cfg.proc,
            id,
            n,
            &plan.key,
            plan.mode,
            if plan.run { "run" } else { "guard" },
            plan.wait
                .map(|w| u64::try_from(w.as_millis()).unwrap_or(u64::MAX)),
            u64::try_from(plan.lease.as_millis()).unwrap_or(u64::MAX),
        )));
        let bounded = tokio::time::timeout(SECTION_BOUND, section(&ctx, &plan, &rec)).await;
        let line = with(&rec, |s| {
            if bounded.is_err() {
                s.ret = now_us();
                s.result = "HUNG".to_owned();
                s.note(&format!("the attempt did not end within {SECTION_BOUND:?}"));
            }
            s.to_line()
        });
        say(&line);
        count.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(rng.range(0, 40))).await;
    }
}

/// Connects to the lock servers, retrying while they restart (bounded).
async fn connect(engine: Engine, urls: &str) -> Result<Locker, String> {
    let urls: Vec<&str> = urls.split(',').collect();
    let mut last = String::new();
    for _ in 0..40 {
        let locker = match engine {
            Engine::Redis => match urls.first() {
                Some(url) => RedisBackend::builder(url)
                    .connect()
                    .await
                    .map(|b| Locker::builder(b).build()),
                None => return Err("no lock server URL".to_owned()),
            },
            Engine::Cluster => Locker::redis_cluster(&urls).await,
            Engine::Sentinel => Locker::redis_sentinel(&urls, MASTER_NAME).await,
            Engine::Redlock => Locker::redlock(&urls).await,
        };
        match locker {
            Ok(l) => return Ok(l),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(last)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let cfg = match WorkerConfig::parse(std::env::args().skip(1)) {
        Ok(c) => Arc::new(c),
        Err(e) => {
            say(&format!("ERROR {e}"));
            return ExitCode::from(2);
        }
    };
    let locker = match connect(cfg.engine, &cfg.lock_url).await {
        Ok(l) => l,
        Err(e) => {
            say(&format!("ERROR connect to the lock server: {e}"));
            return ExitCode::from(2);
        }
    };
    let store_config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(10)))
        .set_response_timeout(Some(Duration::from_secs(10)));
    let store = match redis::Client::open(cfg.store_url.as_str()) {
        Ok(c) => match c
            .get_multiplexed_async_connection_with_config(&store_config)
            .await
        {
            Ok(conn) => conn,
            Err(e) => {
                say(&format!("ERROR connect to the store: {e}"));
                return ExitCode::from(2);
            }
        },
        Err(e) => {
            say(&format!("ERROR store URL: {e}"));
            return ExitCode::from(2);
        }
    };
    let ctx = Ctx {
        locker,
        store,
        script: Arc::new(Script::new(FENCE_STORE)),
    };
    say("READY");
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    match lines.next_line().await {
        Ok(Some(line)) if line.trim() == "GO" => {}
        other => {
            say(&format!("ERROR expected GO, got {other:?}"));
            return ExitCode::from(2);
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    lag_probe(stop.clone());
    let count = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..cfg.tasks)
        .map(|id| {
            tokio::spawn(task(
                ctx.clone(),
                cfg.clone(),
                id,
                stop.clone(),
                count.clone(),
            ))
        })
        .collect();
    // `STOP`, or the end of stdin (the test went away): finish the current attempts.
    loop {
        match lines.next_line().await {
            Ok(Some(line)) if line.trim() != "STOP" => continue,
            _ => break,
        }
    }
    stop.store(true, Ordering::Relaxed);
    let joined = tokio::time::timeout(FINISH_BOUND, futures_join_all(tasks)).await;
    let Ok(results) = joined else {
        say(&format!(
            "HANG tasks did not finish within {FINISH_BOUND:?} of STOP"
        ));
        return ExitCode::from(4);
    };
    let mut code = ExitCode::SUCCESS;
    for (id, r) in results.into_iter().enumerate() {
        if let Err(e) = r {
            say(&format!("PANIC task {id}: {e}"));
            code = ExitCode::from(3);
        }
    }
    say(&format!("DONE sections={}", count.load(Ordering::Relaxed)));
    code
}

/// How often the lag probe wakes, and from how late on it reports.
const PROBE_TICK: Duration = Duration::from_millis(10);
const PROBE_REPORT: Duration = Duration::from_millis(50);

/// A plain OS thread (outside the runtime) that sleeps [`PROBE_TICK`] at a time and prints
/// `LAG <µs> <ms>` when it woke more than [`PROBE_REPORT`] late: the process was not scheduled
/// (a starved machine, or the test's SIGSTOP). The test shows these beside a late wait; they
/// excuse nothing. Ends with `stop`.
fn lag_probe(stop: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            let before = std::time::Instant::now();
            std::thread::sleep(PROBE_TICK);
            let late = before.elapsed().saturating_sub(PROBE_TICK);
            if late > PROBE_REPORT {
                say(&format!("LAG {} {}", now_us(), late.as_millis()));
            }
        }
    });
}

/// Awaits every task in turn (no `futures` dependency): the bound is on the whole.
async fn futures_join_all(
    tasks: Vec<tokio::task::JoinHandle<()>>,
) -> Vec<Result<(), tokio::task::JoinError>> {
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await);
    }
    out
}
