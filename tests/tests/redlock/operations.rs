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
    // Each ran once, before its answer was lost (a frozen proxy has forwarded the removal,
    // which the server may not have run yet; the third server is reached directly).
    for s in &servers {
        eventually("the removal ran", Duration::from_secs(10), async || {
            !s.exists("lock:{vault}").await
        })
        .await;
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

/// One page of `pattern` straight from the backend (`Backend::list_page`, public), from `cursor`.
async fn page(
    backend: &RedlockBackend,
    pattern: &str,
    cursor: Option<&str>,
) -> Result<lock_core::backend::ListPage, LockError> {
    use lock_core::backend::{Backend, KeyPattern};
    let pattern = KeyPattern::new(pattern).unwrap();
    backend.list_page("lock:", &pattern, cursor).await
}

/// A server scanned earlier in a listing that fails later cannot say whether it holds a lock
/// found on a later server: it was listed from the earlier one already, so the page is an
/// error (the caller lists again), never the same lock a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_is_not_listed_twice_when_a_server_scanned_earlier_fails() {
    let mut servers = servers(5);
    let s: Vec<&RedisServer> = servers.iter().collect();
    for i in 0..10 {
        write_on(&s, &format!("dup:{i}"), &stamped("everywhere")).await;
    }
    let operator = backend(&urls(&servers)).await;
    let mut seen: Vec<String> = Vec::new();
    let first = page(&operator, "dup:*", None).await.unwrap();
    seen.extend(first.locks.iter().map(|l| l.key.clone()));
    let mut cursor = first.next;
    assert_eq!(seen.len(), 10, "all found on the first server scanned");
    assert!(
        cursor.as_deref().is_some_and(|c| c.starts_with("1 ")),
        "{cursor:?}"
    );
    // The first server, scanned already, goes down before the second is.
    servers[0].stop();
    while let Some(c) = cursor {
        match page(&operator, "dup:*", Some(&c)).await {
            Ok(next) => {
                seen.extend(next.locks.iter().map(|l| l.key.clone()));
                cursor = next.next;
            }
            Err(e) => {
                println!("the listing after the first server went down: {e}");
                break;
            }
        }
    }
    let mut unique = seen.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), seen.len(), "a lock listed twice: {seen:?}");
    // Listed again from the start: each once, from the servers up.
    let operator = Locker::builder(operator).build();
    assert_eq!(listed(&operator, "dup:*").await.unwrap().len(), 10);
}

/// `Backend::list_page` is public: a cursor it did not make (garbage, another backend's, one
/// naming servers it does not have) is a typed error at once, and one it could have made
/// (any scan position) ends: never a panic, never a listing without end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_listing_cursors_are_refused_or_end() {
    let servers = servers(3);
    let s: Vec<&RedisServer> = servers.iter().collect();
    for i in 0..20 {
        write_on(&s, &format!("c:{i}"), &stamped("everywhere")).await;
    }
    let operator = backend(&urls(&servers)).await;
    for bad in [
        "",
        " ",
        "0",
        "0 0",
        "0 0 - -",
        "3 0 -",
        "9 0 -",
        "18446744073709551616 0 -",
        "0 18446744073709551616 -",
        "-1 0 -",
        "0 -1 -",
        "2 0 -",
        "1 0 1",
        "1 0 0,0",
        "2 0 1,0",
        "0 0 ,",
        "0 0 0",
        "127.0.0.1:6379 0",
        "17",
        "0\t0\t-",
        "0  0 -",
        "0 0 -\n",
        "１ 0 -",
    ] {
        let answer = tokio::time::timeout(Duration::from_secs(5), page(&operator, "*", Some(bad)))
            .await
            .unwrap_or_else(|_| panic!("{bad:?}: no answer"));
        match answer {
            Err(LockError::InvalidConfig { .. }) => {}
            other => panic!("cursor {bad:?}: {other:?}"),
        }
    }
    // Any scan position on any server is a place a listing could be: it ends.
    for start in [
        "0 0 -",
        "0 18446744073709551615 -",
        "0 123456789 -",
        "1 7 0",
        "2 0 0,1",
    ] {
        let mut cursor = Some(start.to_owned());
        let mut pages = 0;
        while let Some(c) = cursor {
            pages += 1;
            assert!(pages < 1000, "{start:?}: no end after {pages} pages");
            let next = tokio::time::timeout(Duration::from_secs(5), page(&operator, "*", Some(&c)))
                .await
                .unwrap_or_else(|_| panic!("{c:?}: no answer"));
            match next {
                Ok(p) => cursor = p.next,
                // A scan of the servers too few to find every lock: refused, not guessed.
                Err(e) => {
                    assert!(no_quorum(&e).is_some(), "{start:?} at {c:?}: {e:?}");
                    break;
                }
            }
        }
    }
}

