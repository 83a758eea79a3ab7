//! What the numbers were measured on.

use std::process::Command;

/// The machine and the conditions of one run.
#[derive(Debug, Clone, Default)]
pub(crate) struct Machine {
    pub(crate) nproc: usize,
    pub(crate) cpu: String,
    pub(crate) kernel: String,
    pub(crate) redis_version: String,
    pub(crate) redis_where: String,
    pub(crate) rustc: String,
    /// `YYYY-MM-DD HH:MM UTC`.
    pub(crate) date: String,
    pub(crate) load_start: String,
    pub(crate) load_end: String,
    /// The source measured: commit and uncommitted changes.
    pub(crate) tree: String,
}

/// The trimmed standard output of a successful command.
fn output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    Some(text.trim().to_owned()).filter(|t| out.status.success() && !t.is_empty())
}

impl Machine {
    pub(crate) fn probe() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == "model name").then(|| v.trim().to_owned())
        });
        let unknown = || "unknown".to_owned();
        Machine {
            nproc: std::thread::available_parallelism().map_or(1, usize::from),
            cpu: cpu.unwrap_or_else(unknown),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| format!("Linux {}", s.trim()))
                .unwrap_or_else(|_| std::env::consts::OS.to_owned()),
            rustc: output("rustc", &["--version"]).unwrap_or_else(unknown),
            date: output("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_else(unknown),
            load_start: load_average(),
            tree: source_tree(),
            ..Machine::default()
        }
    }
}

/// `commit abc1234 + N modified tracked files` of the workspace this binary was built from
/// (read-only git queries).
fn source_tree() -> String {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let Some(commit) = output("git", &["-C", root, "rev-parse", "--short", "HEAD"]) else {
        return "unknown (no git)".to_owned();
    };
    let status = output(
        "git",
        &["-C", root, "status", "--porcelain", "--untracked-files=no"],
    );
    let dirty = status.map_or(0, |s| s.lines().count());
    format!("commit {commit} + {dirty} modified tracked files")
}

/// `/proc/loadavg`'s three load averages.
pub(crate) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}
