//! Redlock (issue 17): one lock over 5 independent redis-server processes, held while 3 of
//! them hold it.
//!
//! - `every_subset_of_servers_down_or_stalled`: all 32 subsets of 5 servers down (killed) or
//!   stalled (SIGSTOP), both kinds mixed: acquired when 3 or more answer; else refused with a
//!   `Backend` error whose source is `NoQuorum`, within the per-server timeout plus slack (not
//!   the wait); and no key left behind on any server afterwards.
//! - `two_holders_never_overlap_under_server_faults`: child processes of this test binary lock
//!   a few keys in a loop while the parent stalls and kills (restarting after the lease, the
//!   documented rule) up to 2 of the 5 servers at a time; every critical section is recorded
//!   on CLOCK_MONOTONIC and no two of one key overlap. One section in eight spans one to two
//!   leases (renewed by the watchdog through the faults); a section counts only if the lock is
//!   still held at its end (`is_held()`).
//! - `watchdog_keeps_the_lock_across_two_losses_and_reports_the_third`.
//! - `restart_rule_*`: a server restarted empty at once lets a second holder in (the hazard);
//!   restarted after the lease, it does not.
//! - waiting by notification, fencing and fair mode refused, idempotency over a quorum.
//! - one server under two URLs is refused at connect, and left out when it joins later (else,
//!   with 2 of 5 down, it and its double made a majority).
//!
//! One set of 5 servers per test, short leases: the file runs in well under a minute.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "test code: a failed expectation fails the test; figures are printed for the notes"
)]

use std::time::{Duration, Instant};

use lock_core::{LockError, Locker, NoQuorum, RedlockBackend};
use lock_testkit::{RedisServer, eventually};
use lock_tests::chaos::{Rng, now_us};

/// The per-server bound the tests configure.
const SERVER_TIMEOUT: Duration = Duration::from_millis(100);

fn servers(n: usize) -> Vec<RedisServer> {
    (0..n).map(|_| RedisServer::start()).collect()
}

fn urls(servers: &[RedisServer]) -> Vec<String> {
    servers.iter().map(RedisServer::url).collect()
}

async fn backend(urls: &[String]) -> RedlockBackend {
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    RedlockBackend::builder(&urls)
        .server_timeout(SERVER_TIMEOUT)
        .response_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap()
}

async fn locker(servers: &[RedisServer], lease: Duration) -> Locker {
    Locker::builder(backend(&urls(servers)).await)
        .lease(lease)
        .build()
}

fn no_quorum(e: &LockError) -> Option<&NoQuorum> {
    match e {
        LockError::Backend { source, .. } => source.downcast_ref::<NoQuorum>(),
        _ => None,
    }
}

/// Until `locker` reaches every server again (a restarted server's connection is re-made in
/// the background): a probe lock is seen on all of them.
async fn all_reachable(locker: &Locker, servers: &[RedisServer]) {
    eventually(
        "every server reachable again",
        Duration::from_secs(10),
        async || {
            let Ok(guard) = locker.try_lock("probe").await else {
                return false;
            };
            let mut everywhere = true;
            for s in servers {
                everywhere &= s.exists("lock:{probe}").await;
            }
            guard.release().await.unwrap();
            everywhere
        },
    )
    .await;
}

