//! The `lock-worker` binary's command line and its summary line: one lock client in its own
//! OS process, for tests that need several processes contending for one lock (driven with
//! `lock_testkit::ChildProcess`).
//!
//! Integration tests find the binary with `env!("CARGO_BIN_EXE_lock-worker")`.
//!
//! ## Modes
//!
//! `lock-worker count --url U --key K --iterations N --counter-key C [options]`: `N` times,
//! under `locker.lock(K).run(..)`, a deliberately non-atomic read-modify-write of the Redis
//! string `C` (`GET`, yield, optional sleep, `SET` + 1). With `--fence-key F` each lock is
//! fenced and, under the lock, its token is checked to be above the one stored in `F` (then
//! stored). Ends with one `summary ...` line ([`WorkerSummary`]) and exit code 0. Any failure
//! prints `error op=<what> kind=<LockError variant or "redis"> message=<text>` and exits with
//! code 2.
//!
//! `lock-worker sections --url U --key K --fence-key F [options]`: `--tasks M` tasks, each
//! taking fenced locks on the keys in turn (`--keys N`: task `t`'s `i`-th lock is on
//! `<K>-<(t + i) mod N>`) until stdin says `stop` or ends. Each critical section enters and
//! leaves the fence-checking store [`SECTION`](crate::probe::SECTION) on the Redis server `U`
//! (keys [`section_keys`](crate::probe::section_keys)`(<F>-<n>)`, counts in the hash
//! [`WorkerArgs::counts_key`]), sleeping `--work-us` in between; a lock with less than
//! [`SECTION_MARGIN`] of its lease left is released without entering. A lock attempt that
//! fails with `Backend` or `Timeout` (a fault) is counted and tried again. Prints `ready` once
//! connected, and at the end one line [`SectionsSummary`].
//!
//! `lock-worker serve --url U [options]`: prints `READY`, then obeys one command per stdin line
//! and answers each with one line on stdout (`WAIT` answers later, when its lock was held),
//! until stdin ends. Tests can SIGKILL or SIGSTOP it while it holds locks.
//!
//! ```text
//! HOLD <key> <lease_ms> <fenced:0|1> [no-watchdog] -> HELD <key> fence=<n|none> | ERR <key> <Variant> <error>
//! STATUS <key>                     -> STATUS <key> held=<bool> remaining_ms=<n>   | ERR <key> not held
//! EXTEND <key> <ms>                -> EXTENDED <key> ok | EXTENDED <key> err=<Variant>
//! WRITE <key> <storage_key>        -> WRITE <key> ok|rejected held=<true|false>
//! RELEASE <key>                    -> RELEASED <key> ok | RELEASED <key> err=<Variant>
//! WAIT <key> <id> <order_list> [fair] [fenced] [keep] -> (later) DONE <id> [fence=<n>] | FAILED <id> <error>
//! STATS                            -> STATS attempts=<n> renewals=<n> waiters=<n>
//! ```
//!
//! `WRITE` is a fenced write to a storage key: accepted only if the held lock's fencing token is
//! at least the highest one the storage has seen. `WAIT` queues a waiter in a new task that,
//! once it holds the lock, appends `<id>` to the Redis list `<order_list>` and releases; with
//! `fenced` its lock is fenced and `DONE` names the fence; with `keep` it keeps the lock (as
//! `HOLD` does, for `STATUS`, `RELEASE`, ...) instead of releasing it. `STATS` reads the
//! locker's counters: `attempts` are its backend calls other than renewals (acquire attempts,
//! releases, queue leaves), so a waiter's wake-ups show there.
//!
//! Options: `--prefix P`, `--holder H` (the locker's holder identity), `--lease-ms`, `--wait-ms` (the locker's defaults; wait 30000),
//! `--work-us` (count, sections: sleep inside the critical section), `--no-lock` (count: no
//! lock at all, the control case), `--wait-go` (count: print `ready` once connected, then wait
//! for a line `go` on stdin, so several processes start together), `--cluster` (`--url` is a
//! comma-separated list of Redis Cluster nodes), `--etcd E` (locks on the etcd cluster whose
//! client URLs are the comma-separated `E`, with a request timeout of [`REQUEST_TIMEOUT`];
//! `--url` is then only the Redis server of the storage keys), `--etcd-namespace NS` (the etcd
//! backend's key namespace), `--zookeeper H` (locks on the ZooKeeper ensemble of the connect
//! string `H`, `host:port,...[/chroot]`, with a request timeout of [`REQUEST_TIMEOUT`]; `--url`
//! is then only the storage), `--zookeeper-root R` (the ZooKeeper backend's root node),
//! `--session-ms` (the ZooKeeper session timeout asked for), `--storage-url U` (count: the
//! server of the counter and fence keys; required with `--cluster`), `--keys N` (count: iteration
//! `i` locks `<key>-<i mod N>` and increments `<counter>-<i mod N>`, fenced against
//! `<fence>-<i mod N>`), `--tasks M` (sections: how many tasks).
//!
//! ```no_run
//! # #[tokio::main] async fn main() {
//! use std::time::Duration;
//! use lock_testkit::{ChildProcess, RedisServer};
//! use lock_tests::worker::{WorkerArgs, WorkerSummary};
//!
//! let server = RedisServer::start();
//! let args = WorkerArgs::count(&server.url(), "stress", 100, "counter");
//! let worker = ChildProcess::spawn("target/debug/lock-worker", args.to_args());
//! let out = worker.finish(Duration::from_secs(60)).await;
//! assert_eq!(WorkerSummary::find(&out.lines).unwrap().increments, 100);
//! # }
//! ```

