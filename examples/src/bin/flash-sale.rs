//! `flash-sale`: the README's main job. Starts the shop service, runs the flash-sale and lottery
//! scenarios against it over HTTP, prints what happened, and exits non-zero if anything was
//! oversold, counted twice or over-awarded.
#![forbid(unsafe_code)]

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use lock_examples::demo::{self, DemoConfig};
use lock_examples::{Shop, ShopConfig, Store};

/// Exit code when an invariant broke (oversold, lost update, double draw...).
const EXIT_BROKEN: u8 = 1;
/// Exit code when the demo could not run at all (bad flags, Redis unreachable).
const EXIT_SETUP: u8 = 2;

/// The flash-sale demo: 20 buyers race for 10 items while waiting for the lock, then 10 buyers
/// make up to 5 attempts each without waiting (`Prefer: wait=0`), then a lottery where every
/// client retries with the same Idempotency-Key. Prints a table and checks that nothing was
/// oversold, counted twice or over-awarded.
///
/// Exit status: 0 when every invariant holds, 1 when one broke, 2 when the demo could not run.
#[derive(Debug, Parser)]
#[command(name = "flash-sale", version)]
struct Args {
    /// CI mode: one round with 10 ms of work per read-modify-write; done in a few seconds.
    #[arg(long, visible_alias = "quick")]
    fast: bool,

    /// Run the whole scenario N times, on fresh SKUs and draws [default: 3; 1 with --fast].
    #[arg(long, value_name = "N")]
    rounds: Option<u32>,

    /// Milliseconds each reservation (and each prize award) works between reading its counter
    /// and writing it back: the race window the lock closes [default: 20; 10 with --fast].
    #[arg(long, value_name = "MS")]
    work_ms: Option<u64>,

    /// Keep locks and state in this Redis instead of in this process (redis://host:port/).
    #[arg(long, env = "REDIS_URL", value_name = "URL")]
    redis_url: Option<String>,

    /// Where the locks live: memory, redis (with --redis-url), etcd (with --etcd-url) or
    /// zookeeper (with --zookeeper-hosts) [default: etcd when --etcd-url is given, else
    /// zookeeper when --zookeeper-hosts is, else redis when --redis-url is, else memory].
    #[arg(long, value_enum, value_name = "BACKEND")]
    backend: Option<BackendArg>,

    /// Keep the locks in these etcd members (comma-separated http://host:port URLs); state stays
    /// in Redis with --redis-url, else in this process. Needs the `etcd` feature.
    #[arg(long, env = "ETCD_URL", value_name = "URLS")]
    etcd_url: Option<String>,

    /// Keep the locks in this ZooKeeper ensemble (a connect string, host:port pairs separated
    /// by commas); state as with --etcd-url. Needs the `zookeeper` feature.
    #[arg(long, env = "ZOOKEEPER_HOSTS", value_name = "HOSTS")]
    zookeeper_hosts: Option<String>,

    /// Run N copies of the service as separate processes sharing the Redis of REDIS_URL, and
    /// spread the buyers across them. With 1 the service runs inside this process.
    #[arg(long, value_name = "N", default_value_t = 1)]
    processes: usize,

    /// Teaching flag: the same scenario with locking turned off, to watch the sale oversell.
    /// Exits with status 1, because the invariants break.
    #[arg(long)]
    no_lock: bool,

    /// Never draw the progress bar (it is drawn on stderr only when that is a terminal).
    #[arg(long)]
    no_progress: bool,

    /// Serve only (used by --processes): no scenario; announce the address on stdout.
    #[arg(long, hide = true)]
    serve_only: bool,

    /// With --serve-only: the port on 127.0.0.1 (0: any free port).
    #[arg(long, hide = true, default_value_t = 0)]
    port: u16,

    /// With --serve-only: stop when stdin closes (the parent demo holds it open).
    #[arg(long, hide = true)]
    exit_on_stdin_eof: bool,

    /// With --serve-only: the key namespace shared with the other processes.
    #[arg(long, hide = true, default_value = "flash-sale:")]
    namespace: String,
}

/// The values of `--backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum BackendArg {
    Memory,
    Redis,
    Etcd,
    Zookeeper,
}

