//! Free loopback ports, for every process the kit starts.
//!
//! Handed out from a range below the kernel's ephemeral ports (32768 and up on Linux), one
//! after the other, never twice in one process: a port the kit gave a server is not handed to
//! another server of a test running beside it, and the kernel never gives it to a connection's
//! local end. (The kernel's own pick, binding port 0, was both: a member that binds its port
//! late, as a ZooKeeper member binds its quorum port when it becomes the leader, could find it
//! taken by another test's server or by a connection, and exit.) Each process starts at its
//! own place in the range, so test processes running side by side rarely meet; a port found
//! in use is skipped.

#![allow(
    clippy::panic,
    reason = "a test harness that cannot do its job fails the test using it, loudly and with the cause"
)]

use std::net::{Ipv4Addr, TcpListener};
use std::sync::atomic::{AtomicU32, Ordering};

/// The range the kit's ports come from: below Linux's ephemeral range (32768-60999).
const FIRST: u32 = 20_000;
const LAST: u32 = 32_000;

/// The next port to try, as an offset in the range (started from the process id).
static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);

/// A free loopback port, handed out once in this process (see the module docs).
pub(crate) fn free_port() -> u16 {
    let span = LAST - FIRST;
    if NEXT.load(Ordering::Relaxed) == u32::MAX {
        let start = std::process::id().wrapping_mul(7919) % span;
        let _ = NEXT.compare_exchange(u32::MAX, start, Ordering::Relaxed, Ordering::Relaxed);
    }
    for _ in 0..span {
        let offset = NEXT.fetch_add(1, Ordering::Relaxed) % span;
        let Ok(port) = u16::try_from(FIRST + offset) else {
            continue;
        };
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {FIRST}..{LAST}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_below_the_ephemeral_range_and_never_handed_out_twice() {
        let ports: Vec<u16> = (0..200).map(|_| free_port()).collect();
        assert!(
            ports
                .iter()
                .all(|p| (20_000..32_000).contains(&u32::from(*p)))
        );
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len());
    }
}
