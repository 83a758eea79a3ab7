//! The second process of the cross-process scenarios: this same binary started with a hidden
//! `--child` flag, driven over stdin/stdout one line at a time.
//!
//! - `--child handoff DESIGN KEY OBSERVE`: on each `go` line, writes `started <t>` and takes the
//!   lock (waiting), then writes `acquired <t> <n>` once the acquire returned and the lock was
//!   released again. Times are [`shared_now_ns`] readings; `<n>` is when an independent
//!   observer connection in this process received the lock's release notification (ours with
//!   OBSERVE `1` only; 0 otherwise), to split the handoff into delivery and wake-up. The
//!   observer is a second subscriber in this process, so the main measurement runs without it.
//! - `--child hot DESIGN KEY TASKS ID_BASE [yield]`: TASKS tasks that lock, record, release, in a
//!   loop from `go` to `stop` (with `yield`, a `yield_now().await` after each release); then writes `records <n>` and one `<t> <task id> <waited ns>` line
//!   per acquisition. `calls` answers `calls <backend calls> <local hand-offs>` (lock-core's
//!   counts so far; 0 0 for the peers).
//! - `--child raw CHANNEL`: the notified-handoff floor without a lock: on `go`, `started <t>`,
//!   wait for a message on CHANNEL, one PING, `acquired <t> <woke>`.
//!
//! All read the Redis URL from their first input line (so a password in it never shows in the
//! process list), write `ready` once connected and end on `quit` (or end of input).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use lock_testkit::ChildProcess;
use lock_testkit::process::say;
use redis::aio::ConnectionManager;
use tokio::io::{AsyncBufReadExt, BufReader, Lines, Stdin};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::Result;
use crate::clock::shared_now_ns;
use crate::designs::{Design, Kind};
use crate::server::{Target, manager_config};

/// The hidden first argument that selects child mode.
pub(crate) const CHILD_FLAG: &str = "--child";

/// How long either side waits for one line from the other before giving up.
const LINE_TIMEOUT: Duration = Duration::from_secs(60);

/// The lease of the cross-process scenarios, on both sides.
pub(crate) const LEASE: Duration = Duration::from_secs(10);

/// One lock acquisition in the hot-key scenario: when (shared clock), by which task, and how
/// long that task had waited for it (ns, from just before its lock call).
pub(crate) type Record = (u64, u32, u64);

/// Entry point of child mode.
pub(crate) fn main(args: &[String]) -> Result<()> {
    let arg = |i: usize| {
        args.get(i)
            .map(String::as_str)
            .ok_or("child: missing argument")
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let mut input = BufReader::new(tokio::io::stdin()).lines();
        let url = input
            .next_line()
            .await?
            .ok_or("child: no Redis URL on stdin")?;
        let target = Target::open(Some(&url))?;
        if arg(0)? == "raw" {
            return child_raw(&target, arg(1)?, &mut input).await;
        }
        let (kind, key) = (Kind::parse(arg(1)?)?, arg(2)?);
        let design = Design::connect(kind, &target, LEASE).await?;
        // One uncontended round first: connections up, scripts loaded.
        let held = design.lock(key, Duration::from_secs(10)).await?;
        design.release(held).await?;
        match arg(0)? {
            "handoff" => {
                let observer = match kind {
                    Kind::Ours if arg(3)? == "1" => Some(observe_release(&target, key).await?),
                    _ => None,
                };
                child_handoff(&design, key, observer.as_ref(), &mut input).await
            }
            "hot" => {
                let yielding = args.get(5).is_some_and(|a| a == "yield");
                let (tasks, base) = (arg(3)?.parse()?, arg(4)?.parse()?);
                let hot = HotTasks::spawn(&design, key, tasks, base, yielding);
                child_hot(&design, hot, &mut input).await
            }
            other => Err(format!("child: unknown mode {other}").into()),
        }
    })
}

/// Stamps the shared clock when a (sharded) pub/sub message arrives.
struct Stamp(Arc<AtomicU64>);

impl redis::aio::AsyncPushSender for Stamp {
    fn send(&self, info: redis::PushInfo) -> std::result::Result<(), redis::aio::SendError> {
        if is_message(&info) {
            self.0.store(shared_now_ns(), Ordering::SeqCst);
        }
        Ok(())
    }
}

fn is_message(info: &redis::PushInfo) -> bool {
    matches!(
        info.kind,
        redis::PushKind::Message | redis::PushKind::SMessage
    )
}

/// Whether the server has sharded pub/sub (Redis 7+).
pub(crate) async fn sharded_pubsub(conn: &mut ConnectionManager) -> Result<bool> {
    let info: String = redis::cmd("INFO").arg("server").query_async(conn).await?;
    let version = info.lines().find_map(|l| l.strip_prefix("redis_version:"));
    let major = version.and_then(|v| v.trim().split('.').next()?.parse::<u32>().ok());
    Ok(major.is_some_and(|major| major >= 7))
}

