//! Forks after taking a lock, then parent and child each try to take one same lock on Redis
//! (`tests/tests/fork.rs`). Owner tokens drawn from a userspace generator whose state `fork`
//! copied would be the same in both, and the second `try_lock` would find "its own" token in
//! the key and report the lock acquired: two holders.
//!
//! ```text
//! lock-fork-probe <redis-url> <key>   ->  one line per process: HELD <role> | BUSY <role> | ERROR <role> <error>
//! ```
//! The parent waits for the child and exits 0; a process exits without releasing (the lease
//! ends the locks), so the other process's attempt always finds the winner's lock in place.

#![allow(clippy::print_stdout, reason = "the probe answers on stdout")]

use std::time::Duration;

use lock_core::{LockError, Locker};

fn runtime() -> tokio::runtime::Runtime {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            println!("ERROR runtime {e}");
            std::process::exit(2);
        }
    }
}

/// One attempt on the shared key; prints the outcome.
fn attempt(url: &str, key: &str, role: &str) {
    let outcome = runtime().block_on(async {
        let locker = Locker::redis(url).await?;
        let guard = locker
            .lock(key)
            .lease(Duration::from_secs(30))
            .watchdog(false)
            .no_wait()
            .await?;
        // Held past this process's exit: the lease frees it.
        std::mem::forget(guard);
        Ok::<(), LockError>(())
    });
    match outcome {
        Ok(()) => println!("HELD {role}"),
        Err(LockError::Busy { .. }) => println!("BUSY {role}"),
        Err(e) => println!("ERROR {role} {e}"),
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(url), Some(key)) = (args.next(), args.next()) else {
        println!("ERROR usage lock-fork-probe <redis-url> <key>");
        std::process::exit(2);
    };
    // Draw tokens before the fork, as a long-running service would have.
    let warmed = runtime().block_on(async {
        let locker = Locker::redis(&url).await?;
        for _ in 0..3 {
            locker.lock("fork-warm-up").await?.release().await?;
        }
        Ok::<(), LockError>(())
    });
    if let Err(e) = warmed {
        println!("ERROR warm-up {e}");
        std::process::exit(2);
    }
    match fork::fork() {
        Ok(fork::Fork::Parent(child)) => {
            attempt(&url, &key, "parent");
            let _ = fork::waitpid(child);
        }
        Ok(fork::Fork::Child) => {
            attempt(&url, &key, "child");
            std::process::exit(0);
        }
        Err(e) => {
            println!("ERROR fork {e}");
            std::process::exit(2);
        }
    }
}
