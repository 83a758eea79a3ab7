//! The flash-sale demo: starts the service, hammers it with the seed scenario, checks the
//! invariants, and reports.
//!
//! ```no_run
//! # async fn demo() -> Result<(), lock_examples::demo::DemoError> {
//! use lock_examples::demo::{self, DemoConfig};
//! let report = demo::run(&DemoConfig::fast()).await?;
//! report.write_table(&mut std::io::stdout()).unwrap();
//! assert_eq!(report.oversold(), 0);
//! assert!(report.passed());
//! # Ok(()) }
//! ```

mod progress;
mod report;
mod scenario;

use std::path::PathBuf;
use std::time::Duration;

use lock_core::Locker;
use tokio::net::TcpListener;

pub use report::{Check, CheckoutPhase, InventoryPhase, LotteryPhase, Report, percentile};

use crate::app::{RunningServer, SetupError, Shop, ShopConfig};
use crate::cluster::{ClusterError, ServerOptions, ServerProcess};
use crate::store::Store;

/// The seed scenario's sizes (see BACKGROUND: "the scenarios they test with").
///
/// ```
/// let s = lock_examples::demo::Scenario::SEED;
/// assert_eq!((s.stock, s.buyers, s.optimistic_buyers, s.attempts), (10, 20, 10, 5));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Scenario {
    /// Items on sale per SKU.
    pub stock: u32,
    /// Pessimistic buyers racing at once; each waits for the lock.
    pub buyers: usize,
    /// Optimistic buyers racing at once; each gives up at once when the lock is busy...
    pub optimistic_buyers: usize,
    /// ...and tries this many times in all.
    pub attempts: u32,
    /// Lottery users per draw.
    pub users: usize,
    /// Prizes per draw.
    pub prizes: u32,
    /// Retries each lottery user sends together with its first request (same key), as a client
    /// whose timeout fired would; one more late retry and one entry under a new key follow.
    /// Checkout clients retry the same way.
    pub concurrent_retries: usize,
    /// Orders paid per round through `POST /checkout`, each under its own `Idempotency-Key`.
    pub checkouts: usize,
}

impl Scenario {
    /// 10 items, 20 waiting buyers; 10 items, 10 buyers x 5 attempts with `no_wait`; a draw
    /// of 12 users for 4 prizes, each user retrying twice at once and once later; 10 orders
    /// paid at checkout, each request retried the same way.
    pub const SEED: Scenario = Scenario {
        stock: 10,
        buyers: 20,
        optimistic_buyers: 10,
        attempts: 5,
        users: 12,
        prizes: 4,
        concurrent_retries: 2,
        checkouts: 10,
    };
}

/// How to run the demo.
///
/// ```
/// let fast = lock_examples::demo::DemoConfig::fast();
/// assert_eq!(fast.rounds, 1);
/// assert!(fast.locking);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DemoConfig {
    /// Redis for locks and state; `None`: everything in this process.
    pub redis_url: Option<String>,
    /// etcd members (comma-separated URLs) for the locks instead (feature `etcd`); state stays
    /// in Redis when [`redis_url`](Self::redis_url) is set, else in this process.
    pub etcd_urls: Option<String>,
    /// A ZooKeeper connect string for the locks instead (feature `zookeeper`); state as with
    /// etcd.
    pub zookeeper_hosts: Option<String>,
    /// Server processes (more than one needs Redis); 1 serves in this process.
    pub processes: usize,
    /// The `flash-sale` binary to start server processes from (default: this executable).
    pub server_exe: Option<PathBuf>,
    /// Whether the service locks (`false`: `--no-lock`).
    pub locking: bool,
    /// How many times the whole scenario runs, on fresh SKUs and draws.
    pub rounds: u32,
    /// The service's work time between reading and writing.
    pub work: Duration,
    /// Whether to draw a progress bar on stderr (only drawn on a terminal).
    pub progress: bool,
    /// The sizes.
    pub scenario: Scenario,
    /// Keep the run's keys in Redis when done (default `false`: the demo removes everything it
    /// wrote under its namespace, locks and idempotency records included).
    pub keep_data: bool,
}

