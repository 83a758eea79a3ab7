//! Contention: waiting by notification, split votes and their take-backs, refused options,
//! stalls seen by waiters, and a token per attempt.

use super::*;

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
    // The lock returns once a majority answered: the last server's SET may land later, and
    // must not be counted below.
    for s in &servers {
        eventually(
            "the holder's SET reached every server",
            Duration::from_secs(10),
            async || s.exists("lock:{held}").await,
        )
        .await;
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
    tells_the_holders_time(&other, "acct").await;
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
    let servers = servers(3);
    let locker = locker(&servers, Duration::from_secs(10)).await;
    held_elsewhere(&servers[..2], "lock:{acct}", "someone").await;
    let mut sets = SetsOf::watch(&servers[2], "lock:{acct}").await;

    let e = locker
        .lock("acct")
        .wait(Duration::from_millis(1700))
        .await
        .map(|_| ())
        .expect_err("held on 2 of 3 servers");
    assert!(matches!(e, LockError::Timeout { .. }), "{e:?}");

    // The token each attempt wrote.
    let mut tokens = Vec::new();
    while let Some(token) = sets.next(Duration::from_millis(200)).await {
        tokens.push(token);
    }
    let distinct: std::collections::HashSet<&String> = tokens.iter().collect();
    println!("{} attempts, {} tokens", tokens.len(), distinct.len());
    assert!(tokens.len() >= 3, "too few attempts seen: {}", tokens.len());
    assert_eq!(distinct.len(), tokens.len(), "an attempt reused a token");
}

/// A waiter's attempts while a server stalls leave `SET`s queued there, which land when it
/// resumes: the first takes the key for an attempt refused long before, and answers busy to the
/// waiter's attempt in flight. That key is this process's own, being taken back: the waiter
/// retries within a few milliseconds, it does not take it for a holder's and nap until its
/// next ticket refresh (750 ms) with the lock free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_gets_a_free_lock_soon_after_a_stall_ends() {
    let mut servers = servers(3);
    let locker = locker(&servers, Duration::from_secs(10)).await;
    all_reachable(&locker, &servers).await;
    let key = "lock:{stall}";
    held_elsewhere(&servers[..1], key, "someone").await;
    held_elsewhere_for(&servers[1..2], key, "brief", 150).await;
    servers[2].pause();
    let wait = {
        let locker = locker.clone();
        tokio::spawn(async move { locker.lock("stall").wait(Duration::from_secs(4)).await })
    };
    // Long enough for the brief key to expire and several split attempts to queue on C.
    tokio::time::sleep(Duration::from_millis(300)).await;
    servers[2].resume();
    let resumed = Instant::now();
    let guard = wait.await.unwrap().expect("free on B and C once C resumes");
    let took = resumed.elapsed();
    guard.release().await.unwrap();
    println!("acquired {took:?} after the stall ended");
    assert!(
        took < Duration::from_millis(400),
        "idled {took:?} with the lock free"
    );
}

/// The hazard a token per attempt closes: a copy of a waiter's refused attempt left on a server
/// (its take-back failed, or its `SET` landed after it) with an expiry before the next
/// attempt's validity ends. Here the copy is planted with the token of the waiter's second
/// attempt, seen with MONITOR, after its take-back; the lock must be acquired on servers whose
/// keys live the full lease, not on that copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_copy_of_a_waiters_refused_attempt_is_never_counted() {
    let servers = servers(3);
    let locker = locker(&servers, Duration::from_secs(10)).await;
    let key = "lock:{stale}";
    held_elsewhere(&servers[..1], key, "someone").await;
    held_elsewhere_for(&servers[1..2], key, "brief", 300).await;
    let mut sets = SetsOf::watch(&servers[2], key).await;
    let wait = {
        let locker = locker.clone();
        tokio::spawn(async move { locker.lock("stale").wait(Duration::from_secs(3)).await })
    };
    let mut tokens = Vec::new();
    while tokens.len() < 2 {
        tokens.push(sets.next(Duration::from_secs(3)).await.expect("an attempt"));
    }
    drop(sets);
    // After the second attempt's take-back: its key is gone from the free server.
    eventually(
        "the second attempt taken back",
        Duration::from_secs(2),
        async || servers[2].get(key).await.as_deref() != Some(tokens[1].as_str()),
    )
    .await;
    // The copy: the second attempt's token, expiring before a later attempt's validity ends.
    let copy = redis::cmd("SET")
        .arg(key)
        .arg(&tokens[1])
        .arg("PX")
        .arg(550)
        .clone();
    let _: () = servers[2].query(copy).await;
    let guard = wait
        .await
        .unwrap()
        .expect("acquired once the brief key expires");
    let mut full = 0;
    for s in &servers {
        let owner: Option<String> = s.query(redis::cmd("GET").arg(key).clone()).await;
        let pttl: i64 = s.query(redis::cmd("PTTL").arg(key).clone()).await;
        if owner.is_some_and(|o| o != "someone") && pttl > 5_000 {
            full += 1;
        }
    }
    assert!(
        full >= 2,
        "acquired on {full} servers with the full lease: a quorum member expires early"
    );
    guard.release().await.unwrap();
}

