//! The randomized fault test ("chaos", `tests/tests/chaos/`) and its worker process
//! (`lock-chaos-worker`): the shared clock, the seeded random numbers, the fence-checking store
//! script, the worker's command line and the record of one critical section, printed by the
//! worker as one line and parsed back by the test.
//!
//! Every time is in microseconds on `CLOCK_MONOTONIC` ([`now_us`]), the clock `Instant` uses:
//! one system-wide counter that every process on the machine reads alike, so the records of
//! several worker processes and the driver's fault timeline can be compared directly.
//!
//! ```
//! use lock_tests::chaos::{Mode, Section};
//!
//! let mut s = Section::new(0, 1, 7, "chaos:k0", Mode::Fenced, "run", Some(500), 1500);
//! s.call = 10;
//! s.acq = Some(20);
//! s.fence = Some(3);
//! s.msg = "two words".into();
//! let line = s.to_line();
//! assert_eq!(Section::parse(&line), Ok(s));
//! ```

use std::fmt::Write as _;

use lock_testkit::process::flag;

/// Microseconds on the machine-wide monotonic clock (`CLOCK_MONOTONIC`, the clock of
/// `std::time::Instant`), comparable between processes.
///
/// ```
/// let a = lock_tests::chaos::now_us();
/// std::thread::sleep(std::time::Duration::from_millis(2));
/// assert!(lock_tests::chaos::now_us() >= a + 2_000);
/// ```
pub fn now_us() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000).saturating_add(nanos / 1_000)
}

/// A small seeded generator (SplitMix64): the same seed gives the same sequence, so a fault
/// schedule can be replayed. Not for anything secret.
///
/// ```
/// use lock_tests::chaos::Rng;
/// let (mut a, mut b) = (Rng::new(42), Rng::new(42));
/// assert_eq!(a.next_u64(), b.next_u64());
/// let r = a.range(10, 20);
/// assert!((10..20).contains(&r));
/// ```
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `lo..hi` (`lo` when the range is empty).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next_u64() % (hi - lo)
    }

    /// True with probability `percent` / 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.range(0, 100) < percent
    }
}

/// The fence-checking store, run on a second redis-server that no fault touches.
///
/// `KEYS[1]` the highest fence accepted for one lock key, `KEYS[2]` the log of accepted writes
/// (a list of `'<write id> <fence>'`); `ARGV[1]` the writer's fence, or `-` for an unfenced
/// lock (always accepted, only logged); `ARGV[2]` the write's id. A fenced write is accepted
/// when its fence is at least the highest one seen. Returns the write's position in the log
/// (from 1) when accepted, 0 when rejected as stale.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let server = lock_testkit::RedisServer::start();
/// let mut conn = server.client().await;
/// let store = redis::Script::new(lock_tests::chaos::FENCE_STORE);
/// let mut write = async |fence: &str, id: &str| -> i64 {
///     store.key("f").key("log").arg(fence).arg(id).invoke_async(&mut conn).await.unwrap()
/// };
/// assert_eq!(write("5", "a").await, 1);
/// assert_eq!(write("4", "b").await, 0); // stale
/// assert_eq!(write("5", "c").await, 2);
/// assert_eq!(write("-", "d").await, 3); // unfenced: logged
/// # }
/// ```
pub const FENCE_STORE: &str = r"
if ARGV[1] ~= '-' then
  local seen = tonumber(redis.call('GET', KEYS[1]) or '0')
  if tonumber(ARGV[1]) < seen then
    return 0
  end
  redis.call('SET', KEYS[1], ARGV[1])
end
return redis.call('RPUSH', KEYS[2], ARGV[2] .. ' ' .. ARGV[1])
";

/// The name of the `i`-th lock key of a chaos run.
///
/// ```
/// assert_eq!(lock_tests::chaos::key_name(2), "chaos:k2");
/// ```
pub fn key_name(i: u64) -> String {
    format!("chaos:k{i}")
}

