//! `unlock KEY [--yes]`: removes a lock whoever holds it, after the operator saw it and said
//! yes, and only if it is still the holding they saw.

use std::io::IsTerminal;
use std::time::Instant;

use lock_core::LockState;
use tokio::io::{AsyncBufReadExt, AsyncReadExt};

use super::Context;
use super::watch::Seen;
use crate::failure::{Failure, code};
use crate::{Out, note, output};

/// Unlocks `key`: asks first unless `yes`.
pub(super) async fn unlock(
    cx: &Context,
    key: &str,
    yes: bool,
    out: &mut Out,
) -> Result<(), Failure> {
    let locker = &cx.admin.locker;
    // A Redis user that could run part of the script only would delete the lock and wake no
    // waiter: check every permission first (writes nothing).
    if let Err(e) = cx.admin.check_write_permissions().await {
        return Err(cx.failure(&e, "unlock").await);
    }
    let confirmed = if yes {
        None
    } else {
        let state = match locker.inspect(key).await {
            Ok(state) => state,
            Err(e) => return Err(cx.failure(&e, "inspect").await),
        };
        let seen_at = Instant::now();
        if !state.held {
            return nothing_held(key, out);
        }
        note(&format!("{}\n", output::block(&state)));
        confirm(key).await?;
        let now = match locker.inspect(key).await {
            Ok(state) => state,
            Err(e) => return Err(cx.failure(&e, "inspect").await),
        };
        if !now.held {
            return nothing_held(key, out);
        }
        let (before, after) = (Seen::of(&state, seen_at), Seen::of(&now, Instant::now()));
        if !before.same_holding(&after) {
            return Err(Failure::new(
                code::REFUSED,
                format!(
                    "lock {key:?} changed hands since it was shown: now {}; nothing removed (run unlock again to see it)",
                    output::line(&now)
                ),
            ));
        }
        Some(state)
    };
    let removed = match locker.force_unlock(key).await {
        Ok(removed) => removed,
        Err(e) => return Err(cx.failure(&e, "force unlock").await),
    };
    let Some(removed) = removed else {
        return nothing_held(key, out);
    };
    if let Some(seen) = &confirmed
        && seen.holder != removed.holder
    {
        // The holder changed in the round trip between the last look and the removal.
        note(&format!(
            "lock-admin: warning: the holder removed ({:?}) is not the one confirmed ({:?}): it took the lock in the instant before the removal",
            removed.holder, seen.holder
        ));
    }
    print_removed(Some(&removed), key, out)
}

/// Asks on stderr, reads the answer on stdin: `y` or `yes` goes on; anything else, the end of
/// stdin or Ctrl-C refuses.
async fn confirm(key: &str) -> Result<(), Failure> {
    let mut err = std::io::stderr();
    {
        use std::io::Write;
        let _ = write!(
            err,
            "Remove lock {key:?}? Its holder loses it at its next renewal, the waiters are woken. [y/N] "
        );
        let _ = err.flush();
    }
    let mut answer = String::new();
    let read = async {
        let mut stdin = tokio::io::BufReader::new(tokio::io::stdin().take(1024));
        stdin.read_line(&mut answer).await
    };
    let read = tokio::select! {
        read = read => read,
        _ = tokio::signal::ctrl_c() => {
            note("");
            return Err(Failure::new(code::REFUSED, "interrupted: nothing removed"));
        }
    };
    match read {
        Ok(0) => {
            let why = if std::io::stdin().is_terminal() {
                "no answer"
            } else {
                "no answer (stdin is not a terminal and gave none)"
            };
            note("");
            Err(Failure::new(
                code::REFUSED,
                format!("{why}: nothing removed; answer y, or pass --yes to unlock without asking"),
            ))
        }
        Ok(_) => match answer.trim().to_ascii_lowercase().as_str() {
            "y" | "yes" => Ok(()),
            _ => Err(Failure::new(
                code::REFUSED,
                "not confirmed: nothing removed",
            )),
        },
        Err(e) => Err(Failure::new(
            code::REFUSED,
            format!("cannot read the answer ({e}): nothing removed"),
        )),
    }
}

fn nothing_held(key: &str, out: &mut Out) -> Result<(), Failure> {
    print_removed(None, key, out)?;
    Err(Failure::new(
        code::NOTHING_HELD,
        format!("lock {key:?} is not held: nothing removed"),
    ))
}

fn print_removed(removed: Option<&LockState>, key: &str, out: &mut Out) -> Result<(), Failure> {
    if out.json {
        let object = serde_json::json!({
            "key": key,
            "removed": removed.map(output::json),
        });
        out.line(&object.to_string())
    } else if let Some(removed) = removed {
        out.line(&format!("removed: {}", output::line(removed)))
    } else {
        Ok(())
    }
}
