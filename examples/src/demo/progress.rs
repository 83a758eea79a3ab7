//! A one-line progress bar on stderr, drawn only when stderr is a terminal.
//!
//! Hand-rolled rather than indicatif: the demo needs one bar, a counter and a label, redrawn
//! ten times a second; that is forty lines with `std::io::IsTerminal`, against five more crates
//! to compile on every CI run. Off a terminal (CI logs, tests) it draws nothing, so captured
//! output holds only the table.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::task::JoinHandle;

const WIDTH: u64 = 30;

#[derive(Debug, Default)]
struct State {
    done: AtomicU64,
    label: Mutex<String>,
}

/// Progress of the demo, counted in buyers and lottery users who are done.
#[derive(Debug, Clone)]
pub(crate) struct Progress {
    state: Arc<State>,
    total: u64,
}

/// The redraw task; [`finish`](Drawing::finish) erases the bar.
#[derive(Debug)]
pub(crate) struct Drawing {
    task: Option<JoinHandle<()>>,
}

impl Progress {
    /// A bar for `total` units; drawn when `enabled` and stderr is a terminal.
    pub(crate) fn start(total: u64, enabled: bool) -> (Progress, Drawing) {
        let progress = Progress {
            state: Arc::default(),
            total: total.max(1),
        };
        let task = (enabled && std::io::stderr().is_terminal()).then(|| {
            let progress = progress.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(100));
                loop {
                    tick.tick().await;
                    progress.draw();
                }
            })
        });
        (progress, Drawing { task })
    }

    /// Names what is running now.
    pub(crate) fn phase(&self, label: impl Into<String>) {
        *self
            .state
            .label
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = label.into();
    }

    /// One more unit done.
    pub(crate) fn tick(&self) {
        self.state.done.fetch_add(1, Ordering::Relaxed);
    }

    fn draw(&self) {
        let done = self.state.done.load(Ordering::Relaxed).min(self.total);
        let filled = done * WIDTH / self.total;
        let label = self
            .state
            .label
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let bar: String = (0..WIDTH)
            .map(|i| if i < filled { '#' } else { '-' })
            .collect();
        // A failed write to stderr only loses a frame of the bar.
        let _ = write!(
            std::io::stderr().lock(),
            "\r\x1b[2K[{bar}] {done:>4}/{} {label}",
            self.total
        );
    }
}

impl Drawing {
    /// Stops redrawing and erases the bar.
    pub(crate) fn finish(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = write!(std::io::stderr().lock(), "\r\x1b[2K");
        }
    }
}

impl Drop for Drawing {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