/// A RESP3 connection subscribed to `channel`, its pushes handed to `sender`.
async fn subscribed(
    target: &Target,
    channel: &str,
    sender: impl redis::aio::AsyncPushSender,
) -> Result<ConnectionManager> {
    let info = target.client()?.get_connection_info().clone();
    let resp3 = info
        .redis_settings()
        .clone()
        .set_protocol(redis::ProtocolVersion::RESP3);
    let client = redis::Client::open(info.set_redis_settings(resp3))?;
    let config = manager_config().set_push_sender(sender);
    let mut conn = ConnectionManager::new_with_config(client, config).await?;
    let sharded = sharded_pubsub(&mut conn).await?;
    let command = if sharded { "SSUBSCRIBE" } else { "SUBSCRIBE" };
    redis::cmd(command)
        .arg(channel)
        .exec_async(&mut conn)
        .await?;
    Ok(conn)
}

/// When a release notification of lock-core's lock `key` last reached this process.
struct Observer {
    last: Arc<AtomicU64>,
    _conn: ConnectionManager,
}

/// Subscribes a connection of its own to the release channel of lock-core's lock `key` (its
/// documented key layout).
async fn observe_release(target: &Target, key: &str) -> Result<Observer> {
    let last = Arc::new(AtomicU64::new(0));
    let channel = format!("{}{{{key}}}:released", lock_core::DEFAULT_PREFIX);
    let conn = subscribed(target, &channel, Stamp(last.clone())).await?;
    Ok(Observer { last, _conn: conn })
}

/// The notified-handoff floor, no lock: on `go`, writes `started`, waits for a message on
/// `channel`, sends one PING, and writes `acquired <t> <woke>` when its answer is back (`woke`:
/// when the message reached the waiting task). The same path a notified waiter takes (push →
/// task → one round trip), minus everything a lock adds.
async fn child_raw(target: &Target, channel: &str, input: &mut Input) -> Result<()> {
    let (tx, mut pushes) = tokio::sync::mpsc::unbounded_channel::<redis::PushInfo>();
    let _sub = subscribed(target, channel, tx).await?;
    let mut conn = target.manager().await?;
    redis::cmd("PING").query_async::<String>(&mut conn).await?;
    say("ready");
    while next_line(input, &["go"]).await?.is_some() {
        say(&format!("started {}", shared_now_ns()));
        while !is_message(&pushes.recv().await.ok_or("child: subscriber closed")?) {}
        let woke = shared_now_ns();
        redis::cmd("PING").query_async::<String>(&mut conn).await?;
        say(&format!("acquired {} {woke}", shared_now_ns()));
    }
    Ok(())
}

type Input = Lines<BufReader<Stdin>>;

/// The next line from the parent, one of `allowed`; `None` on `quit` or end of input.
async fn next_line(input: &mut Input, allowed: &[&str]) -> Result<Option<String>> {
    match input.next_line().await?.as_deref().map(str::trim) {
        None | Some("quit") => Ok(None),
        Some(line) if allowed.contains(&line) => Ok(Some(line.to_owned())),
        Some(other) => Err(format!("child: unexpected line {other:?}").into()),
    }
}

async fn child_handoff(
    design: &Design,
    key: &str,
    observer: Option<&Observer>,
    input: &mut Input,
) -> Result<()> {
    say("ready");
    while next_line(input, &["go"]).await?.is_some() {
        if let Some(o) = observer {
            o.last.store(0, Ordering::SeqCst);
        }
        say(&format!("started {}", shared_now_ns()));
        let held = design.lock(key, Duration::from_secs(30)).await?;
        let acquired = shared_now_ns();
        let notified = observer.map_or(0, |o| o.last.load(Ordering::SeqCst));
        design.release(held).await?;
        say(&format!("acquired {acquired} {notified}"));
    }
    Ok(())
}

async fn child_hot(design: &Design, hot: HotTasks, input: &mut Input) -> Result<()> {
    say("ready");
    let mut hot = Some(hot);
    while let Some(line) = next_line(input, &["go", "calls", "stop"]).await? {
        match (line.as_str(), hot.take()) {
            ("go", Some(h)) => hot = Some(h.go()),
            ("calls", h) => {
                hot = h;
                let [calls, local] = design.our_counts().unwrap_or_default();
                say(&format!("calls {calls} {local}"));
            }
            (_, Some(h)) => say(&match h.stop().await {
                Ok(records) => {
                    let mut out = format!("records {}", records.len());
                    records
                        .iter()
                        .for_each(|(t, id, w)| out.push_str(&format!("\n{t} {id} {w}")));
                    out
                }
                Err(e) => format!("error {e}"),
            }),
            (_, None) => {}
        }
    }
    Ok(())
}

