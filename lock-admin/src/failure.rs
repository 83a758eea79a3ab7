//! Why a command failed, said so an operator can act on it, and the exit code it ends with.

use std::error::Error as _;
use std::fmt;

use lock_core::LockError;

/// The exit codes, listed in `--help`.
pub(crate) mod code {
    /// Done.
    pub(crate) const OK: u8 = 0;
    /// The backend failed: unreachable, timed out, or an unexpected answer.
    pub(crate) const BACKEND: u8 = 1;
    /// Bad arguments: options, `--url`, key, pattern or prefix (clap's own errors too).
    pub(crate) const USAGE: u8 = 2;
    /// `unlock` refused: not confirmed, or the lock changed hands since it was shown.
    pub(crate) const REFUSED: u8 = 3;
    /// `unlock` found nothing held: nothing was removed.
    pub(crate) const NOTHING_HELD: u8 = 4;
    /// Not allowed or not possible: the Redis user lacks a permission, or the backend cannot
    /// inspect, list or force unlock (yet).
    pub(crate) const NOT_PERMITTED: u8 = 5;
    /// `unlock` cannot say what it removed: its answer was lost (the lock may or may not have
    /// been removed), or it removed another holding than the one confirmed.
    pub(crate) const UNCERTAIN: u8 = 6;
}

/// The text of `--help` on exit codes.
pub(crate) const EXIT_CODES: &str = "Exit codes:
  0  done (watch: ended by Ctrl-C, --count or --for)
  1  the backend failed: unreachable, timed out, or an unexpected answer
  2  bad arguments: options, --url, key, pattern or prefix
  3  unlock refused: not confirmed, or the lock changed hands since it was shown
  4  unlock found nothing held: nothing was removed
  5  not permitted: the Redis user lacks a permission, or the backend cannot inspect, list
     or force unlock
  6  unlock's outcome is unknown (its answer was lost: the lock may or may not have been
     removed; inspect it), or it removed another holding than the one confirmed";

/// A failed command: what to print, and the exit code.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) code: u8,
    pub(crate) message: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl Failure {
    pub(crate) fn new(code: u8, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
    }

    pub(crate) fn usage(message: impl Into<String>) -> Self {
        Failure::new(code::USAGE, message)
    }

    /// A failed write to stdout or stderr (a closed pipe is not one: see `main`).
    pub(crate) fn io(e: &std::io::Error) -> Self {
        Failure::new(code::BACKEND, format!("cannot write the output: {e}"))
    }

    /// `e`, from `doing` (connect, inspect, list, force unlock) on `backend` (its kind) with the
    /// key prefix `prefix`, said for an operator.
    pub(crate) fn lock(e: &LockError, doing: &str, backend: &str, prefix: &str) -> Self {
        let chain = chain(e);
        // The library's own permission check names what is missing already.
        let checked = matches!(e, LockError::InvalidConfig { what, .. } if what.contains("permission") || what.contains("ACL"));
        if let (false, Some(refusal)) = (checked, noperm(&chain)) {
            return Failure::new(
                code::NOT_PERMITTED,
                permission_message(&refusal, doing, prefix),
            );
        }
        match e {
            LockError::InvalidKey { .. } => Failure::usage(e.to_string()),
            LockError::InvalidConfig { what, .. } => {
                if what.contains("cannot inspect")
                    || what.contains("cannot force")
                    || what.contains("cannot list")
                {
                    Failure::new(
                        code::NOT_PERMITTED,
                        format!(
                            "{backend}: {what}: this version of lock-core has no inspection for this backend yet (lock-admin uses it as soon as it has)"
                        ),
                    )
                } else if checked {
                    Failure::new(
                        code::NOT_PERMITTED,
                        format!("{backend}: {what}. {}", rule_hint(prefix)),
                    )
                } else {
                    Failure::usage(format!("{backend}: {what}"))
                }
            }
            _ => Failure::new(code::BACKEND, format!("{backend}: cannot {doing}: {chain}")),
        }
    }
}

