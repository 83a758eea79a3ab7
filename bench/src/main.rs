//! lock-bench: measures lock-core against the Redis round trip (the floor) and against the peers
//! (the seed design, `SET NX` + 10 ms sleep polling, and the `rslock` crate), on the same Redis in
//! the same run, and writes a Markdown report plus an SVG of handoff latencies.
//!
//! ```text
//! cargo run --release -p lock-bench --bin lock-bench -- [--quick] [--out BENCHMARKS.md] [--redis-url URL]
//! ```
//!
//! Without `--redis-url` (or `REDIS_URL`) it starts its own `redis-server` on a free loopback
//! port (no persistence, temporary directory, killed at exit). Speed claims live in the report,
//! never in tests: the quick mode only proves the harness still runs.
#![forbid(unsafe_code)]

mod child;
mod clock;
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
usage: lock-bench [--quick] [--out PATH] [--redis-url URL]

  --quick          a few seconds per run, for CI (the figures are not meaningful)
  --out PATH       where to write the Markdown report (default: BENCHMARKS.md at the workspace
                   root); the handoff plot goes next to it as <stem>-handoff.svg
  --redis-url URL  benchmark this Redis instead of starting one (also: REDIS_URL)
";

/// Command-line options of the report binary.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub(crate) quick: bool,
    pub(crate) out: PathBuf,
    pub(crate) redis_url: Option<String>,
}

fn parse_options(args: &[String]) -> std::result::Result<Options, String> {
    let mut quick = false;
    let mut out = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../BENCHMARKS.md"));
    let mut redis_url = std::env::var("REDIS_URL").ok().filter(|u| !u.is_empty());
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--out" => {
                out = PathBuf::from(it.next().ok_or("--out needs a path")?);
            }
            "--redis-url" => {
                redis_url = Some(it.next().ok_or("--redis-url needs a URL")?.clone());
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    Ok(Options {
        quick,
        out,
        redis_url,
    })
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
    if args.first().map(String::as_str) == Some(child::CHILD_FLAG) {
        return match child::main(&args[1..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                progress(&format!("child error: {e}"));
                ExitCode::FAILURE
            }
        };
    }
    let options = match parse_options(&args) {
        Ok(o) => o,
        Err(msg) => {
            let mut err = std::io::stderr().lock();
            if !msg.is_empty() {
                let _ = writeln!(err, "lock-bench: {msg}");
            }
            let _ = write!(err, "{USAGE}");
            return if msg.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(2)
            };
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            progress(&format!("cannot start the tokio runtime: {e}"));
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(scenarios::run_all(&options)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            progress(&format!("error: {e}"));
            ExitCode::FAILURE
        }
    }
}
