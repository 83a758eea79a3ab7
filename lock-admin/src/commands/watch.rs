//! `watch KEY`: the lock's state each time its holder, fence or waiters change.
//!
//! The lock is re-inspected every `--interval` (no backend offers a notification of another
//! holder's acquire that a tool could subscribe to without taking part in the lock). Two
//! looks show the same holding when the holder, the fence and the instant it took the lock
//! agree. That instant is the one the backend recorded ([`lock_core::LockState::since`], on
//! Redis) when it has one, compared exactly; otherwise it is read as "now less `held_for`",
//! which wobbles by the round trip: a holder that takes the lock again within [`SAME_SINCE`]
//! of its previous acquire, unfenced, is then taken for the same holding.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lock_core::LockState;

use super::Context;
use crate::failure::{Failure, code};
use crate::{Out, note, output};

/// How far apart two readings of "when the holder took it" may be and still be one holding.
pub(super) const SAME_SINCE: Duration = Duration::from_millis(100);

/// When a watch ends (besides Ctrl-C).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stop {
    /// After this many changes.
    pub(crate) count: Option<u64>,
    /// After this long.
    pub(crate) after: Option<Duration>,
}

/// What a watch compares between two looks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Seen {
    held: bool,
    holder: Option<String>,
    fence: Option<u64>,
    waiters: usize,
    /// When the holder took it, on this process's monotonic clock (read from `held_for`).
    since: Option<Instant>,
    /// When the holder took it, as the backend recorded it: the same at every look at one
    /// holding (`None` where the backend does not record it).
    stamp: Option<std::time::SystemTime>,
}

impl Seen {
    /// `state`, read at `at`.
    pub(super) fn of(state: &LockState, at: Instant) -> Seen {
        Seen {
            held: state.held,
            holder: state.holder.clone(),
            fence: state.fence,
            waiters: state.waiters,
            since: state.held_for.and_then(|d| at.checked_sub(d)),
            stamp: state.since,
        }
    }

    /// Whether `self` and `other` show one holding by one holder (waiters aside).
    pub(super) fn same_holding(&self, other: &Seen) -> bool {
        self.held == other.held
            && self.holder == other.holder
            && self.fence == other.fence
            && match (self.stamp, other.stamp, self.since, other.since) {
                // The recorded instant: exact.
                (Some(a), Some(b), ..) => a == b,
                (_, _, Some(a), Some(b)) => a.max(b) - a.min(b) <= SAME_SINCE,
                (_, _, a, b) => a.is_none() && b.is_none(),
            }
    }

    /// Whether a watch prints `other` after `self`.
    fn changed(&self, other: &Seen) -> bool {
        !self.same_holding(other) || self.waiters != other.waiters
    }
}

