//! `lock-admin`: the operators' command-line tool for the locks of lock-core. It lists the held
//! locks, inspects one, watches one change hands, and frees a stuck one, on every backend
//! (one Redis server, Cluster, Sentinel, Redlock, etcd, ZooKeeper), through `Locker::list`,
//! `Locker::inspect` and `Locker::force_unlock` alone. Never a token: what it prints is a
//! lock's key, holder identity, age, lease left, fence and waiters.
//!
//! ```text
//! lock-admin --url redis://ops:secret@10.0.0.1:6379/ list 'order:*'
//! lock-admin --url redis+cluster://10.0.0.1:7000,10.0.0.2:7000 inspect order:42
//! lock-admin --url redis://10.0.0.1/ watch order:42 --json
//! lock-admin --url redis://10.0.0.1/ unlock order:42          # asks [y/N]
//! ```
//!
//! See the guide's "Operating it" chapter (docs/src/operating.md).

#![forbid(unsafe_code)]

mod commands;
mod connect;
mod failure;
mod output;
mod target;

use std::io::Write;
use std::time::Duration;

use clap::{FromArgMatches, Parser, Subcommand};

use crate::failure::{EXIT_CODES, Failure, code};

/// Look at and free the locks of lock-core: list, inspect, watch, unlock.
#[derive(Debug, Parser)]
#[command(name = "lock-admin", version)]
struct Cli {
    /// The backend's URL: redis://host:port, redis+cluster://h1:p1,h2:p2, ... (the schemes
    /// are listed below).
    #[arg(long, env = "LOCK_ADMIN_URL", hide_env_values = true, global = true)]
    url: Option<String>,

    /// The locks' key prefix, as the application's Locker was built with (default "lock:").
    #[arg(long, global = true)]
    prefix: Option<String>,

    /// Print JSON: one object per line (list, watch), durations in milliseconds.
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List the held locks whose keys match PATTERN.
    ///
    /// One a line, printed as they are read, a page at a time (SCAN on the server or every
    /// primary of a cluster, never KEYS): memory stays bounded whatever the number of keys.
    List {
        /// A glob on lock keys as the application names them: `*` any run, `?` one
        /// character, `\` makes the next one literal.
        #[arg(default_value = "*")]
        pattern: String,
    },
    /// Show one lock's state: held, holder, held for, lease left, last fence, waiters.
    Inspect {
        /// The lock's key, as the application names it (without the prefix).
        key: String,
    },
    /// Print a lock's state each time its holder, fence or waiters change.
    ///
    /// The state now first, then each change, until Ctrl-C, --count changes or --for. The
    /// lock is re-inspected every --interval: a holder that comes and goes between two looks
    /// is not seen.
    Watch {
        /// The lock's key.
        key: String,
        /// How often to re-inspect the lock (ms, s, m, h).
        #[arg(long, default_value = "250ms", value_parser = parse_interval)]
        interval: Duration,
        /// Stop after N changes (the state printed first is not one).
        #[arg(long)]
        count: Option<u64>,
        /// Stop after this long (e.g. 30s, 5m).
        #[arg(long = "for", value_parser = parse_duration)]
        for_: Option<Duration>,
    },
    /// Remove a lock whoever holds it, waking its waiters.
    ///
    /// Shows the lock and asks for confirmation first ([y/N] on stdin; --yes does not ask);
    /// after a yes, looks again and refuses if the lock changed hands meanwhile. The oldest
    /// waiter is handed the lock; the evicted holder learns at its next renewal, and its
    /// fenced writes are refused (the next fence is larger). Prints what it removed.
    Unlock {
        /// The lock's key.
        key: String,
        /// Do not ask: remove whatever holds it now.
        #[arg(long)]
        yes: bool,
    },
}

/// The `--help` text after the options: the URL schemes, then the exit codes.
const SCHEMES_HELP: &str = "--url schemes (also LOCK_ADMIN_URL; a password in it is never printed):
  redis://[user:pass@]host:port[/db]   one Redis server (rediss:// TLS, redis+unix:///path)
  redis+cluster://[user:pass@]h1:p1,h2:p2             Redis Cluster (rediss+cluster://)
  redis+sentinel://[user:pass@]h1:p1,h2:p2/MASTER[/db] the primary Sentinel names MASTER;
      user:pass is the primary's, ?sentinel_user=..&sentinel_password=.. the sentinels'
  redlock://[user:pass@]h1:p1,h2:p2,h3:p3[/db]       Redlock (redlock+rediss://)
  etcd://[user:pass@]h1:2379,h2:2379[?namespace=NS]  etcd (etcd+https://)
  zookeeper://[user:pass@]h1:2181,h2:2181[/chroot][?root=/lock-core]   ZooKeeper