/// The store's keys for one lock key: (highest fence seen, log of accepted writes).
///
/// ```
/// let (fence, log) = lock_tests::chaos::store_keys("chaos:k0");
/// assert_eq!((fence.as_str(), log.as_str()), ("store:chaos:k0:fence", "store:chaos:k0:log"));
/// ```
pub fn store_keys(key: &str) -> (String, String) {
    (format!("store:{key}:fence"), format!("store:{key}:log"))
}

/// The longest lease a chaos worker asks for, in ms: the delay before a killed Redlock server
/// may come back empty (Redlock's documented restart rule: down for at least the longest
/// lease).
pub const MAX_LEASE_MS: u64 = 2000;

/// The engine a chaos run locks on: what `--lock-url` holds and how a worker connects.
///
/// ```
/// use lock_tests::chaos::Engine;
/// assert_eq!(Engine::parse("redlock"), Some(Engine::Redlock));
/// assert!(!Engine::Redlock.fencing());
/// assert_eq!(Engine::Cluster.as_str(), "cluster");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Engine {
    /// One redis-server (`--lock-url` is its URL).
    Redis,
    /// A Redis Cluster (`--lock-url`: every node's URL, comma-separated).
    Cluster,
    /// A Sentinel-watched primary (`--lock-url`: the sentinels' URLs; the name `mymaster`).
    Sentinel,
    /// Redlock over independent servers (`--lock-url`: their URLs).
    Redlock,
}

impl Engine {
    /// The name used on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Engine::Redis => "redis",
            Engine::Cluster => "cluster",
            Engine::Sentinel => "sentinel",
            Engine::Redlock => "redlock",
        }
    }

    /// The engine named `s`.
    pub fn parse(s: &str) -> Option<Engine> {
        [
            Engine::Redis,
            Engine::Cluster,
            Engine::Sentinel,
            Engine::Redlock,
        ]
        .into_iter()
        .find(|e| e.as_str() == s)
    }

    /// Whether the engine draws fences (Redlock refuses `fenced()`).
    pub fn fencing(self) -> bool {
        self != Engine::Redlock
    }

    /// The mode of the `i`-th key on this engine: [`Mode::of_key`], or without fences
    /// [`Mode::of_key_unfenced`].
    ///
    /// ```
    /// use lock_tests::chaos::{Engine, Mode};
    /// assert_eq!(Engine::Redis.mode_of(0), Mode::Fenced);
    /// assert_eq!(Engine::Redlock.mode_of(0), Mode::Nested);
    /// ```
    pub fn mode_of(self, i: u64) -> Mode {
        if self.fencing() {
            Mode::of_key(i)
        } else {
            Mode::of_key_unfenced(i)
        }
    }
}

/// How one key is locked: each key of a run has one mode, so fenced and unfenced writers never
/// share a key in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mode {
    /// `.fenced()`: every write carries the fence and the store checks it.
    Fenced,
    /// Fenced outer lock and a nested `run` on the same key inside it (reentrant).
    Reentrant,
    /// No fence: the store logs the writes without checking.
    Plain,
    /// An unfenced outer lock and a nested `run` on the same key inside it (reentrant where
    /// fencing is refused: Redlock).
    Nested,
}

impl Mode {
    /// The mode of the `i`-th key: fenced, reentrant, plain, fenced, ...
    ///
    /// ```
    /// use lock_tests::chaos::Mode;
    /// assert_eq!(Mode::of_key(4), Mode::Reentrant);
    /// ```
    pub fn of_key(i: u64) -> Mode {
        match i % 3 {
            0 => Mode::Fenced,
            1 => Mode::Reentrant,
            _ => Mode::Plain,
        }
    }

    /// The mode of the `i`-th key where fencing is refused: nested, plain, nested, ...
    ///
    /// ```
    /// use lock_tests::chaos::Mode;
    /// assert_eq!(Mode::of_key_unfenced(1), Mode::Plain);
    /// ```
    pub fn of_key_unfenced(i: u64) -> Mode {
        if i.is_multiple_of(2) {
            Mode::Nested
        } else {
            Mode::Plain
        }
    }

    /// Whether the lock draws a fence.
    pub fn fenced(self) -> bool {
        matches!(self, Mode::Fenced | Mode::Reentrant)
    }