use std::fmt::Write as _;
use std::time::Duration;

use lock_core::LockError;

/// How long each request of a worker on etcd (`--etcd`) or ZooKeeper (`--zookeeper`) may take
/// before the backend gives up on it: short, so that an attempt sent to a killed or paused
/// member fails over soon.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

/// A `sections` worker enters its critical section only with at least this much of its lease
/// left: far more than a section takes, so a section that ends past its lease is a fault of
/// the lock, not of the worker.
pub const SECTION_MARGIN: Duration = Duration::from_millis(500);

/// The name of a [`LockError`] variant, as the worker processes print it (`Busy`, `Timeout`,
/// ...; `Other` for a variant added later).
pub fn error_kind(e: &LockError) -> &'static str {
    match e {
        LockError::Busy { .. } => "Busy",
        LockError::Timeout { .. } => "Timeout",
        LockError::LeaseLost { .. } => "LeaseLost",
        LockError::MaxHoldExceeded { .. } => "MaxHoldExceeded",
        LockError::InvalidKey { .. } => "InvalidKey",
        LockError::InvalidConfig { .. } => "InvalidConfig",
        LockError::NoGlobalLocker => "NoGlobalLocker",
        LockError::Backend { .. } => "Backend",
        _ => "Other",
    }
}

/// What a worker does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The counter stress.
    Count,
    /// Obey lock commands on stdin, one answer line each.
    Serve,
    /// Tasks running critical sections checked by a fence-checking store, until stopped.
    Sections,
}

