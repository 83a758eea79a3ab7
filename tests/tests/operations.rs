//! What the people on call do, on a real redis-server with lock clients in their own OS
//! processes (`lock-worker serve`, see `lock_tests::worker`): `inspect` from another process
//! (holder, age, fence, waiters; nothing after the release), `force_unlock` of a stuck holder
//! (the waiter woken at once, the old holder's release `LeaseLost` and its fenced write
//! refused), and `list` over 100,000 keys holding one page at a time. The conformance suite
//! (`operations` area) checks the same API on every backend; this file adds what needs
//! processes, a fenced store and volume. Durations asserted are correctness bounds (an age
//! against the clock that measured it, a wake-up against the waiter's own timer), not speed
//! claims; figures are printed.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout,
    reason = "test code: a failed expectation fails the test; figures are printed for the notes"
)]

mod support;

use std::time::{Duration, Instant};

use lock_core::{LockError, Locker, RedisBackend};
use lock_testkit::proxy::Proxy;
use lock_testkit::{ChildProcess, RedisServer};
use lock_tests::worker::WorkerArgs;

use support::{locker, locker_at, ready, until_queued};

/// The holder identity of the agent process.
const AGENT: &str = "agent-7/pid of a lock-worker";

/// A `lock-worker serve` process on `server` naming itself `holder`.
async fn agent(server: &RedisServer, holder: &str) -> ChildProcess {
    let args = WorkerArgs::serve(&server.url())
        .wait_ms(10_000)
        .holder(holder);
    ready(ChildProcess::spawn(
        env!("CARGO_BIN_EXE_lock-worker"),
        args.to_args(),
    ))
    .await
}