    /// Whether a nested `run` on the same key runs inside the outer lock.
    pub fn nests(self) -> bool {
        matches!(self, Mode::Reentrant | Mode::Nested)
    }

    /// The name used in record lines.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Fenced => "fenced",
            Mode::Reentrant => "reentrant",
            Mode::Plain => "plain",
            Mode::Nested => "nested",
        }
    }

    fn parse(s: &str) -> Option<Mode> {
        match s {
            "fenced" => Some(Mode::Fenced),
            "reentrant" => Some(Mode::Reentrant),
            "plain" => Some(Mode::Plain),
            "nested" => Some(Mode::Nested),
            _ => None,
        }
    }
}

/// What the store answered to one write, as the writer saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Accepted (the store logged it).
    Accepted,
    /// Rejected as stale by the fence check.
    Rejected,
    /// The store call failed: the write's fate is in the store's log.
    Failed,
    /// No answer: the write was cancelled with its critical section (lease lost).
    Unknown,
}

impl Answer {
    fn code(self) -> char {
        match self {
            Answer::Accepted => 'a',
            Answer::Rejected => 'r',
            Answer::Failed => 'e',
            Answer::Unknown => '-',
        }
    }

    fn parse(s: &str) -> Option<Answer> {
        match s {
            "a" => Some(Answer::Accepted),
            "r" => Some(Answer::Rejected),
            "e" => Some(Answer::Failed),
            "-" => Some(Answer::Unknown),
            _ => None,
        }
    }
}

/// One write to the store inside a critical section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    /// Unique in the run: `p<proc>t<task>n<section>w<i>`.
    pub id: String,
    /// When `is_held()` was called (and answered true) just before the write was sent.
    pub check: u64,
    /// When the store's answer arrived, if it did.
    pub done: Option<u64>,
    /// The answer.
    pub answer: Answer,
}

/// The record of one attempt to lock a key and, when it was acquired, of the critical section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    /// The worker process (0-based).
    pub proc: u32,
    /// The task in the process.
    pub task: u32,
    /// The attempt's number in the task.
    pub n: u64,
    /// The lock key.
    pub key: String,
    /// How the key is locked.
    pub mode: Mode,
    /// `run` (the body inside `LockRequest::run`) or `guard` (a `LockGuard`, released after).
    pub api: String,
    /// The requested wait in ms; `None` for `no_wait`.
    pub wait_ms: Option<u64>,
    /// The requested lease in ms.
    pub lease_ms: u64,
    /// Just before the request was made.
    pub call: u64,
    /// When the lock was held (the body's first line, or the guard returned).
    pub acq: Option<u64>,
    /// The fence, when fenced and acquired.
    pub fence: Option<u64>,
    /// When the body finished (or was cancelled).
    pub end: Option<u64>,
    /// When the whole call returned (`run`, or the guard's release, or the failed acquire).
    pub ret: u64,
    /// When the holder was first told of the loss of the lock.
    pub told: Option<u64>,
    /// How it was told: `lost` (`lost()` resolved), `is_held` (false before a write), `run`
    /// (`run` returned `LeaseLost`), `release` (the release said `LeaseLost`), `inner` (the
    /// nested reentrant `run` returned `LeaseLost`).
    pub how: Option<String>,
    /// `ok`, or the `LockError` variant (`Busy`, `Timeout`, `LeaseLost`, `Backend`...), or
    /// `HUNG` when the section did not return within the worker's bound.
    pub result: String,
    /// The guard's release: `ok` or the error variant.
    pub release: Option<String>,
    /// The nested reentrant `run`'s result: `ok` or the error variant.
    pub inner: Option<String>,
    /// The writes, in order.
    pub writes: Vec<Write>,
    /// Error messages, for the report (free text, the line's last field).
    pub msg: String,
}

impl Section {
    /// A record of an attempt not made yet.
    #[allow(clippy::too_many_arguments, reason = "a plain record constructor")]
    pub fn new(
        proc: u32,
        task: u32,
        n: u64,
        key: &str,
        mode: Mode,
        api: &str,
        wait_ms: Option<u64>,
        lease_ms: u64,
    ) -> Self {
        Section {
            proc,
            task,
            n,
            key: key.to_owned(),
            mode,
            api: api.to_owned(),
            wait_ms,
            lease_ms,
            call: 0,
            acq: None,
            fence: None,
            end: None,
            ret: 0,
            told: None,
            how: None,
            result: "-".to_owned(),
            release: None,
            inner: None,
            writes: Vec::new(),
            msg: String::new(),
        }
    }

