//! Forks after taking a lock, then parent and child each try to take one same lock on Redis
//! (`tests/tests/fork.rs`). Owner tokens drawn from a userspace generator whose state `fork`
//! copied would be the same in both, and the second `try_lock` would find "its own" token in
//! the key and report the lock acquired: two holders.
//!
//! ```text
//! lock-fork-probe <redis-url> <key>        ->  one line per process: HELD <role> | BUSY <role> | ERROR <role> <error>
//! lock-fork-probe <redis-url> <key> fair   ->  the same after waiting in fair mode, TIMEOUT <role> when the wait ran out
//! ```
//! In `fair` mode the probe holds `<key>` across the fork; parent and child then queue for it
//! (a waiter's ticket names it in a hand-over message: tickets drawn from a copied generator
//! would be equal, and both processes would take one hand-over as theirs); once both tickets
//! are in the queue (or after 2 s), the probe releases and each waiter reports.
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

/// Fair mode: waits for `key`, reports, keeps the lock past exit when it got it.
async fn wait_fairly(url: &str, key: &str, role: &str) {
    let outcome = async {
        let locker = Locker::redis(url).await?;
        let guard = locker
            .lock(key)
            .fair()
            .fenced()
            .lease(Duration::from_secs(30))
            .wait(Duration::from_secs(3))
            .await?;
        std::mem::forget(guard);
        Ok::<(), LockError>(())
    }
    .await;
    match outcome {
        Ok(()) => println!("HELD {role}"),
        Err(LockError::Timeout { .. }) => println!("TIMEOUT {role}"),
        Err(e) => println!("ERROR {role} {e}"),
    }
}

/// Fair mode, after the warm-up: the two processes queue behind a lock held across the fork.
fn fair(url: &str, key: &str) {
    let rt = runtime();
    let holder = rt.block_on(async {
        let locker = Locker::redis(url).await?;
        locker.lock(key).await
    });
    let holder = match holder {
        Ok(g) => g,
        Err(e) => {
            println!("ERROR holder {e}");
            std::process::exit(2);
        }
    };
    match fork::fork() {
        Ok(fork::Fork::Child) => {
            runtime().block_on(wait_fairly(url, key, "child"));
            std::process::exit(0);
        }
        Ok(fork::Fork::Parent(child)) => {
            rt.block_on(async {
                let waiter = tokio::spawn({
                    let (url, key) = (url.to_owned(), key.to_owned());
                    async move { wait_fairly(&url, &key, "parent").await }
                });
                // Both tickets queued: the waiters hash holds two entries (server state, no
                // signal: polled, within a bound).
                let queued = async {
                    let client = redis::Client::open(url).ok()?;
                    let mut conn = client.get_multiplexed_async_connection().await.ok()?;
                    loop {
                        let n: i64 = redis::cmd("HLEN")
                            .arg(format!("lock:{{{key}}}:waiters"))
                            .query_async(&mut conn)
                            .await
                            .ok()?;
                        if n >= 2 {
                            return Some(());
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                };
                let _ = tokio::time::timeout(Duration::from_secs(2), queued).await;
                if let Err(e) = holder.release().await {
                    println!("ERROR holder {e}");
                }
                let _ = waiter.await;
            });
            let _ = fork::waitpid(child);
        }
        Err(e) => {
            println!("ERROR fork {e}");
            std::process::exit(2);
        }
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(url), Some(key), mode) = (args.next(), args.next(), args.next()) else {
        println!("ERROR usage lock-fork-probe <redis-url> <key>");
        std::process::exit(2);
    };
    // Draw tokens and tickets before the fork, as a long-running service would have.
    let warmed = runtime().block_on(async {
        let locker = Locker::redis(&url).await?;
        for _ in 0..3 {
            locker.lock("fork-warm-up").await?.release().await?;
            locker.lock("fork-warm-up").fair().await?.release().await?;
        }
        Ok::<(), LockError>(())
    });
    if let Err(e) = warmed {
        println!("ERROR warm-up {e}");
        std::process::exit(2);
    }
    if mode.as_deref() == Some("fair") {
        fair(&url, &key);
        return;
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
