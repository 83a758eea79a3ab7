//! The bounds a session and a request timeout set: a lease is checked against the session the
//! lock is taken on (a new session after an expiry may be granted less than the first), and
//! a single attempt through a silent ensemble answers within two request timeouts, whatever
//! it retried inside and even when it has to make a new session.

use std::time::{Duration, Instant};

use lock_core::{LockError, Locker};
use lock_testkit::zookeeper::{ZkClient, ZooKeeperEnsemble, proxied_connect_string};

use super::{LEASE, SESSION, backend_with, contenders, tree};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_attempt_through_a_silent_ensemble_errs_within_two_request_timeouts() {
    let hosts = tree("silent").await;
    let root = &hosts[hosts.find('/').unwrap()..];
    let proxies = ZooKeeperEnsemble::shared().await.proxies().await;
    let through = format!("{}{root}", proxied_connect_string(&proxies));
    // A short session, so that it expires on the client's side within the test; a new one's
    // connect through the silence takes 3 hosts x 2/5 of it (2.4 s), unless the attempt's
    // bound cuts it.
    let session = Duration::from_secs(2);
    let request = Duration::from_millis(500);
    let locker = Locker::builder(backend_with(&through, session, request).await)
        .lease(session / 4 * 3)
        .build();
    let warm = locker.try_lock("till").fenced().await.expect("lock");
    warm.release().await.expect("release");

    proxies.iter().for_each(|p| p.blackhole());
    // Attempts one after the other for twice the session: while the client still thinks it
    // is connected, once it noticed the silence (its requests wait for a reconnection), and
    // once it gave the session up (7/5 of it): the backend then connects anew, which may take
    // longer, but not the attempt.
    let silent = Instant::now();
    let bound = request * 2 + Duration::from_millis(500);
    let mut took = Vec::new();
    while silent.elapsed() < session * 2 + request {
        let start = Instant::now();
        let answer = locker.try_lock("till").fenced().await;
        let elapsed = start.elapsed();
        assert!(
            answer.is_err(),
            "granted through a silent ensemble: {answer:?}"
        );
        assert!(
            elapsed <= bound,
            "a single attempt answered after {elapsed:?}, {:?} into the silence (request \
             timeout {request:?}): {answer:?}",
            start - silent
        );
        took.push(elapsed);
    }
    println!("single attempts through a silent ensemble (request timeout {request:?}): {took:?}");
    proxies.iter().for_each(|p| p.restore());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_is_checked_against_the_session_granted_after_an_expiry() {
    // Two servers granting different sessions: the first up to 60 s, the second up to 2 s
    // (as one ensemble whose maxSessionTimeout was lowered while a client was away).
    let short = Duration::from_secs(2);
    let (first, second) = tokio::join!(
        ZooKeeperEnsemble::start_single(),
        ZooKeeperEnsemble::builder()
            .members(1)
            .max_session_timeout(short)
            .start()
    );
    let proxies = [first.proxy(0).await, second.proxy(0).await];
    proxies[1].cut();
    let hosts = proxied_connect_string(&proxies);
    let backend = backend_with(&hosts, SESSION, Duration::from_secs(1)).await;
    assert_eq!(backend.session_timeout(), SESSION, "the first session");
    let locker = Locker::builder(backend.clone()).lease(LEASE).build();
    let guard = locker.lock("k").fenced().await.expect("lock");
    // The second server stands for the same ensemble: it has the backend's root too.
    let zk = ZkClient::connect(&second.client_addr(0).to_string()).await;
    zk.create("/lock-core", b"").await;

    // The client loses the first server and reaches the second, which does not know its
    // session: expired, and the backend makes a new one there, granted 2 s.
    proxies[0].cut();
    proxies[1].restore();
    tokio::time::timeout(Duration::from_secs(15), guard.lost())
        .await
        .expect("lost() after the session expired");
    assert!(!guard.is_held());
    let lost = Instant::now();
    // The client learns of the expiry once it reaches the second server; until then an
    // attempt fails on the old session.
    let mut failed = 0;
    let refused = loop {
        match locker.try_lock("k2").fenced().await {
            Err(LockError::Backend { .. }) if lost.elapsed() < Duration::from_secs(15) => {
                failed += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            answer => break answer,
        }
    };
    println!(
        "{failed} attempts failed on the old session ({:?})",
        lost.elapsed()
    );
    println!(
        "session granted after the expiry: {:?}; a {LEASE:?} lease: {refused:?}",
        backend.session_timeout()
    );
    assert_eq!(backend.session_timeout(), short, "the new session");
    assert!(
        matches!(refused, Err(LockError::InvalidConfig { .. })),
        "a {LEASE:?} lease on a {short:?} session: {refused:?}"
    );
    assert!(contenders(&zk, "k2").await.is_empty(), "a node was made");
    // A lease the new session vouches for is granted.
    let fits = locker
        .lock("k2")
        .lease(short / 4 * 3)
        .fenced()
        .await
        .expect("a lease within the new session");
    fits.release().await.expect("release");
}