    /// Records that the holder learned of the loss at `at` (the earliest telling is kept).
    pub fn tell(&mut self, at: u64, how: &str) {
        if self.told.is_none_or(|t| at < t) {
            self.told = Some(at);
            self.how = Some(how.to_owned());
        }
    }

    /// Adds to the free-text messages.
    pub fn note(&mut self, what: &str) {
        if !self.msg.is_empty() {
            self.msg.push_str("; ");
        }
        self.msg.push_str(&what.replace(['\n', '\r'], " "));
    }

    /// `p3t1n17`: the section's name in reports.
    pub fn name(&self) -> String {
        format!("p{}t{}n{}", self.proc, self.task, self.n)
    }

    /// The record as one line starting with `SEC `.
    pub fn to_line(&self) -> String {
        fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
            v.map_or_else(|| "-".to_owned(), |v| v.to_string())
        }
        let mut writes = String::new();
        for (i, w) in self.writes.iter().enumerate() {
            if i > 0 {
                writes.push(',');
            }
            let _ = write!(
                writes,
                "{}@{}@{}@{}",
                w.id,
                w.check,
                opt(w.done),
                w.answer.code()
            );
        }
        if writes.is_empty() {
            writes.push('-');
        }
        format!(
            "SEC p={} t={} n={} key={} mode={} api={} wait={} lease={} call={} acq={} fence={} \
             end={} ret={} told={} how={} result={} release={} inner={} writes={} msg={}",
            self.proc,
            self.task,
            self.n,
            self.key,
            self.mode.as_str(),
            self.api,
            opt(self.wait_ms),
            self.lease_ms,
            self.call,
            opt(self.acq),
            opt(self.fence),
            opt(self.end),
            self.ret,
            opt(self.told),
            opt(self.how.as_deref()),
            self.result,
            opt(self.release.as_deref()),
            opt(self.inner.as_deref()),
            writes,
            self.msg,
        )
    }

    /// Parses a line made by [`to_line`](Self::to_line).
    ///
    /// # Errors
    /// What is missing or malformed.
    pub fn parse(line: &str) -> Result<Section, String> {
        let rest = line
            .strip_prefix("SEC ")
            .ok_or_else(|| format!("not a record: {line:?}"))?;
        let (fields, msg) = rest
            .split_once(" msg=")
            .ok_or_else(|| format!("no msg field: {line:?}"))?;
        let map: std::collections::HashMap<&str, &str> = fields
            .split_whitespace()
            .filter_map(|f| f.split_once('='))
            .collect();
        let get = |name: &str| {
            map.get(name)
                .copied()
                .ok_or_else(|| format!("no {name} in {line:?}"))
        };
        let num = |name: &str| -> Result<u64, String> {
            get(name)?
                .parse()
                .map_err(|e| format!("{name} in {line:?}: {e}"))
        };
        let opt_num = |name: &str| -> Result<Option<u64>, String> {
            match get(name)? {
                "-" => Ok(None),
                v => v
                    .parse()
                    .map(Some)
                    .map_err(|e| format!("{name} in {line:?}: {e}")),
            }
        };
        let opt_str = |name: &str| -> Result<Option<String>, String> {
            Ok(match get(name)? {
                "-" => None,
                v => Some(v.to_owned()),
            })
        };
        let mut writes = Vec::new();
        let raw = get("writes")?;
        if raw != "-" {
            for w in raw.split(',') {
                let parts: Vec<&str> = w.split('@').collect();
                let [id, check, done, answer] = parts.as_slice() else {
                    return Err(format!("bad write {w:?} in {line:?}"));
                };
                writes.push(Write {
                    id: (*id).to_owned(),
                    check: check
                        .parse()
                        .map_err(|e| format!("write {w:?} in {line:?}: {e}"))?,
                    done: match *done {
                        "-" => None,
                        d => Some(
                            d.parse()
                                .map_err(|e| format!("write {w:?} in {line:?}: {e}"))?,
                        ),
                    },
                    answer: Answer::parse(answer)
                        .ok_or_else(|| format!("bad answer in {w:?} in {line:?}"))?,
                });
            }
        }
        Ok(Section {
            proc: u32::try_from(num("p")?).map_err(|e| e.to_string())?,
            task: u32::try_from(num("t")?).map_err(|e| e.to_string())?,
            n: num("n")?,
            key: get("key")?.to_owned(),
            mode: Mode::parse(get("mode")?).ok_or_else(|| format!("bad mode in {line:?}"))?,
            api: get("api")?.to_owned(),
            wait_ms: opt_num("wait")?,
            lease_ms: num("lease")?,
            call: num("call")?,
            acq: opt_num("acq")?,
            fence: opt_num("fence")?,
            end: opt_num("end")?,
            ret: num("ret")?,
            told: opt_num("told")?,
            how: opt_str("how")?,
            result: get("result")?.to_owned(),
            release: opt_str("release")?,
            inner: opt_str("inner")?,
            writes,
            msg: msg.to_owned(),
        })
    }
}

