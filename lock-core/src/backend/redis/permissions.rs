//! The permission check: before the first lock of a key prefix, a script that writes nothing
//! makes sure the Redis user may run every command the lock runs on that prefix's keys and
//! channels; a success is remembered per prefix.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::{Script, Value};
use tokio::sync::OnceCell;
use tokio::time::Instant;

use super::{RedisBackend, retriable};
use crate::LockError;
use crate::key::{LockKey, display_key, validate_prefix};
use crate::sync::Mutex;

static PROBE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("scripts/probe.lua")));

/// The operators' reads' check (inspect.lua and SCAN), run after a refusal to name it.
static PROBE_INSPECT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/probe_inspect.lua")));

/// The lock name the permission check stands in for a lock of a prefix (it writes nothing).
const PROBE_NAME: &str = "__lock_probe__";

/// Where a missing permission is explained.
pub(super) const ACL_HINT: &str = "see \"Permissions\" in the guide's Redis chapter (docs/src/backends/redis.md) for the ACL rule";

pub(super) fn is_noperm(e: &redis::RedisError) -> bool {
    e.code() == Some("NOPERM")
}

/// Whether `e` is Redis refusing a permission: `NOPERM`, or a command or key refused inside a
/// script (Redis names neither then: "The user executing the script can't run this command").
pub(super) fn is_refusal(e: &redis::RedisError) -> bool {
    is_noperm(e)
        || e.to_string()
            .contains("The user executing the script can't")
}

/// The permission check's refusal `e` (see [`RedisBackend::check_permissions`]) with what
/// the refused operation left: its `outcome` ("nothing was locked", "nothing was removed");
/// any other error as it is.
pub(super) fn for_operation(e: LockError, outcome: &str) -> LockError {
    match e {
        LockError::InvalidConfig { what } if what.ends_with(ACL_HINT) => {
            let head = what[..what.len() - ACL_HINT.len()].trim_end_matches([':', ' ']);
            LockError::config(format!("{head}; {outcome}: {ACL_HINT}"))
        }
        other => other,
    }
}

impl RedisBackend {
    /// Checks that the Redis user may run everything the lock runs on the keys and channels of
    /// `prefix` (keys `<prefix>*`, channels `<prefix>*`, the commands of the guide's ACL rule),
    /// without writing anything. The backend does it by itself before the first acquire of each
    /// prefix, and [`Locker::redis`](crate::Locker::redis) at connect for the default prefix;
    /// call it at start-up to learn of a missing permission before the first lock. A success is
    /// remembered per prefix.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] naming the refused commands, keys or channels (and for a
    /// prefix with braces or too long), [`LockError::Backend`] when Redis cannot be reached.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let backend = lock_core::RedisBackend::connect("redis://shop:secret@127.0.0.1:6379/").await?;
    /// backend.check_permissions("shop:").await?; // ACL: ~shop:* &shop:* ...
    /// let locker = lock_core::Locker::builder(backend).prefix("shop:").build();
    /// # drop(locker); Ok(()) }
    /// ```
    pub async fn check_permissions(&self, prefix: &str) -> Result<(), LockError> {
        validate_prefix(prefix)?;
        self.check_prefix(prefix).await
    }

    /// Runs the permission check of the key's prefix unless it passed already (one map lookup
    /// then).
    pub(super) async fn check_permissions_of(&self, key: &LockKey) -> Result<(), LockError> {
        // A prefix holds no brace: the lock name's first `{` opens the hash tag.
        let name = key.name();
        let prefix = name.split_once('{').map_or(name, |(prefix, _)| prefix);
        self.check_prefix(prefix).await
    }

    /// One check at a time per prefix. A check that failed answers the callers that queued
    /// behind it with its error for a moment ([`RECENT_FAILURE`]) instead of each running the
    /// check again in turn (against a stalled server, the last of N would wait N timeouts).
    async fn check_prefix(&self, prefix: &str) -> Result<(), LockError> {
        // The hot path (every acquire): the first prefix that passed, compared without a lock.
        if self
            .inner
            .permissions
            .first_passed
            .get()
            .map(String::as_str)
            == Some(prefix)
        {
            return Ok(());
        }
        let entry = self.inner.permissions.entry(prefix);
        if entry.passed.initialized() {
            return Ok(());
        }
        entry
            .passed
            .get_or_try_init(|| async {
                if let Some(error) = entry.recent_failure() {
                    return Err(error);
                }
                // Boxed: run once per prefix, its state would otherwise size every acquire's
                // future.
                Box::pin(self.probe(prefix)).await.inspect_err(|e| {
                    *entry.failed.lock() = Some((Instant::now(), e.clone()));
                })
            })
            .await?;
        let _ = self.inner.permissions.first_passed.set(prefix.to_owned());
        Ok(())
    }

