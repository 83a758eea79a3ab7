//! The idempotency record store on Redis alone: a restart without persistence, ACL, a paused
//! server, several waiters of one process.

use std::time::Duration;

use lock_core::conformance::helpers::{completed, settled, started, state};
use lock_core::{IdempotencyState, LockError, Locker};
use lock_testkit::{RedisServer, eventually};

use crate::fixture::{SOON, lock_name};

const TTL: Duration = Duration::from_secs(60);

/// Redis only: a restart without persistence loses the records like the locks (the next
/// request with the key runs again: documented), and a holder whose lock went with the data
/// cannot store afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_persistence_loses_records_and_refuses_the_store() {
    let mut server = RedisServer::start();
    let locker = Locker::redis(&server.url()).await.expect("connect");
    let guard = locker.lock("kept").await.expect("acquire");
    guard.store_result("fp", b"done", TTL).await.expect("store");
    guard.release().await.expect("release");
    let holder = locker.lock("running").await.expect("acquire");
    completed(state(&locker, "kept").await);

    server.restart();
    eventually("the locker reads the restarted server", SOON, async || {
        matches!(
            locker.idempotency_state("kept").await,
            Ok(IdempotencyState::Absent)
        )
    })
    .await;
    assert!(matches!(
        holder.store_result("fp", b"after the restart", TTL).await,
        Err(LockError::LeaseLost { .. })
    ));
    assert_eq!(state(&locker, "running").await, IdempotencyState::Absent);
    assert_eq!(
        server.dbsize().await,
        0,
        "nothing was written after the restart"
    );
}

/// Redis only: the README's ACL rule (read from the guide's Redis chapter, where the README
/// sends it) is enough for the result store and the "started" mark, with no `@dangerous`
/// command: storing and reading a record, a mark written and taken back, and a refused stale
/// store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_acl_rule_suffices_for_the_result_store() {
    const README: &str = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/src/backends/redis.md"
    ));
    let rule = README
        .lines()
        .find_map(|l| l.trim().strip_prefix("ACL SETUSER "))
        .expect("the guide gives an `ACL SETUSER` rule");
    let user = lock_testkit::AclUser::from_setuser(rule.split_whitespace())
        .expect("the rule sets a password");
    let server = RedisServer::builder()
        .requirepass("adminpw")
        .user(&user)
        .start();
    let locker = Locker::redis(&server.url_for(&user))
        .await
        .expect("the restricted user connects");
    assert_eq!(state(&locker, "acl").await, IdempotencyState::Absent);
    let guard = locker.lock("acl").await.expect("acquire");
    assert_eq!(state(&locker, "acl").await, IdempotencyState::InFlight);
    guard.mark_started("fp", TTL).await.expect("mark");
    guard.clear_started().await.expect("take the mark back");
    guard.mark_started("fp", TTL).await.expect("mark again");
    guard.store_result("fp", b"ok", TTL).await.expect("store");
    assert_eq!(completed(state(&locker, "acl").await).result, b"ok");
    server.del(&lock_name("lock:", "acl")).await;
    assert!(matches!(
        guard.store_result("fp", b"stale", TTL).await,
        Err(LockError::LeaseLost { .. })
    ));
    assert_eq!(completed(state(&locker, "acl").await).result, b"ok");
}

/// Redis only (issue 29, item 9, review): a mark write that gets no answer in time (the
/// server stalled) is taken back by `mark_started` itself, owner-checked; when the key held
/// an earlier request's mark (that request started and recorded nothing), the take-back,
/// run by the server once it wakes, must not remove that mark: removed, the next request
/// would run the work a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mark_write_without_an_answer_keeps_an_earlier_mark() {
    let mut server = RedisServer::start();
    let backend = lock_core::RedisBackend::builder(&server.url())
        .response_timeout(Duration::from_millis(300))
        .connect()
        .await
        .expect("connect");
    let locker = Locker::builder(backend).build();
    // Scripts loaded (as in any process that ran one before), so the frozen server is the
    // only delay.
    let warm = locker.lock("warm").await.expect("acquire");
    warm.mark_started("fp", TTL).await.expect("mark");
    warm.clear_started().await.expect("take the mark back");
    warm.release().await.expect("release");
    let first = locker.lock("charge").await.expect("acquire");
    first.mark_started("fp", TTL).await.expect("mark");
    first.release().await.expect("release");
    assert_eq!(started(state(&locker, "charge").await).0, "fp");

    let retry = locker.lock("charge").await.expect("the lock is free");
    server.pause();
    let marked = retry.mark_started("fp", TTL).await;
    server.resume();
    assert!(
        matches!(marked, Err(LockError::Backend { .. })),
        "{marked:?}"
    );
    // Sent on the same connection after the queued mark write and its take-back: answered
    // once both ran.
    retry.release().await.expect("release");
    assert_eq!(
        started(settled(&locker, "charge").await).0,
        "fp",
        "the earlier request's mark survives a timed-out mark write"
    );
}

/// Redis only (issue 29, item 9, review): a lock handed over locally to another task of the
/// same locker keeps its token, and the next holder is another request. The first one wrote
/// its mark and released without a result (its store refused, say): the next one must find
/// that mark an earlier request's (`OutcomeUnknown`), not its own. Before, the mark was the
/// token's, and the waiting duplicate ran the work a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_handed_over_locally_never_takes_the_last_holders_mark() {
    let server = RedisServer::start();
    let locker = Locker::redis(&server.url()).await.expect("connect");
    let first = locker.lock("pay").await.expect("acquire");
    // The first waiter gets the lock from the backend (nobody queued when it was taken) and
    // passes it on locally to the second.
    let first_waiter = tokio::spawn({
        let locker = locker.clone();
        async move {
            let guard = locker.lock("pay").await.expect("acquire");
            guard.mark_started("fp", TTL).await.expect("mark");
            // ... the work ran, its result could not be stored ...
            guard.release().await.expect("release");
        }
    });
    eventually("the first waiter queued", SOON, async || {
        locker.stats().waiters == 1
    })
    .await;
    let second_waiter = tokio::spawn({
        let locker = locker.clone();
        async move { locker.lock("pay").await.expect("acquire") }
    });
    eventually("both waiters queued", SOON, async || {
        locker.stats().waiters == 2
    })
    .await;
    first.release().await.expect("release");
    first_waiter.await.expect("join");
    let next = second_waiter.await.expect("join");
    assert_eq!(locker.stats().local_handoffs, 1, "handed over locally");
    match next.mark_started("fp", TTL).await {
        Err(LockError::OutcomeUnknown { fingerprint, .. }) => assert_eq!(fingerprint, "fp"),
        other => panic!("expected OutcomeUnknown, got {other:?}"),
    }
    next.release().await.expect("release");
    assert_eq!(started(settled(&locker, "pay").await).0, "fp");
}