/// The command line of `lock-worker`: built by tests, parsed by the binary.
///
/// ```
/// use lock_tests::worker::WorkerArgs;
/// let args = WorkerArgs::count("redis://127.0.0.1:6379/", "k", 10, "c").fence_key("f").wait_go();
/// let line = args.to_args();
/// assert_eq!(WorkerArgs::parse(line.iter().cloned()).unwrap(), args);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerArgs {
    /// The mode.
    pub mode: Mode,
    /// The Redis URL.
    pub url: String,
    /// Count: the lock key.
    pub key: String,
    /// The locker's prefix (default `lock:`).
    pub prefix: Option<String>,
    /// The locker's holder identity (default: the locker's own).
    pub holder: Option<String>,
    /// The lease in milliseconds (default: the locker's).
    pub lease_ms: Option<u64>,
    /// The wait in milliseconds.
    pub wait_ms: u64,
    /// Count: iterations.
    pub iterations: u64,
    /// Count: the counter's Redis key.
    pub counter_key: String,
    /// Count: where the highest fencing token seen is kept (turns fencing on).
    pub fence_key: Option<String>,
    /// Count: microseconds to sleep inside the critical section.
    pub work_us: u64,
    /// Count: run without any lock (the control case).
    pub no_lock: bool,
    /// Count: print `ready` and wait for `go` on stdin before starting.
    pub wait_go: bool,
    /// `url` is a comma-separated list of Redis Cluster nodes: locks go through the cluster
    /// backend.
    pub cluster: bool,
    /// Count: where the counter and fence keys live (default: `url`; required with `cluster`).
    pub storage_url: Option<String>,
    /// Count: spread the iterations over this many keys (`<key>-<i>`, each with its own
    /// counter `<counter>-<i>` and fence key `<fence>-<i>`); 1 (the default) keeps the names.
    pub keys: u64,
    /// Locks on etcd: its client URLs, comma-separated (`url` is then only the storage).
    pub etcd: Option<String>,
    /// The etcd backend's key namespace (default: the backend's).
    pub etcd_namespace: Option<String>,
    /// Locks on ZooKeeper: the ensemble's connect string, `host:port,...[/chroot]` (`url` is
    /// then only the storage).
    pub zookeeper: Option<String>,
    /// The ZooKeeper backend's root node (default: the backend's).
    pub zookeeper_root: Option<String>,
    /// ZooKeeper: the session timeout asked for, in milliseconds (default: the backend's).
    pub session_ms: Option<u64>,
    /// Sections: how many tasks run critical sections.
    pub tasks: u64,
}

impl WorkerArgs {
    fn new(mode: Mode, url: &str, key: &str) -> Self {
        WorkerArgs {
            mode,
            url: url.to_owned(),
            key: key.to_owned(),
            prefix: None,
            holder: None,
            lease_ms: None,
            wait_ms: 30_000,
            iterations: 0,
            counter_key: String::new(),
            fence_key: None,
            work_us: 0,
            no_lock: false,
            wait_go: false,
            cluster: false,
            storage_url: None,
            keys: 1,
            etcd: None,
            etcd_namespace: None,
            zookeeper: None,
            zookeeper_root: None,
            session_ms: None,
            tasks: 1,
        }
    }

    /// Tasks running critical sections on `key` (or `key-<n>`, see [`keys`](Self::keys))
    /// through the fence-checking store under `fence_key` on the Redis server `url`.
    ///
    /// ```
    /// let args = lock_tests::worker::WorkerArgs::sections("redis://127.0.0.1/", "acct", "fence").tasks(4);
    /// assert_eq!((args.to_args()[0].as_str(), args.tasks), ("sections", 4));
    /// ```
    pub fn sections(url: &str, key: &str, fence_key: &str) -> Self {
        WorkerArgs {
            fence_key: Some(fence_key.to_owned()),
            ..Self::new(Mode::Sections, url, key)
        }
    }

    /// The counter stress: `iterations` locked increments of `counter_key`.
    ///
    /// ```
    /// let args = lock_tests::worker::WorkerArgs::count("redis://127.0.0.1/", "k", 5, "c");
    /// assert_eq!(args.iterations, 5);
    /// ```
    pub fn count(url: &str, key: &str, iterations: u64, counter_key: &str) -> Self {
        WorkerArgs {
            iterations,
            counter_key: counter_key.to_owned(),
            ..Self::new(Mode::Count, url, key)
        }
    }

    /// Obey lock commands on stdin (see the module docs).
    ///
    /// ```
    /// let args = lock_tests::worker::WorkerArgs::serve("redis://127.0.0.1/");
    /// assert_eq!(args.to_args()[0], "serve");
    /// ```
    pub fn serve(url: &str) -> Self {
        Self::new(Mode::Serve, url, "")
    }