impl Args {
    /// Checks `--backend` against the URLs given, and drops a URL the backend does not use.
    fn settle_backend(&mut self) -> Result<(), String> {
        let chosen = self.backend.unwrap_or(if self.etcd_url.is_some() {
            BackendArg::Etcd
        } else if self.zookeeper_hosts.is_some() {
            BackendArg::Zookeeper
        } else if self.redis_url.is_some() {
            BackendArg::Redis
        } else {
            BackendArg::Memory
        });
        match chosen {
            BackendArg::Memory
                if self.redis_url.is_some()
                    || self.etcd_url.is_some()
                    || self.zookeeper_hosts.is_some() =>
            {
                Err("--backend memory takes no --redis-url, --etcd-url or --zookeeper-hosts".into())
            }
            BackendArg::Redis if self.redis_url.is_none() => {
                Err("--backend redis needs --redis-url (or REDIS_URL)".into())
            }
            BackendArg::Redis => {
                self.etcd_url = None;
                self.zookeeper_hosts = None;
                Ok(())
            }
            BackendArg::Etcd if self.etcd_url.is_none() => {
                Err("--backend etcd needs --etcd-url (or ETCD_URL)".into())
            }
            BackendArg::Etcd if !cfg!(feature = "etcd") => {
                Err(lock_examples::demo::ETCD_MISSING.into())
            }
            BackendArg::Etcd => {
                self.zookeeper_hosts = None;
                Ok(())
            }
            BackendArg::Zookeeper if self.zookeeper_hosts.is_none() => {
                Err("--backend zookeeper needs --zookeeper-hosts (or ZOOKEEPER_HOSTS)".into())
            }
            BackendArg::Zookeeper if !cfg!(feature = "zookeeper") => {
                Err(lock_examples::demo::ZOOKEEPER_MISSING.into())
            }
            BackendArg::Zookeeper => {
                self.etcd_url = None;
                Ok(())
            }
            BackendArg::Memory => Ok(()),
        }
    }
}

fn main() -> ExitCode {
    let mut args = Args::parse();
    if let Err(message) = args.settle_backend() {
        return fail(&format!("flash-sale: {message}"));
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return fail(&format!("cannot start the async runtime: {e}")),
    };
    if args.serve_only {
        runtime.block_on(serve_only(&args))
    } else {
        runtime.block_on(run_demo(&args))
    }
}

async fn run_demo(args: &Args) -> ExitCode {
    let base = if args.fast {
        DemoConfig::fast()
    } else {
        DemoConfig::standard()
    };
    let mut config = base
        .redis_url(args.redis_url.clone())
        .etcd_urls(args.etcd_url.clone())
        .zookeeper_hosts(args.zookeeper_hosts.clone())
        .processes(args.processes)
        .locking(!args.no_lock)
        .progress(!args.no_progress);
    if let Some(rounds) = args.rounds {
        config.rounds = rounds;
    }
    if let Some(ms) = args.work_ms {
        config.work = Duration::from_millis(ms);
    }
    let report = match demo::run(&config).await {
        Ok(report) => report,
        Err(e) => return fail(&format!("flash-sale: {e}")),
    };
    let mut out = std::io::stdout().lock();
    if let Err(e) = report.write_table(&mut out).and_then(|()| out.flush()) {
        return fail(&format!("flash-sale: cannot write the report: {e}"));
    }
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_BROKEN)
    }
}

async fn serve_only(args: &Args) -> ExitCode {
    let mut config = ShopConfig::default().locking(!args.no_lock);
    if let Some(ms) = args.work_ms {
        config.work = Duration::from_millis(ms);
    }
    let (ns, redis) = (&args.namespace, args.redis_url.as_deref());
    let shop = match (&args.etcd_url, &args.zookeeper_hosts, redis) {
        (Some(urls), _, redis) => lock_examples::demo::etcd_shop(urls, redis, ns, config).await,
        (None, Some(hosts), redis) => {
            lock_examples::demo::zookeeper_shop(hosts, redis, ns, config).await
        }
        (None, None, Some(url)) => Shop::redis(url, ns, config).await.map_err(Into::into),
        (None, None, None) => Ok(Shop::new(
            lock_core::Locker::memory(),
            Store::memory(ns),
            config,
        )),
    };
    let shop = match shop {
        Ok(shop) => shop,
        Err(e) => return fail(&format!("flash-sale --serve-only: {e}")),
    };
    let mut stdout = std::io::stdout();
    match lock_examples::cluster::serve(shop, args.port, args.exit_on_stdin_eof, &mut stdout).await
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&format!("flash-sale --serve-only: {e}")),
    }
}

fn fail(message: &str) -> ExitCode {
    // Nothing better to do if stderr itself is gone.
    let _ = writeln!(std::io::stderr().lock(), "{message}");
    ExitCode::from(EXIT_SETUP)
}
