//! What the people on call do, on Redlock (issue 33): `inspect`, `force_unlock` and `list` judged
//! over the quorum. A lock is held when a quorum of servers hold the same acquisition (never
//! from a minority); `force_unlock` removes that acquisition only (another token on a server,
//! a contender's minority, is left alone), wakes a waiter at once and the old holder learns;
//! a listing reports each held lock once, also with a server down; too few servers is an
//! error, never a guess, and so is a removal whose answers are lost on a majority (logged);
//! no token (nor its digest) in a state, an error or a log line.
//!
//! Values "held elsewhere" are written straight onto the servers in the library's format
//! (`<token>|<since ms>|<holder>|`), as another client's acquisition would leave them.

use std::sync::{Arc, Mutex};

use lock_core::LockState;

use super::*;

/// A value in the library's format: a fresh 32-hex-digit token, stamped now with `holder`.
fn stamped(holder: &str) -> String {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let token = lock_core::backend::Token::generate();
    format!("{}|{since}|{holder}|", token.as_str())
}

/// Writes `value` as lock `key` (prefix `lock:`) on `servers`, for 30 s.
async fn write_on(servers: &[&RedisServer], key: &str, value: &str) {
    for s in servers {
        let set = redis::cmd("SET")
            .arg(format!("lock:{{{key}}}"))
            .arg(value)
            .arg("PX")
            .arg(30_000)
            .clone();
        let _: () = s.query(set).await;
    }
}

/// The held locks matching `pattern`, in the order listed.
async fn listed(locker: &Locker, pattern: &str) -> Result<Vec<LockState>, LockError> {
    let mut held = locker.list(pattern);
    let mut states = Vec::new();
    while let Some(state) = held.next().await {
        states.push(state?);
    }
    Ok(states)
}