    /// Sets the locker's prefix.
    ///
    /// ```
    /// let a = lock_tests::worker::WorkerArgs::serve("redis://h/").prefix("shop:");
    /// assert_eq!(a.prefix.as_deref(), Some("shop:"));
    /// ```
    #[must_use]
    pub fn prefix(mut self, prefix: &str) -> Self {
        self.prefix = Some(prefix.to_owned());
        self
    }

    /// Sets the locker's holder identity (what `inspect` shows of its locks).
    ///
    /// ```
    /// let a = lock_tests::worker::WorkerArgs::serve("redis://h/").holder("agent 7");
    /// let back = lock_tests::worker::WorkerArgs::parse(a.to_args().into_iter()).unwrap();
    /// assert_eq!(back.holder.as_deref(), Some("agent 7"));
    /// ```
    #[must_use]
    pub fn holder(mut self, holder: &str) -> Self {
        self.holder = Some(holder.to_owned());
        self
    }

    /// Sets the lease.
    ///
    /// ```
    /// let a = lock_tests::worker::WorkerArgs::serve("redis://h/").lease_ms(500);
    /// assert_eq!(a.lease_ms, Some(500));
    /// ```
    #[must_use]
    pub fn lease_ms(mut self, ms: u64) -> Self {
        self.lease_ms = Some(ms);
        self
    }

    /// Sets the wait.
    ///
    /// ```
    /// let a = lock_tests::worker::WorkerArgs::serve("redis://h/").wait_ms(0);
    /// assert_eq!(a.wait_ms, 0);
    /// ```
    #[must_use]
    pub fn wait_ms(mut self, ms: u64) -> Self {
        self.wait_ms = ms;
        self
    }

    /// Count: fenced locks, checked against the highest token stored in `key`.
    ///
    /// ```
    /// let a = lock_tests::worker::WorkerArgs::count("redis://h/", "k", 1, "c").fence_key("f");
    /// assert_eq!(a.fence_key.as_deref(), Some("f"));
    /// ```
    #[must_use]
    pub fn fence_key(mut self, key: &str) -> Self {
        self.fence_key = Some(key.to_owned());
        self
    }

    /// Count: sleep inside the critical section.
    ///
    /// ```
    /// let a = lock_tests::worker::WorkerArgs::count("redis://h/", "k", 1, "c").work_us(50);
    /// assert_eq!(a.work_us, 50);
    /// ```
    #[must_use]
    pub fn work_us(mut self, us: u64) -> Self {
        self.work_us = us;
        self
    }

    /// Count: no lock (the control case that should lose updates).
    ///
    /// ```
    /// let a = lock_tests::worker::WorkerArgs::count("redis://h/", "k", 1, "c").no_lock();
    /// assert!(a.no_lock);
    /// ```
    #[must_use]
    pub fn no_lock(mut self) -> Self {
        self.no_lock = true;
        self
    }

    /// Print `ready`, then wait for `go` on stdin.
    ///
    /// ```
    /// let a = lock_tests::worker::WorkerArgs::count("redis://h/", "k", 1, "c").wait_go();
    /// assert!(a.wait_go);
    /// ```
    #[must_use]
    pub fn wait_go(mut self) -> Self {
        self.wait_go = true;
        self
    }

    /// Locks on a Redis Cluster: `url` is its nodes' URLs, comma-separated.
    ///
    /// ```
    /// let a = lock_tests::worker::WorkerArgs::count("redis://a:7000/,redis://b:7001/", "k", 1, "c").cluster();
    /// assert!(a.cluster);
    /// ```
    #[must_use]
    pub fn cluster(mut self) -> Self {
        self.cluster = true;
        self
    }

