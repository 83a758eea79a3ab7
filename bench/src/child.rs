//! The second process of the cross-process scenarios: this same binary started with a hidden
//! `--child` flag, driven over stdin/stdout one line at a time.
//!
//! - `--child handoff --design D --key K --lease-ms L [--observe 1]`: on each `go` line, writes
//!   `started <t>` and takes the lock (waiting), then writes `acquired <t> <n>` once the acquire
//!   returned and the lock was released again. Times are [`shared_now_ns`] readings; `<n>` is
//!   when an independent observer connection in this process received the lock's release
//!   notification (ours with `--observe 1` only; 0 otherwise), to split the handoff into
//!   delivery and wake-up. The observer is a second subscriber in this process, so the main
//!   measurement runs without it.
//! - `--child hot --design D --key K --tasks N --id-base B --lease-ms L`: N tasks that
//!   lock, record, release, in a loop from `go` to `stop`; then writes `records <n>` and one
//!   `<t> <task id>` line per acquisition.
//!
//! - `--child raw --design ours --key C`: the notified-handoff floor without a lock (see
//!   `child_raw`): on `go`, `started <t>`, wait for a message on channel C, one PING,
//!   `acquired <t> 0`.
//!
//! All take the Redis URL from the environment ([`URL_ENV`], so a password in it never shows
//! in the process list), write `ready` once connected and end on `quit` (or end of input).

use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{ChildStdin, ChildStdout};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::Result;
use crate::clock::shared_now_ns;
use crate::designs::{Design, Kind};
use crate::server::Target;

/// The hidden first argument that selects child mode.
pub(crate) const CHILD_FLAG: &str = "--child";

/// The environment variable that hands the Redis URL to the child.
pub(crate) const URL_ENV: &str = "LOCK_BENCH_CHILD_REDIS_URL";

/// How long either side waits for one line from the other before giving up.
const LINE_TIMEOUT: Duration = Duration::from_secs(60);

/// One lock acquisition in the hot-key scenario: when (shared clock) and by which task.
pub(crate) type Record = (u64, u32);

struct ChildArgs {
    mode: String,
    kind: Kind,
    url: String,
    key: String,
    tasks: usize,
    id_base: u32,
    lease: Duration,
    observe: bool,
}

fn parse(args: &[String]) -> Result<ChildArgs> {
    let mut it = args.iter();
    let mode = it.next().ok_or("child: missing mode")?.clone();
    let mut kind = None;
    let url = std::env::var(URL_ENV).ok();
    let mut key = None;
    let mut tasks = 1;
    let mut id_base = 0;
    let mut lease = Duration::from_secs(10);
    let mut observe = false;
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| format!("child: {flag} needs a value"))?;
        match flag.as_str() {
            "--design" => kind = Some(Kind::parse(value)?),
            "--key" => key = Some(value.clone()),
            "--tasks" => tasks = value.parse()?,
            "--id-base" => id_base = value.parse()?,
            "--lease-ms" => lease = Duration::from_millis(value.parse()?),
            "--observe" => observe = value == "1",
            other => return Err(format!("child: unknown flag {other}").into()),
        }
    }
    Ok(ChildArgs {
        mode,
        kind: kind.ok_or("child: --design missing")?,
        url: url.ok_or_else(|| format!("child: {URL_ENV} missing"))?,
        key: key.ok_or("child: --key missing")?,
        tasks,
        id_base,
        lease,
        observe,
    })
}

/// Entry point of child mode.
pub(crate) fn main(args: &[String]) -> Result<()> {
    let args = parse(args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let target = Target::open(Some(&args.url))?;
        let mut input = BufReader::new(tokio::io::stdin()).lines();
        if args.mode == "raw" {
            return child_raw(&target, &args.key, &mut input).await;
        }
        let design = Design::connect(args.kind, &target, args.lease).await?;
        match args.mode.as_str() {
            "handoff" => {
                let observer = match args.kind {
                    Kind::Ours if args.observe => Some(observe_release(&target, &args.key).await?),
                    _ => None,
                };
                child_handoff(&design, &args.key, observer.as_ref(), &mut input).await
            }
            "hot" => child_hot(&design, &args, &mut input).await,
            other => Err(format!("child: unknown mode {other}").into()),
        }
    })
}

