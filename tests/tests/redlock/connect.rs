//! Connecting: a majority needed, late servers joining, and one server under two URLs refused.

use super::*;

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
    // The three stopped servers refuse at once (their ports are closed); the bound is for the
    // two up, which a loaded machine answered later than 300 ms (1 of 2 counted).
    let refused = RedlockBackend::builder(&all.iter().map(String::as_str).collect::<Vec<_>>())
        .connect_timeout(Duration::from_secs(3))
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
    // Server 3 joined once: a probe lock lands on it (retried: under load a lock is decided
    // by the first three answers, before server 3's, within the 100 ms per-server bound).
    all_reachable(&locker, &servers).await;
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