    /// Count: keep the counter and fence keys on this server.
    ///
    /// ```
    /// let a = lock_tests::worker::WorkerArgs::count("redis://h/", "k", 1, "c").storage_url("redis://s/");
    /// assert_eq!(a.storage_url.as_deref(), Some("redis://s/"));
    /// ```
    #[must_use]
    pub fn storage_url(mut self, url: &str) -> Self {
        self.storage_url = Some(url.to_owned());
        self
    }

    /// Count: spread the iterations over `n` keys, each with its own counter (and fence key).
    ///
    /// ```
    /// let a = lock_tests::worker::WorkerArgs::count("redis://h/", "k", 1, "c").keys(12);
    /// assert_eq!(a.keys, 12);
    /// ```
    #[must_use]
    pub fn keys(mut self, n: u64) -> Self {
        self.keys = n;
        self
    }

    /// Locks on the etcd cluster whose client URLs are `urls` (comma-separated); `url` is then
    /// only the Redis server of the storage keys.
    ///
    /// ```
    /// let a = lock_tests::worker::WorkerArgs::serve("redis://h/").etcd("http://e:2379").etcd_namespace("t/");
    /// assert_eq!((a.etcd.as_deref(), a.etcd_namespace.as_deref()), (Some("http://e:2379"), Some("t/")));
    /// ```
    #[must_use]
    pub fn etcd(mut self, urls: &str) -> Self {
        self.etcd = Some(urls.to_owned());
        self
    }

    /// Sets the etcd backend's key namespace (with [`etcd`](Self::etcd)).
    ///
    /// See [`etcd`](Self::etcd).
    #[must_use]
    pub fn etcd_namespace(mut self, namespace: &str) -> Self {
        self.etcd_namespace = Some(namespace.to_owned());
        self
    }

    /// Locks on the ZooKeeper ensemble of the connect string `hosts` (`host:port,...`, maybe
    /// ending in a chroot `/path`); `url` is then only the Redis server of the storage keys.
    ///
    /// ```
    /// use lock_tests::worker::WorkerArgs;
    /// let a = WorkerArgs::sections("redis://h/", "k", "f")
    ///     .zookeeper("z1:2181,z2:2181/t")
    ///     .zookeeper_root("/locks")
    ///     .session_ms(4000);
    /// assert_eq!(a.zookeeper.as_deref(), Some("z1:2181,z2:2181/t"));
    /// assert_eq!(WorkerArgs::parse(a.to_args().into_iter()), Ok(a.clone()));
    /// // One lock service at a time.
    /// assert!(WorkerArgs::parse(a.etcd("http://e:2379").to_args().into_iter()).is_err());
    /// ```
    #[must_use]
    pub fn zookeeper(mut self, hosts: &str) -> Self {
        self.zookeeper = Some(hosts.to_owned());
        self
    }

    /// Sets the ZooKeeper backend's root node (with [`zookeeper`](Self::zookeeper)).
    ///
    /// See [`zookeeper`](Self::zookeeper).
    #[must_use]
    pub fn zookeeper_root(mut self, root: &str) -> Self {
        self.zookeeper_root = Some(root.to_owned());
        self
    }

    /// Sets the ZooKeeper session timeout asked for (with [`zookeeper`](Self::zookeeper)).
    ///
    /// See [`zookeeper`](Self::zookeeper).
    #[must_use]
    pub fn session_ms(mut self, ms: u64) -> Self {
        self.session_ms = Some(ms);
        self
    }

    /// Sections: how many tasks run critical sections.
    ///
    /// See [`sections`](Self::sections).
    #[must_use]
    pub fn tasks(mut self, n: u64) -> Self {
        self.tasks = n;
        self
    }

    /// Sections: the hash of the store's counts (`entered`, `left`, `stale`, `overlap`; see
    /// [`SECTION`](crate::probe::SECTION)): `<fence_key>:counts`.
    ///
    /// ```
    /// let a = lock_tests::worker::WorkerArgs::sections("redis://h/", "k", "fence");
    /// assert_eq!(a.counts_key().as_deref(), Some("fence:counts"));
    /// ```
    pub fn counts_key(&self) -> Option<String> {
        self.fence_key.as_ref().map(|f| format!("{f}:counts"))
    }

