//! Servers outliving the test process: a process-wide ensemble in a `static` is never dropped,
//! and a test process killed by SIGKILL drops nothing. A watchdog `sh`, started once per test
//! process, learns each such server's pid on a pipe; when the pipe closes (the test process
//! has ended, however it ended), it SIGKILLs every one still running. A pid is killed only
//! while its command line still holds the marker it was registered with (a path unique to
//! this test process), so a pid reused by another process is left alone.

use std::io::Write;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock, PoisonError};

/// Reads `pid marker` lines until EOF, then kills each pid whose command line holds its
/// marker. Ignores the signals a terminal sends the whole process group, so that it still
/// reaps after a Ctrl-C.
const SCRIPT: &str = r#"trap '' INT TERM HUP
while read -r pid marker; do set -- "$@" "$pid" "$marker"; done
while [ "$#" -ge 2 ]; do
  if grep -qaF -- "$2" "/proc/$1/cmdline" 2>/dev/null; then kill -9 "$1" 2>/dev/null; fi
  shift 2
done"#;

/// The watchdog's stdin, once it runs (`None`: it could not start; servers are then only
/// killed on drop, as before).
fn watchdog() -> &'static Option<Mutex<ChildStdin>> {
    static WATCHDOG: OnceLock<Option<Mutex<ChildStdin>>> = OnceLock::new();
    WATCHDOG.get_or_init(|| {
        let child = Command::new("sh")
            .args(["-c", SCRIPT])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        // The child is not waited for: it ends after this process, reparented.
        child.stdin.map(Mutex::new)
    })
}

/// Has the watchdog kill `pid` when this process ends, if its command line then still holds
/// `marker` (one line).
pub(crate) fn kill_at_exit(pid: u32, marker: &str) {
    if let Some(stdin) = watchdog() {
        let mut stdin = stdin.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = writeln!(stdin, "{pid} {marker}");
        let _ = stdin.flush();
    }
}