fn say(line: &str) -> Result<()> {
    // Blocking stdout is fine: one short line, and the parent is always reading.
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

/// Records when a release notification of lock-core's lock `key` reaches this process.
struct Observer {
    last: Arc<AtomicU64>,
    _conn: redis::aio::ConnectionManager,
}

struct Stamp(Arc<AtomicU64>);

impl redis::aio::AsyncPushSender for Stamp {
    fn send(&self, info: redis::PushInfo) -> std::result::Result<(), redis::aio::SendError> {
        if matches!(
            info.kind,
            redis::PushKind::Message | redis::PushKind::SMessage
        ) {
            self.0.store(shared_now_ns(), Ordering::SeqCst);
        }
        Ok(())
    }
}

/// The release channel of lock-core's lock `key` (its documented key layout).
pub(crate) fn release_channel(key: &str) -> String {
    format!("{}{{{key}}}:released", lock_core::DEFAULT_PREFIX)
}

/// Whether the server has sharded pub/sub (Redis 7+).
pub(crate) async fn sharded_pubsub(conn: &mut redis::aio::ConnectionManager) -> Result<bool> {
    let info: String = redis::cmd("INFO").arg("server").query_async(conn).await?;
    Ok(info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .and_then(|v| v.trim().split('.').next()?.parse::<u32>().ok())
        .is_some_and(|major| major >= 7))
}

/// A RESP3 connection subscribed to `channel`, its pushes handed to `sender`.
async fn subscribed(
    target: &Target,
    channel: &str,
    sender: impl redis::aio::AsyncPushSender,
) -> Result<redis::aio::ConnectionManager> {
    let info = target.client()?.get_connection_info().clone();
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(redis::ProtocolVersion::RESP3);
    let client = redis::Client::open(info.set_redis_settings(settings))?;
    let config = redis::aio::ConnectionManagerConfig::new().set_push_sender(sender);
    let mut conn = redis::aio::ConnectionManager::new_with_config(client, config).await?;
    let command = if sharded_pubsub(&mut conn).await? {
        "SSUBSCRIBE"
    } else {
        "SUBSCRIBE"
    };
    redis::cmd(command)
        .arg(channel)
        .exec_async(&mut conn)
        .await?;
    Ok(conn)
}

/// Subscribes its own connection to the release channel of lock-core's lock `key`.
async fn observe_release(target: &Target, key: &str) -> Result<Observer> {
    let last = Arc::new(AtomicU64::new(0));
    let conn = subscribed(target, &release_channel(key), Stamp(last.clone())).await?;
    Ok(Observer { last, _conn: conn })
}

/// The notified-handoff floor, no lock: on `go`, writes `started`, waits for a message on the
/// channel `key`, sends one PING, and writes `acquired <t> <woke>` when its answer is back
/// (`woke`: when the message reached the waiting task). The same
/// path a notified waiter takes (push → task → one round trip), minus everything a lock adds.
async fn child_raw(
    target: &Target,
    key: &str,
    input: &mut Lines<BufReader<tokio::io::Stdin>>,
) -> Result<()> {
    let (tx, mut pushes) = tokio::sync::mpsc::unbounded_channel::<redis::PushInfo>();
    let _sub = subscribed(target, key, tx).await?;
    let mut conn = target.manager().await?;
    redis::cmd("PING").query_async::<String>(&mut conn).await?;
    say("ready")?;
    while let Some(line) = input.next_line().await? {
        match line.trim() {
            "go" => {
                say(&format!("started {}", shared_now_ns()))?;
                loop {
                    let push = pushes.recv().await.ok_or("child: subscriber closed")?;
                    if matches!(
                        push.kind,
                        redis::PushKind::Message | redis::PushKind::SMessage
                    ) {
                        break;
                    }
                }
                let woke = shared_now_ns();
                redis::cmd("PING").query_async::<String>(&mut conn).await?;
                say(&format!("acquired {} {woke}", shared_now_ns()))?;
            }
            "quit" => break,
            other => return Err(format!("child: unexpected line {other:?}").into()),
        }
    }
    Ok(())
}

async fn child_handoff(
    design: &Design,
    key: &str,
    observer: Option<&Observer>,
    input: &mut Lines<BufReader<tokio::io::Stdin>>,
) -> Result<()> {
    // One uncontended round first: connections up, scripts loaded.
    let held = design.lock(key, Duration::from_secs(10)).await?;
    design.release(held).await?;
    say("ready")?;
    while let Some(line) = input.next_line().await? {
        match line.trim() {
            "go" => {
                if let Some(o) = observer {
                    o.last.store(0, Ordering::SeqCst);
                }
                say(&format!("started {}", shared_now_ns()))?;
                let held = design.lock(key, Duration::from_secs(30)).await?;
                let acquired = shared_now_ns();
                let notified = observer.map_or(0, |o| o.last.load(Ordering::SeqCst));
                design.release(held).await?;
                say(&format!("acquired {acquired} {notified}"))?;
            }
            "quit" => break,
            other => return Err(format!("child: unexpected line {other:?}").into()),
        }
    }
    Ok(())
}

async fn child_hot(
    design: &Design,
    args: &ChildArgs,
    input: &mut Lines<BufReader<tokio::io::Stdin>>,
) -> Result<()> {
    let held = design.lock(&args.key, Duration::from_secs(10)).await?;
    design.release(held).await?;
    let tasks = HotTasks::spawn(design, &args.key, args.tasks, args.id_base);
    say("ready")?;
    let mut tasks = Some(tasks);
    while let Some(line) = input.next_line().await? {
        match line.trim() {
            "go" => {
                if let Some(t) = &tasks {
                    t.go();
                }
            }
            "calls" => say(&format!("calls {}", design.backend_calls().unwrap_or(0)))?,
            "stop" => {
                let Some(t) = tasks.take() else { continue };
                match t.stop().await {
                    Ok(records) => {
                        let mut out = String::with_capacity(records.len() * 24 + 16);
                        out.push_str(&format!("records {}\n", records.len()));
                        for (t, id) in records {
                            out.push_str(&format!("{t} {id}\n"));
                        }
                        let mut stdout = std::io::stdout().lock();
                        stdout.write_all(out.as_bytes())?;
                        stdout.flush()?;
                    }
                    Err(e) => say(&format!("error {e}"))?,
                }
            }
            "quit" => break,
            other => return Err(format!("child: unexpected line {other:?}").into()),
        }
    }
    Ok(())
}

/// Tasks hammering one key: lock, record the acquisition, release, again; from `go` until
/// stopped.
pub(crate) struct HotTasks {
    start: watch::Sender<bool>,
    set: JoinSet<Result<()>>,
    records: Arc<Mutex<Vec<Record>>>,
}

impl HotTasks {
    pub(crate) fn spawn(design: &Design, key: &str, tasks: usize, id_base: u32) -> Self {
        let (start, _) = watch::channel(false);
        let records = Arc::new(Mutex::new(Vec::with_capacity(1 << 16)));
        let mut set = JoinSet::new();
        for i in 0..tasks {
            let id = id_base + u32::try_from(i).unwrap_or(u32::MAX);
            let design = design.clone();
            let key = key.to_owned();
            let records = records.clone();
            let mut go = start.subscribe();
            set.spawn(async move {
                go.wait_for(|v| *v).await?;
                loop {
                    let held = design.lock(&key, Duration::from_secs(60)).await?;
                    let t = shared_now_ns();
                    records
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push((t, id));
                    design.release(held).await?;
                }
            });
        }
        HotTasks {
            start,
            set,
            records,
        }
    }

    pub(crate) fn go(&self) {
        self.start.send_replace(true);
    }

    /// Stops every task; the acquisitions recorded, or the first task error.
    pub(crate) async fn stop(mut self) -> Result<Vec<Record>> {
        self.set.abort_all();
        while let Some(joined) = self.set.join_next().await {
            if let Ok(Err(e)) = joined {
                return Err(e);
            }
        }
        let records =
            std::mem::take(&mut *self.records.lock().unwrap_or_else(PoisonError::into_inner));
        Ok(records)
    }
}

/// The parent's handle on a child process.
pub(crate) struct ChildProc {
    child: tokio::process::Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl ChildProc {
    /// Starts this binary in child mode with `args`, on the Redis at `url`, and waits for its
    /// `ready`.
    pub(crate) async fn spawn(args: &[String], url: &str) -> Result<Self> {
        let exe = std::env::current_exe()?;
        let mut child = tokio::process::Command::new(exe)
            .arg(CHILD_FLAG)
            .args(args)
            .env(URL_ENV, url)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;
        let stdin = child.stdin.take().ok_or("child stdin")?;
        let stdout = child.stdout.take().ok_or("child stdout")?;
        let mut proc = ChildProc {
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
        };
        let ready = proc.recv().await?;
        if ready != "ready" {
            return Err(format!("child said {ready:?} instead of ready").into());
        }
        Ok(proc)
    }

    pub(crate) async fn send(&mut self, line: &str) -> Result<()> {
        self.stdin.write_all(line.as_bytes()).await?;
        self.stdin.write_all(b"\n").await?;
        self.stdin.flush().await?;
        Ok(())
    }

    pub(crate) async fn recv(&mut self) -> Result<String> {
        match tokio::time::timeout(LINE_TIMEOUT, self.lines.next_line()).await {
            Ok(Ok(Some(line))) => Ok(line),
            Ok(Ok(None)) => Err("the child process ended early (see its error above)".into()),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err("no answer from the child process within 60 s".into()),
        }
    }

    /// Reads a line `<word> <u64>...` and returns the numbers.
    pub(crate) async fn recv_tagged(&mut self, word: &str) -> Result<Vec<u64>> {
        let line = self.recv().await?;
        line.strip_prefix(word)
            .and_then(|rest| {
                rest.split_whitespace()
                    .map(|n| n.parse().ok())
                    .collect::<Option<Vec<u64>>>()
            })
            .filter(|v| !v.is_empty())
            .ok_or_else(|| format!("child said {line:?}, expected `{word}<n>...`").into())
    }

    /// The child design's count of backend calls so far (lock-core only; 0 for the peers).
    pub(crate) async fn backend_calls(&mut self) -> Result<u64> {
        self.send("calls").await?;
        Ok(self.recv_tagged("calls ").await?[0])
    }

    /// Stops the hot-key tasks and reads their records.
    pub(crate) async fn stop_hot(&mut self) -> Result<Vec<Record>> {
        self.send("stop").await?;
        let line = self.recv().await?;
        let n: usize = match line.strip_prefix("records ") {
            Some(n) => n.trim().parse()?,
            None => return Err(format!("child: {line}").into()),
        };
        let mut records = Vec::with_capacity(n);
        for _ in 0..n {
            let line = self.recv().await?;
            let (t, id) = line
                .split_once(' ')
                .ok_or_else(|| format!("bad record {line:?}"))?;
            records.push((t.parse()?, id.parse()?));
        }
        Ok(records)
    }

    /// Says `quit` and waits for the process to end.
    pub(crate) async fn finish(mut self) -> Result<()> {
        self.send("quit").await?;
        let status = tokio::time::timeout(LINE_TIMEOUT, self.child.wait()).await??;
        if status.success() {
            Ok(())
        } else {
            Err(format!("child process failed: {status}").into())
        }
    }
}