/// Whether `message` tells of a command Redis refused inside a script, without naming it.
pub(crate) fn script_refusal(message: &str) -> bool {
    message.contains("user executing the script can't run")
}

/// `e` and its sources, each once (a source's text is often already in its parent's).
fn chain(e: &LockError) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

/// The Redis refusal in `text` (`NOPERM ...`; redis-rs shows it as `NoPerm: ...`), when
/// there is one.
fn noperm(text: &str) -> Option<String> {
    let at = text.to_ascii_lowercase().find("noperm")?;
    let refusal = text[at..].trim();
    // A pipeline's error ends with its own brackets.
    Some(refusal.trim_end_matches([')', ']']).to_owned())
}

/// What the operator must grant: the permission named in Redis's refusal, and the guide's rule.
fn permission_message(refusal: &str, doing: &str, prefix: &str) -> String {
    let lower = refusal.to_ascii_lowercase();
    let missing = if lower.contains("access a key")
        || lower.contains("keys") && !lower.contains("'keys'")
    {
        format!("access to the lock's keys: grant ~{prefix}*")
    } else if lower.contains("channel") {
        format!("access to the lock's channels: grant &{prefix}*")
    } else if let Some(command) = quoted_command(&lower) {
        let grant = match command.split('|').next().unwrap_or("") {
            "scan" | "get" | "pttl" | "hvals" | "exists" | "llen" | "lrange" | "hget" => "+@read",
            "del" | "lpop" | "set" | "hset" | "hdel" | "rpush" | "lrem" | "incr" | "pexpire" => {
                "+@write"
            }
            "eval" | "evalsha" | "script" => "+@scripting",
            "publish" | "spublish" | "subscribe" | "ssubscribe" => "+@pubsub",
            "hello" | "ping" | "auth" => "+@connection",
            "time" => "+time",
            "cluster" => "+cluster|slots",
            _ => "it",
        };
        format!(
            "the command {} (grant {grant})",
            command.to_ascii_uppercase()
        )
    } else {
        "a permission Redis did not name".to_owned()
    };
    format!(
        "the Redis user cannot {doing} (locks of prefix {prefix:?}): it lacks {missing} ({refusal}). {}",
        rule_hint(prefix)
    )
}

/// What lock-admin needs of a Redis user, and where the guide says it.
pub(crate) fn rule_hint(prefix: &str) -> String {
    format!(
        "lock-admin needs the lock's own ACL rule: ~{prefix}* &{prefix}* +@read +@write +@scripting +@pubsub +@connection +time -@dangerous (SCAN and the inspect script for list, inspect and watch; the force-unlock script for unlock; +cluster|slots on a cluster); see \"Permissions\" in docs/src/backends/redis.md"
    )
}

/// The command named in `'...'` of a refusal (`no permissions to run the 'scan' command`).
fn quoted_command(text: &str) -> Option<&str> {
    let start = text.find('\'')? + 1;
    let len = text[start..].find('\'')?;
    let command = &text[start..start + len];
    (!command.is_empty() && command.len() < 40).then_some(command)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_refusals_name_the_missing_permission() {
        let m = permission_message(
            "NOPERM User ops has no permissions to run the 'scan' command",
            "list",
            "lock:",
        );
        assert!(m.contains("the command SCAN (grant +@read)"), "{m}");
        assert!(m.contains("docs/src/backends/redis.md"), "{m}");
        let m = permission_message("NOPERM No permissions to access a key", "inspect", "shop:");
        assert!(m.contains("grant ~shop:*"), "{m}");
        let m = permission_message(
            "NOPERM User ops has no permissions to run the 'evalsha' command",
            "inspect",
            "lock:",
        );
        assert!(m.contains("EVALSHA (grant +@scripting)"), "{m}");
        let m = permission_message("NOPERM something new", "inspect", "lock:");
        assert!(m.contains("did not name"), "{m}");
        assert_eq!(noperm("x: y"), None);
        assert_eq!(
            noperm("backend failed: NOPERM no").as_deref(),
            Some("NOPERM no")
        );
    }
}