/// Asks the agent to hold `key` (fenced, 30 s lease, renewed): its fence.
async fn hold(agent: &mut ChildProcess, key: &str) -> u64 {
    let answer = agent.ask(&format!("HOLD {key} 30000 1")).await;
    answer
        .strip_prefix(&format!("HELD {key} fence="))
        .and_then(|f| f.parse().ok())
        .unwrap_or_else(|| panic!("the agent could not hold {key}: {answer}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_from_another_process_sees_holder_age_fence_and_waiters_then_nothing() {
    let server = RedisServer::start();
    let mut agent = agent(&server, AGENT).await;
    let inspector = locker(&server, Duration::from_secs(5)).await;
    assert!(!inspector.inspect("report").await.unwrap().held);

    let sent = Instant::now();
    let fence = hold(&mut agent, "report").await;
    let answered = Instant::now();
    let state = inspector.inspect("report").await.unwrap();
    let (age_low, age_high) = (answered.elapsed(), sent.elapsed());
    assert!(state.held, "{state:?}");
    assert_eq!(state.holder.as_deref(), Some(AGENT));
    assert_eq!(state.fence, Some(fence));
    assert_eq!(state.waiters, 0);
    let held_for = state.held_for.expect("the age of the lock");
    // The agent stamped the lock between our command and its answer: its age is between the
    // two, within the 50 ms of two clocks read a few ms apart on one host.
    let slack = Duration::from_millis(50);
    assert!(
        held_for + slack >= age_low && held_for <= age_high + slack,
        "held for {held_for:?}; taken between {age_low:?} and {age_high:?} ago"
    );
    let remaining = state.remaining.expect("the lease left");
    assert!(remaining <= Duration::from_secs(30) && remaining > Duration::from_secs(25));
    println!(
        "inspect: held for {held_for:?} (taken {age_low:?}..{age_high:?} ago), {remaining:?} left"
    );

    // A waiter of this process queues: counted.
    let waiter = inspector.clone();
    let waiting = tokio::spawn(async move {
        let g = waiter
            .lock("report")
            .fair()
            .wait(Duration::from_secs(10))
            .await
            .expect("served after the agent's release");
        g.release().await.expect("release");
    });
    until_queued(&server, "report", 1).await;
    assert_eq!(inspector.inspect("report").await.unwrap().waiters, 1);

    assert_eq!(agent.ask("RELEASE report").await, "RELEASED report ok");
    waiting.await.unwrap();
    let after = inspector.inspect("report").await.unwrap();
    assert!(!after.held && after.holder.is_none() && after.held_for.is_none());
    assert_eq!((after.fence, after.waiters), (Some(fence), 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_unlock_wakes_the_waiter_at_once_and_the_stuck_holder_is_refused() {
    let server = RedisServer::start();
    let (mut stuck, mut next) = (agent(&server, AGENT).await, agent(&server, "agent-8").await);
    let old = hold(&mut stuck, "vault").await;
    // A waiter in another process, fenced; its own timer would try again after 750 ms (a
    // quarter of the hand-over lease): a wake-up well before that is the force unlock's.
    next.send("WAIT vault w1 order fenced keep").await;
    until_queued(&server, "vault", 1).await;

    let operator = locker(&server, Duration::from_secs(5)).await;
    let start = Instant::now();
    let removed = operator
        .force_unlock("vault")
        .await
        .unwrap()
        .expect("a held lock removed");
    let done = next.line().await;
    let woken = start.elapsed();
    println!("force_unlock: the waiter was served {woken:?} after the call began");
    assert_eq!(removed.holder.as_deref(), Some(AGENT));
    assert_eq!(removed.fence, Some(old));
    let fence: u64 = done
        .strip_prefix("DONE w1 fence=")
        .and_then(|f| f.parse().ok())
        .unwrap_or_else(|| panic!("the waiter: {done}"));
    assert!(fence > old, "{fence} after {old}");
    assert!(
        woken < Duration::from_millis(500),
        "served {woken:?} after the force unlock: by its timer, not woken"
    );
    let state = operator.inspect("vault").await.unwrap();
    assert_eq!(state.holder.as_deref(), Some("agent-8"));

    // The new holder writes first; the stuck one's fenced write is refused, its release too.
    assert_eq!(
        next.ask("WRITE vault store").await,
        "WRITE vault ok held=true"
    );
    assert_eq!(
        stuck.ask("WRITE vault store").await,
        "WRITE vault rejected held=true"
    );
    assert_eq!(
        stuck.ask("RELEASE vault").await,
        "RELEASED vault err=LeaseLost"
    );
    assert_eq!(next.ask("RELEASE vault").await, "RELEASED vault ok");
    assert_eq!(operator.force_unlock("vault").await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_100_000_locks_holds_one_page_at_a_time() {
    const LOCKS: usize = 100_000;
    let server = RedisServer::start();
    // Written straight into Redis as held locks look (a token and a stamp, a lease), plus as
    // many other keys of the same prefix that are not locks (fence counters) and keys of
    // another prefix: the listing skips both.
    let mut conn = server.client().await;
    for chunk in (0..LOCKS).collect::<Vec<_>>().chunks(10_000) {
        let mut pipe = redis::pipe();
        for i in chunk {
            let value = format!("{:032x}|1764000000000|bulk loader|", i);
            pipe.cmd("SET")
                .arg(format!("lock:{{job:{i}}}"))
                .arg(value)
                .arg("PX")
                .arg(600_000)
                .ignore();
            pipe.cmd("SET")
                .arg(format!("lock:{{job:{i}}}:fence"))
                .arg(7)
                .ignore();
            pipe.cmd("SET")
                .arg(format!("other:{{job:{i}}}"))
                .arg("x")
                .ignore();
        }
        let () = pipe.query_async(&mut conn).await.unwrap();
    }
    let locker = Locker::builder(RedisBackend::connect(&server.url()).await.unwrap()).build();
    let start = Instant::now();
    let mut held = locker.list("job:*");
    let (mut count, mut most) = (0, 0);
    while let Some(state) = held.next().await {
        let state = state.unwrap();
        assert!(state.held && state.holder.as_deref() == Some("bulk loader"));
        assert_eq!(state.fence, Some(7));
        count += 1;
        most = most.max(held.buffered());
    }
    println!(
        "listed {count} locks in {:?}, at most {most} buffered",
        start.elapsed()
    );
    assert_eq!(count, LOCKS);
    assert!(most <= 1000, "{most} states held at once");
    // A pattern matches user keys, not the backend's names.
    let mut few = locker.list("job:4242*");
    let mut keys = Vec::new();
    while let Some(state) = few.next().await {
        keys.push(state.unwrap().key);
    }
    keys.sort();
    let expected: Vec<String> = std::iter::once("job:4242".to_owned())
        .chain((0..10).map(|i| format!("job:4242{i}")))
        .collect();
    assert_eq!(keys, expected);
    assert!(locker.list("nothing:*").next().await.is_none());
}

/// A force unlock whose answer is lost with its connection is not sent again (a second run,
/// with no token to check, would remove the waiter the first one handed the lock to): the
/// caller gets an error that says to inspect, and the waiter keeps the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_unlock_whose_answer_is_lost_is_not_sent_again() {
    let server = RedisServer::start();
    let proxy = Proxy::start(format!("127.0.0.1:{}", server.port()).parse().unwrap()).await;
    let named = async |url: &str, holder: &str| {
        let backend = RedisBackend::builder(url)
            .response_timeout(Duration::from_secs(10))
            .connect_timeout(Duration::from_secs(10))
            .connect()
            .await
            .unwrap();
        Locker::builder(backend).holder(holder).build()
    };
    let stuck = named(&server.url(), "stuck").await;
    let (w1, w2) = (
        named(&server.url(), "waiter-1").await,
        named(&server.url(), "waiter-2").await,
    );
    let operator = named(&format!("redis://{}/", proxy.addr()), "operator").await;
    // Its script is loaded, so the call below is one EVALSHA.
    assert_eq!(operator.force_unlock("warm").await.unwrap(), None);
    let _stuck = stuck.lock("vault").await.unwrap();
    let first = tokio::spawn(async move { w1.lock("vault").wait(Duration::from_secs(20)).await });
    until_queued(&server, "vault", 1).await;
    let second = tokio::spawn(async move { w2.lock("vault").wait(Duration::from_secs(20)).await });
    until_queued(&server, "vault", 2).await;

    // The call reaches Redis; its answer is held back, then the connection cut.
    proxy.freeze_after(b"lock:{vault}");
    let call = tokio::spawn({
        let operator = operator.clone();
        async move { operator.force_unlock("vault").await }
    });
    proxy.wait_frozen().await;
    proxy.cut();
    proxy.restore();
    let answer = call.await.unwrap();
    let err = answer.expect_err("no answer came back");
    assert!(err.to_string().contains("inspect it"), "{err}");
    // It ran once: the first waiter was handed the lock and keeps it.
    let g1 = first.await.unwrap().expect("the first waiter served");
    let now = operator.inspect("vault").await.unwrap();
    assert_eq!(now.holder.as_deref(), Some("waiter-1"), "{now:?}");
    assert!(g1.is_held());
    g1.release().await.unwrap();
    second.await.unwrap().unwrap().release().await.unwrap();
}

/// A key under the prefix that is not UTF-8 (no lock of ours) is skipped by a listing, which
/// still lists the locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_that_is_not_utf8_is_skipped_by_a_listing() {
    let server = RedisServer::start();
    let locker = locker(&server, Duration::from_secs(5)).await;
    let held = locker.lock("order:1").await.unwrap();
    let () = server
        .query(redis::cmd("SET").arg(&b"lock:{\xff}"[..]).arg("x").clone())
        .await;
    let mut listing = locker.list("*");
    let first = listing.next().await.expect("one lock").unwrap();
    assert_eq!(first.key, "order:1");
    assert!(listing.next().await.is_none());
    held.release().await.unwrap();
}

/// A force unlock whose answer does not come back in time (a timeout, not a dropped
/// connection) is not sent again either, and its error says the outcome is unknown: the lock
/// may have been removed, inspect it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_unlock_that_times_out_says_the_outcome_is_unknown() {
    let server = RedisServer::start();
    let proxy = Proxy::start(format!("127.0.0.1:{}", server.port()).parse().unwrap()).await;
    let backend = RedisBackend::builder(&format!("redis://{}/", proxy.addr()))
        .response_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    let operator = Locker::builder(backend).holder("operator").build();
    assert_eq!(operator.force_unlock("warm").await.unwrap(), None);
    let stuck = locker(&server, Duration::from_secs(5)).await;
    let _stuck = stuck.lock("vault").await.unwrap();
    proxy.freeze_after(b"lock:{vault}");
    let err = operator
        .force_unlock("vault")
        .await
        .expect_err("no answer came back");
    let text = err.to_string();
    assert!(
        text.contains("outcome is unknown") && text.contains("inspect it"),
        "{text}"
    );
    // It ran once, on the server: the lock is gone.
    assert!(!stuck.inspect("vault").await.unwrap().held);
    proxy.cut();
}

/// `force_unlock_seen` removes the holding an operator saw, and nothing else: after the lock
/// changed hands, even to a new acquire by the same holder (same name, unfenced), it answers
/// `ChangedHands` and the new holding stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_unlock_seen_removes_only_the_holding_seen() {
    use lock_core::Unlocked;
    let server = RedisServer::start();
    let app = locker(&server, Duration::from_secs(5)).await;
    let operator = locker(&server, Duration::from_secs(5)).await;
    // A free lock seen removes nothing, even a holding without a stamp (an older version's,
    // written here by hand: no since, no fence, as the free state has none).
    let free = operator.inspect("vault").await.unwrap();
    server
        .set("lock:{vault}", "0123456789abcdef0123456789abcdef")
        .await;
    assert!(matches!(
        operator.force_unlock_seen(&free).await.unwrap(),
        Unlocked::ChangedHands(_)
    ));
    assert!(server.exists("lock:{vault}").await);
    server.del("lock:{vault}").await;
    let first = app.lock("vault").await.unwrap();
    let seen = operator.inspect("vault").await.unwrap();
    assert!(seen.since.is_some(), "{seen:?}");
    // The same holder releases and takes it again: another holding, same name, same fence.
    first.release().await.unwrap();
    // A new stamp needs a new millisecond.
    tokio::time::sleep(Duration::from_millis(2)).await;
    let second = app.lock("vault").await.unwrap();
    let now = operator.inspect("vault").await.unwrap();
    assert_eq!(
        (now.holder.as_ref(), now.fence),
        (seen.holder.as_ref(), seen.fence)
    );
    assert_ne!(now.since, seen.since);
    match operator.force_unlock_seen(&seen).await.unwrap() {
        Unlocked::ChangedHands(state) => assert_eq!(state.since, now.since),
        other => panic!("{other:?}"),
    }
    assert!(operator.inspect("vault").await.unwrap().held);
    // The holding seen now is removed, once.
    match operator.force_unlock_seen(&now).await.unwrap() {
        Unlocked::Removed(state) => assert_eq!(state.since, now.since),
        other => panic!("{other:?}"),
    }
    assert!(!operator.inspect("vault").await.unwrap().held);
    assert_eq!(
        operator.force_unlock_seen(&now).await.unwrap(),
        Unlocked::NotHeld
    );
    assert!(matches!(
        second.release().await,
        Err(lock_core::LockError::LeaseLost { .. })
    ));
}

/// The operators' calls as a Redis user that lacks a command they run: a typed
/// `InvalidConfig` naming the command and pointing at the guide's ACL rule, never a generic
/// retryable backend error. `force_unlock` is checked before it writes: a user that may not
/// pop the queue (its script deletes the lock first) is refused with "nothing was removed",
/// and the lock stays held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_refused_by_the_acl_name_the_missing_command() {
    let server = RedisServer::start();
    let app = locker(&server, Duration::from_secs(5)).await;
    let guard = app.lock("job").await.unwrap();
    let user = async |name: &str, without: &str| {
        let () = server
            .query(
                redis::cmd("ACL")
                    .arg(&["SETUSER", name, "on", ">pw", "~lock:*", "&lock:*", "+@all"][..])
                    .arg(without)
                    .clone(),
            )
            .await;
        let url = format!("redis://{name}:pw@127.0.0.1:{}/", server.port());
        locker_at(&url, Duration::from_secs(5)).await
    };
    let check = |r: Result<(), LockError>, names: &[&str], doing: &str| match r {
        Err(LockError::InvalidConfig { what, .. }) => {
            for name in names.iter().chain(&["docs/src/backends/redis.md"]) {
                assert!(what.contains(name), "{doing}: {name} in {what}");
            }
            assert!(!what.contains("nothing was locked"), "{doing}: {what}");
            println!("{doing}: {what}");
        }
        other => panic!("{doing}: expected InvalidConfig naming {names:?}, got {other:?}"),
    };
    let listed = async |l: &Locker| match l.list("*").next().await {
        Some(Err(e)) => Err(e),
        other => panic!("a refusal, got {other:?}"),
    };
    let no_hvals = user("nohvals", "-hvals").await;
    check(
        no_hvals.inspect("job").await.map(drop),
        &["HVALS"],
        "inspect without HVALS",
    );
    check(listed(&no_hvals).await, &["HVALS"], "list without HVALS");
    let no_time = user("notime", "-time").await;
    check(
        no_time.inspect("job").await.map(drop),
        &["TIME"],
        "inspect without TIME",
    );
    check(listed(&no_time).await, &["TIME"], "list without TIME");
    let no_scan = user("noscan", "-scan").await;
    check(listed(&no_scan).await, &["SCAN"], "list without SCAN");
    let no_lpop = user("nolpop", "-lpop").await;
    check(
        no_lpop.force_unlock("job").await.map(drop),
        &["LPOP", "nothing was removed"],
        "force_unlock without LPOP",
    );
    assert!(guard.is_held());
    assert_eq!(
        app.inspect("job").await.unwrap().holder,
        Some(app.holder().to_owned())
    );
    guard.release().await.unwrap();
}
