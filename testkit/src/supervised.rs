//! A server process the kit started and supervises: killed like a crash, frozen and thawed,
//! and always killed on drop. Shared by every kind of server ([`RedisServer`](crate::RedisServer),
//! [`EtcdCluster`](crate::etcd::EtcdCluster)'s members).

#![allow(
    clippy::panic,
    reason = "a test harness that cannot do its job fails the test using it, loudly and with the cause"
)]

use std::process::{Child, ExitStatus};

use crate::signal::{Signal, send_signal, wait_stopped_blocking};

/// One child process (or none: not started, or killed), and whether it is frozen.
#[derive(Debug, Default)]
pub(crate) struct Supervised {
    child: Option<Child>,
    paused: bool,
}

impl Supervised {
    /// Supervises a freshly spawned process (running, not paused).
    pub(crate) fn set(&mut self, child: Child) {
        self.kill();
        self.child = Some(child);
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Running (a paused process counts as running).
    pub(crate) fn is_running(&self) -> bool {
        self.child.is_some()
    }

    pub(crate) fn is_paused(&self) -> bool {
        self.paused
    }

    /// Running and not paused: it may answer.
    pub(crate) fn is_live(&self) -> bool {
        self.is_running() && !self.paused
    }

    /// SIGKILL, like a crash, and waits for the exit. Does nothing when not running.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGKILL ends a stopped (paused) process too.
            let _ = child.kill();
            let _ = child.wait();
        }
        self.paused = false;
    }

    /// The exit status when the process has exited on its own (it is then no longer running).
    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        self.paused = false;
        Some(status)
    }

    /// SIGSTOP, and waits until every thread has stopped.
    ///
    /// # Panics
    /// When the process is not running (`what` names it) or `kill` fails.
    pub(crate) fn pause(&mut self, what: &str) {
        let pid = self.running_pid(what);
        send_signal(pid, Signal::Stop);
        wait_stopped_blocking(pid);
        self.paused = true;
    }

    /// SIGCONT.
    ///
    /// # Panics
    /// When the process is not running (`what` names it) or `kill` fails.
    pub(crate) fn resume(&mut self, what: &str) {
        send_signal(self.running_pid(what), Signal::Cont);
        self.paused = false;
    }

    fn running_pid(&self, what: &str) -> u32 {
        self.pid()
            .unwrap_or_else(|| panic!("{what} is not running"))
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.kill();
    }
}