impl DemoConfig {
    /// The full demo: 3 rounds, 20 ms of work between read and write.
    ///
    /// ```
    /// assert_eq!(lock_examples::demo::DemoConfig::standard().rounds, 3);
    /// ```
    pub fn standard() -> Self {
        DemoConfig {
            redis_url: None,
            etcd_urls: None,
            zookeeper_hosts: None,
            processes: 1,
            server_exe: None,
            locking: true,
            rounds: 3,
            work: Duration::from_millis(20),
            progress: true,
            scenario: Scenario::SEED,
            keep_data: false,
        }
    }

    /// The CI run (`--fast`): 1 round, 10 ms of work.
    ///
    /// ```
    /// assert_eq!(lock_examples::demo::DemoConfig::fast().work.as_millis(), 10);
    /// ```
    pub fn fast() -> Self {
        DemoConfig {
            rounds: 1,
            work: Duration::from_millis(10),
            ..DemoConfig::standard()
        }
    }

    /// Sets [`redis_url`](Self::redis_url).
    ///
    /// ```
    /// let c = lock_examples::demo::DemoConfig::fast().redis_url(Some("redis://127.0.0.1:6379/".into()));
    /// assert!(c.redis_url.is_some());
    /// ```
    #[must_use]
    pub fn redis_url(mut self, url: Option<String>) -> Self {
        self.redis_url = url;
        self
    }

    /// Sets [`etcd_urls`](Self::etcd_urls).
    ///
    /// ```
    /// let c = lock_examples::demo::DemoConfig::fast().etcd_urls(Some("http://127.0.0.1:2379".into()));
    /// assert!(c.etcd_urls.is_some());
    /// ```
    #[must_use]
    pub fn etcd_urls(mut self, urls: Option<String>) -> Self {
        self.etcd_urls = urls;
        self
    }

    /// Sets [`zookeeper_hosts`](Self::zookeeper_hosts).
    ///
    /// ```
    /// let c = lock_examples::demo::DemoConfig::fast().zookeeper_hosts(Some("127.0.0.1:2181".into()));
    /// assert!(c.zookeeper_hosts.is_some());
    /// ```
    pub fn zookeeper_hosts(mut self, hosts: Option<String>) -> Self {
        self.zookeeper_hosts = hosts;
        self
    }

    /// Sets [`processes`](Self::processes).
    ///
    /// ```
    /// assert_eq!(lock_examples::demo::DemoConfig::fast().processes(3).processes, 3);
    /// ```
    #[must_use]
    pub fn processes(mut self, n: usize) -> Self {
        self.processes = n;
        self
    }

    /// Sets [`server_exe`](Self::server_exe).
    ///
    /// ```
    /// let c = lock_examples::demo::DemoConfig::fast().server_exe("target/debug/flash-sale".into());
    /// assert!(c.server_exe.is_some());
    /// ```
    #[must_use]
    pub fn server_exe(mut self, exe: PathBuf) -> Self {
        self.server_exe = Some(exe);
        self
    }

    /// Sets [`locking`](Self::locking).
    ///
    /// ```
    /// assert!(!lock_examples::demo::DemoConfig::fast().locking(false).locking);
    /// ```
    #[must_use]
    pub fn locking(mut self, on: bool) -> Self {
        self.locking = on;
        self
    }

    /// Sets [`keep_data`](Self::keep_data).
    ///
    /// ```
    /// assert!(lock_examples::demo::DemoConfig::fast().keep_data(true).keep_data);
    /// ```
    #[must_use]
    pub fn keep_data(mut self, on: bool) -> Self {
        self.keep_data = on;
        self
    }

    /// Sets [`progress`](Self::progress).
    ///
    /// ```
    /// assert!(!lock_examples::demo::DemoConfig::fast().progress(false).progress);
    /// ```
    #[must_use]
    pub fn progress(mut self, on: bool) -> Self {
        self.progress = on;
        self
    }
}

/// The demo could not run (its verdict on the invariants is in the [`Report`], not here).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DemoError {
    /// The options contradict each other.
    #[error("{0}")]
    Config(String),
    /// The service could not be set up.
    #[error(transparent)]
    Setup(#[from] SetupError),
    /// A server process could not be started.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// Seeding or reading back state failed.
    #[error("cannot prepare or read the demo's state: {0}")]
    State(String),
}