/// One acquisition's value takes several forms across the servers (bare token, marked with
/// '+', stamped, stamped and marked), and all are that acquisition, as the release scripts
/// read the token (the head before '|' or '+'); a token one digit off, or one with a digit
/// more, is another acquisition. Held and removed only where the forms of the one token are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_form_of_one_token_is_one_acquisition_and_no_other_is() {
    let servers = servers(5);
    let s: Vec<&RedisServer> = servers.iter().collect();
    let token = lock_core::backend::Token::generate();
    let t = token.as_str();
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let last = if t.ends_with('0') { '1' } else { '0' };
    let off_by_one = format!("{}{last}|{since}|off by one|", &t[..t.len() - 1]);
    let longer = format!("{t}0|{since}|longer|");
    // Two forms of other tokens beside two of the one token: no majority holds one.
    write_on(&s[..1], "forms", &format!("{t}+")).await;
    write_on(&s[1..2], "forms", &format!("{t}|{since}|forms holder|+")).await;
    write_on(&s[2..3], "forms", &off_by_one).await;
    write_on(&s[3..4], "forms", &longer).await;
    let operator = locker(&servers, Duration::from_secs(5)).await;
    let state = operator.inspect("forms").await.unwrap();
    assert!(!state.held, "two of five hold the token: {state:?}");
    assert_eq!(operator.force_unlock("forms").await.unwrap(), None);
    // The bare token on the fifth: three of five hold it, in three forms.
    write_on(&s[4..], "forms", t).await;
    let state = operator.inspect("forms").await.unwrap();
    assert!(state.held, "{state:?}");
    assert_eq!(state.holder.as_deref(), Some("forms holder"));
    let removed = operator
        .force_unlock("forms")
        .await
        .unwrap()
        .expect("removed");
    assert_eq!(removed.holder.as_deref(), Some("forms holder"));
    for i in [0, 1, 4] {
        assert!(!servers[i].exists("lock:{forms}").await, "server {i}");
    }
    assert_eq!(servers[2].get("lock:{forms}").await, Some(off_by_one));
    assert_eq!(servers[3].get("lock:{forms}").await, Some(longer));
}

/// The Redlock callers drop a server's pending call once the outcome is decided. On the
/// connection a server's backend uses (redis-rs's multiplexed `ConnectionManager`), a request
/// dropped at any point (before it is written, written and unanswered, single or pipelined)
/// shifts no later answer: every answer that arrives is its own request's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_requests_shift_no_later_answer_on_a_shared_connection() {
    use redis::AsyncCommands as _;
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let conn = client.get_connection_manager().await.unwrap();
    let keys = 64u64;
    {
        let mut c = conn.clone();
        for i in 0..keys {
            let () = c.set(format!("k{i}"), format!("v{i}")).await.unwrap();
        }
    }
    let mut rng = Rng::new(now_us());
    let (mut answered, mut dropped) = (0u64, 0u64);
    for _ in 0..200 {
        let mut calls = tokio::task::JoinSet::new();
        for _ in 0..32 {
            let mut c = conn.clone();
            let (i, j) = (rng.range(0, keys), rng.range(0, keys));
            let pipelined = rng.chance(50);
            let cut = Duration::from_micros(rng.range(0, 400));
            calls.spawn(async move {
                let call = async {
                    if pipelined {
                        let (a, b): (String, String) = redis::pipe()
                            .get(format!("k{i}"))
                            .cmd("EVAL")
                            .arg("return redis.call('GET', KEYS[1])")
                            .arg(1)
                            .arg(format!("k{j}"))
                            .query_async(&mut c)
                            .await
                            .unwrap();
                        assert_eq!((a, b), (format!("v{i}"), format!("v{j}")));
                    } else {
                        let a: String = c.get(format!("k{i}")).await.unwrap();
                        assert_eq!(a, format!("v{i}"));
                    }
                };
                tokio::time::timeout(cut, call).await.is_ok()
            });
        }
        while let Some(done) = calls.join_next().await {
            if done.unwrap() {
                answered += 1;
            } else {
                dropped += 1;
            }
        }
    }
    println!("shared connection: {answered} answered, {dropped} dropped mid-flight");
    assert!(answered > 100 && dropped > 100, "{answered} / {dropped}");
    // And after all that, a plain call gets its own answer.
    let mut c = conn.clone();
    let v: String = c.get("k7").await.unwrap();
    assert_eq!(v, "v7");
}

