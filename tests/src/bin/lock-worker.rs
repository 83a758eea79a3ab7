//! `lock-worker`: one OS process contending for locks on Redis, etcd or ZooKeeper, spawned by the
//! multi-process and fault tests: a batch stress (`count`), tasks running checked critical
//! sections until stopped (`sections`), or a lock client obeying commands on stdin (`serve`).
//! See `lock_tests::worker` for its command line, commands and answers.

#![forbid(unsafe_code)]
#![allow(
    clippy::print_stdout,
    reason = "the worker talks to the test that spawned it through stdout lines"
)]

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use lock_core::backend::{Backend, IntoBackend};
use lock_core::{
    EtcdBackend, LockError, LockGuard, Locker, RedisBackend, RedisClusterBackend, ZooKeeperBackend,
    current_fence,
};
use lock_testkit::process::say;
use lock_tests::probe::{SECTION, section_keys};
use lock_tests::worker::{
    Mode, REQUEST_TIMEOUT, SECTION_MARGIN, SectionsSummary, WorkerArgs, WorkerSummary, error_kind,
};
use redis::aio::MultiplexedConnection;
use redis::{AsyncCommands, Script};
use tokio::io::{AsyncBufReadExt, BufReader, Lines, Stdin};
use tokio::sync::Mutex;

/// A failure: what was being done and why.
struct Failure {
    op: &'static str,
    kind: String,
    message: String,
}

impl Failure {
    fn lock(op: &'static str, e: &LockError) -> Self {
        Failure {
            op,
            kind: error_kind(e).to_owned(),
            message: e.to_string(),
        }
    }

    fn redis(op: &'static str, e: &redis::RedisError) -> Self {
        Failure {
            op,
            kind: "redis".to_owned(),
            message: e.to_string(),
        }
    }

    fn usage(message: String) -> Self {
        Failure {
            op: "args",
            kind: "usage".to_owned(),
            message,
        }
    }
}

// Two threads: a serving worker runs waiters in their own tasks beside the command loop.
#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let result = match WorkerArgs::parse(std::env::args().skip(1)) {
        Ok(args) => run(args).await,
        Err(e) => Err(Failure::usage(e)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            say(&format!(
                "error op={} kind={} message={}",
                f.op,
                f.kind,
                f.message.replace('\n', " ")
            ));
            ExitCode::from(2)
        }
    }
}

/// How long a worker on etcd or ZooKeeper may take to connect.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The backend the command line names: etcd (`--etcd`), ZooKeeper (`--zookeeper`), a Redis
/// Cluster (`--cluster`) or one Redis server.
async fn backend(args: &WorkerArgs) -> Result<Arc<dyn Backend>, Failure> {
    let connecting = |e: LockError| Failure::lock("connect", &e);
    Ok(if let Some(etcd) = &args.etcd {
        let urls: Vec<&str> = etcd.split(',').collect();
        let mut builder = EtcdBackend::builder(&urls)
            .connect_timeout(CONNECT_TIMEOUT)
            .request_timeout(REQUEST_TIMEOUT);
        if let Some(ns) = &args.etcd_namespace {
            builder = builder.namespace(ns);
        }
        builder.connect().await.map_err(connecting)?.into_backend()
    } else if let Some(hosts) = &args.zookeeper {
        let mut builder = ZooKeeperBackend::builder(hosts)
            .connect_timeout(CONNECT_TIMEOUT)
            .request_timeout(REQUEST_TIMEOUT);
        if let Some(root) = &args.zookeeper_root {
            builder = builder.root(root);
        }
        if let Some(ms) = args.session_ms {
            builder = builder.session_timeout(Duration::from_millis(ms));
        }
        builder.connect().await.map_err(connecting)?.into_backend()
    } else if args.cluster {
        let urls: Vec<&str> = args.url.split(',').collect();
        RedisClusterBackend::connect(&urls)
            .await
            .map_err(connecting)?
            .into_backend()
    } else {
        RedisBackend::connect(&args.url)
            .await
            .map_err(connecting)?
            .into_backend()
    })
}

async fn run(args: WorkerArgs) -> Result<(), Failure> {
    let backend = backend(&args).await?;
    let mut builder = Locker::builder(backend).wait(Duration::from_millis(args.wait_ms));
    if let Some(p) = &args.prefix {
        builder = builder.prefix(p.clone());
    }
    if let Some(h) = &args.holder {
        builder = builder.holder(h.clone());
    }
    if let Some(ms) = args.lease_ms {
        builder = builder.lease(Duration::from_millis(ms));
    }
    let locker = builder
        .try_build()
        .map_err(|e| Failure::lock("configure", &e))?;
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    match args.mode {
        Mode::Count => count(&args, &locker, &mut stdin).await,
        Mode::Serve => serve(&args, locker, &mut stdin).await,
        Mode::Sections => sections(&args, &locker, &mut stdin).await,
    }
}