/// `key` held by another client (`holder`, no locker) on `servers` for 10 s.
async fn held_elsewhere(servers: &[RedisServer], key: &str, holder: &str) {
    for s in servers {
        let set = redis::cmd("SET")
            .arg(key)
            .arg(holder)
            .arg("PX")
            .arg(10_000)
            .clone();
        let _: () = s.query(set).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_subset_of_servers_down_or_stalled() {
    let mut servers = servers(5);
    let lease = Duration::from_secs(10);
    let locker = locker(&servers, lease).await;
    all_reachable(&locker, &servers).await;
    let started = Instant::now();
    let (mut acquired, mut refused) = (0, 0);
    let mut slowest_refusal = Duration::ZERO;
    for mask in 0u32..32 {
        let faulty: Vec<usize> = (0..5).filter(|i| mask & (1 << i) != 0).collect();
        // Both kinds of fault, mixed: alternate by position and subset.
        let stalled = |i: usize| (i + mask as usize).is_multiple_of(2);
        for &i in &faulty {
            if stalled(i) {
                servers[i].pause();
            } else {
                servers[i].stop();
            }
        }
        let key = format!("subset{mask}");
        let asked = Instant::now();
        // A wait far above the per-server timeout: a refusal must not wait for it.
        let answer = locker.lock(&key).wait(Duration::from_secs(5)).await;
        let took = asked.elapsed();
        let up = 5 - faulty.len();
        match answer {
            Ok(guard) => {
                assert!(
                    up >= 3,
                    "subset {faulty:?}: acquired with only {up} servers up"
                );
                assert!(guard.is_held());
                guard.release().await.unwrap();
                acquired += 1;
            }
            Err(e) => {
                assert!(
                    up < 3,
                    "subset {faulty:?}: refused with {up} servers up: {e}"
                );
                let q = no_quorum(&e)
                    .unwrap_or_else(|| panic!("subset {faulty:?}: not a NoQuorum error: {e:?}"));
                assert_eq!((q.quorum, q.servers), (3, 5));
                assert!(q.answered < 3, "{q:?}");
                assert!(e.is_retryable());
                // The per-server timeout plus generous slack for a loaded machine: far from the
                // 5 s wait.
                assert!(
                    took < SERVER_TIMEOUT + Duration::from_millis(1500),
                    "subset {faulty:?}: refused after {took:?}"
                );
                slowest_refusal = slowest_refusal.max(took);
                refused += 1;
            }
        }
        for &i in &faulty {
            if stalled(i) {
                servers[i].resume();
            } else {
                servers[i].restart();
            }
        }
        // Nothing left behind on any server: not by the refusal (its releases went out on every
        // server, after its SETs on the same connections, so a stalled server runs both when it
        // resumes), not by the release. The bound is far below the 10 s lease, so a key that
        // was left would still be there.
        let name = format!("lock:{{{key}}}");
        for (i, s) in servers.iter().enumerate() {
            eventually(
                &format!("subset {faulty:?}: no key left on server {i}"),
                Duration::from_secs(3),
                async || !s.exists(&name).await,
            )
            .await;
        }
        if faulty.iter().any(|&i| !stalled(i)) {
            all_reachable(&locker, &servers).await;
        }
    }
    assert_eq!((acquired, refused), (16, 16));
    println!(
        "32 subsets in {:?}; slowest refusal {slowest_refusal:?} (per-server timeout {SERVER_TIMEOUT:?})",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_keeps_the_lock_across_two_losses_and_reports_the_third() {
    let mut servers = servers(5);
    let lease = Duration::from_millis(900);
    let locker = locker(&servers, lease).await;
    let guard = locker.lock("job").await.unwrap();
    servers[0].pause();
    servers[1].stop();
    // Three leases: the watchdog renewed on the 3 left every lease/3.
    tokio::time::sleep(lease * 3).await;
    assert!(guard.is_held(), "lost with 3 of 5 servers up");
    assert!(
        tokio::time::timeout(Duration::ZERO, guard.lost())
            .await
            .is_err()
    );
    for s in &servers[2..] {
        assert!(s.pttl("lock:{job}").await > 0);
    }
    let third = Instant::now();
    servers[2].pause();
    tokio::time::timeout(lease + Duration::from_secs(2), guard.lost())
        .await
        .expect("the holder is told within its lease when a third server goes");
    println!(
        "loss reported {:?} after the third server stalled",
        third.elapsed()
    );
    assert!(!guard.is_held());
    // Not ours any more: LeaseLost, or no quorum to release on (3 of 5 are down).
    let released = guard.release().await.unwrap_err();
    assert!(
        matches!(released, LockError::LeaseLost { .. }) || no_quorum(&released).is_some(),
        "{released:?}"
    );
    servers[0].resume();
    servers[2].resume();
}

/// A renewal that only a minority of servers accepts is a loss, told at once: the lock is
/// gone from 3 of 5 servers (deleted behind its back) while all 5 answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_on_a_minority_is_a_loss() {
    let servers = servers(5);
    let lease = Duration::from_millis(900);
    let locker = locker(&servers, lease).await;
    let guard = locker.lock("job").await.unwrap();
    for s in &servers[..3] {
        assert_eq!(s.del("lock:{job}").await, 1);
    }
    tokio::time::timeout(lease * 2, guard.lost())
        .await
        .expect("the holder is told");
    assert!(!guard.is_held());
    // Not renewed on the two servers where it was still there after the loss was seen.
    let lost_at = Instant::now();
    for s in &servers[3..] {
        eventually("the minority's copies expire", lease * 3, async || {
            !s.exists("lock:{job}").await
        })
        .await;
    }
    println!(
        "minority copies gone {:?} after the loss",
        lost_at.elapsed()
    );
}

/// A refused attempt that got some servers (a split vote: 3 busy, 2 free) gives them back at
/// once, without announcing a release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_vote_leaves_no_key_behind() {
    let servers = servers(5);
    let locker = locker(&servers, Duration::from_secs(10)).await;
    held_elsewhere(&servers[..3], "lock:{split}", "someone").await;
    for s in &servers {
        s.reset_stats().await;
    }
    match locker.try_lock("split").await {
        Err(LockError::Busy { .. }) => {}
        other => panic!("expected Busy, got {other:?}"),
    }
    for s in &servers[3..] {
        eventually(
            "the free servers are given back",
            Duration::from_secs(3),
            async || !s.exists("lock:{split}").await,
        )
        .await;
        // Taken back by expiry, not announced as a release.
        let stats = s.commandstats().await;
        assert_eq!(stats.get("publish").copied().unwrap_or(0), 0, "{stats:?}");
        assert_eq!(stats.get("spublish").copied().unwrap_or(0), 0, "{stats:?}");
    }
    for s in &servers[..3] {
        assert_eq!(s.get("lock:{split}").await.as_deref(), Some("someone"));
    }
}

/// Connecting needs a majority of the servers, and waits for no more; those down or stalled at
/// connect join when they answer. The same server twice is refused (a majority of one server
/// is no majority).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_needs_a_majority_and_late_servers_join() {
    let mut servers = servers(5);
    let all = urls(&servers);
    servers[0].stop();
    servers[1].stop();
    servers[2].stop();
    let refused = RedlockBackend::builder(&all.iter().map(String::as_str).collect::<Vec<_>>())
        .connect_timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap_err();
    assert_eq!(
        no_quorum(&refused).map(|q| q.answered),
        Some(2),
        "{refused:?}"
    );
    servers[2].restart();
    let locker = locker(&servers, Duration::from_secs(5)).await;
    locker.lock("late").await.unwrap().release().await.unwrap();
    servers[0].restart();
    servers[1].restart();
    // Connected in the background (every second): a lock is on all five again.
    all_reachable(&locker, &servers).await;
    // A stalled minority does not hold the connect up: it waits for a majority, not for the
    // stalled servers' connect timeouts (30 s here; the hang guard is 10 s).
    servers[0].pause();
    servers[1].pause();
    let stalled = tokio::time::timeout(
        Duration::from_secs(10),
        RedlockBackend::builder(&all.iter().map(String::as_str).collect::<Vec<_>>())
            .connect_timeout(Duration::from_secs(30))
            .response_timeout(Duration::from_secs(30))
            .server_timeout(SERVER_TIMEOUT)
            .connect(),
    )
    .await
    .expect("connect waits for a majority, not for the stalled servers")
    .unwrap();
    let guard = Locker::builder(stalled)
        .build()
        .lock("stalled")
        .await
        .unwrap();
    servers[0].resume();
    servers[1].resume();
    guard.release().await.unwrap();
    let twice = [all[3].as_str(), all[4].as_str(), all[3].as_str()];
    assert!(matches!(
        RedlockBackend::connect(&twice).await,
        Err(LockError::InvalidConfig { .. })
    ));
}

/// Local hand-off on Redlock: a locker passing a hot key between its own tasks lets a waiter
/// of another locker in at the bound of its turns (the waiter announced itself on the servers,
/// and keep.lua there sees it), instead of for its whole wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_handoff_gives_way_to_another_lockers_waiter() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    let servers = servers(5);
    let backend_of = async || backend(&urls(&servers)).await;
    let hog = Locker::builder(backend_of().await)
        .local_turns(4)
        .local_hold(Duration::from_secs(600))
        .build();
    let other = Locker::builder(backend_of().await).build();
    let (stop, taken) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let mut busy = tokio::task::JoinSet::new();
    for _ in 0..6 {
        let (hog, stop, taken) = (hog.clone(), stop.clone(), taken.clone());
        busy.spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let guard = hog.lock("hot").wait(Duration::from_secs(20)).await.unwrap();
                taken.fetch_add(1, Ordering::SeqCst);
                tokio::task::yield_now().await;
                let _ = guard.release().await;
            }
        });
    }
    eventually(
        "the hog passes the lock locally",
        Duration::from_secs(10),
        async || hog.stats().local_handoffs > 10,
    )
    .await;
    let asked = taken.load(Ordering::SeqCst);
    let guard = tokio::time::timeout(
        Duration::from_secs(15),
        other.lock("hot").wait(Duration::from_secs(10)),
    )
    .await
    .expect("hang guard")
    .expect("the other locker gets its turn");
    let between = taken.load(Ordering::SeqCst) - asked;
    stop.store(true, Ordering::SeqCst);
    guard.release().await.unwrap();
    while let Some(done) = busy.join_next().await {
        done.unwrap();
    }
    println!(
        "{between} turns of the hog before the other locker got in ({} local hand-offs in all)",
        hog.stats().local_handoffs
    );
    assert!(
        between < 2_000,
        "{between} turns of the hog before the other got in"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_and_fair_mode_are_refused_before_any_io() {
    let servers = servers(3);
    let locker = locker(&servers, Duration::from_secs(5)).await;
    // Refused before any I/O and before the local queue. A fair request subscribes nowhere
    // first.
    let holder = locker.lock("held").await.unwrap();
    for s in &servers {
        s.reset_stats().await;
    }
    let fair = locker
        .lock("held")
        .fair()
        .wait(Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(matches!(fair, LockError::InvalidConfig { .. }), "{fair:?}");
    for s in &servers {
        assert_eq!(s.subscribed_channels().await, Vec::<String>::new());
        let stats = s.commandstats().await;
        for command in ["subscribe", "ssubscribe", "psubscribe", "set"] {
            assert_eq!(stats.get(command), None, "{command} sent: {stats:?}");
        }
    }
    // A fenced request behind a local holder of the key (with a local waiter, so the key has
    // a local queue) is refused at once: it does not wait in the local queue (where it would
    // time out after its wait instead).
    let waiter = {
        let locker = locker.clone();
        tokio::spawn(async move { locker.lock("held").wait(Duration::from_secs(10)).await })
    };
    eventually("a local waiter", Duration::from_secs(3), async || {
        locker.stats().waiters > 0
    })
    .await;
    let asked = Instant::now();
    let fenced = tokio::time::timeout(
        Duration::from_secs(2),
        locker.lock("held").fenced().wait(Duration::from_secs(5)),
    )
    .await
    .expect("refused at once, not after waiting in the local queue")
    .unwrap_err();
    assert!(
        matches!(&fenced, LockError::InvalidConfig { what, .. } if what.contains("fenced() is not available on Redlock")),
        "{fenced:?} after {:?}",
        asked.elapsed()
    );
    holder.release().await.unwrap();
    waiter.await.unwrap().unwrap().release().await.unwrap();
    let fenced = locker.lock("f").fenced().await.unwrap_err();
    assert!(
        matches!(&fenced, LockError::InvalidConfig { what, .. } if what.contains("fenced() is not available on Redlock")),
        "{fenced:?}"
    );
    let fenced = locker.try_lock("f").fenced().await.unwrap_err();
    assert!(matches!(fenced, LockError::InvalidConfig { .. }));
    let fair = locker.lock("f").fair().await.unwrap_err();
    assert!(
        matches!(&fair, LockError::InvalidConfig { what, .. } if what.contains("fair() is not available on Redlock")),
        "{fair:?}"
    );
    for s in &servers {
        assert_eq!(s.keys("lock:{f}*").await, Vec::<String>::new());
    }
    // Plain locks work on the same locker.
    locker.lock("f").await.unwrap().release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_by_the_release_not_by_polling() {
    let servers = servers(5);
    let lease = Duration::from_secs(20);
    let holder = locker(&servers, lease).await;
    let waiter = locker(&servers, lease).await;
    let guard = holder.lock("hot").await.unwrap();
    for s in &servers {
        s.reset_stats().await;
    }
    let wait = tokio::spawn(async move {
        let got = waiter.lock("hot").wait(Duration::from_secs(15)).await;
        (got.map(|g| (Instant::now(), g)), waiter)
    });
    let hold = Duration::from_secs(2);
    tokio::time::sleep(hold).await;
    // The waiter announced itself on every server (so a release there publishes), as a bare
    // expiry: no token, so no server can hand the lock to it behind the others' backs.
    for s in &servers {
        let entries: Vec<String> = s
            .query(redis::cmd("HVALS").arg("lock:{hot}:waiters").clone())
            .await;
        assert_eq!(entries.len(), 1, "{entries:?}");
        assert!(
            entries[0].bytes().all(|b| b.is_ascii_digit()),
            "{entries:?}"
        );
    }
    let released = Instant::now();
    guard.release().await.unwrap();
    let (got, _waiter) = tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .expect("hang guard")
        .unwrap();
    let (at, guard) = got.unwrap();
    let after = at.saturating_duration_since(released);
    // Attempts while the lease (20 s) ran: a polling waiter (10 ms) would have sent ~200.
    // Ours: the first, the core's ticket refreshes (every 750 ms), the one after the message.
    let sets = servers[0]
        .commandstats()
        .await
        .get("set")
        .copied()
        .unwrap_or(0);
    println!("waiter acquired {after:?} after the release; {sets} SETs on server 0 in {hold:?}");
    assert!(
        sets <= 8,
        "{sets} acquire attempts on one server while waiting {hold:?}"
    );
    // The lease (20 s) had not run out: only the release message could have woken it this
    // early, or a ticket refresh (750 ms at most).
    assert!(after < Duration::from_secs(5), "{after:?}");
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_records_need_a_quorum() {
    let mut servers = servers(5);
    let locker = locker(&servers, Duration::from_secs(5)).await;
    let guard = locker.lock("charge:1").await.unwrap();
    servers[0].pause();
    servers[1].stop();
    guard
        .store_result("fp", b"receipt", Duration::from_secs(60))
        .await
        .unwrap();
    guard.release().await.unwrap();
    match locker.idempotency_state("charge:1").await.unwrap() {
        lock_core::IdempotencyState::Completed(r) => assert_eq!(r.result, b"receipt"),
        other => panic!("{other:?}"),
    }
    servers[2].pause();
    let e = locker.idempotency_state("charge:1").await.unwrap_err();
    assert!(no_quorum(&e).is_some(), "{e:?}");
    servers[0].resume();
    servers[2].resume();
    servers[1].restart();
}

/// A server restarted empty at once can let a second holder in: the hazard the restart rule
/// (stay down for at least the longest lease, or persist with `appendfsync always`) prevents.
/// Shown without the watchdog (whose checks after a reconnect only narrow the window).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_rule_an_immediate_restart_lets_a_second_holder_in() {
    let mut servers = servers(5);
    let lease = Duration::from_secs(20);
    let a = locker(&servers, lease).await;
    let b = locker(&servers, lease).await;
    let held = a.lock("acct").watchdog(false).await.unwrap();
    // One server at a time (never more than a minority down), each back at once, empty.
    for s in servers.iter_mut().take(3) {
        s.restart();
    }
    all_reachable(&b, &servers).await;
    // The acquisition returned on a quorum; its SET to a server that was restarted right after
    // may still have been in flight, and a call is sent again once after a reconnect: that copy
    // (a later TTL, the first holder's token) goes, as if the server had come back empty later.
    for s in &servers[..3] {
        s.del("lock:{acct}").await;
    }
    for s in &servers[3..] {
        assert!(s.exists("lock:{acct}").await, "untouched servers keep it");
    }
    let second = b.try_lock("acct").await;
    let first_held = held.is_held();
    assert!(
        second.is_ok() && first_held,
        "expected the documented hazard: two holders after three immediate empty restarts; \
         second: {:?}, first still held: {first_held}",
        second.as_ref().map(|_| ())
    );
}

/// The same sequence with the rule followed: each restarted server stays down for longer than
/// the lease. The first holder's lease has run out by the time a second can get a majority.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_rule_a_delayed_restart_keeps_one_holder() {
    let mut servers = servers(5);
    let lease = Duration::from_millis(800);
    let a = locker(&servers, lease).await;
    let b = locker(&servers, lease).await;
    let held = a.lock("acct").await.unwrap();
    let mut overlaps = 0;
    for s in servers.iter_mut().take(3) {
        s.stop();
        // Down for the lease plus the drift allowance and a margin.
        let down = Instant::now();
        while down.elapsed() < lease + Duration::from_millis(200) {
            if b.try_lock("acct").await.is_ok_and(|g| {
                let both = held.is_held();
                drop(g);
                both
            }) {
                overlaps += 1;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        s.restart();
    }
    all_reachable(&b, &servers).await;
    // After the third restart the first holder's lock is on 2 servers: lost, and told.
    tokio::time::timeout(lease * 2, held.lost())
        .await
        .expect("the first holder is told its lock is gone");
    let second = b.lock("acct").wait(lease * 3).await.unwrap();
    assert!(!held.is_held());
    assert_eq!(overlaps, 0);
    second.release().await.unwrap();
}

/// A renewal that a quorum of servers answers without a quorum of yes, while a server that did
/// not answer may still hold the lock, is undecided: retried while the lease is locally valid,
/// not reported lost. The lock is held on exactly 3 of 5 servers (2 were down at acquire and
/// came back empty); one of the 3 stalls for less than the lease: 2 say no, 2 yes, 1 is silent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecided_renewal_is_retried_not_lost() {
    let mut servers = servers(5);
    let lease = Duration::from_millis(1500);
    let locker = locker(&servers, lease).await;
    servers[0].stop();
    servers[1].stop();
    let guard = locker.lock("job").await.unwrap();
    servers[0].restart();
    servers[1].restart();
    all_reachable(&locker, &servers).await;
    // The attempt's task on a stopped server may have reached it once it was back (a call is
    // retried once after a reconnect): as if it had come back empty later, the copy goes.
    for s in &servers[..2] {
        s.del("lock:{job}").await;
        assert!(!s.exists("lock:{job}").await);
    }
    assert!(guard.is_held());
    // Longer than a watchdog tick (lease/3), well under the lease.
    servers[4].pause();
    tokio::time::sleep(Duration::from_millis(700)).await;
    servers[4].resume();
    // Two more leases: renewed on the 3 again.
    let lost = tokio::time::timeout(lease * 2, guard.lost()).await;
    assert!(
        lost.is_err(),
        "reported lost while the stalled server still held it"
    );
    assert!(guard.is_held());
    for s in &servers[2..] {
        assert!(s.pttl("lock:{job}").await > 0);
    }
    guard.release().await.unwrap();
}

/// A refused attempt without a quorum of answers (`NoQuorum`) is taken back by the backend
/// alone, announcing nothing: no release is published to the key's announced waiters. The
/// stalled server receives the attempt's `SET` before anything else, so a release sent by the
/// core after the refusal would find the lock there, and publish to the waiter announced there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_without_quorum_publishes_nothing() {
    let mut servers = servers(5);
    let locker = locker(&servers, Duration::from_secs(10)).await;
    all_reachable(&locker, &servers).await;
    // A waiter of another process announced on every server (a bare expiry, one minute ahead).
    for s in &servers {
        let (secs, micros): (String, String) = s.query(redis::cmd("TIME").clone()).await;
        let now_ms = secs.parse::<u64>().unwrap() * 1000 + micros.parse::<u64>().unwrap() / 1000;
        let _: () = s
            .query(
                redis::cmd("HSET")
                    .arg("lock:{nq}:waiters")
                    .arg("tother")
                    .arg((now_ms + 60_000).to_string())
                    .clone(),
            )
            .await;
        let _: () = s
            .query(
                redis::cmd("RPUSH")
                    .arg("lock:{nq}:queue")
                    .arg("tother")
                    .clone(),
            )
            .await;
        s.reset_stats().await;
    }
    servers[0].stop();
    servers[1].stop();
    servers[2].pause();
    let e = locker.try_lock("nq").await.unwrap_err();
    assert_eq!(no_quorum(&e).map(|q| q.answered), Some(2), "{e:?}");
    // Within the connection's response timeout (500 ms): what was sent there is answered.
    tokio::time::sleep(Duration::from_millis(200)).await;
    servers[2].resume();
    for s in &servers[2..] {
        eventually("taken back", Duration::from_secs(3), async || {
            !s.exists("lock:{nq}").await
        })
        .await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for s in &servers[2..] {
        let stats = s.commandstats().await;
        assert_eq!(stats.get("publish"), None, "{stats:?}");
        assert_eq!(stats.get("spublish"), None, "{stats:?}");
        // The announced waiter is still there: no release handed it a turn.
        assert!(s.exists("lock:{nq}:waiters").await);
    }
    servers[0].restart();
    servers[1].restart();
}

/// An idempotency read hears every server that answers within the bound, not only the first
/// quorum: a record on one server only (a store that failed on the others), and that server
/// slow but answering, is seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_read_hears_every_server_that_answers() {
    let mut servers = servers(5);
    let locker = locker(&servers, Duration::from_secs(5)).await;
    all_reachable(&locker, &servers).await;
    let guard = locker.lock("charge:2").await.unwrap();
    guard
        .store_result("fp", b"receipt", Duration::from_secs(60))
        .await
        .unwrap();
    guard.release().await.unwrap();
    // The store answers once a quorum stored the record (a server whose store came after the
    // release refused it): keep it on one server that has it, the slow one.
    let mut with_record = Vec::new();
    for (i, s) in servers.iter().enumerate() {
        if s.exists("lock:{charge:2}:result").await {
            with_record.push(i);
        }
    }
    assert!(
        with_record.len() >= 3,
        "stored on a quorum: {with_record:?}"
    );
    let slow = with_record[0];
    for (i, s) in servers.iter().enumerate() {
        if i != slow {
            s.del("lock:{charge:2}:result").await;
        }
    }
    // The one server with the record answers 200 ms late (the read's bound is 500 ms).
    servers[slow].pause();
    let pid = servers[slow].pid().unwrap();
    let thaw = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        let status = std::process::Command::new("kill")
            .args(["-CONT", &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    });
    let state = locker.idempotency_state("charge:2").await.unwrap();
    thaw.join().unwrap();
    servers[slow].resume();
    match state {
        lock_core::IdempotencyState::Completed(r) => assert_eq!(r.result, b"receipt"),
        other => panic!("the record on the slow server was not heard: {other:?}"),
    }
}

/// Split votes do not idle the lock. In each of 30 rounds, two lockers wait for a key a third
/// one holds (announced on the servers, asleep until a release message), with one of 5
/// servers down; the release wakes both at once, and their attempts often split 2-2. A refused
/// split-vote attempt answers busy for a short random pause and the waiter retries after it,
/// instead of sleeping until its next ticket refresh (750 ms here, with nobody left to
/// announce a release). In no round does the first acquisition come near that interval after
/// the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_votes_do_not_idle_the_lock() {
    let mut servers = servers(5);
    let lease = Duration::from_secs(10);
    let holder = locker(&servers, lease).await;
    let a = locker(&servers, lease).await;
    let b = locker(&servers, lease).await;
    for l in [&holder, &a, &b] {
        all_reachable(l, &servers).await;
    }
    servers[4].stop();
    let mut firsts = Vec::new();
    for _ in 0..30 {
        let held = holder
            .lock("hot")
            .wait(Duration::from_secs(20))
            .await
            .unwrap();
        let waiters: Vec<_> = [&a, &b]
            .into_iter()
            .map(|l| {
                let l = l.clone();
                tokio::spawn(async move {
                    let guard = l.lock("hot").wait(Duration::from_secs(20)).await.unwrap();
                    let at = Instant::now();
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    guard.release().await.unwrap();
                    at
                })
            })
            .collect();
        // Both waiting (announced on the servers, asleep) before the release.
        eventually(
            "both waiters announced",
            Duration::from_secs(10),
            async || {
                let entries: Vec<String> = servers[0]
                    .query(redis::cmd("HKEYS").arg("lock:{hot}:waiters").clone())
                    .await;
                a.stats().waiters == 1 && b.stats().waiters == 1 && entries.len() >= 2
            },
        )
        .await;
        let released = Instant::now();
        held.release().await.unwrap();
        let mut first = Duration::MAX;
        for w in waiters {
            let at = tokio::time::timeout(Duration::from_secs(20), w)
                .await
                .expect("hang guard")
                .unwrap();
            first = first.min(at.saturating_duration_since(released));
        }
        firsts.push(first);
    }
    firsts.sort();
    let idle = firsts
        .iter()
        .filter(|w| **w >= Duration::from_millis(700))
        .count();
    println!(
        "30 rounds; first acquisition after the release: median {:?}, longest {:?}; {idle} of 700 ms or more",
        firsts[firsts.len() / 2],
        firsts.last().unwrap()
    );
    // A correctness bound, not a speed claim: 700 ms is a lock left idle while both waiters
    // sleep for their refresh interval.
    assert_eq!(idle, 0, "first acquisitions after each release: {firsts:?}");
    servers[4].restart();
}

/// The same, deterministic: a rival's key on 2 of the 4 servers up (server 4 is down) splits
/// every vote 2-2 until the rival takes it back, announcing nothing (as a refused attempt
/// does). The waiter retries after each split's short random pause, so it keeps attempting
/// (counted by `LockerStats::backend_calls`) and takes the lock once the rival's copies are
/// gone, instead of one attempt and a nap until its next ticket refresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_vote_is_retried_after_a_short_pause() {
    let mut servers = servers(5);
    let waiter = locker(&servers, Duration::from_secs(10)).await;
    all_reachable(&waiter, &servers).await;
    servers[4].stop();
    held_elsewhere(&servers[..2], "lock:{split2}", "rival").await;
    let before = waiter.stats().backend_calls;
    let wait = {
        let waiter = waiter.clone();
        tokio::spawn(async move { waiter.lock("split2").wait(Duration::from_secs(5)).await })
    };
    // Counted until 5 calls or 700 ms, whichever comes first: under the 750 ms ticket refresh
    // a napping waiter would not reach, yet loose enough for a loaded 2-core machine.
    let counting = Instant::now();
    let attempts = loop {
        let attempts = waiter.stats().backend_calls - before;
        if attempts >= 5 || counting.elapsed() >= Duration::from_millis(700) {
            break attempts;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let counted = counting.elapsed();
    for s in &servers[..2] {
        assert_eq!(s.del("lock:{split2}").await, 1);
    }
    let guard = wait
        .await
        .unwrap()
        .expect("taken once the rival's copies are gone");
    println!("{attempts} backend calls in {counted:?} of split votes");
    // Without the short pause: the first attempt, the queued waiter's first, then a nap of
    // 750 ms (its ticket refresh): 2 calls (each refused attempt's take-back is not counted).
    assert!(
        attempts >= 5,
        "{attempts} backend calls while the votes split: the waiter slept"
    );
    guard.release().await.unwrap();
    servers[4].restart();
}

// ---------------------------------------------------------------------------------------------
// Multi-process stress: children of this binary lock, the parent injects server faults.

const CHILD_ENV: &str = "REDLOCK_STRESS_CHILD";
const STRESS_KEYS: u64 = 2;

/// The child's side: runs only when started by the stress test (with its environment).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stress_child() {
    let Ok(config) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut parts = config.split(';');
    let urls: Vec<String> = parts
        .next()
        .unwrap()
        .split(',')
        .map(str::to_owned)
        .collect();
    let out = parts.next().unwrap().to_owned();
    let run_ms: u64 = parts.next().unwrap().parse().unwrap();
    let seed: u64 = parts.next().unwrap().parse().unwrap();
    let lease = Duration::from_millis(1000);
    let locker = Locker::builder(backend(&urls).await).lease(lease).build();
    let mut rng = Rng::new(seed);
    let mut records = String::new();
    let (mut ok, mut failed, mut sections) = (0u64, 0u64, 0u64);
    let end = Instant::now() + Duration::from_millis(run_ms);
    while Instant::now() < end {
        let key = format!("k{}", rng.range(0, STRESS_KEYS));
        let guard = match locker.lock(&key).wait(Duration::from_secs(3)).await {
            Ok(g) => g,
            Err(_) => {
                failed += 1;
                tokio::time::sleep(Duration::from_millis(rng.range(0, 20))).await;
                continue;
            }
        };
        let t_in = now_us();
        // One section in eight spans one to two leases (on a fixed schedule, so every run has
        // some): the watchdog must renew it on a majority through the faults, or the holder
        // must find it no longer held.
        sections += 1;
        let long = sections % 8 == 3;
        let hold = if long {
            rng.range(lease.as_millis() as u64, 2 * lease.as_millis() as u64)
        } else {
            rng.range(0, 15)
        };
        tokio::time::sleep(Duration::from_millis(hold)).await;
        let t_out = now_us();
        // Claimed held from t_in to t_out only if still held after t_out.
        if guard.is_held() {
            records.push_str(&format!("{key} {t_in} {t_out} {}\n", u8::from(long)));
            ok += 1;
        }
        let _ = guard.release().await;
    }
    records.push_str(&format!("# {ok} {failed}\n"));
    std::fs::write(out, records).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_holders_never_overlap_under_server_faults() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let mut servers = servers(5);
    let urls = urls(&servers).join(",");
    let dir = std::env::temp_dir().join(format!("redlock-stress-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let run = Duration::from_secs(12);
    let lease = Duration::from_millis(1000);
    let exe = std::env::current_exe().unwrap();
    let mut children: Vec<(std::process::Child, std::path::PathBuf)> = (0..3)
        .map(|c| {
            let out = dir.join(format!("child{c}.txt"));
            let child = std::process::Command::new(&exe)
                .args(["--exact", "stress_child", "--nocapture", "--test-threads=1"])
                .env(
                    CHILD_ENV,
                    format!("{urls};{};{};{}", out.display(), run.as_millis(), 100 + c),
                )
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap();
            (child, out)
        })
        .collect();
    // Faults: at most 2 servers faulty at once; a stall lasts up to 400 ms; a killed server
    // stays down for the lease and a margin (the restart rule) before it comes back empty.
    let mut rng = Rng::new(17);
    let mut down_until: Vec<Option<(Instant, bool)>> = vec![None; 5];
    let (mut stalls, mut kills) = (0, 0);
    let end = Instant::now() + run - Duration::from_secs(1);
    while Instant::now() < end {
        let now = Instant::now();
        for (i, slot) in down_until.iter_mut().enumerate() {
            if let Some((until, stalled)) = *slot
                && now >= until
            {
                if stalled {
                    servers[i].resume();
                } else {
                    servers[i].restart();
                }
                *slot = None;
            }
        }
        let faulty = down_until.iter().filter(|d| d.is_some()).count();
        if faulty < 2 && rng.range(0, 3) == 0 {
            let i = rng.range(0, 5) as usize;
            if down_until[i].is_none() {
                if rng.range(0, 2) == 0 {
                    servers[i].pause();
                    down_until[i] =
                        Some((now + Duration::from_millis(50 + rng.range(0, 350)), true));
                    stalls += 1;
                } else {
                    servers[i].stop();
                    down_until[i] = Some((now + lease + Duration::from_millis(200), false));
                    kills += 1;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(30 + rng.range(0, 70))).await;
    }
    for (i, slot) in down_until.iter().enumerate() {
        match slot {
            Some((until, true)) => {
                let _ = until;
                servers[i].resume();
            }
            Some((until, false)) => {
                tokio::time::sleep(until.saturating_duration_since(Instant::now())).await;
                servers[i].restart();
            }
            None => {}
        }
    }
    let mut sections: Vec<(String, u64, u64)> = Vec::new();
    let (mut ok, mut failed, mut long_held) = (0u64, 0u64, 0u64);
    for (child, out) in &mut children {
        let bound = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                assert!(status.success(), "a stress child failed: {status}");
                break;
            }
            assert!(Instant::now() < bound, "a stress child hangs");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let text = std::fs::read_to_string(&*out).unwrap();
        for line in text.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            if f[0] == "#" {
                ok += f[1].parse::<u64>().unwrap();
                failed += f[2].parse::<u64>().unwrap();
            } else {
                long_held += u64::from(f[3] == "1");
                sections.push((
                    f[0].to_owned(),
                    f[1].parse().unwrap(),
                    f[2].parse().unwrap(),
                ));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    sections.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    // In start order per key, each section must begin after every earlier one ended.
    let mut overlaps = Vec::new();
    let mut last: Option<&(String, u64, u64)> = None;
    for s in &sections {
        if let Some(l) = last.filter(|l| l.0 == s.0) {
            if s.1 < l.2 {
                overlaps.push((l.clone(), s.clone()));
            }
            if s.2 > l.2 {
                last = Some(s);
            }
        } else {
            last = Some(s);
        }
    }
    println!(
        "{ok} critical sections ({long_held} of them spanning 1-2 leases; {failed} waits failed) by 3 processes; {stalls} stalls, {kills} kills; {} overlaps",
        overlaps.len()
    );
    assert!(overlaps.is_empty(), "two holders at once: {overlaps:?}");
    assert!(ok >= 50, "too few critical sections to mean anything: {ok}");
    assert!(
        long_held >= 3,
        "too few sections spanning a renewal held to the end: {long_held}"
    );
    assert!(
        stalls + kills >= 10,
        "too few faults: {stalls} stalls, {kills} kills"
    );
}

/// The same server and database under a second URL (here an explicit `/0`; in production
/// another host name, address or forwarded port) would vote twice. Connect refuses it, naming
/// the two places in the list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server_under_two_urls_is_refused_at_connect() {
    let servers = servers(3);
    let list = urls_with_double(&servers, 1);
    let urls: Vec<&str> = list.iter().map(String::as_str).collect();
    let e = RedlockBackend::builder(&urls)
        .server_timeout(SERVER_TIMEOUT)
        .connect()
        .await
        .expect_err("one server under two URLs");
    match &e {
        LockError::InvalidConfig { what, .. } => {
            assert!(
                what.contains("1 and 3") || what.contains("3 and 1"),
                "{what}"
            );
        }
        other => panic!("{other:?}"),
    }
    // Nothing of the check is left behind: its probe keys are deleted (the joins still running
    // when connect gave up finish theirs a moment later), well before their 10 s expiry.
    eventually(
        "the probe keys are deleted",
        Duration::from_secs(5),
        async || {
            let mut left = 0;
            for s in &servers {
                left += s.keys("lock:{redlock-identity}:*").await.len();
            }
            left == 0
        },
    )
    .await;
}

/// The servers' URLs, then server `twice` again under a second URL (an explicit `/0`; in
/// production another host name, address or forwarded port).
fn urls_with_double(servers: &[RedisServer], twice: usize) -> Vec<String> {
    let mut list = urls(servers);
    list.push(format!("redis://127.0.0.1:{}/0", servers[twice].port()));
    list
}

/// Until both URLs of `server` (listed twice) have tried to join: the second to join is
/// checked against the first, reading its probe key through `server` (EXISTS there).
async fn both_urls_tried(server: &RedisServer) {
    eventually(
        "both URLs of the server tried to join",
        Duration::from_secs(10),
        async || {
            server
                .commandstats()
                .await
                .get("exists")
                .is_some_and(|n| *n >= 1)
        },
    )
    .await;
}

/// With the servers left, `locker` must find no majority.
async fn no_majority(locker: &Locker) {
    let e = locker.try_lock("acct").await.expect_err("no majority");
    assert!(no_quorum(&e).is_some(), "{e:?}");
}

/// A server down at connect joins later; given twice, only its first URL joins. Otherwise,
/// with 2 of the 5 others down, the one server left with its double would make a majority.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_joining_later_under_a_second_url_is_refused() {
    let mut servers = servers(4);
    let list = urls_with_double(&servers, 3);
    servers[3].stop();
    let locker = Locker::builder(backend(&list).await).build();
    servers[3].restart();
    // Both of its URLs connect again (every second).
    both_urls_tried(&servers[3]).await;
    let probe = locker.try_lock("probe").await.unwrap();
    assert!(
        servers[3].exists("lock:{probe}").await,
        "server 3 joined once"
    );
    probe.release().await.unwrap();
    servers[0].stop();
    servers[1].stop();
    // Servers 2 and 3 answer: 2 votes of 5, whatever server 3's second URL says.
    no_majority(&locker).await;
}

/// A server that cannot be checked when it connects (here it refuses writes: full under
/// `noeviction`) does not join until it can be; then only one of its two URLs joins. Letting
/// it in unchecked would have let its double vote too: with 2 of 4 real servers down, server
/// 1 and its double would make 3 of 5 votes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_cannot_be_checked_joins_only_once_it_can() {
    let mut servers = servers(4);
    let list = urls_with_double(&servers, 1);
    let maxmemory = |bytes: u64| {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg(bytes)
            .clone()
    };
    let () = servers[1].query(maxmemory(1)).await;
    // Servers 0, 2 and 3 are a majority of the 5 URLs.
    let locker = Locker::builder(backend(&list).await).build();
    let () = servers[1].query(maxmemory(0)).await;
    // Both URLs of server 1 are tried again (every second) once it takes writes.
    both_urls_tried(&servers[1]).await;
    servers[2].stop();
    servers[3].stop();
    no_majority(&locker).await;
}

/// A lock held on 4 of 5 servers while the fifth stalls: each refused `try_lock` leaves a
/// take-back waiting on the stalled server, which must not make the next refusal look like a
/// split vote. `retry_after` stays the holder's time, not a pause of a few milliseconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_reports_the_holders_time_while_a_server_stalls() {
    let mut servers = servers(5);
    let holder = locker(&servers, Duration::from_secs(10)).await;
    let other = locker(&servers, Duration::from_secs(10)).await;
    let guard = holder.try_lock("acct").await.unwrap();
    servers[4].pause();
    for _ in 0..3 {
        match other.try_lock("acct").await {
            Err(LockError::Busy { retry_after, .. }) => assert!(
                retry_after.is_none_or(|d| d > Duration::from_secs(1)),
                "held ~10 s more on 4 of 5 servers, yet retry after {retry_after:?}"
            ),
            answer => panic!("{:?}", answer.map(|_| ())),
        }
    }
    servers[4].resume();
    guard.release().await.unwrap();
}

/// The same for a waiter: it does not poll a held lock every few milliseconds while one server
/// stalls (its first attempt's take-back waits on that server for up to a few response
/// timeouts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_does_not_poll_a_held_lock_while_a_server_stalls() {
    let mut servers = servers(5);
    let holder = locker(&servers, Duration::from_secs(10)).await;
    let other = locker(&servers, Duration::from_secs(10)).await;
    let guard = holder.try_lock("acct").await.unwrap();
    servers[4].pause();
    servers[0].reset_stats().await;
    let e = other
        .lock("acct")
        .wait(Duration::from_millis(1500))
        .await
        .map(|_| ())
        .expect_err("held");
    assert!(matches!(e, LockError::Timeout { .. }), "{e:?}");
    let sets = servers[0]
        .commandstats()
        .await
        .get("set")
        .copied()
        .unwrap_or(0);
    servers[4].resume();
    println!("{sets} SETs on server 0 during a 1.5 s wait on a held lock");
    // Polling every ~10 ms would be ~70; the first attempt, the queued one and ticket
    // refreshes (every 750 ms) are a handful.
    assert!(sets < 15, "{sets} acquire attempts in 1.5 s: a hot retry");
    guard.release().await.unwrap();
}

/// A waiter's refused attempts are taken back on each server by a compare-and-delete of their
/// token. A copy one of them leaves (a take-back that failed, a `SET` that landed after it)
/// must never count as a later attempt's yes (it expires earlier: a member of the quorum lost
/// before the validity ends), nor may a late take-back delete a later attempt's key: every
/// attempt writes a token of its own. Seen with MONITOR on the one free server of three (a
/// holder is on the other two): a 1.7 s wait makes its first attempt, its queued one and two
/// ticket refreshes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiters_attempts_each_write_a_token_of_their_own() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    let servers = servers(3);
    let locker = locker(&servers, Duration::from_secs(10)).await;
    held_elsewhere(&servers[..2], "lock:{acct}", "someone").await;
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", servers[2].port()))
        .await
        .unwrap();
    assert_eq!(servers[2].password(), None, "MONITOR is sent without AUTH");
    stream.write_all(b"MONITOR\r\n").await.unwrap();
    let mut lines = BufReader::new(stream).lines();
    assert_eq!(lines.next_line().await.unwrap().as_deref(), Some("+OK"));

    let e = locker
        .lock("acct")
        .wait(Duration::from_millis(1700))
        .await
        .map(|_| ())
        .expect_err("held on 2 of 3 servers");
    assert!(matches!(e, LockError::Timeout { .. }), "{e:?}");

    // `... "SET" "lock:{acct}" "<token>" "NX" "PX" ...`: the token each attempt wrote.
    let mut tokens = Vec::new();
    while let Ok(Ok(Some(line))) =
        tokio::time::timeout(Duration::from_millis(200), lines.next_line()).await
    {
        if let Some((_, rest)) = line.split_once(r#""SET" "lock:{acct}" ""#) {
            tokens.push(rest.split('"').next().unwrap().to_owned());
        }
    }
    let distinct: std::collections::HashSet<&String> = tokens.iter().collect();
    println!("{} attempts, {} tokens", tokens.len(), distinct.len());
    assert!(tokens.len() >= 3, "too few attempts seen: {}", tokens.len());
    assert_eq!(distinct.len(), tokens.len(), "an attempt reused a token");
}
