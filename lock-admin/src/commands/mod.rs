//! The subcommands, each against a `Locker` alone.

mod unlock;
mod watch;

use crate::connect::Admin;
use crate::failure::{self, Failure};
use crate::target::Target;
use crate::{Cli, Command, Out, note, output};

/// Runs `cli`'s command, printing to `out`.
pub(crate) async fn run(cli: Cli, out: &mut Out) -> Result<(), Failure> {
    let url = cli.url.as_deref().ok_or_else(|| {
        Failure::usage("no backend: give --url (or set LOCK_ADMIN_URL); see --help for the schemes")
    })?;
    let target = Target::parse(url).map_err(|e| Failure::usage(e.0))?;
    let admin = Admin::connect(&target, cli.prefix.as_deref()).await?;
    let context = Context {
        admin,
        kind: target.kind(),
    };
    match cli.command {
        Command::List { pattern } => list(&context, &pattern, out).await,
        Command::Inspect { key } => inspect(&context, &key, out).await,
        Command::Watch {
            key,
            interval,
            count,
            for_,
        } => {
            let stop = watch::Stop { count, after: for_ };
            watch::watch(&context, &key, interval, stop, out).await
        }
        Command::Unlock { key, yes } => unlock::unlock(&context, &key, yes, out).await,
    }
}

/// What every command needs: the locker, and the backend's kind for its messages.
pub(crate) struct Context {
    pub(crate) admin: Admin,
    pub(crate) kind: &'static str,
}

impl Context {
    /// `e` from `doing`, said for an operator. A command refused inside a script is not
    /// named by Redis ("the user executing the script can't run this command"): the
    /// library's permission check (it writes nothing) is run then, to name it.
    pub(crate) async fn failure(&self, e: &lock_core::LockError, doing: &str) -> Failure {
        let failure = Failure::lock(e, doing, self.kind, self.admin.locker.prefix());
        if !failure::script_refusal(&failure.message) {
            return failure;
        }
        let prefix = self.admin.locker.prefix();
        match self.admin.check_write_permissions().await {
            Err(checked @ lock_core::LockError::InvalidConfig { .. }) => {
                Failure::lock(&checked, doing, self.kind, prefix)
            }
            _ => Failure::new(
                failure::code::NOT_PERMITTED,
                format!(
                    "the Redis user cannot {doing} (locks of prefix {prefix:?}): Redis refused a command of the inspect script, which runs GET, PTTL and HVALS (grant +@read on ~{prefix}*) and TIME (grant +time) ({}). {}",
                    failure.message,
                    failure::rule_hint(prefix)
                ),
            ),
        }
    }
}

/// `list [PATTERN]`: the held locks, printed as each page is read.
async fn list(cx: &Context, pattern: &str, out: &mut Out) -> Result<(), Failure> {
    let mut held = cx.admin.locker.list(pattern);
    let mut count: u64 = 0;
    while let Some(state) = held.next().await {
        let state = match state {
            Ok(state) => state,
            Err(e) => return Err(cx.failure(&e, "list").await),
        };
        if out.json {
            out.line(&output::json(&state).to_string())?;
        } else {
            out.line(&output::line(&state))?;
        }
        count += 1;
    }
    out.flush()?;
    if !out.json {
        let s = if count == 1 { "" } else { "s" };
        note(&format!(
            "{count} held lock{s} matching {pattern:?} under prefix {:?}",
            cx.admin.locker.prefix()
        ));
    }
    Ok(())
}

/// `inspect KEY`: one lock's state (free is an answer too).
async fn inspect(cx: &Context, key: &str, out: &mut Out) -> Result<(), Failure> {
    let state = match cx.admin.locker.inspect(key).await {
        Ok(state) => state,
        Err(e) => return Err(cx.failure(&e, "inspect").await),
    };
    if out.json {
        out.line(&output::json(&state).to_string())
    } else {
        out.line(&output::block(&state))
    }
}