/// Tasks hammering one key: lock, record the acquisition, release, again; from `go` until
/// stopped. `yielding`: each task awaits `tokio::task::yield_now()` between its release and its
/// next lock, as a real handler awaits something between one lock and the next.
pub(crate) struct HotTasks {
    start: watch::Sender<bool>,
    set: JoinSet<Result<()>>,
    records: Arc<Mutex<Vec<Record>>>,
}

impl HotTasks {
    pub(crate) fn spawn(
        design: &Design,
        key: &str,
        tasks: usize,
        id_base: u32,
        yielding: bool,
    ) -> Self {
        let (start, _) = watch::channel(false);
        let records = Arc::new(Mutex::new(Vec::with_capacity(1 << 16)));
        let mut set = JoinSet::new();
        for id in (id_base..).take(tasks) {
            let (design, key, records) = (design.clone(), key.to_owned(), records.clone());
            let mut go = start.subscribe();
            set.spawn(async move {
                go.wait_for(|v| *v).await?;
                loop {
                    let asked = shared_now_ns();
                    let held = design.lock(&key, Duration::from_secs(60)).await?;
                    let t = shared_now_ns();
                    records
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push((t, id, t.saturating_sub(asked)));
                    design.release(held).await?;
                    if yielding {
                        tokio::task::yield_now().await;
                    }
                }
            });
        }
        HotTasks {
            start,
            set,
            records,
        }
    }

    pub(crate) fn go(self) -> Self {
        self.start.send_replace(true);
        self
    }

    /// Stops every task; the acquisitions recorded, or the first task error.
    pub(crate) async fn stop(mut self) -> Result<Vec<Record>> {
        self.set.abort_all();
        while let Some(joined) = self.set.join_next().await {
            if let Ok(Err(e)) = joined {
                return Err(e);
            }
        }
        let mut records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(std::mem::take(&mut *records))
    }
}

/// The parent's handle on a child process: the test kit's line-driven child, whose failures
/// carry what the child printed (its stderr included).
pub(crate) struct ChildProc(ChildProcess);

impl ChildProc {
    /// Starts this binary in child mode with `args`, hands it the Redis URL on its first line
    /// (a password in it never shows in the process list), and waits for its `ready`.
    pub(crate) async fn spawn(args: &[&str], url: &str) -> Result<Self> {
        let args = [CHILD_FLAG].iter().chain(args);
        let child = ChildProcess::spawn(std::env::current_exe()?, args);
        let mut child = child.answer_timeout(LINE_TIMEOUT);
        child.send(url).await;
        child.expect_line("ready", LINE_TIMEOUT).await;
        Ok(ChildProc(child))
    }

    pub(crate) async fn send(&mut self, line: &str) {
        self.0.send(line).await;
    }

    /// Reads a line `<word> <u64>...` and returns the numbers.
    pub(crate) async fn recv_tagged(&mut self, word: &str) -> Result<Vec<u64>> {
        let line = self.0.line().await;
        let numbers = line.strip_prefix(word).and_then(|rest| {
            let numbers = rest.split_whitespace().map(|n| n.parse().ok());
            numbers.collect::<Option<Vec<u64>>>()
        });
        let numbers = numbers.filter(|v| !v.is_empty());
        Ok(numbers.ok_or_else(|| format!("child said {line:?}, expected `{word}<n>...`"))?)
    }

    /// The child design's counts of backend calls and local hand-offs so far (lock-core
    /// only; 0 for the peers).
    pub(crate) async fn our_counts(&mut self) -> Result<[u64; 2]> {
        self.send("calls").await;
        let counts = self.recv_tagged("calls ").await?;
        Ok([counts[0], counts.get(1).copied().unwrap_or(0)])
    }

    /// Stops the hot-key tasks and reads their records.
    pub(crate) async fn stop_hot(&mut self) -> Result<Vec<Record>> {
        self.send("stop").await;
        let n = self.recv_tagged("records ").await?[0];
        let mut records = Vec::new();
        for _ in 0..n {
            let line = self.0.line().await;
            let mut fields = line.split(' ').map(str::parse::<u64>);
            let mut next = || fields.next().ok_or_else(|| format!("bad record {line:?}"));
            let (t, id, waited) = (next()??, next()??, next()??);
            records.push((t, u32::try_from(id)?, waited));
        }
        Ok(records)
    }

    /// Closes its input (its `quit`) and waits for the process to end.
    pub(crate) async fn finish(self) -> Result<()> {
        let out = self.0.finish(LINE_TIMEOUT).await;
        match out.status.success() {
            true => Ok(()),
            false => Err(format!("child process failed: {}; {}", out.status, out.stderr).into()),
        }
    }
}