async fn wait_go(stdin: &mut Lines<BufReader<Stdin>>) -> Result<(), Failure> {
    say("ready");
    match stdin.next_line().await {
        Ok(Some(line)) if line.trim() == "go" => Ok(()),
        other => Err(Failure::usage(format!(
            "expected `go` on stdin, got {other:?}"
        ))),
    }
}

async fn count(
    args: &WorkerArgs,
    locker: &Locker,
    stdin: &mut Lines<BufReader<Stdin>>,
) -> Result<(), Failure> {
    let storage = args.storage_url.as_deref().unwrap_or(args.url.as_str());
    let client = redis::Client::open(storage).map_err(|e| Failure::redis("open", &e))?;
    let conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| Failure::redis("connect counter", &e))?;
    if args.wait_go {
        wait_go(stdin).await?;
    }
    let started = Instant::now();
    let mut summary = WorkerSummary {
        pid: std::process::id(),
        iterations: args.iterations,
        increments: 0,
        max_fence: 0,
        fence_violations: 0,
        elapsed_ms: 0,
    };
    for i in 0..args.iterations {
        let (key, counter, fence) = args.names(i);
        let body = increment(&counter, fence.as_deref(), args.work_us, conn.clone());
        let outcome = if args.no_lock {
            body.await
        } else {
            let mut request = locker.lock(&key);
            if fence.is_some() {
                request = request.fenced();
            }
            request
                .run(body)
                .await
                .map_err(|e| Failure::lock("lock", &e))?
        }?;
        summary.increments += 1;
        if let Some((fence, violated)) = outcome {
            summary.max_fence = summary.max_fence.max(fence);
            summary.fence_violations += u64::from(violated);
        }
    }
    summary.elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    say(&summary.to_line());
    Ok(())
}

/// One non-atomic read-modify-write of the counter (and, when fenced, the fence check).
/// Returns the fence drawn and whether it failed to be above the highest one stored.
async fn increment(
    counter_key: &str,
    fence_key: Option<&str>,
    work_us: u64,
    mut conn: MultiplexedConnection,
) -> Result<Option<(u64, bool)>, Failure> {
    let value: Option<u64> = conn
        .get(counter_key)
        .await
        .map_err(|e| Failure::redis("get counter", &e))?;
    // The window a missing lock would lose updates in.
    tokio::task::yield_now().await;
    if work_us > 0 {
        tokio::time::sleep(Duration::from_micros(work_us)).await;
    }
    let () = conn
        .set(counter_key, value.unwrap_or(0) + 1)
        .await
        .map_err(|e| Failure::redis("set counter", &e))?;
    let Some(fence_key) = fence_key else {
        return Ok(None);
    };
    let Some(fence) = current_fence() else {
        return Err(Failure::usage("a fenced lock has no fencing token".into()));
    };
    let seen: Option<u64> = conn
        .get(fence_key)
        .await
        .map_err(|e| Failure::redis("get fence", &e))?;
    let violated = seen.is_some_and(|s| fence <= s);
    if !violated {
        let () = conn
            .set(fence_key, fence)
            .await
            .map_err(|e| Failure::redis("set fence", &e))?;
    }
    Ok(Some((fence, violated)))
}

/// Fenced storage: write only when the writer's token is not older than the last one seen.
const FENCED_WRITE: &str = r"
-- KEYS[1] the stored value, KEYS[2] the highest fencing token seen
-- ARGV[1] the writer's fencing token, ARGV[2] the value
-- Returns 1 when written, 0 when rejected as stale.
local seen = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[1]) < seen then
  return 0
end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('SET', KEYS[1], ARGV[2])
return 1
";

/// Generous bounds for the storage connection: a test may pause this process or load the
/// machine, and a storage hiccup must not look like a lock failure.
fn storage_config() -> redis::AsyncConnectionConfig {
    redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(10)))
        .set_response_timeout(Some(Duration::from_secs(10)))
}

/// The locks a serving worker holds, by key.
type Held = Arc<Mutex<HashMap<String, LockGuard>>>;