/// A take-back whose task is dropped before it ever runs (its runtime shutting down, with the
/// backend shared with another runtime) still counts as ended: otherwise its server's busy
/// votes would be taken for this process's own key forever, and `try_lock` on a lock held
/// for 10 s would say "retry in a few ms" (waiters would poll it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_back_dropped_with_its_runtime_does_not_make_waiters_poll() {
    let mut servers = servers(3);
    let locker = locker(&servers, Duration::from_secs(10)).await;
    all_reachable(&locker, &servers).await;
    let key = "lock:{rt}";
    held_elsewhere(&servers[1..2], key, "someone").await;
    servers[2].pause();
    let other_runtime = locker.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.spawn(async move { other_runtime.try_lock("rt").await.map(|_| ()) });
        // A said yes, B busy, C stalled: undecided for up to the 100 ms per-server bound
        // when the runtime goes, with the attempt's take-backs spawned but never run.
        rt.block_on(async { tokio::time::sleep(Duration::from_millis(40)).await });
        drop(rt);
    })
    .join()
    .unwrap();
    servers[2].resume();
    // A's copy of the dropped attempt is left to a holder: held for 10 s on A and B.
    let _: () = servers[0].query(redis::cmd("DEL").arg(key).clone()).await;
    held_elsewhere(&servers[..2], key, "someone").await;
    tells_the_holders_time(&locker, "rt").await;
}

/// Three `try_lock`s of `key`, held for about 10 s more on a majority, are refused with the
/// holder's time (or none), not a pause of a few milliseconds.
async fn tells_the_holders_time(locker: &Locker, key: &str) {
    for _ in 0..3 {
        match locker.try_lock(key).await {
            Err(LockError::Busy { retry_after, .. }) => assert!(
                retry_after.is_none_or(|d| d > Duration::from_secs(1)),
                "held ~10 s more on a majority, yet retry after {retry_after:?}"
            ),
            answer => panic!("{:?}", answer.map(|_| ())),
        }
    }
}

/// The tokens `SET`s write to one key on one server, seen with MONITOR on a connection of its
/// own (the test servers have no password).
struct SetsOf {
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::net::TcpStream>>,
    /// What precedes the token in a MONITOR line: `... "SET" "<key>" "<token>" "NX" ...`.
    before_token: String,
}

impl SetsOf {
    async fn watch(server: &RedisServer, key: &str) -> Self {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        assert_eq!(server.password(), None, "MONITOR is sent without AUTH");
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", server.port()))
            .await
            .unwrap();
        stream.write_all(b"MONITOR\r\n").await.unwrap();
        let mut lines = tokio::io::BufReader::new(stream).lines();
        assert_eq!(lines.next_line().await.unwrap().as_deref(), Some("+OK"));
        SetsOf {
            lines,
            before_token: format!(r#""SET" "{key}" ""#),
        }
    }

    /// The token of the next `SET` of the key; `None` when the server shows nothing for
    /// `quiet`.
    async fn next(&mut self, quiet: Duration) -> Option<String> {
        loop {
            let line = tokio::time::timeout(quiet, self.lines.next_line())
                .await
                .ok()?
                .unwrap()?;
            if let Some((_, rest)) = line.split_once(&self.before_token) {
                return Some(rest.split('"').next().unwrap().to_owned());
            }
        }
    }
}
