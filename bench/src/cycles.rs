//! A lone client process doing uncontended lock + release cycles and nothing else: `--cycles`
//! does a fixed number (for counting the client's instructions per cycle with callgrind: the
//! `instructions` section runs it twice per design, with two cycle counts, so that start-up and
//! connection set-up cancel out in the difference), `--rate` counts the cycles of a window (for
//! the pinned many-keys rows: the `throughput` section runs it on a core of its own).
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379/ lock-bench --cycles DESIGN CYCLES TASKS KEYS [RUNTIME]
//! REDIS_URL=redis://127.0.0.1:6379/ lock-bench --rate DESIGN TASKS KEYS RUNTIME WARM_MS RUN_MS
//! ```
//!
//! With `--cycles`, TASKS tasks share CYCLES cycles (each does CYCLES / TASKS); with `--rate`
//! they loop until the window ends. Each task is on KEYS keys of its own in turn, so no two tasks
//! meet on a key: the uncontended path only. DESIGN is `ours`, `ours-nowd` (watchdog off),
//! `seed` or `rslock`; RUNTIME `current` (default) or `multi`. Every key is locked once before
//! the counted cycles start (connections made, scripts loaded). `--cycles` prints the cycles
//! done on stdout, `--rate` the cycles per second of the window after WARM_MS.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lock_core::{Locker, RedisBackend};

use crate::Result;
use crate::designs::{Design, Kind};
use crate::server::Target;

/// The hidden first argument that selects the fixed-count mode.
pub(crate) const CYCLES_FLAG: &str = "--cycles";
/// The hidden first argument that selects the window mode.
pub(crate) const RATE_FLAG: &str = "--rate";

/// The lease of every design here: long enough that no lock expires under callgrind's slowdown.
const LEASE: Duration = Duration::from_secs(30);

/// How many cycles to run, or for how long.
#[derive(Clone, Copy)]
enum Amount {
    Cycles(usize),
    /// Warm-up, then the measured window.
    Window(Duration, Duration),
}

/// Entry point of `--cycles` (`rate` false) and `--rate` (`rate` true).
pub(crate) fn main(args: &[String], rate: bool) -> Result<()> {
    let usage = if rate {
        "--rate DESIGN TASKS KEYS RUNTIME WARM_MS RUN_MS"
    } else {
        "--cycles DESIGN CYCLES TASKS KEYS [current|multi]"
    };
    let arg = |i: usize| {
        args.get(i)
            .map(String::as_str)
            .ok_or_else(|| format!("{usage}: missing argument"))
    };
    let number = |i: usize, name: &str| -> Result<usize> {
        Ok(arg(i)?.parse().map_err(|e| format!("{name}: {e}"))?)
    };
    let design = arg(0)?.to_owned();
    let (amount, tasks, keys, runtime) = if rate {
        let ms = |i, name| number(i, name).map(|n| Duration::from_millis(n as u64));
        let window = Amount::Window(ms(4, "WARM_MS")?, ms(5, "RUN_MS")?);
        (
            window,
            number(1, "TASKS")?,
            number(2, "KEYS")?,
            Some(arg(3)?),
        )
    } else {
        let cycles = Amount::Cycles(number(1, "CYCLES")?);
        let runtime = args.get(4).map(String::as_str);
        (cycles, number(2, "TASKS")?, number(3, "KEYS")?, runtime)
    };
    if tasks == 0 || keys == 0 {
        return Err("TASKS and KEYS must be at least 1".into());
    }
    let runtime = match runtime {
        None | Some("current") => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
        Some("multi") => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?,
        Some(other) => return Err(format!("unknown runtime `{other}`").into()),
    };
    let url = std::env::var("REDIS_URL").map_err(|_| format!("{usage}: needs REDIS_URL"))?;
    let said = runtime.block_on(run(&design, &url, amount, tasks, keys))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{said}")?;
    Ok(())
}

/// The cycles done (`Cycles`) or the cycles per second of the window (`Window`).
async fn run(design: &str, url: &str, amount: Amount, tasks: usize, keys: usize) -> Result<f64> {
    let target = Target::open(Some(url))?;
    let design = match design {
        "ours-nowd" => {
            let backend = RedisBackend::connect(&target.url).await?;
            let locker = Locker::builder(backend)
                .lease(LEASE)
                .watchdog(false)
                .try_build()?;
            Design::Ours(locker)
        }
        other => Design::connect(Kind::parse(other)?, &target, LEASE).await?,
    };
    // Warm-up: every key once (connections, scripts, tables), not counted.
    let none = Arc::new(AtomicBool::new(false));
    let loops = |n: usize, stop: &Arc<AtomicBool>, count: &Arc<AtomicU64>| {
        let mut set = tokio::task::JoinSet::new();
        for t in 0..tasks {
            let (design, stop, count) = (design.clone(), stop.clone(), count.clone());
            set.spawn(async move { task(&design, t, keys, n, &stop, &count).await });
        }
        set
    };
    let warm = Arc::new(AtomicU64::new(0));
    let mut set = loops(keys, &none, &warm);
    while let Some(r) = set.join_next().await {
        r??;
    }
    let count = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut set = match amount {
        Amount::Cycles(cycles) => loops(cycles / tasks, &none, &count),
        Amount::Window(..) => loops(usize::MAX, &stop, &count),
    };
    let said = match amount {
        Amount::Cycles(_) => {
            while let Some(r) = set.join_next().await {
                r??;
            }
            count.load(Ordering::Relaxed) as f64
        }
        Amount::Window(warm, window) => {
            tokio::time::sleep(warm).await;
            let (c0, t0) = (count.load(Ordering::Relaxed), Instant::now());
            tokio::time::sleep(window).await;
            let (c1, elapsed) = (count.load(Ordering::Relaxed), t0.elapsed());
            stop.store(true, Ordering::Relaxed);
            while let Some(r) = set.join_next().await {
                r??;
            }
            (c1 - c0) as f64 / elapsed.as_secs_f64()
        }
    };
    Ok(said)
}

/// Up to `n` cycles of task `t` over its `keys` keys in turn, until `stop`; each counted.
async fn task(
    design: &Design,
    t: usize,
    keys: usize,
    n: usize,
    stop: &AtomicBool,
    count: &AtomicU64,
) -> Result<()> {
    let names: Vec<String> = (0..keys).map(|k| format!("cycles:{t}:{k}")).collect();
    for i in 0..n {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let held = design
            .lock(&names[i % keys], Duration::from_secs(5))
            .await?;
        design.release(held).await?;
        count.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}
