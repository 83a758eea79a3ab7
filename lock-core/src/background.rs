//! Detached background work (a release after a drop, a queue clean-up, a watcher): spawned on
//! the current tokio runtime, if there is one. Outside a runtime there is nowhere to run it;
//! the caller decides what to do instead (the lease expiring is always the backstop).

use std::future::Future;

use tokio::task::JoinHandle;

/// Spawns `task` on the current runtime; `None` (and `task` dropped) outside one.
pub(crate) fn spawn<F>(task: F) -> Option<JoinHandle<F::Output>>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handle = tokio::runtime::Handle::try_current().ok()?;
    Some(handle.spawn(task))
}