    async fn probe(&self, prefix: &str) -> Result<(), LockError> {
        let key = LockKey::new(prefix, PROBE_NAME)?;
        let channel = key.channel();
        let mut call = PROBE.prepare_invoke();
        call.key(key.name())
            .key(key.fence())
            .key(key.queue())
            .key(key.waiters())
            .key(key.result())
            .arg(&channel)
            .arg(if self.inner.sharded { "1" } else { "0" });
        let mut conn = self.inner.conn.clone();
        let answer = match call.invoke_async::<Value>(&mut conn).await {
            Err(e) if retriable(&e) => call.invoke_async::<Value>(&mut conn).await,
            answer => answer,
        };
        let shown = display_key(prefix);
        let refused = match answer {
            Ok(Value::Array(items)) => items,
            Ok(other) => {
                return Err(LockError::protocol(
                    "check permissions",
                    None,
                    format!("the permission check answered {other:?}"),
                ));
            }
            Err(e) if is_noperm(&e) => {
                return Err(LockError::config(format!(
                    "the Redis user may not run the lock's scripts on the keys of prefix {shown:?} ({e}); it needs keys ~{shown}*, channels &{shown}* and +@scripting: {ACL_HINT}"
                )));
            }
            Err(e) => return Err(LockError::backend("check permissions", None, e)),
        };
        if refused.is_empty() {
            return Ok(());
        }
        Err(LockError::config(format!(
            "the Redis user lacks permissions the lock needs for prefix {shown:?}: {}: {ACL_HINT}",
            describe(&refused, &shown, "+@read +@write")
        )))
    }
}

/// The refusals a permission check answered (`<kind> <COMMAND> <name>`), said once per kind,
/// commands and names each listed once; keys are granted by `~<prefix>*` and `key_grant`.
fn describe(refused: &[Value], shown: &str, key_grant: &str) -> String {
    // Each refusal is `<kind> <COMMAND> <name>`; told once per kind, commands and names
    // each listed once.
    let mut kinds: [(&str, Vec<String>, Vec<String>); 3] = [
        ("key", Vec::new(), Vec::new()),
        ("channel", Vec::new(), Vec::new()),
        ("command", Vec::new(), Vec::new()),
    ];
    for item in refused {
        let text = match item {
            Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            Value::SimpleString(s) => s.clone(),
            other => format!("{other:?}"),
        };
        let mut parts = text.splitn(3, ' ');
        let (kind, command, name) = (parts.next(), parts.next(), parts.next());
        let Some((_, commands, names)) = kinds.iter_mut().find(|(k, ..)| Some(*k) == kind) else {
            let (_, commands, _) = &mut kinds[2];
            commands.push(display_key(&text));
            continue;
        };
        for (list, value) in [(commands, command), (names, name.filter(|n| *n != "-"))] {
            if let Some(value) = value.map(display_key)
                && !list.contains(&value)
            {
                list.push(value);
            }
        }
    }
    kinds
        .iter()
        .filter(|(_, commands, _)| !commands.is_empty())
        .map(|(kind, commands, names)| match *kind {
            "key" => format!(
                "{} on keys {} (grant ~{shown}* and {key_grant})",
                commands.join(", "),
                names.join(", ")
            ),
            "channel" => format!(
                "{} on channel {} (grant &{shown}* and +@pubsub)",
                commands.join(", "),
                names.join(", ")
            ),
            _ if commands.len() == 1 => format!("the command {}", commands[0]),
            _ => format!("the commands {}", commands.join(", ")),
        })
        .collect::<Vec<String>>()
        .join("; ")
}

