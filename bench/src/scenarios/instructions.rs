//! Client instructions per uncontended lock + release cycle, counted by callgrind: the same
//! count however busy the machine is, where timings on this shared host vary by ±25 % from run
//! to run.
//!
//! For each design and shape, this binary runs itself in `--cycles` mode (see `cycles.rs`)
//! under `valgrind --tool=callgrind` twice, with N and 3N cycles, against the run's Redis: the
//! difference of the two totals over 2N is the client's instructions per cycle, every thread of
//! the client counted, with start-up, connecting and the warm-up cancelled out. The redis-server
//! is not counted. A current-thread runtime; the shapes are 1 task on 1 key and T tasks on 4 keys
//! each (no two tasks meet on a key: the uncontended path only).
//!
//! The profiles are written to `LOCK_BENCH_CALLGRIND_DIR` when it is set (`bench/callgrind.sh`
//! sets it, to read them with `callgrind_annotate`), else to a temporary directory removed
//! afterwards.

use std::path::{Path, PathBuf};

use super::Plan;
use crate::Result;
use crate::designs::Kind;
use crate::server::Target;

/// The environment variable naming a directory to keep the callgrind profiles in.
const KEEP_DIR: &str = "LOCK_BENCH_CALLGRIND_DIR";

/// One shape's counts: instructions per cycle of ours, the seed design and rslock.
#[derive(Debug, Clone)]
pub(crate) struct Shape {
    pub(crate) tasks: usize,
    pub(crate) keys: usize,
    /// Cycles of the shorter run (the longer one does three times as many).
    pub(crate) cycles: usize,
    /// Ours, seed, rslock, in [`Kind::ALL`]'s order.
    pub(crate) per_cycle: [u64; 3],
}

/// Every shape of the run.
#[derive(Debug, Clone, Default)]
pub(crate) struct Instructions {
    pub(crate) shapes: Vec<Shape>,
}

/// Counts every design in every shape of the plan.
pub(crate) async fn instructions(plan: &Plan, target: &Target) -> Result<Instructions> {
    let valgrind = which("valgrind")
        .ok_or("valgrind is missing (the instruction counts need it): apt-get install valgrind")?;
    let exe = std::env::current_exe()?;
    let (dir, temporary) = match std::env::var_os(KEEP_DIR) {
        Some(d) => (PathBuf::from(d), false),
        None => (
            std::env::temp_dir().join(format!("lock-bench-callgrind-{}", std::process::id())),
            true,
        ),
    };
    std::fs::create_dir_all(&dir)?;
    let mut out = Instructions::default();
    let counted = async {
        for &(tasks, keys, cycles) in &plan.instruction_shapes {
            let mut per_cycle = [0; 3];
            for (i, kind) in Kind::ALL.into_iter().enumerate() {
                crate::progress(&format!(
                    "  {} task(s) x {keys} key(s), {}: {cycles} and {} cycles under callgrind",
                    tasks,
                    kind.name(),
                    3 * cycles
                ));
                let run = |n| Run {
                    valgrind: &valgrind,
                    exe: &exe,
                    dir: &dir,
                    url: &target.url,
                    design: kind.name(),
                    cycles: n,
                    tasks,
                    keys,
                };
                let short = run(cycles).total().await?;
                let long = run(3 * cycles).total().await?;
                let cycles = u64::try_from(2 * cycles)?;
                per_cycle[i] = long.saturating_sub(short) / cycles;
            }
            out.shapes.push(Shape {
                tasks,
                keys,
                cycles,
                per_cycle,
            });
        }
        Ok::<_, crate::BoxError>(())
    }
    .await;
    if temporary {
        let _ = std::fs::remove_dir_all(&dir);
    }
    counted?;
    Ok(out)
}

/// One run of `lock-bench --cycles` under callgrind.
struct Run<'a> {
    valgrind: &'a Path,
    exe: &'a Path,
    dir: &'a Path,
    url: &'a str,
    design: &'a str,
    cycles: usize,
    tasks: usize,
    keys: usize,
}

impl Run<'_> {
    /// The instructions callgrind collected over the whole run.
    async fn total(&self) -> Result<u64> {
        let (design, n, tasks, keys) = (self.design, self.cycles, self.tasks, self.keys);
        let profile = self.dir.join(format!("{design}-{n}-{tasks}x{keys}.out"));
        let ran = tokio::process::Command::new(self.valgrind)
            .arg("--tool=callgrind")
            .arg(format!("--callgrind-out-file={}", profile.display()))
            .arg(self.exe)
            .arg(crate::cycles::CYCLES_FLAG)
            .args([
                design.to_owned(),
                n.to_string(),
                tasks.to_string(),
                keys.to_string(),
            ])
            .env("REDIS_URL", self.url)
            .kill_on_drop(true)
            .output()
            .await?;
        let log = String::from_utf8_lossy(&ran.stderr);
        if !ran.status.success() {
            return Err(format!("{design} under callgrind failed ({}):\n{log}", ran.status).into());
        }
        collected(&log)
            .ok_or_else(|| format!("no `Collected :` line from callgrind:\n{log}").into())
    }
}

/// The total of callgrind's `==pid== Collected : N` line.
fn collected(log: &str) -> Option<u64> {
    log.lines()
        .find_map(|l| l.split_once("Collected :"))
        .and_then(|(_, n)| n.trim().parse().ok())
}

/// `name` on the `PATH`.
fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::collected;

    #[test]
    fn the_total_is_read_from_callgrinds_summary() {
        let log = "==12== Events    : Ir\n==12== Collected : 123456789\n==12==\n==12== I   refs:      123,456,789\n";
        assert_eq!(collected(log), Some(123_456_789));
        assert_eq!(collected("==12== I   refs: 5\n"), None);
    }
}
