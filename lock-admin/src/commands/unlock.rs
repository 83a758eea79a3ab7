//! `unlock KEY [--yes]`: removes a lock whoever holds it, after the operator saw it and said
//! yes, and only if it is still the holding they saw.

use std::io::IsTerminal;
use std::time::Instant;

use lock_core::{LockError, LockState, Unlocked};
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
    // waiter: check every permission first (writes nothing; the library checks again).
    if let Err(e) = cx.admin.check_write_permissions().await {
        return Err(cx.failure(&e, "unlock").await);
    }
    if yes {
        let removed = match locker.force_unlock(key).await {
            Ok(removed) => removed,
            Err(e) => return Err(removal_failure(cx, &e, key).await),
        };
        return match removed {
            Some(removed) => print_removed(Some(&removed), key, out),
            None => nothing_held(key, out),
        };
    }
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
    // Removed only if it is still the holding shown, in the same atomic step as the removal.
    match locker.force_unlock_seen(&state).await {
        Ok(Unlocked::Removed(removed)) => print_removed(Some(&removed), key, out),
        Ok(Unlocked::NotHeld) => nothing_held(key, out),
        Ok(Unlocked::ChangedHands(now)) => Err(changed_hands(key, &now)),
        Ok(other) => Err(Failure::new(
            code::BACKEND,
            format!(
                "lock {key:?}: an answer this lock-admin does not know ({other:?}); inspect it"
            ),
        )),
        Err(LockError::InvalidConfig { what, .. })
            if what.contains("cannot force an unlock of a holding seen") =>
        {
            compare_then_remove(cx, key, &state, seen_at, out).await
        }
        Err(e) => Err(removal_failure(cx, &e, key).await),
    }
}

/// On a backend that cannot compare and remove in one step: looks again, refuses if the lock
/// changed hands, then removes whoever holds it (a holding that comes in the one round trip
/// between the two is removed, and said so).
async fn compare_then_remove(
    cx: &Context,
    key: &str,
    seen: &LockState,
    seen_at: Instant,
    out: &mut Out,
) -> Result<(), Failure> {
    let locker = &cx.admin.locker;
    let now = match locker.inspect(key).await {
        Ok(state) => state,
        Err(e) => return Err(cx.failure(&e, "inspect").await),
    };
    if !now.held {
        return nothing_held(key, out);
    }
    let before = Seen::of(seen, seen_at);
    if !before.same_holding(&Seen::of(&now, Instant::now())) {
        return Err(changed_hands(key, &now));
    }
    let removed = match locker.force_unlock(key).await {
        Ok(Some(removed)) => removed,
        Ok(None) => return nothing_held(key, out),
        Err(e) => return Err(removal_failure(cx, &e, key).await),
    };
    print_removed(Some(&removed), key, out)?;
    if !before.same_holding(&Seen::of(&removed, Instant::now())) {
        // Removed, but not the holding confirmed: it came in the round trip before the removal.
        return Err(Failure::new(
            code::UNCERTAIN,
            format!(
                "lock {key:?}: the holding removed is not the one confirmed (it took the lock in the instant before the removal): removed {}",
                output::line(&removed)
            ),
        ));
    }
    Ok(())
}

fn changed_hands(key: &str, now: &LockState) -> Failure {
    Failure::new(
        code::REFUSED,
        format!(
            "lock {key:?} changed hands since it was shown: now {}; nothing removed (run unlock again to see it)",
            output::line(now)
        ),
    )
}

/// A failed removal: a refusal before anything was written is said as such; any other
/// failure may have come after the removal (the answer lost, a timeout): the outcome is
/// unknown, and it is never sent again (a second one would remove the next holder).
async fn removal_failure(cx: &Context, e: &LockError, key: &str) -> Failure {
    let failure = cx.failure(e, "force unlock").await;
    if failure.code != code::BACKEND {
        return failure;
    }
    Failure::new(
        code::UNCERTAIN,
        format!(
            "unlock of {key:?}: the outcome is unknown, the lock may or may not have been removed ({}); inspect it: lock-admin inspect {}",
            failure.message,
            output::shell_word(key)
        ),
    )
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