/// Obeys commands on stdin until it ends (see `lock_tests::worker`).
async fn serve(
    args: &WorkerArgs,
    locker: Locker,
    stdin: &mut Lines<BufReader<Stdin>>,
) -> Result<(), Failure> {
    let storage = redis::Client::open(args.url.as_str()).map_err(|e| Failure::redis("open", &e))?;
    say("READY");
    let held: Held = Arc::default();
    while let Ok(Some(line)) = stdin.next_line().await {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["HOLD", key, lease, fenced, rest @ ..] => {
                let lease = Duration::from_millis(lease.parse().unwrap_or(1000));
                let mut req = locker.lock(key).lease(lease);
                if *fenced == "1" {
                    req = req.fenced();
                }
                if rest.contains(&"no-watchdog") {
                    req = req.watchdog(false);
                }
                match req.await {
                    Ok(g) => {
                        let fence = g.fence().map_or("none".into(), |f| f.to_string());
                        held.lock().await.insert((*key).to_owned(), g);
                        say(&format!("HELD {key} fence={fence}"));
                    }
                    Err(e) => say(&format!("ERR {key} {} {e}", error_kind(&e))),
                }
            }
            ["STATUS", key] => match held.lock().await.get(*key) {
                Some(g) => say(&format!(
                    "STATUS {key} held={} remaining_ms={}",
                    g.is_held(),
                    g.remaining().as_millis()
                )),
                None => say(&format!("ERR {key} not held")),
            },
            ["EXTEND", key, ms] => {
                let ms = ms.parse::<u64>().unwrap_or(0);
                match held.lock().await.get(*key) {
                    Some(g) => match g.extend(Duration::from_millis(ms)).await {
                        Ok(()) => say(&format!("EXTENDED {key} ok")),
                        Err(e) => say(&format!("EXTENDED {key} err={}", error_kind(&e))),
                    },
                    None => say(&format!("ERR {key} not held")),
                }
            }
            ["WRITE", key, storage_key] => {
                let map = held.lock().await;
                let Some(g) = map.get(*key) else {
                    say(&format!("ERR {key} not held"));
                    continue;
                };
                let verdict =
                    match fenced_write(&storage, storage_key, g.fence().unwrap_or(0)).await {
                        true => "ok",
                        false => "rejected",
                    };
                say(&format!("WRITE {key} {verdict} held={}", g.is_held()));
            }
            ["RELEASE", key] => {
                let guard = held.lock().await.remove(*key);
                match guard {
                    Some(g) => match g.release().await {
                        Ok(()) => say(&format!("RELEASED {key} ok")),
                        Err(e) => say(&format!("RELEASED {key} err={}", error_kind(&e))),
                    },
                    None => say(&format!("ERR {key} not held")),
                }
            }
            ["WAIT", key, id, order, rest @ ..] => {
                let waiter = Waiter {
                    key: (*key).to_owned(),
                    id: (*id).to_owned(),
                    order: (*order).to_owned(),
                    fair: rest.contains(&"fair"),
                    fenced: rest.contains(&"fenced"),
                    keep: rest.contains(&"keep").then(|| held.clone()),
                };
                tokio::spawn(waiter.run(locker.clone(), storage.clone()));
            }
            ["STATS"] => {
                let stats = locker.stats();
                say(&format!(
                    "STATS attempts={} renewals={} waiters={}",
                    stats.backend_calls - stats.renewal_calls,
                    stats.renewal_calls,
                    stats.waiters
                ));
            }
            _ => say(&format!("ERR unknown command {line:?}")),
        }
    }
    Ok(())
}

/// The fenced write of `WRITE`: whether the storage accepted `fence`.
async fn fenced_write(storage: &redis::Client, storage_key: &str, fence: u64) -> bool {
    let Ok(mut conn) = storage
        .get_multiplexed_async_connection_with_config(&storage_config())
        .await
    else {
        return false;
    };
    Script::new(FENCED_WRITE)
        .key(storage_key)
        .key(format!("{storage_key}:fence"))
        .arg(fence)
        .arg(format!("written-by-{fence}"))
        .invoke_async::<i64>(&mut conn)
        .await
        .is_ok_and(|written| written == 1)
}

/// A `WAIT` command: one waiter in a task of its own.
struct Waiter {
    key: String,
    id: String,
    order: String,
    fair: bool,
    fenced: bool,
    /// `keep`: where the lock goes once its id is recorded, instead of being released.
    keep: Option<Held>,
}

impl Waiter {
    /// Waits for the lock, appends the id to the order list, then releases the lock or keeps
    /// it; answers `DONE` or `FAILED`.
    async fn run(self, locker: Locker, storage: redis::Client) {
        let mut req = locker.lock(&self.key).wait(Duration::from_secs(30));
        if self.fair {
            req = req.fair();
        }
        if self.fenced {
            req = req.fenced();
        }
        let id = &self.id;
        let guard = match req.await {
            Ok(guard) => guard,
            Err(e) => return say(&format!("FAILED {id} {e}")),
        };
        let done = match guard.fence() {
            Some(fence) => format!("DONE {id} fence={fence}"),
            None => format!("DONE {id}"),
        };
        if let Err(e) = self.record(&storage).await {
            return say(&format!("FAILED {id} {e}"));
        }
        match self.keep {
            Some(held) => {
                held.lock().await.insert(self.key.clone(), guard);
                say(&done);
            }
            None => match guard.release().await {
                Ok(()) => say(&done),
                Err(e) => say(&format!("FAILED {id} {e}")),
            },
        }
    }

