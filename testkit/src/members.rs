//! The members of a consensus set (an etcd cluster's, a ZooKeeper ensemble's): numbered from
//! 0, each a supervised process with a log that spans its launches, and the faults every such
//! set offers (kill, pause, resume, a minority left alone).

#![allow(
    clippy::panic,
    reason = "a test harness that cannot do its job fails the test using it, loudly and with the cause"
)]

use std::fs;
use std::ops::{Deref, DerefMut};
use std::path::PathBuf;

use crate::supervised::Supervised;

/// How many of its last lines a failure message shows of a member's log.
const TAIL_LINES: usize = 40;

/// A member's log file, appended to by every launch, and where the current launch starts.
#[derive(Debug)]
pub(crate) struct LaunchLog {
    path: PathBuf,
    start: u64,
}

impl LaunchLog {
    pub(crate) fn new(path: PathBuf) -> Self {
        Self { path, start: 0 }
    }

    /// The file opened for appending, for a new launch's output (which starts here).
    pub(crate) fn open_for_launch(&mut self) -> fs::File {
        let file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", self.path.display()));
        self.start = file.metadata().map_or(0, |m| m.len());
        file
    }

    /// Every launch's output.
    pub(crate) fn read(&self) -> String {
        fs::read_to_string(&self.path).unwrap_or_default()
    }

    /// The current launch's output.
    pub(crate) fn this_launch(&self) -> String {
        let log = self.read();
        log.get(self.start as usize..).unwrap_or(&log).to_owned()
    }

    /// The last lines, for failure messages.
    pub(crate) fn tail(&self) -> String {
        let log = self.read();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n")
    }
}

/// One member of a set: its process, its log, and its name for messages.
pub(crate) trait SetMember {
    fn process(&self) -> &Supervised;
    fn process_mut(&mut self) -> &mut Supervised;
    fn launch_log(&self) -> &LaunchLog;
    /// `etcd member m1 (client 127.0.0.1:1234)`, for messages.
    fn what(&self) -> String;

    /// Panics with its log when it was running and has exited on its own.
    fn check_not_crashed(&mut self) {
        if let Some(status) = self.process_mut().exited() {
            panic!(
                "{} exited on its own ({status}); its log:\n{}",
                self.what(),
                self.launch_log().tail()
            );
        }
    }
}

/// The members of one set, indexable as a slice; `kind` and `set` name them in messages
/// (`etcd` `cluster`, `ZooKeeper` `ensemble`).
#[derive(Debug)]
pub(crate) struct Members<M> {
    kind: &'static str,
    set: &'static str,
    members: Vec<M>,
}

impl<M> Deref for Members<M> {
    type Target = [M];

    fn deref(&self) -> &[M] {
        &self.members
    }
}

impl<M> DerefMut for Members<M> {
    fn deref_mut(&mut self) -> &mut [M] {
        &mut self.members
    }
}

impl<M: SetMember> Members<M> {
    pub(crate) fn new(kind: &'static str, set: &'static str, members: Vec<M>) -> Self {
        Self { kind, set, members }
    }

    /// Member `i`.
    ///
    /// # Panics
    /// When there is no member `i`.
    pub(crate) fn member(&self, i: usize) -> &M {
        self.members.get(i).unwrap_or_else(|| {
            panic!(
                "no {} member {i}: there are {}",
                self.kind,
                self.members.len()
            )
        })
    }

    /// Member `i`, to change.
    ///
    /// # Panics
    /// When there is no member `i`.
    pub(crate) fn member_mut(&mut self, i: usize) -> &mut M {
        self.member(i);
        &mut self.members[i]
    }

    /// A majority of the members.
    pub(crate) fn quorum(&self) -> usize {
        self.members.len() / 2 + 1
    }

    /// How many run and are not paused.
    pub(crate) fn live_count(&self) -> usize {
        self.members
            .iter()
            .filter(|m| m.process().is_live())
            .count()
    }

    /// Panics at once when fewer than a quorum of members are live: the set could never
    /// become healthy, a wait for it would only time out.
    pub(crate) fn assert_quorum_live(&self) {
        let live = self.live_count();
        assert!(
            live >= self.quorum(),
            "the {} {} cannot become healthy: {live} of {} members are live (running, not \
             paused), a quorum is {}",
            self.kind,
            self.set,
            self.members.len(),
            self.quorum()
        );
    }

    /// The members that do not run (killed, or exited), in order.
    pub(crate) fn not_running(&self) -> Vec<usize> {
        (0..self.members.len())
            .filter(|&i| !self.members[i].process().is_running())
            .collect()
    }

    /// SIGKILL to member `i`, waiting for its exit (nothing when it does not run).
    pub(crate) fn kill(&mut self, i: usize) {
        self.member_mut(i).process_mut().kill();
    }

    /// SIGKILL to every member.
    pub(crate) fn kill_all(&mut self) {
        for member in &mut self.members {
            member.process_mut().kill();
        }
    }

    /// SIGKILL to every member but `i`.
    pub(crate) fn kill_all_but(&mut self, i: usize) {
        self.member(i);
        for (j, member) in self.members.iter_mut().enumerate() {
            if j != i {
                member.process_mut().kill();
            }
        }
    }

    /// SIGSTOP to member `i`, waiting until it has stopped.
    pub(crate) fn pause(&mut self, i: usize) {
        let what = self.member(i).what();
        self.member_mut(i).process_mut().pause(&what);
    }

    /// SIGCONT to member `i`.
    pub(crate) fn resume(&mut self, i: usize) {
        let what = self.member(i).what();
        self.member_mut(i).process_mut().resume(&what);
    }
}