impl RedisBackend {
    /// After Redis refused the operators' read `doing` ("inspect", "list") of the locks of
    /// `prefix` with `refused`: the reads' permission check (probe_inspect.lua, which writes
    /// nothing) names what is missing, as a [`LockError::InvalidConfig`] pointing to the
    /// guide's ACL rule. Reads refused half-way leave nothing half done: they are not checked
    /// before, only explained after.
    pub(super) async fn explain_refusal(
        &self,
        prefix: &str,
        doing: &'static str,
        refused: &redis::RedisError,
    ) -> LockError {
        let shown = display_key(prefix);
        let probe_key = match LockKey::new(prefix, PROBE_NAME) {
            Ok(k) => k,
            Err(e) => return e,
        };
        let mut call = PROBE_INSPECT.prepare_invoke();
        call.key(probe_key.name())
            .key(probe_key.fence())
            .key(probe_key.waiters())
            .arg(if doing == "list" { "1" } else { "0" });
        let mut conn = self.inner.conn.clone();
        let missing = match call.invoke_async::<Value>(&mut conn).await {
            Ok(Value::Array(items)) if !items.is_empty() => describe(&items, &shown, "+@read"),
            Err(e) if is_refusal(&e) => format!(
                "the commands EVALSHA, SCRIPT LOAD (grant +@scripting; {})",
                display_key(&e.to_string())
            ),
            // Nothing more to name: Redis's own words.
            _ => format!(
                "a permission Redis names so: {}",
                display_key(&refused.to_string())
            ),
        };
        LockError::config(format!(
            "the Redis user may not {doing} the locks of prefix {shown:?}: it lacks {missing}; nothing was read: {ACL_HINT}"
        ))
    }
}

/// How long a failed permission check answers for the callers queued behind it.
const RECENT_FAILURE: Duration = Duration::from_secs(1);

/// The permission checks, one entry per prefix: concurrent first locks of a prefix wait for
/// one check; a success is kept, a failure only for [`RECENT_FAILURE`].
#[derive(Default)]
pub(super) struct Permissions {
    checked: Mutex<HashMap<String, Arc<PrefixCheck>>>,
    /// The first prefix whose check passed (most backends serve one prefix): its acquires skip
    /// the map and its lock.
    first_passed: std::sync::OnceLock<String>,
}

#[derive(Default)]
struct PrefixCheck {
    passed: OnceCell<()>,
    failed: Mutex<Option<(Instant, LockError)>>,
}

impl PrefixCheck {
    fn recent_failure(&self) -> Option<LockError> {
        self.failed
            .lock()
            .as_ref()
            .filter(|(at, _)| at.elapsed() < RECENT_FAILURE)
            .map(|(_, e)| e.clone())
    }
}

impl Permissions {
    fn entry(&self, prefix: &str) -> Arc<PrefixCheck> {
        let mut checked = self.checked.lock();
        if let Some(entry) = checked.get(prefix) {
            return entry.clone();
        }
        checked.entry(prefix.to_owned()).or_default().clone()
    }
}

#[cfg(test)]
mod tests {
    /// Every command the lock's scripts run is in the permission check: a command added to a
    /// script without it would be refused half-way through that script for a restricted user.
    #[test]
    fn the_permission_check_covers_every_command_the_scripts_run() {
        let probe = include_str!("scripts/probe.lua");
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/backend/redis/scripts");
        let mut scripts = 0;
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{dir}: {e}")) {
            let path = entry.unwrap_or_else(|e| panic!("{dir}: {e}")).path();
            // inspect.lua is the operators' (`Locker::inspect`, `list`), never run by a lock:
            // probe_inspect.lua names what a refused one lacks (below).
            if path.extension().is_none_or(|e| e != "lua")
                || path.ends_with("probe.lua")
                || path.ends_with("probe_inspect.lua")
                || path.ends_with("inspect.lua")
            {
                continue;
            }
            scripts += 1;
            assert_checked(&path, probe, "probe.lua");
        }
        assert!(scripts >= 5, "read {scripts} scripts from {dir}");
        let inspect = assert_checked(
            std::path::Path::new(&format!("{dir}/inspect.lua")),
            include_str!("scripts/probe_inspect.lua"),
            "probe_inspect.lua",
        );
        assert!(inspect >= 4, "inspect.lua runs {inspect} commands");
    }

    /// Every command the script at `path` runs is named in `probe`; how many calls it makes.
    fn assert_checked(path: &std::path::Path, probe: &str, probe_name: &str) -> usize {
        let text =
            std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut commands = 0;
        for call in ["redis.call(", "redis.pcall("] {
            for rest in text.split(call).skip(1) {
                let rest = rest.trim_start();
                let Some(quote) = rest.chars().next().filter(|c| *c == '\'' || *c == '"') else {
                    panic!(
                        "{}: a command name that is not a literal ({}...): keep the permission check complete by hand",
                        path.display(),
                        &rest[..rest.len().min(30)]
                    );
                };
                let name: String = rest[1..].chars().take_while(|c| *c != quote).collect();
                let name = name.to_ascii_uppercase();
                let listed = ["'", "\""]
                    .iter()
                    .any(|q| probe.contains(&format!("{q}{name}{q}")));
                assert!(
                    listed,
                    "{} runs {name}, which scripts/{probe_name} does not check",
                    path.display()
                );
                commands += 1;
            }
        }
        commands
    }
}
