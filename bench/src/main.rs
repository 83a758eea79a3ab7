//! lock-bench: measures lock-core against the Redis round trip (the floor) and against the peers
//! (the seed design, `SET NX` + 10 ms sleep polling, and the `rslock` crate), on the same Redis in
//! the same run, and writes a Markdown report plus an SVG of handoff latencies.
//!
//! ```text
//! cargo run --release -p lock-bench --bin lock-bench [--features etcd,zookeeper] -- [--quick] [--out BENCHMARKS.md] [--redis-url URL] [--only SECTION]
//! ```
//!
//! With `--features etcd` it also measures lock-core's etcd backend on an etcd member it starts
//! (the report's etcd section; `etcd` from Debian's `etcd-server`, and protoc for the build),
//! and with `--features zookeeper` its ZooKeeper backend on a standalone server it starts (the
//! report's ZooKeeper section; Java and ZooKeeper's jars, as the test kit finds them).
//!
//! Without `--redis-url` (or `REDIS_URL`) it starts its own `redis-server` on a free loopback
//! port (no persistence, temporary directory, killed at exit). Speed claims live in the report,
//! never in tests: the quick mode only proves the harness still runs.
#![forbid(unsafe_code)]

mod child;
mod clock;
mod cycles;
mod designs;
mod machine;
mod report;
mod scenarios;
mod server;
mod stats;
mod svg;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Every error of the harness: a message for the operator.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub(crate) type Result<T> = std::result::Result<T, BoxError>;

const USAGE: &str = "\
usage: lock-bench [--quick] [--out PATH] [--redis-url URL] [--only SECTION]

  --quick          a few seconds per run, for CI (the figures are not meaningful)
  --out PATH       where to write the Markdown report (default: BENCHMARKS.md at the workspace
                   root); the handoff plot goes next to it as <stem>-handoff.svg
  --redis-url URL  benchmark this Redis instead of starting one (also: REDIS_URL); the
                   cluster and redlock sections always start their own servers
  --only SECTION   run one section and print its table rows and a note naming the run on
                   stdout, no report written (a partial run); sections: latency
                   instructions (needs valgrind) throughput handoff hot watchdog layer
                   idempotency cluster redlock, and etcd when
                   built with `--features etcd` (its own etcd member, started by the bench),
                   zookeeper when built with `--features zookeeper` (its own server)
";

/// Command-line options of the report binary.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub(crate) quick: bool,
    pub(crate) out: PathBuf,
    pub(crate) redis_url: Option<String>,
    /// Run this section only (`--only`), printing its rows instead of writing the report.
    pub(crate) only: Option<String>,
}

/// The options, or the message to print above the usage (empty for `--help`).
fn parse_options(args: &[String]) -> std::result::Result<Options, String> {
    let mut o = Options {
        quick: false,
        out: PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../BENCHMARKS.md")),
        redis_url: std::env::var("REDIS_URL").ok().filter(|u| !u.is_empty()),
        only: None,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--quick" => o.quick = true,
            "--out" => o.out = it.next().ok_or("--out needs a path")?.into(),
            "--redis-url" => {
                o.redis_url = Some(it.next().ok_or("--redis-url needs a URL")?.clone())
            }
            "--only" => {
                let section = it.next().ok_or("--only needs a section")?;
                if !scenarios::SECTIONS.split(' ').any(|s| s == section) {
                    let known = scenarios::SECTIONS;
                    return Err(format!("unknown section `{section}` (known: {known})"));
                }
                o.only = Some(section.clone());
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    Ok(o)
}

/// Progress lines for the operator, on stderr (stdout is the child protocol's channel).
pub(crate) fn progress(msg: &str) {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let t = START.get_or_init(std::time::Instant::now).elapsed();
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "lock-bench [{:6.2}s] {msg}", t.as_secs_f64());
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (role, result) = match args.split_first() {
        Some((flag, args)) if flag == child::CHILD_FLAG => ("child error", child::main(args)),
        Some((flag, args)) if flag == cycles::CYCLES_FLAG => {
            ("cycles error", cycles::main(args, false))
        }
        Some((flag, args)) if flag == cycles::RATE_FLAG => ("rate error", cycles::main(args, true)),
        _ => match parse_options(&args) {
            Ok(options) => ("error", run(&options)),
            Err(msg) => {
                let mut err = std::io::stderr().lock();
                if !msg.is_empty() {
                    let _ = writeln!(err, "lock-bench: {msg}");
                }
                let _ = write!(err, "{USAGE}");
                return ExitCode::from(if msg.is_empty() { 0 } else { 2 });
            }
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            progress(&format!("{role}: {e}"));
            ExitCode::FAILURE
        }
    }
}

fn run(options: &Options) -> Result<()> {
    // With the `metrics` feature the locks' metrics go to a real recorder, as in a service
    // that exports them (the exporter's rendering is left out: it runs at scrape time).
    #[cfg(feature = "metrics")]
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| format!("installing the metrics recorder: {e}"))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(scenarios::run_all(options))
}