/// Watches `key` until Ctrl-C or `stop`.
pub(super) async fn watch(
    cx: &Context,
    key: &str,
    interval: Duration,
    stop: Stop,
    out: &mut Out,
) -> Result<(), Failure> {
    let deadline = stop.after.map(|d| tokio::time::Instant::now() + d);
    let until_deadline = async {
        match deadline {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    let interrupted = async {
        // Without a handler (none can be installed), only --count and --for end the watch.
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        result = changes(cx, key, interval, stop.count, out) => result,
        () = until_deadline => Ok(()),
        () = interrupted => Ok(()),
    }
}

/// The loop of looks; returns after `count` changes, or on an error that looking again
/// cannot mend (a permission, a bad key).
async fn changes(
    cx: &Context,
    key: &str,
    interval: Duration,
    count: Option<u64>,
    out: &mut Out,
) -> Result<(), Failure> {
    let mut last: Option<Seen> = None;
    let mut changes = 0;
    let mut failing = false;
    loop {
        match cx.admin.locker.inspect(key).await {
            Ok(state) => {
                if failing {
                    note("lock-admin: the backend answers again");
                    failing = false;
                }
                let seen = Seen::of(&state, Instant::now());
                if last.as_ref().is_none_or(|l| l.changed(&seen)) {
                    print(&state, out)?;
                    if last.is_some() {
                        changes += 1;
                    }
                    last = Some(seen);
                    if count.is_some_and(|n| changes >= n) {
                        return Ok(());
                    }
                }
            }
            Err(e) => {
                let failure = cx.failure(&e, "inspect").await;
                if failure.code != code::BACKEND {
                    return Err(failure);
                }
                // The backend may come back: say so once, and keep looking.
                if !failing {
                    note(&format!("lock-admin: {failure} (still watching)"));
                    failing = true;
                }
            }
        }
        tokio::time::sleep(interval).await;
    }
}

fn print(state: &LockState, out: &mut Out) -> Result<(), Failure> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    if out.json {
        let mut object = output::json(state);
        object["at_ms"] = output::millis(now).into();
        out.line(&object.to_string())?;
    } else {
        out.line(&format!("{}  {}", clock(now), output::line(state)))?;
    }
    out.flush()
}

/// `HH:MM:SS.mmm` UTC of a time since 1970.
fn clock(since_epoch: Duration) -> String {
    let ms = output::millis(since_epoch);
    let s = ms / 1000;
    format!(
        "{:02}:{:02}:{:02}.{:03}Z",
        (s / 3600) % 24,
        (s / 60) % 60,
        s % 60,
        ms % 1000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(holder: &str, held_for_ms: u64, fence: Option<u64>, waiters: usize) -> LockState {
        let mut s = LockState::free("k");
        s.held = true;
        s.holder = Some(holder.to_owned());
        s.held_for = Some(Duration::from_millis(held_for_ms));
        s.remaining = Some(Duration::from_secs(10));
        s.fence = fence;
        s.waiters = waiters;
        s
    }

    #[test]
    fn a_change_of_holder_fence_waiters_or_holding_is_seen_not_the_clock() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_millis(1000);
        let first = Seen::of(&held("a", 5_000, Some(3), 0), t0);
        // The same holding a second later, its lease renewed.
        assert!(!first.changed(&Seen::of(&held("a", 6_010, Some(3), 0), t1)));
        // A waiter came.
        assert!(first.changed(&Seen::of(&held("a", 6_000, Some(3), 1), t1)));
        // Another holder, another fence, a new holding by the same holder, released.
        assert!(first.changed(&Seen::of(&held("b", 6_000, Some(3), 0), t1)));
        assert!(first.changed(&Seen::of(&held("a", 6_000, Some(4), 0), t1)));
        assert!(first.changed(&Seen::of(&held("a", 300, Some(3), 0), t1)));
        assert!(first.changed(&Seen::of(&LockState::free("k"), t1)));
        assert!(!first.same_holding(&Seen::of(&held("a", 300, Some(3), 0), t1)));
    }

    /// Where the backend records when a holding began, a new acquire by the same holder (same
    /// name, same fence: unfenced) is a change however soon it comes, and the same holding
    /// read with a wobbling `held_for` is not.
    #[test]
    fn a_recorded_since_tells_a_new_holding_by_the_same_holder() {
        let t0 = Instant::now();
        let stamped = |held_for_ms: u64, since_ms: u64| {
            let mut s = held("a", held_for_ms, None, 0);
            s.since = Some(UNIX_EPOCH + Duration::from_millis(since_ms));
            s
        };
        let first = Seen::of(&stamped(5_000, 1_000_000), t0);
        // Re-taken 1 ms later by the same holder: within SAME_SINCE, still a change.
        assert!(first.changed(&Seen::of(&stamped(4_999, 1_000_001), t0)));
        // The same holding, its held_for read 300 ms off (a slow round trip): no change.
        assert!(!first.changed(&Seen::of(&stamped(5_300, 1_000_000), t0)));
    }

    #[test]
    fn clock_reads_utc() {
        assert_eq!(
            clock(Duration::from_millis(86_400_000 + 3_723_045)),
            "01:02:03.045Z"
        );
    }
}