    /// The names iteration `i` uses: lock key, counter key and fence key (see
    /// [`keys`](Self::keys)).
    ///
    /// ```
    /// let a = lock_tests::worker::WorkerArgs::count("redis://h/", "k", 1, "c").keys(3);
    /// assert_eq!(a.names(4).0, "k-1");
    /// assert_eq!(lock_tests::worker::WorkerArgs::count("redis://h/", "k", 1, "c").names(4).1, "c");
    /// ```
    pub fn names(&self, i: u64) -> (String, String, Option<String>) {
        if self.keys <= 1 {
            return (
                self.key.clone(),
                self.counter_key.clone(),
                self.fence_key.clone(),
            );
        }
        let n = i % self.keys;
        (
            format!("{}-{n}", self.key),
            format!("{}-{n}", self.counter_key),
            self.fence_key.as_ref().map(|f| format!("{f}-{n}")),
        )
    }

    /// The command-line arguments (without the program name).
    ///
    /// ```
    /// let a = lock_tests::worker::WorkerArgs::count("redis://h/", "k", 1, "c");
    /// assert_eq!(a.to_args()[0], "count");
    /// ```
    pub fn to_args(&self) -> Vec<String> {
        let mut v = vec![
            match self.mode {
                Mode::Count => "count",
                Mode::Serve => "serve",
                Mode::Sections => "sections",
            }
            .to_owned(),
        ];
        let mut opt = |name: &str, value: String| {
            v.push(name.to_owned());
            v.push(value);
        };
        opt("--url", self.url.clone());
        if self.mode != Mode::Serve {
            opt("--key", self.key.clone());
        }
        opt("--wait-ms", self.wait_ms.to_string());
        if let Some(p) = &self.prefix {
            opt("--prefix", p.clone());
        }
        if let Some(h) = &self.holder {
            opt("--holder", h.clone());
        }
        if let Some(l) = self.lease_ms {
            opt("--lease-ms", l.to_string());
        }
        if self.mode == Mode::Count {
            opt("--iterations", self.iterations.to_string());
            opt("--counter-key", self.counter_key.clone());
            opt("--work-us", self.work_us.to_string());
            if let Some(f) = &self.fence_key {
                opt("--fence-key", f.clone());
            }
            if let Some(u) = &self.storage_url {
                opt("--storage-url", u.clone());
            }
            opt("--keys", self.keys.to_string());
        }
        if self.mode == Mode::Sections {
            opt("--work-us", self.work_us.to_string());
            if let Some(f) = &self.fence_key {
                opt("--fence-key", f.clone());
            }
            opt("--keys", self.keys.to_string());
            opt("--tasks", self.tasks.to_string());
        }
        if let Some(e) = &self.etcd {
            opt("--etcd", e.clone());
        }
        if let Some(ns) = &self.etcd_namespace {
            opt("--etcd-namespace", ns.clone());
        }
        if let Some(z) = &self.zookeeper {
            opt("--zookeeper", z.clone());
        }
        if let Some(root) = &self.zookeeper_root {
            opt("--zookeeper-root", root.clone());
        }
        if let Some(ms) = self.session_ms {
            opt("--session-ms", ms.to_string());
        }
        let flags = [
            (self.no_lock, "--no-lock"),
            (self.wait_go, "--wait-go"),
            (self.cluster, "--cluster"),
        ];
        v.extend(
            flags
                .into_iter()
                .filter(|(on, _)| *on)
                .map(|(_, f)| f.to_owned()),
        );
        v
    }

