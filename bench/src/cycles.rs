//! `--cycles`: uncontended lock + release cycles and nothing else, for counting the client's
//! instructions per cycle with callgrind (`bench/callgrind.sh` runs it twice per design, with
//! two cycle counts, so that start-up and connection set-up cancel out in the difference).
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379/ lock-bench --cycles DESIGN CYCLES TASKS KEYS [RUNTIME]
//! ```
//!
//! TASKS tasks share CYCLES cycles (each does CYCLES / TASKS), each on KEYS keys of its own in
//! turn, so no two tasks meet on a key: the uncontended path only. DESIGN is `ours`, `ours-nowd`
//! (watchdog off), `seed` or `rslock`; RUNTIME `current` (default) or `multi`. Every key is
//! locked once before the counted cycles start (connections made, scripts loaded). Prints the
//! cycles done on stdout.

use std::io::Write;
use std::time::Duration;

use lock_core::{Locker, RedisBackend};

use crate::Result;
use crate::designs::{Design, Kind};
use crate::server::Target;

/// The hidden first argument that selects this mode.
pub(crate) const CYCLES_FLAG: &str = "--cycles";

/// The lease of every design here: long enough that no lock expires under callgrind's slowdown.
const LEASE: Duration = Duration::from_secs(30);

/// Entry point of `--cycles`.
pub(crate) fn main(args: &[String]) -> Result<()> {
    let arg = |i: usize| {
        args.get(i)
            .map(String::as_str)
            .ok_or("--cycles DESIGN CYCLES TASKS KEYS [current|multi]: missing argument")
    };
    let design = arg(0)?.to_owned();
    let cycles: usize = arg(1)?.parse().map_err(|e| format!("CYCLES: {e}"))?;
    let tasks: usize = arg(2)?.parse().map_err(|e| format!("TASKS: {e}"))?;
    let keys: usize = arg(3)?.parse().map_err(|e| format!("KEYS: {e}"))?;
    if tasks == 0 || keys == 0 {
        return Err("TASKS and KEYS must be at least 1".into());
    }
    let runtime = match args.get(4).map(String::as_str) {
        None | Some("current") => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
        Some("multi") => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?,
        Some(other) => return Err(format!("unknown runtime `{other}`").into()),
    };
    let url = std::env::var("REDIS_URL").map_err(|_| "--cycles needs REDIS_URL")?;
    let done = runtime.block_on(run(&design, &url, cycles, tasks, keys))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{done}")?;
    Ok(())
}

async fn run(design: &str, url: &str, cycles: usize, tasks: usize, keys: usize) -> Result<usize> {
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
    let per_task = cycles / tasks;
    // Warm-up: every key once (connections, scripts, tables), not counted.
    let mut set = tokio::task::JoinSet::new();
    for t in 0..tasks {
        let design = design.clone();
        set.spawn(async move { task(&design, t, keys, keys).await });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    let mut set = tokio::task::JoinSet::new();
    for t in 0..tasks {
        let design = design.clone();
        set.spawn(async move { task(&design, t, keys, per_task).await });
    }
    let mut done = 0;
    while let Some(r) = set.join_next().await {
        done += r??;
    }
    Ok(done)
}

/// `n` cycles of task `t` over its `keys` keys in turn.
async fn task(design: &Design, t: usize, keys: usize, n: usize) -> Result<usize> {
    let names: Vec<String> = (0..keys).map(|k| format!("cycles:{t}:{k}")).collect();
    for i in 0..n {
        let held = design
            .lock(&names[i % keys], Duration::from_secs(5))
            .await?;
        design.release(held).await?;
    }
    Ok(n)
}