    /// Appends the id to the order list.
    async fn record(&self, storage: &redis::Client) -> redis::RedisResult<()> {
        let mut conn = storage
            .get_multiplexed_async_connection_with_config(&storage_config())
            .await?;
        redis::cmd("RPUSH")
            .arg(&self.order)
            .arg(&self.id)
            .exec_async(&mut conn)
            .await
    }
}

/// What the tasks of a `sections` worker did (the summary's counts).
#[derive(Default)]
struct Tally {
    sections: AtomicU64,
    refused: AtomicU64,
    skipped: AtomicU64,
    lock_errors: AtomicU64,
    release_errors: AtomicU64,
}

/// Runs `--tasks` tasks of critical sections until stdin says `stop` or ends (see
/// `lock_tests::worker`).
async fn sections(
    args: &WorkerArgs,
    locker: &Locker,
    stdin: &mut Lines<BufReader<Stdin>>,
) -> Result<(), Failure> {
    let client = redis::Client::open(args.url.as_str()).map_err(|e| Failure::redis("open", &e))?;
    let conn = client
        .get_multiplexed_async_connection_with_config(&storage_config())
        .await
        .map_err(|e| Failure::redis("connect storage", &e))?;
    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let mut tasks = Vec::new();
    for task in 0..args.tasks {
        let (args, locker, conn) = (args.clone(), locker.clone(), conn.clone());
        let (stop, tally) = (stop.clone(), tally.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = task;
            while !stop.load(Relaxed) {
                section(&args, &locker, conn.clone(), task, i, &tally).await?;
                i += 1;
            }
            Ok::<(), Failure>(())
        }));
    }
    say("ready");
    while let Ok(Some(line)) = stdin.next_line().await {
        if line.trim() == "stop" {
            break;
        }
    }
    stop.store(true, Relaxed);
    for task in tasks {
        task.await
            .map_err(|e| Failure::usage(format!("a task panicked: {e}")))??;
    }
    say(&SectionsSummary {
        pid: std::process::id(),
        sections: tally.sections.load(Relaxed),
        refused: tally.refused.load(Relaxed),
        skipped: tally.skipped.load(Relaxed),
        lock_errors: tally.lock_errors.load(Relaxed),
        release_errors: tally.release_errors.load(Relaxed),
    }
    .to_line());
    Ok(())
}

/// One critical section of task `task`, its `i`-th: lock, enter the store, work, leave,
/// release.
async fn section(
    args: &WorkerArgs,
    locker: &Locker,
    mut conn: MultiplexedConnection,
    task: u64,
    i: u64,
    tally: &Tally,
) -> Result<(), Failure> {
    let (key, _, fence_key) = args.names(i);
    let Some(fence_key) = fence_key else {
        return Err(Failure::usage("sections needs --fence-key".into()));
    };
    let guard = match locker.lock(&key).fenced().await {
        Ok(guard) => guard,
        Err(LockError::Backend { .. } | LockError::Timeout { .. }) => {
            tally.lock_errors.fetch_add(1, Relaxed);
            return Ok(());
        }
        Err(e) => return Err(Failure::lock("lock", &e)),
    };
    let Some(fence) = guard.fence() else {
        return Err(Failure::usage("a fenced lock has no fencing token".into()));
    };
    if guard.remaining() < SECTION_MARGIN {
        tally.skipped.fetch_add(1, Relaxed);
    } else {
        let id = format!("{}:{task}:{fence}", std::process::id());
        let [highest, marker] = section_keys(&fence_key);
        let counts = args.counts_key().unwrap_or_default();
        let script = Script::new(SECTION);
        let mut store = async |op: &str| -> Result<bool, Failure> {
            let answer: String = script
                .key(&highest)
                .key(&marker)
                .key(&counts)
                .arg(op)
                .arg(fence)
                .arg(&id)
                .invoke_async(&mut conn)
                .await
                .map_err(|e| Failure::redis("store", &e))?;
            Ok(answer == "ok")
        };
        let entered = store("enter").await?;
        if entered {
            tokio::time::sleep(Duration::from_micros(args.work_us)).await;
        }
        if entered && store("leave").await? {
            tally.sections.fetch_add(1, Relaxed);
        } else {
            tally.refused.fetch_add(1, Relaxed);
        }
    }
    if guard.release().await.is_err() {
        tally.release_errors.fetch_add(1, Relaxed);
    }
    Ok(())
}