A Redis user needs the lock's own ACL rule for the prefix (SCAN, the inspect and
force-unlock scripts): see \"Permissions\" in docs/src/backends/redis.md.";

/// The command line, with the schemes and exit codes after the options in `--help`.
fn command() -> clap::Command {
    use clap::CommandFactory;
    Cli::command().after_help(format!("{SCHEMES_HELP}\n\n{EXIT_CODES}"))
}

/// A watch's interval: a duration of at least 10 ms (a look is a round trip to the backend).
fn parse_interval(text: &str) -> Result<Duration, String> {
    parse_duration(text).and_then(|d| {
        if d < Duration::from_millis(10) {
            Err(format!("{text:?} is below the 10ms allowed"))
        } else {
            Ok(d)
        }
    })
}

/// `250ms`, `2s`, `1.5s`, `5m`, `1h`.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("{text:?} has no unit: write 250ms, 2s, 5m or 1h"))?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("{text:?}: {number:?} is not a number"))?;
    let scale = match unit {
        "ms" => 0.001,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        other => return Err(format!("{text:?}: unknown unit {other:?} (ms, s, m, h)")),
    };
    Duration::try_from_secs_f64(number * scale)
        .ok()
        .filter(|d| *d <= Duration::from_secs(366 * 24 * 3600))
        .ok_or_else(|| format!("{text:?} is out of range"))
}

/// Standard output, buffered; a closed pipe (`lock-admin list | head`) ends the command
/// quietly with success.
pub(crate) struct Out {
    out: std::io::BufWriter<std::io::Stdout>,
    pub(crate) json: bool,
}

impl Out {
    /// Writes one line.
    pub(crate) fn line(&mut self, text: &str) -> Result<(), Failure> {
        writeln!(self.out, "{text}").map_err(|e| write_failure(&e))
    }

    /// Sends what is buffered (after each line of a watch, at the end of a list).
    pub(crate) fn flush(&mut self) -> Result<(), Failure> {
        self.out.flush().map_err(|e| write_failure(&e))
    }
}

/// A closed pipe is the reader having seen enough: exit 0, silently.
fn write_failure(e: &std::io::Error) -> Failure {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        Failure::new(code::OK, "")
    } else {
        Failure::io(e)
    }
}

/// `text` with every character a terminal would not show as itself (controls, escape
/// sequences, line separators, bidirectional overrides) escaped, and cut to 4 KiB: an error
/// may quote what a user typed or a server answered.
fn printable(text: &str) -> String {
    const MAX: usize = 4096;
    let mut out = String::with_capacity(text.len().min(MAX));
    for c in text.chars() {
        if out.len() >= MAX {
            out.push_str(&format!("... ({} bytes)", text.len()));
            break;
        }
        if c.escape_debug().len() > 1 && !matches!(c, '"' | '\'' | '\\') {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    out
}

/// Writes a message for the operator (prompts, summaries, errors) to stderr.
pub(crate) fn note(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{text}");
    let _ = err.flush();
}

fn main() {
    let cli = match Cli::from_arg_matches(&command().get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            note(&format!("lock-admin: cannot start the async runtime: {e}"));
            std::process::exit(i32::from(code::BACKEND));
        }
    };
    let mut out = Out {
        out: std::io::BufWriter::new(std::io::stdout()),
        json: cli.json,
    };
    let result = runtime.block_on(commands::run(cli, &mut out));
    let result = result.and_then(|()| out.flush());
    let code = match result {
        Ok(()) => code::OK,
        Err(failure) => {
            let _ = out.flush();
            if !failure.message.is_empty() {
                note(&format!("lock-admin: {}", printable(&failure.message)));
            }
            failure.code
        }
    };
    // Without waiting for the runtime's background tasks (connections, a pending stdin read).
    std::process::exit(i32::from(code));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_need_a_unit_and_a_sane_size() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_interval("0ms").is_err() && parse_interval("10ms").is_ok());
        for bad in [
            "250",
            "",
            "ms",
            "1.2.3s",
            "5y",
            "-1s",
            "1e400s",
            "99999999h",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn messages_are_printable_and_bounded() {
        assert_eq!(
            printable("a \"b\" \u{1b}[2J\u{202e}c\n"),
            "a \"b\" \\u{1b}[2J\\u{202e}c\\n"
        );
        let long = printable(&"x".repeat(100_000));
        assert!(
            long.len() < 4200 && long.ends_with("(100000 bytes)"),
            "{}",
            long.len()
        );
    }

    #[test]
    fn the_help_lists_every_exit_code_and_scheme() {
        command().debug_assert();
        let mut command = command();
        let help = command.render_long_help().to_string();
        for text in [
            "redis+cluster://",
            "redis+sentinel://",
            "redlock://",
            "etcd://",
            "zookeeper://",
            "  5  not permitted",
        ] {
            assert!(help.contains(text), "{text}: {help}");
        }
    }
}