/// Runs the demo: starts the service (in this process, or `processes` children sharing
/// Redis), runs the scenario `rounds` times, reads the state back through the service's GET
/// routes, stops the servers, removes every key of the run (unless
/// [`keep_data`](DemoConfig::keep_data)) and returns the report.
///
/// # Errors
/// [`DemoError`] when the demo cannot run; broken invariants are reported, not errors.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_examples::demo::DemoError> {
/// let report = lock_examples::demo::run(&lock_examples::demo::DemoConfig::fast().locking(false)).await?;
/// assert!(report.oversold() > 0);
/// # Ok(()) }
/// ```
pub async fn run(config: &DemoConfig) -> Result<Report, DemoError> {
    if config.processes == 0 || config.rounds == 0 {
        return Err(DemoError::Config(
            "--processes and --rounds must be at least 1".into(),
        ));
    }
    if config.processes > 1 && config.redis_url.is_none() {
        return Err(DemoError::Config(format!(
            "--processes {} needs REDIS_URL (or --redis-url): separate processes share their stock (and, without etcd, their locks) only through Redis",
            config.processes
        )));
    }
    let namespace = format!("flash-sale:{}:", random_hex());
    let shop_config = ShopConfig::default()
        .work(config.work)
        .locking(config.locking);
    let redis = config.redis_url.as_deref();
    let shop = match (&config.etcd_urls, &config.zookeeper_hosts, redis) {
        (Some(urls), _, redis) => etcd_shop(urls, redis, &namespace, shop_config).await?,
        (None, Some(hosts), redis) => zookeeper_shop(hosts, redis, &namespace, shop_config).await?,
        (None, None, None) => Shop::new(Locker::memory(), Store::memory(&namespace), shop_config),
        (None, None, Some(url)) => Shop::redis(url, &namespace, shop_config).await?,
    };
    let servers = Servers::start(&shop, config, &namespace).await?;
    let bases = servers.base_urls();
    let mut report = scenario::drive(&shop, &bases, config, &namespace).await;
    // The lock's latency as an operator sees it: from the service's own `/metrics`.
    if let (Ok(report), Some(base)) = (&mut report, bases.first()) {
        match crate::client::ShopClient::new().metrics(base).await {
            Ok(text) => report.lock_latency = Some(crate::metrics::lock_latency_line(&text)),
            Err(e) => report.notes.push(format!("reading /metrics failed: {e}")),
        }
    }
    servers.stop().await;
    if config.keep_data {
        return report;
    }
    // Runs against a user's Redis leave nothing behind: state, ledgers, fencing counters and
    // idempotency records all live under this run's namespace.
    let cleared = shop.store().clear().await;
    let mut report = report?;
    match cleared {
        Ok(n) => report.cleaned_keys = Some(n),
        Err(e) => report
            .notes
            .push(format!("cleanup of {namespace}* failed: {e}")),
    }
    Ok(report)
}

/// A shop with its locks on the etcd members of `urls` (comma-separated), state in the Redis of
/// `redis` or in this process.
///
/// # Errors
/// [`DemoError`] when etcd or Redis cannot be reached.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_examples::demo::DemoError> {
/// let shop = lock_examples::demo::etcd_shop("http://127.0.0.1:2379", None, "shop:", Default::default()).await?;
/// # drop(shop); Ok(()) }
/// ```
#[cfg(feature = "etcd")]
pub async fn etcd_shop(
    urls: &str,
    redis: Option<&str>,
    namespace: &str,
    config: ShopConfig,
) -> Result<Shop, DemoError> {
    let urls: Vec<&str> = urls.split(',').map(str::trim).collect();
    let store = state_store(redis, namespace).await?;
    Ok(Shop::etcd(&urls, store, namespace, config).await?)
}

/// The shop's state: in the Redis of `redis`, or in this process.
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
async fn state_store(redis: Option<&str>, namespace: &str) -> Result<Store, DemoError> {
    Ok(match redis {
        Some(url) => Store::redis(url, namespace)
            .await
            .map_err(SetupError::from)?,
        None => Store::memory(namespace),
    })
}

/// A shop with its locks on the ZooKeeper ensemble of `hosts` (a connect string), state in
/// the Redis of `redis` or in this process.
///
/// # Errors
/// [`DemoError`] when ZooKeeper or Redis cannot be reached.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_examples::demo::DemoError> {
/// let shop = lock_examples::demo::zookeeper_shop("127.0.0.1:2181", None, "shop:", Default::default()).await?;
/// # drop(shop); Ok(()) }
/// ```
#[cfg(feature = "zookeeper")]
pub async fn zookeeper_shop(
    hosts: &str,
    redis: Option<&str>,
    namespace: &str,
    config: ShopConfig,
) -> Result<Shop, DemoError> {
    let store = state_store(redis, namespace).await?;
    Ok(Shop::zookeeper(hosts, store, namespace, config).await?)
}