fn keys_of(states: &[LockState]) -> Vec<&str> {
    let mut keys: Vec<&str> = states.iter().map(|s| s.key.as_str()).collect();
    keys.sort_unstable();
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_on_a_minority_is_neither_held_nor_listed_nor_removed() {
    let servers = servers(5);
    let operator = locker(&servers, Duration::from_secs(5)).await;
    all_reachable(&operator, &servers).await;
    let s: Vec<&RedisServer> = servers.iter().collect();
    // Two of five: a contender's minority.
    let minority = stamped("minority holder");
    write_on(&s[..2], "minor", &minority).await;
    // A split: two acquisitions on two servers each, the fifth free.
    write_on(&s[..2], "split", &stamped("left")).await;
    write_on(&s[2..4], "split", &stamped("right")).await;
    // Three of five: held.
    write_on(&s[2..], "major", &stamped("majority holder")).await;
    for key in ["minor", "split"] {
        let state = operator.inspect(key).await.unwrap();
        assert!(!state.held, "{key}: {state:?}");
        assert!(state.holder.is_none() && state.remaining.is_none() && state.held_for.is_none());
        assert_eq!(operator.force_unlock(key).await.unwrap(), None, "{key}");
    }
    // Nothing of the minority was touched.
    for server in &s[..2] {
        assert_eq!(
            server.get("lock:{minor}").await.as_deref(),
            Some(minority.as_str())
        );
    }
    let major = operator.inspect("major").await.unwrap();
    assert!(major.held, "{major:?}");
    assert_eq!(major.holder.as_deref(), Some("majority holder"));
    assert_eq!(major.fence, None, "Redlock keeps no fence counter");
    let left = major.remaining.unwrap();
    assert!(
        left <= Duration::from_secs(30) && left > Duration::from_secs(25),
        "{left:?}"
    );
    assert!(major.held_for.unwrap() < Duration::from_secs(5));
    let states = listed(&operator, "*").await.unwrap();
    assert_eq!(keys_of(&states), ["major"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_unlock_removes_only_the_quorums_acquisition_and_wakes_the_waiter() {
    let servers = servers(5);
    let lease = Duration::from_secs(3);
    let stuck = Locker::builder(backend(&urls(&servers)).await)
        .lease(lease)
        .holder("stuck holder")
        .build();
    all_reachable(&stuck, &servers).await;
    let held = stuck.lock("job").await.unwrap();
    // A split on the fifth server: another acquisition's value there (the stuck holder's
    // token is on the other four).
    let other = stamped("intruder");
    write_on(&[&servers[4]], "job", &other).await;
    let waiter = Locker::builder(backend(&urls(&servers)).await)
        .lease(Duration::from_secs(10))
        .holder("waiter")
        .build();
    let waiting = tokio::spawn(async move {
        let guard = waiter.lock("job").wait(Duration::from_secs(20)).await;
        (guard, Instant::now())
    });
    // The waiter is queued on the servers before the lock is freed.
    eventually("the waiter announced", Duration::from_secs(5), async || {
        stuck.inspect("job").await.unwrap().waiters == 1
    })
    .await;
    let operator = locker(&servers, Duration::from_secs(5)).await;
    let freed = Instant::now();
    let removed = operator
        .force_unlock("job")
        .await
        .unwrap()
        .expect("the quorum's lock was removed");
    assert!(removed.held);
    assert_eq!(removed.holder.as_deref(), Some("stuck holder"));
    assert_eq!(removed.waiters, 1);
    // The intruder's value on the fifth server is left as it was.
    assert_eq!(
        servers[4].get("lock:{job}").await.as_deref(),
        Some(other.as_str())
    );
    let (next, at) = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiter is served long before the stuck lease or its wait ends")
        .unwrap();
    let next = next.expect("the waiter gets the lock");
    let woke = at.duration_since(freed);
    println!("force_unlock on Redlock: the waiter held the lock {woke:?} after the call began");
    assert!(
        woke < lease,
        "served after {woke:?}: by the lease, not the force"
    );
    // The stuck holder learns at its next renewal, and its release touches nothing.
    tokio::time::timeout(lease * 2, held.lost())
        .await
        .expect("the evicted holder is told");
    assert!(!held.is_held());
    match held.release().await {
        Err(LockError::LeaseLost { .. }) => {}
        other => panic!("the evicted holder's release: {other:?}"),
    }
    let now = operator.inspect("job").await.unwrap();
    assert!(now.held && next.is_held(), "{now:?}");
    assert_eq!(now.holder.as_deref(), Some("waiter"));
    assert_eq!(
        servers[4].get("lock:{job}").await.as_deref(),
        Some(other.as_str())
    );
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_held_lock_is_listed_once_also_with_a_server_down() {
    const EVERYWHERE: usize = 1500;
    let mut servers = servers(5);
    let operator = locker(&servers, Duration::from_secs(5)).await;
    all_reachable(&operator, &servers).await;
    // Held on all five (the first scanned finds them all: listed from it only), over several
    // SCAN pages.
    let values: Vec<String> = (0..EVERYWHERE).map(|_| stamped("everywhere")).collect();
    for s in &servers {
        let mut conn = s.client().await;
        let mut pipe = redis::pipe();
        for (i, value) in values.iter().enumerate() {
            pipe.cmd("SET")
                .arg(format!("lock:{{all:{i}}}"))
                .arg(value)
                .arg("PX")
                .arg(60_000)
                .ignore();
        }
        let _: () = pipe.query_async(&mut conn).await.unwrap();
    }
    // Held on the last three only: found on the third server scanned.
    let s: Vec<&RedisServer> = servers.iter().collect();
    for i in 0..10 {
        write_on(&s[2..], &format!("late:{i}"), &stamped("late")).await;
    }
    // On a minority: never listed.
    write_on(&s[..2], "minor", &stamped("minority")).await;
    // Held on servers 2 to 4, another acquisition's minority on the first two (scanned
    // first): listed once, from the first server holding the quorum's acquisition.
    let quorum = stamped("split quorum");
    write_on(&s[..2], "split", &stamped("split minority")).await;
    write_on(&s[2..], "split", &quorum).await;
    for round in ["all up", "the first server down"] {
        let started = Instant::now();
        let states = listed(&operator, "*").await.unwrap();
        let keys = keys_of(&states);
        let mut unique = keys.clone();
        unique.dedup();
        assert_eq!(unique.len(), keys.len(), "{round}: a lock listed twice");
        assert_eq!(keys.len(), EVERYWHERE + 11, "{round}");
        assert!(!keys.contains(&"minor"));
        assert!(states.iter().all(|s| s.held));
        println!(
            "listing {} Redlock locks ({round}) took {:?}",
            keys.len(),
            started.elapsed()
        );
        let late = listed(&operator, "late:*").await.unwrap();
        assert_eq!(late.len(), 10, "{round}");
        assert!(late.iter().all(|s| s.holder.as_deref() == Some("late")));
        let split = listed(&operator, "split").await.unwrap();
        assert_eq!(keys_of(&split), ["split"], "{round}");
        assert_eq!(split[0].holder.as_deref(), Some("split quorum"));
        servers[0].stop();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_answers_from_a_quorum_and_fails_without_one() {
    let mut servers = servers(5);
    let holder = Locker::builder(backend(&urls(&servers)).await)
        .lease(Duration::from_secs(10))
        .holder("holder")
        .build();
    all_reachable(&holder, &servers).await;
    let guard = holder.lock("job").await.unwrap();
    let second = holder.lock("second").await.unwrap();
    // On exactly three servers, by hand: with one of them down nobody can tell.
    let s: Vec<&RedisServer> = servers.iter().collect();
    write_on(&s[..3], "bare", &stamped("bare quorum")).await;
    let operator = locker(&servers, Duration::from_secs(5)).await;
    servers[0].stop();
    let state = operator.inspect("job").await.unwrap();
    assert!(state.held && state.holder.as_deref() == Some("holder"));
    let undecided = operator.inspect("bare").await.unwrap_err();
    let q = no_quorum(&undecided).unwrap_or_else(|| panic!("{undecided:?}"));
    assert_eq!((q.answered, q.quorum, q.servers), (4, 3, 5));
    assert!(operator.force_unlock("bare").await.is_err());
    assert!(
        listed(&operator, "*").await.is_err(),
        "a listing meeting it"
    );
    // A stalled server is not waited for once a quorum settles the answer (waiting for it
    // would take the response timeout, 500 ms here).
    servers[1].pause();
    let asked = Instant::now();
    let state = operator.inspect("job").await.unwrap();
    let took = asked.elapsed();
    assert!(
        state.held && state.holder.as_deref() == Some("holder"),
        "3 of 5 answer"
    );
    println!("inspect on Redlock with a server down and one stalled: {took:?}");
    assert!(took < Duration::from_millis(500), "{took:?}");
    // Nor by a removal: it is decided once fewer than a quorum are unheard.
    let asked = Instant::now();
    let removed = operator.force_unlock("second").await.unwrap();
    let took = asked.elapsed();
    assert_eq!(removed.unwrap().holder.as_deref(), Some("holder"));
    println!("force_unlock on Redlock with a server down and one stalled: {took:?}");
    assert!(took < Duration::from_millis(500), "{took:?}");
    tokio::time::timeout(Duration::from_secs(10), second.lost())
        .await
        .expect("the evicted holder is told");
    servers[1].stop();
    assert!(operator.inspect("job").await.unwrap().held, "3 of 5 up");
    assert_eq!(
        keys_of(&listed(&operator, "job").await.unwrap()),
        ["job"],
        "3 of 5 up"
    );
    servers[2].stop();
    for e in [
        operator.inspect("job").await.unwrap_err(),
        operator.force_unlock("job").await.unwrap_err(),
        listed(&operator, "*").await.unwrap_err(),
    ] {
        let q = no_quorum(&e).unwrap_or_else(|| panic!("not a NoQuorum error: {e:?}"));
        assert_eq!((q.answered, q.quorum), (2, 3), "{e}");
        assert!(e.is_retryable());
    }
    // The lock was never touched by any of it.
    for server in &servers[3..] {
        assert!(server.exists("lock:{job}").await);
    }
    drop(guard);
}

/// Every event's and span's fields, as text.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<String>>);

struct Fields<'a>(&'a mut String);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write as _;
        let _ = write!(self.0, "{}={value:?} ", field.name());
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Captured {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _id: &tracing::span::Id,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        attrs.record(&mut Fields(&mut self.0.lock().unwrap()));
    }

    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut text = self.0.lock().unwrap();
        text.push_str(event.metadata().target());
        text.push(' ');
        event.record(&mut Fields(&mut text));
        text.push('\n');
    }
}

/// On one thread (the capture is the thread's subscriber): every task of the test logs into it.
#[tokio::test(flavor = "current_thread")]
async fn no_token_nor_its_digest_in_states_errors_or_logs() {
    use tracing_subscriber::layer::SubscriberExt;

    let captured = Captured::default();
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(captured.clone()));
    let servers = servers(3);
    let lease = Duration::from_secs(2);
    let stuck = Locker::builder(backend(&urls(&servers)).await)
        .lease(lease)
        .holder("stuck holder")
        .build();
    all_reachable(&stuck, &servers).await;
    let held = stuck.lock("job").await.unwrap();
    let value = servers[0].get("lock:{job}").await.unwrap();
    let token = value.split('|').next().unwrap().to_owned();
    assert_eq!(token.len(), 32, "{value}");
    let digest: String = servers[0]
        .query(
            redis::cmd("EVAL")
                .arg("return redis.sha1hex(ARGV[1])")
                .arg(0)
                .arg(&token)
                .clone(),
        )
        .await;
    let operator = locker(&servers, Duration::from_secs(5)).await;
    let mut shown = Vec::new();
    shown.push(format!("{:?}", operator.inspect("job").await.unwrap()));
    shown.push(format!("{:?}", listed(&operator, "*").await.unwrap()));
    shown.push(format!("{:?}", operator.force_unlock("job").await.unwrap()));
    tokio::time::timeout(lease * 2, held.lost()).await.unwrap();
    let e = held.release().await.unwrap_err();
    shown.push(format!("{e} {e:?}"));
    // With the lock on a bare quorum and one of its servers down: the errors.
    write_on(&[&servers[0], &servers[1]], "job", &value).await;
    let mut servers = servers;
    servers[0].stop();
    for e in [
        operator.inspect("job").await.unwrap_err(),
        operator.force_unlock("job").await.unwrap_err(),
        listed(&operator, "*").await.unwrap_err(),
    ] {
        shown.push(format!("{e} {e:?}"));
    }
    let logs = captured.0.lock().unwrap().clone();
    assert!(
        logs.contains("force_unlock removed a held lock"),
        "the audit event: {logs}"
    );
    for text in shown.iter().chain([&logs]) {
        assert!(!text.contains(&token), "the token in: {text}");
        assert!(!text.contains(&digest), "the token's digest in: {text}");
    }
}

/// A removal whose answers are lost on a majority of the servers: the call reached them (each
/// removed the lock, once), but the operator cannot know it, so it gets a `NoQuorum` error
/// (not "removed", not "nothing held") and an audit warning naming the servers that did answer;
/// the lock is gone everywhere and the next holder takes it.
#[tokio::test(flavor = "current_thread")]
async fn a_removal_whose_answers_are_lost_on_a_majority_is_an_error_and_logged() {
    use lock_testkit::proxy::Proxy;
    use tracing_subscriber::layer::SubscriberExt;

    let captured = Captured::default();
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(captured.clone()));
    let servers = servers(3);
    let stuck = Locker::builder(backend(&urls(&servers)).await)
        .lease(Duration::from_secs(3))
        .holder("stuck holder")
        .build();
    all_reachable(&stuck, &servers).await;
    let mut proxies = Vec::new();
    for s in &servers[..2] {
        proxies.push(Proxy::start(format!("127.0.0.1:{}", s.port()).parse().unwrap()).await);
    }
    let mut through: Vec<String> = proxies
        .iter()
        .map(|p| format!("redis://{}/", p.addr()))
        .collect();
    through.push(servers[2].url());
    let through: Vec<&str> = through.iter().map(String::as_str).collect();
    let operator = Locker::builder(
        RedlockBackend::builder(&through)
            .response_timeout(Duration::from_secs(10))
            .connect()
            .await
            .unwrap(),
    )
    .build();
    // The removal's script is loaded on every server, so the call below is one EVALSHA each.
    let warm = stuck.lock("warm").await.unwrap();
    assert!(operator.force_unlock("warm").await.unwrap().is_some());
    drop(warm);
    let held = stuck.lock("vault").await.unwrap();
    let value = servers[0].get("lock:{vault}").await.unwrap();
    let token = value.split('|').next().unwrap().to_owned();
    let digest: String = servers[0]
        .query(
            redis::cmd("EVAL")
                .arg("return redis.sha1hex(ARGV[1])")
                .arg(0)
                .arg(&token)
                .clone(),
        )
        .await;
    // Only the removal carries the digest: it reaches the servers, their answers are held back.
    for p in &proxies {
        p.freeze_after(digest.as_bytes());
    }
    let call = tokio::spawn({
        let operator = operator.clone();
        async move { operator.force_unlock("vault").await }
    });
    for p in &proxies {
        p.wait_frozen().await;
    }
    // Each ran once, before its answer was lost.
    for s in &servers {
        assert!(!s.exists("lock:{vault}").await);
    }
    for p in &proxies {
        p.cut();
        p.restore();
    }
    let e = call.await.unwrap().expect_err("two of three answers lost");
    let q = no_quorum(&e).unwrap_or_else(|| panic!("not a NoQuorum error: {e:?}"));
    assert_eq!((q.answered, q.quorum, q.servers), (1, 2, 3));
    let logs = captured.0.lock().unwrap().clone();
    assert!(
        logs.contains("force_unlock removed the lock on some Redlock servers only")
            && logs.contains("removed_on=1"),
        "{logs}"
    );
    assert!(!logs.contains(&token) && !logs.contains(&digest));
    // The stuck holder learns; the next holder takes the lock and keeps it.
    tokio::time::timeout(Duration::from_secs(6), held.lost())
        .await
        .expect("the evicted holder is told");
    let next = operator.lock("vault").await.unwrap();
    assert!(operator.inspect("vault").await.unwrap().held);
    next.release().await.unwrap();
}