    /// Parses a command line (without the program name).
    ///
    /// # Errors
    /// A message saying what is wrong.
    ///
    /// ```
    /// use lock_tests::worker::WorkerArgs;
    /// assert!(WorkerArgs::parse(["count".to_owned()].into_iter()).is_err()); // no --url
    /// ```
    pub fn parse(mut args: impl Iterator<Item = String>) -> Result<Self, String> {
        let mode = match args.next().as_deref() {
            Some("count") => Mode::Count,
            Some("serve") => Mode::Serve,
            Some("sections") => Mode::Sections,
            other => {
                return Err(format!(
                    "expected mode `count`, `serve` or `sections`, got {other:?}"
                ));
            }
        };
        let mut a = Self::new(mode, "", "");
        while let Some(flag) = args.next() {
            let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
            let number = |s: String| {
                s.parse::<u64>()
                    .map_err(|e| format!("{flag}: {s:?} is not a number ({e})"))
            };
            match flag.as_str() {
                "--url" => a.url = value()?,
                "--key" => a.key = value()?,
                "--prefix" => a.prefix = Some(value()?),
                "--holder" => a.holder = Some(value()?),
                "--lease-ms" => a.lease_ms = Some(number(value()?)?),
                "--wait-ms" => a.wait_ms = number(value()?)?,
                "--iterations" => a.iterations = number(value()?)?,
                "--counter-key" => a.counter_key = value()?,
                "--fence-key" => a.fence_key = Some(value()?),
                "--work-us" => a.work_us = number(value()?)?,
                "--no-lock" => a.no_lock = true,
                "--wait-go" => a.wait_go = true,
                "--cluster" => a.cluster = true,
                "--storage-url" => a.storage_url = Some(value()?),
                "--keys" => a.keys = number(value()?)?,
                "--etcd" => a.etcd = Some(value()?),
                "--etcd-namespace" => a.etcd_namespace = Some(value()?),
                "--zookeeper" => a.zookeeper = Some(value()?),
                "--zookeeper-root" => a.zookeeper_root = Some(value()?),
                "--session-ms" => a.session_ms = Some(number(value()?)?),
                "--tasks" => a.tasks = number(value()?)?,
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        if a.url.is_empty() {
            return Err("--url is required".into());
        }
        if a.mode == Mode::Count && (a.counter_key.is_empty() || a.key.is_empty()) {
            return Err("count needs --key and --counter-key".into());
        }
        if a.mode == Mode::Count && a.cluster && a.storage_url.is_none() {
            return Err("count on a cluster needs --storage-url".into());
        }
        if a.mode == Mode::Sections && (a.key.is_empty() || a.fence_key.is_none()) {
            return Err("sections needs --key and --fence-key".into());
        }
        if [a.cluster, a.etcd.is_some(), a.zookeeper.is_some()]
            .iter()
            .filter(|&&on| on)
            .count()
            > 1
        {
            return Err("--cluster, --etcd and --zookeeper exclude each other".into());
        }
        if a.zookeeper.is_none() && (a.zookeeper_root.is_some() || a.session_ms.is_some()) {
            return Err("--zookeeper-root and --session-ms need --zookeeper".into());
        }
        Ok(a)
    }
}

/// The last line of a `count` worker.
///
/// ```
/// use lock_tests::worker::WorkerSummary;
/// let s = WorkerSummary { pid: 7, iterations: 3, increments: 3, max_fence: 9, fence_violations: 0, elapsed_ms: 12 };
/// assert_eq!(WorkerSummary::parse(&s.to_line()), Some(s));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerSummary {
    /// The worker's process id.
    pub pid: u32,
    /// Iterations asked for.
    pub iterations: u64,
    /// Increments done (equal to `iterations` unless it failed).
    pub increments: u64,
    /// The highest fencing token it drew (0 when not fenced).
    pub max_fence: u64,
    /// Fenced locks whose token was not above the highest stored one (must be 0).
    pub fence_violations: u64,
    /// Wall time of the loop.
    pub elapsed_ms: u64,
}

impl WorkerSummary {
    /// The line as the worker prints it.
    ///
    /// ```
    /// use lock_tests::worker::WorkerSummary;
    /// let s = WorkerSummary { pid: 1, iterations: 1, increments: 1, max_fence: 0, fence_violations: 0, elapsed_ms: 1 };
    /// assert!(s.to_line().starts_with("summary "));
    /// ```
    pub fn to_line(&self) -> String {
        let mut s = String::from("summary mode=count");
        let _ = write!(
            s,
            " pid={} iterations={} increments={} max_fence={} fence_violations={} elapsed_ms={}",
            self.pid,
            self.iterations,
            self.increments,
            self.max_fence,
            self.fence_violations,
            self.elapsed_ms
        );
        s
    }