/// Without the `zookeeper` feature: says how to get it ([`ZOOKEEPER_MISSING`]).
///
/// ```
/// # async fn demo() {
/// let refused = lock_examples::demo::zookeeper_shop("127.0.0.1:2181", None, "shop:", Default::default()).await;
/// assert!(refused.is_err());
/// # }
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(demo());
/// ```
#[cfg(not(feature = "zookeeper"))]
pub async fn zookeeper_shop(
    _hosts: &str,
    _redis: Option<&str>,
    _namespace: &str,
    _config: ShopConfig,
) -> Result<Shop, DemoError> {
    Err(DemoError::Config(ZOOKEEPER_MISSING.into()))
}

/// What a build without the `zookeeper` feature says to `--zookeeper-hosts`.
///
/// ```
/// assert!(lock_examples::demo::ZOOKEEPER_MISSING.contains("--features zookeeper"));
/// ```
pub const ZOOKEEPER_MISSING: &str = "this build has no ZooKeeper support: run it with `cargo run -p lock-examples --features zookeeper --bin flash-sale -- ...`";

/// Without the `etcd` feature: says how to get it ([`ETCD_MISSING`]).
///
/// ```
/// # async fn demo() {
/// let refused = lock_examples::demo::etcd_shop("http://127.0.0.1:2379", None, "shop:", Default::default()).await;
/// assert!(refused.is_err());
/// # }
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(demo());
/// ```
#[cfg(not(feature = "etcd"))]
pub async fn etcd_shop(
    _urls: &str,
    _redis: Option<&str>,
    _namespace: &str,
    _config: ShopConfig,
) -> Result<Shop, DemoError> {
    Err(DemoError::Config(ETCD_MISSING.into()))
}

/// What a build without the `etcd` feature says to `--etcd-url`.
///
/// ```
/// assert!(lock_examples::demo::ETCD_MISSING.contains("--features etcd"));
/// ```
pub const ETCD_MISSING: &str = "this build has no etcd support: run it with `cargo run -p lock-examples --features etcd --bin flash-sale -- ...` (building etcd-client needs protoc: apt-get install -y protobuf-compiler)";

/// The servers of one run.
enum Servers {
    InProcess(RunningServer),
    Processes(Vec<ServerProcess>),
}

impl Servers {
    async fn start(
        shop: &Shop,
        config: &DemoConfig,
        namespace: &str,
    ) -> Result<Servers, DemoError> {
        if config.processes == 1 {
            let listener = TcpListener::bind("127.0.0.1:0")
                .await
                .map_err(SetupError::from)?;
            return Ok(Servers::InProcess(shop.spawn(listener)?));
        }
        let exe = match &config.server_exe {
            Some(exe) => exe.clone(),
            None => std::env::current_exe().map_err(SetupError::from)?,
        };
        let mut options = ServerOptions::new(
            exe,
            config.redis_url.clone().unwrap_or_default(),
            namespace.to_owned(),
        );
        options.work = config.work;
        options.etcd_urls = config.etcd_urls.clone();
        options.zookeeper_hosts = config.zookeeper_hosts.clone();
        options.locking = config.locking;
        let mut processes = Vec::with_capacity(config.processes);
        for _ in 0..config.processes {
            match ServerProcess::start(&options).await {
                Ok(process) => processes.push(process),
                Err(e) => {
                    for process in processes {
                        process.stop().await;
                    }
                    return Err(e.into());
                }
            }
        }
        Ok(Servers::Processes(processes))
    }

    fn base_urls(&self) -> Vec<String> {
        match self {
            Servers::InProcess(server) => vec![server.base_url()],
            Servers::Processes(processes) => {
                processes.iter().map(|p| p.base_url().to_owned()).collect()
            }
        }
    }

    async fn stop(self) {
        match self {
            Servers::InProcess(server) => server.stop().await,
            Servers::Processes(processes) => {
                for process in processes {
                    process.stop().await;
                }
            }
        }
    }
}

/// 16 random hex digits (falls back to the clock and pid if the system has no randomness).
fn random_hex() -> String {
    let n = getrandom::u64().unwrap_or_else(|_| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        (nanos as u64) ^ u64::from(std::process::id()).rotate_left(32)
    });
    format!("{n:016x}")
}