/// The command line of `lock-chaos-worker`.
///
/// ```
/// use lock_tests::chaos::{Engine, WorkerConfig};
/// let c = WorkerConfig {
///     engine: Engine::Redlock,
///     lock_url: "redis://127.0.0.1:1/,redis://127.0.0.1:3/".into(),
///     store_url: "redis://127.0.0.1:2/".into(),
///     proc: 1,
///     tasks: 4,
///     keys: 3,
///     seed: 42,
/// };
/// assert_eq!(WorkerConfig::parse(c.to_args()), Ok(c));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerConfig {
    /// The engine the lock is on.
    pub engine: Engine,
    /// The lock servers (the ones the faults hit), comma-separated: see [`Engine`].
    pub lock_url: String,
    /// The fence-checking store (never faulted).
    pub store_url: String,
    /// This worker's number.
    pub proc: u32,
    /// How many tasks lock concurrently.
    pub tasks: u32,
    /// How many keys (`chaos:k0`..): their modes cycle fenced, reentrant, plain.
    pub keys: u64,
    /// The run's seed (each task derives its own).
    pub seed: u64,
}

impl WorkerConfig {
    /// The arguments that [`parse`](Self::parse) reads back.
    pub fn to_args(&self) -> Vec<String> {
        vec![
            "--engine".into(),
            self.engine.as_str().into(),
            "--lock-url".into(),
            self.lock_url.clone(),
            "--store-url".into(),
            self.store_url.clone(),
            "--proc".into(),
            self.proc.to_string(),
            "--tasks".into(),
            self.tasks.to_string(),
            "--keys".into(),
            self.keys.to_string(),
            "--seed".into(),
            self.seed.to_string(),
        ]
    }

    /// Reads the arguments (without the program name).
    ///
    /// # Errors
    /// A usage message.
    pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<WorkerConfig, String> {
        let args: Vec<String> = args.into_iter().collect();
        let get = |name: &str| -> Result<String, String> {
            flag(&args, name)
                .map(str::to_owned)
                .ok_or_else(|| format!("usage: lock-chaos-worker: missing {name}"))
        };
        let num = |name: &str| -> Result<u64, String> {
            get(name)?
                .parse()
                .map_err(|e| format!("usage: lock-chaos-worker: {name}: {e}"))
        };
        let engine = get("--engine")?;
        Ok(WorkerConfig {
            engine: Engine::parse(&engine)
                .ok_or_else(|| format!("usage: lock-chaos-worker: no engine {engine:?}"))?,
            lock_url: get("--lock-url")?,
            store_url: get("--store-url")?,
            proc: u32::try_from(num("--proc")?).map_err(|e| e.to_string())?,
            tasks: u32::try_from(num("--tasks")?).map_err(|e| e.to_string())?,
            keys: num("--keys")?,
            seed: num("--seed")?,
        })
    }
}