    /// The last `summary` line among a worker's output lines, parsed.
    ///
    /// ```
    /// let lines = ["ready".to_owned(), "summary mode=count pid=1 iterations=1 increments=1 max_fence=0 fence_violations=0 elapsed_ms=3".to_owned()];
    /// assert_eq!(lock_tests::worker::WorkerSummary::find(&lines).unwrap().elapsed_ms, 3);
    /// ```
    pub fn find(lines: &[String]) -> Option<Self> {
        lines.iter().rev().find_map(|l| Self::parse(l))
    }

    /// Parses a `summary ...` line.
    ///
    /// ```
    /// assert_eq!(lock_tests::worker::WorkerSummary::parse("ready"), None);
    /// ```
    pub fn parse(line: &str) -> Option<Self> {
        let rest = line.strip_prefix("summary ")?;
        let field = |name: &str| number_field(rest, name);
        Some(WorkerSummary {
            pid: u32::try_from(field("pid")?).ok()?,
            iterations: field("iterations")?,
            increments: field("increments")?,
            max_fence: field("max_fence")?,
            fence_violations: field("fence_violations")?,
            elapsed_ms: field("elapsed_ms")?,
        })
    }
}

/// The last line of a `sections` worker: what its tasks did.
///
/// ```
/// use lock_tests::worker::SectionsSummary;
/// let s = SectionsSummary { pid: 7, sections: 40, refused: 0, skipped: 1, lock_errors: 3, release_errors: 2 };
/// assert!(s.to_line().starts_with("sections "));
/// assert_eq!(SectionsSummary::parse(&s.to_line()), Some(s));
/// assert_eq!(SectionsSummary::parse("ready"), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SectionsSummary {
    /// The worker's process id.
    pub pid: u32,
    /// Critical sections the store accepted, entering and leaving.
    pub sections: u64,
    /// Critical sections the store refused, entering or leaving (must be 0).
    pub refused: u64,
    /// Locks released without entering: too little of the lease left.
    pub skipped: u64,
    /// Lock attempts that failed with `Backend` or `Timeout` (in a fault).
    pub lock_errors: u64,
    /// Releases that failed (in a fault; the key then ends with its lease).
    pub release_errors: u64,
}

impl SectionsSummary {
    /// The line as the worker prints it.
    ///
    /// See the [type docs](Self).
    pub fn to_line(&self) -> String {
        format!(
            "sections pid={} sections={} refused={} skipped={} lock_errors={} release_errors={}",
            self.pid,
            self.sections,
            self.refused,
            self.skipped,
            self.lock_errors,
            self.release_errors
        )
    }

    /// Parses a `sections ...` line.
    ///
    /// See the [type docs](Self).
    pub fn parse(line: &str) -> Option<Self> {
        let rest = line.strip_prefix("sections ")?;
        let field = |name: &str| number_field(rest, name);
        Some(SectionsSummary {
            pid: u32::try_from(field("pid")?).ok()?,
            sections: field("sections")?,
            refused: field("refused")?,
            skipped: field("skipped")?,
            lock_errors: field("lock_errors")?,
            release_errors: field("release_errors")?,
        })
    }
}

/// The number `name=<n>` among the space-separated fields of `line`.
fn number_field(line: &str, name: &str) -> Option<u64> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))?
        .parse()
        .ok()
}