/// An even number of servers: four, a majority of three, a listing scanning two. A lock on
/// three is held, listed once and removed; a two-two split is free (no majority holds
/// either), never listed nor removed; with one server down a lock on exactly three (that one
/// among them) cannot be told, and a listing passes the down server over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_servers_judge_over_three() {
    let mut servers = servers(4);
    let s: Vec<&RedisServer> = servers.iter().collect();
    let split = (stamped("left"), stamped("right"));
    write_on(&s[..2], "split", &split.0).await;
    write_on(&s[2..], "split", &split.1).await;
    write_on(&s[1..], "three", &stamped("three of four")).await;
    write_on(&s[..3], "edge", &stamped("edge")).await;
    write_on(&s[..2], "two", &stamped("two of four")).await;
    let operator = locker(&servers, Duration::from_secs(5)).await;
    assert!(!operator.inspect("split").await.unwrap().held);
    assert!(!operator.inspect("two").await.unwrap().held);
    assert_eq!(operator.force_unlock("split").await.unwrap(), None);
    assert_eq!(servers[0].get("lock:{split}").await, Some(split.0.clone()));
    assert_eq!(servers[3].get("lock:{split}").await, Some(split.1.clone()));
    let three = operator.inspect("three").await.unwrap();
    assert_eq!(three.holder.as_deref(), Some("three of four"), "{three:?}");
    assert_eq!(
        keys_of(&listed(&operator, "*").await.unwrap()),
        ["edge", "three"]
    );
    servers[0].stop();
    // Three of four answer: "edge" is on two of them and maybe on the fourth.
    let e = operator.inspect("edge").await.unwrap_err();
    assert!(no_quorum(&e).is_some(), "{e:?}");
    assert!(operator.inspect("three").await.unwrap().held);
    assert!(listed(&operator, "three").await.unwrap().len() == 1);
    assert!(listed(&operator, "*").await.is_err(), "edge cannot be told");
    let removed = operator.force_unlock("three").await.unwrap();
    assert_eq!(removed.unwrap().holder.as_deref(), Some("three of four"));
    // Answered once fewer than three are unheard: the last removal may still be on its way.
    eventually(
        "removed on every server up",
        Duration::from_secs(5),
        async || {
            let mut gone = true;
            for server in &servers[1..] {
                gone &= !server.exists("lock:{three}").await;
            }
            gone
        },
    )
    .await;
}

/// One acquisition writes one value, stamp included, on every server: the servers' tasks must
/// not each read the clock (a stamp one millisecond apart made `inspect` answer another `since`
/// depending on which servers answered first, and `lock-admin unlock` refuse a holding it had
/// just shown as "changed hands"). Many acquisitions, so that some straddle a millisecond.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_acquisition_bears_one_stamp_on_every_server() {
    let servers = servers(3);
    let app = Locker::builder(backend(&urls(&servers)).await)
        .lease(Duration::from_secs(30))
        .holder("stamper")
        .build();
    all_reachable(&app, &servers).await;
    let mut guards = Vec::new();
    for i in 0..300 {
        guards.push(app.lock(format!("stamp{i}")).await.unwrap());
    }
    for i in 0..300 {
        let key = format!("lock:{{stamp{i}}}");
        // The last server's SET may land after the acquire returned on a majority.
        eventually(
            "the value on every server",
            Duration::from_secs(5),
            async || {
                let mut values = Vec::new();
                for s in &servers {
                    values.push(s.get(&key).await);
                }
                values.iter().all(Option::is_some)
            },
        )
        .await;
        let mut values = Vec::new();
        for s in &servers {
            values.push(s.get(&key).await.unwrap());
        }
        assert!(
            values.iter().all(|v| *v == values[0]),
            "{key}: one acquisition, several values: {values:?}"
        );
        assert!(values[0].contains("|stamper|"), "{values:?}");
    }
    for guard in guards {
        guard.release().await.unwrap();
    }
}
