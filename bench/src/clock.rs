//! A clock that two processes on one machine can compare.
//!
//! `std::time::Instant` is opaque: its readings cannot leave the process. The cross-process
//! handoff needs "A is about to release" and "B's acquire returned" on one time line, so both
//! processes read `CLOCK_MONOTONIC` directly (rustix, no `unsafe`). On Linux that clock is one
//! system-wide counter (the one `Instant` uses), read through the vDSO in ~20-50 ns with 1 ns
//! resolution; NTP can only slew it (at most 500 ppm, i.e. 0.05 µs on a 100 µs handoff), never
//! step it. `CLOCK_REALTIME` (`SystemTime`) has the same resolution but can be stepped mid-run;
//! `quanta` scales the TSC with a per-process calibration, so its readings are not guaranteed to
//! agree between processes. The error of a handoff sample is therefore the two clock reads
//! (< 0.1 µs) plus slew, far below the ~100 µs being measured.

use rustix::time::{ClockId, clock_gettime};

/// Nanoseconds on the machine-wide monotonic clock.
pub(crate) fn shared_now_ns() -> u64 {
    let ts = clock_gettime(ClockId::Monotonic);
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agrees_with_instant() {
        let outer = std::time::Instant::now();
        let a = shared_now_ns();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let b = shared_now_ns();
        let outer = u64::try_from(outer.elapsed().as_nanos()).unwrap();
        // Same clock as `Instant`: the inner span is at least the sleep and never longer than
        // the span measured around it.
        assert!(b - a >= 5_000_000, "{}", b - a);
        assert!(b - a <= outer, "{} > {outer}", b - a);
    }
}
