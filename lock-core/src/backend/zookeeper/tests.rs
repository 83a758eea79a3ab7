//! The ZooKeeper backend against a real ensemble: the test kit's shared one, each test under a
//! root node of its own.

use std::time::Duration;

use lock_testkit::zookeeper::{ZkClient, ZooKeeperEnsemble};
use tokio::time::Instant;

use super::*;
use crate::backend::consensus_tests::{self, Store, waiters_are_served_in_creation_order};
use crate::test_support::within;
use crate::{IdempotencyState, LockError, Locker};

/// A session of 4 s: leases up to 3 s.
const SESSION: Duration = Duration::from_secs(4);
const LEASE: Duration = Duration::from_secs(3);

/// A test's own tree in the shared ensemble: its connect string, and a client to look inside.
struct Tree {
    hosts: String,
    client: ZkClient,
}

impl Tree {
    async fn new(name: &str) -> Tree {
        let ensemble = ZooKeeperEnsemble::shared().await;
        let hosts = ensemble.chroot(name).await;
        let client = ZkClient::connect(&hosts).await;
        Tree { hosts, client }
    }

    async fn backend(&self) -> ZooKeeperBackend {
        ZooKeeperBackend::builder(&self.hosts)
            .session_timeout(SESSION)
            .connect()
            .await
            .unwrap()
    }

    async fn locker(&self) -> Locker {
        Locker::builder(self.backend().await).lease(LEASE).build()
    }

    /// The contender nodes of lock `key` (default prefix), in queue order.
    async fn contenders(&self, key: &str) -> Vec<String> {
        let dir = format!(
            "{DEFAULT_ROOT}/{}",
            escape(&format!("{}{{{key}}}", crate::DEFAULT_PREFIX))
        );
        let mut nodes: Vec<String> = self
            .client
            .children(&dir)
            .await
            .unwrap_or_default()
            .into_iter()
            .filter(|c| super::lock::is_contender(c))
            .collect();
        nodes.sort_by_key(|n| n.rsplit('-').next().map(str::to_owned));
        nodes
    }

    /// Ends `session` (as an expiry would): another client takes it over and closes it.
    /// Returns once the backend's client knows.
    async fn end(&self, session: &super::session::Session) {
        let taken = zk::Client::connector()
            .with_session(session.client.session().clone())
            .connect(&self.hosts)
            .await
            .unwrap();
        drop(taken);
        let mut states = session.client.state_watcher();
        within(async {
            while !session.client.state().is_terminated() {
                states.changed().await;
            }
        })
        .await;
    }

    async fn until_contenders(&self, key: &str, n: usize) {
        consensus_tests::until_contenders(self, key, n).await;
    }
}

/// A holder of lock `job` and a waiter queued behind it with a ticket, each on a backend of
/// its own: the set-up of the checks of a waiter's sessions and hand-overs.
struct Queued {
    holder: ZooKeeperBackend,
    waiter: ZooKeeperBackend,
    key: crate::key::LockKey,
    held: crate::token::Token,
    waiting: crate::token::Token,
}

impl Tree {
    async fn held_and_queued(&self, ticket: &crate::backend::QueueTicket) -> Queued {
        use crate::backend::AttemptOptions;
        let (holder, waiter) = (self.backend().await, self.backend().await);
        let key = crate::key::LockKey::new(crate::DEFAULT_PREFIX, "job").unwrap();
        let (held, waiting) = (
            crate::token::Token::generate(),
            crate::token::Token::generate(),
        );
        let got = holder
            .acquire_lock(&key, &held, LEASE, AttemptOptions::default())
            .await
            .unwrap();
        assert!(matches!(got, Attempt::Acquired { .. }));
        let busy = waiter
            .acquire_lock(
                &key,
                &waiting,
                LEASE,
                crate::test_support::queued(ticket, true),
            )
            .await
            .unwrap();
        assert!(matches!(busy, Attempt::Busy { .. }));
        Queued {
            holder,
            waiter,
            key,
            held,
            waiting,
        }
    }
}

impl Store for Tree {
    type Backend = ZooKeeperBackend;

    async fn backend(&self) -> ZooKeeperBackend {
        Tree::backend(self).await
    }

    fn builder(&self, backend: ZooKeeperBackend) -> crate::LockerBuilder {
        Locker::builder(backend).lease(LEASE)
    }

    async fn contenders(&self, key: &str) -> usize {
        Tree::contenders(self, key).await.len()
    }

    fn fair_heard(backend: &ZooKeeperBackend) -> u64 {
        backend
            .inner
            .fair_heard
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_and_release_leave_one_node_then_none() {
    let tree = Tree::new("zk-one").await;
    let locker = tree.locker().await;
    let guard = locker.lock("job").fenced().await.unwrap();
    assert_eq!(tree.contenders("job").await.len(), 1);
    assert!(guard.fence().unwrap() > 0);
    guard.release().await.unwrap();
    assert!(tree.contenders("job").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_try_lock_leaves_no_node_behind_and_fences_increase() {
    let tree = Tree::new("zk-busy").await;
    let (a, b) = (tree.locker().await, tree.locker().await);
    let mut last = 0;
    for _ in 0..3 {
        let held = a.lock("job").fenced().await.unwrap();
        let fence = held.fence().unwrap();
        assert!(fence > last, "fence {fence} after {last}");
        last = fence;
        assert!(matches!(
            b.try_lock("job").await,
            Err(LockError::Busy { .. })
        ));
        assert_eq!(tree.contenders("job").await.len(), 1);
        held.release().await.unwrap();
        let other = b.lock("job").fenced().await.unwrap();
        assert!(other.fence().unwrap() > last);
        last = other.fence().unwrap();
        other.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_times_out_deletes_its_node() {
    let tree = Tree::new("zk-timeout").await;
    let (a, b) = (tree.locker().await, tree.locker().await);
    let held = a.lock("job").await.unwrap();
    for fair in [false, true] {
        let request = b.lock("job").wait(Duration::from_millis(300));
        let request = if fair { request.fair() } else { request };
        let timed_out = request.await;
        assert!(
            matches!(timed_out, Err(LockError::Timeout { .. })),
            "{timed_out:?}"
        );
        // Deleted as the wait ends (in the background when the bound came mid-request).
        let left = tokio::time::timeout(Duration::from_secs(1), tree.until_contenders("job", 1));
        assert!(left.await.is_ok(), "fair: {fair}: the waiter's node stayed");
    }
    held.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_above_three_quarters_of_the_session_is_refused() {
    let tree = Tree::new("zk-lease").await;
    let backend = tree.backend().await;
    assert_eq!(backend.session_timeout(), SESSION);
    let locker = Locker::builder(backend).build();
    let refused = locker
        .lock("job")
        .lease(LEASE + Duration::from_millis(1))
        .await;
    assert!(
        matches!(refused, Err(LockError::InvalidConfig { .. })),
        "{refused:?}"
    );
    assert!(tree.contenders("job").await.is_empty());
    let ok = locker.lock("job").lease(LEASE).await.unwrap();
    let longer = ok.extend(SESSION).await;
    assert!(
        matches!(longer, Err(LockError::InvalidConfig { .. })),
        "{longer:?}"
    );
    ok.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_keeps_a_lock_past_its_lease_and_a_deleted_node_is_lost() {
    let tree = Tree::new("zk-renew").await;
    let (a, b) = (tree.locker().await, tree.locker().await);
    let guard = a.lock("job").lease(Duration::from_secs(1)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(guard.is_held());
    assert!(a.stats().renewal_calls >= 3, "{:?}", a.stats());
    assert!(matches!(
        b.try_lock("job").await,
        Err(LockError::Busy { .. })
    ));
    // An operator deletes the node: the next renewal reports the loss.
    let node = tree.contenders("job").await.remove(0);
    let dir = format!(
        "{DEFAULT_ROOT}/{}",
        escape(&format!("{}{{job}}", crate::DEFAULT_PREFIX))
    );
    assert!(tree.client.delete(&format!("{dir}/{node}")).await);
    within(guard.lost()).await;
    assert!(matches!(
        guard.release().await,
        Err(LockError::LeaseLost { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_without_the_watchdog_ends_at_its_lease() {
    let tree = Tree::new("zk-unrenewed").await;
    let (a, b) = (tree.locker().await, tree.locker().await);
    let start = Instant::now();
    let free = a
        .lock("free")
        .lease(Duration::from_secs(1))
        .watchdog(false)
        .await
        .unwrap();
    let next = b
        .lock("free")
        .wait(Duration::from_secs(5))
        .await
        .expect("the lock outlived its lease");
    assert!(start.elapsed() >= Duration::from_secs(1));
    assert!(!free.is_held());
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_records_store_read_and_mark() {
    let tree = Tree::new("zk-record").await;
    let backend = tree.backend().await;
    let locker = Locker::builder(backend.clone()).lease(LEASE).build();
    let key = crate::key::LockKey::new(crate::DEFAULT_PREFIX, "pay").unwrap();
    assert_eq!(
        backend.read_state(&key).await.unwrap(),
        IdempotencyState::Absent
    );
    let guard = locker.lock("pay").await.unwrap();
    assert_eq!(
        backend.read_state(&key).await.unwrap(),
        IdempotencyState::InFlight
    );
    let stored = guard
        .store_result("fp", b"done", Duration::from_secs(60))
        .await;
    assert!(stored.is_ok(), "{stored:?}");
    guard.release().await.unwrap();
    match backend.read_state(&key).await.unwrap() {
        IdempotencyState::Completed(record) => {
            assert_eq!(record.fingerprint, "fp");
            assert_eq!(record.result, b"done");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_with_odd_bytes_are_one_node_each() {
    let tree = Tree::new("zk-names").await;
    let locker = tree.locker().await;
    for key in ["a/b", "..", ".", "ünïcode", "sp ace", "%41"] {
        let guard = locker.lock(key).fenced().await.unwrap();
        guard.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_past_its_max_hold_ends_at_its_lease() {
    let tree = Tree::new("zk-max-hold").await;
    let (a, b) = (tree.locker().await, tree.locker().await);
    let kept = a.lock("kept").await.unwrap();
    // Held by a task that never lets go: the watchdog stops renewing it at its max hold,
    // and the session (kept by the client's pings) would keep its node.
    let hung = a
        .lock("hung")
        .lease(Duration::from_secs(1))
        .max_hold(Duration::from_secs(1))
        .await
        .unwrap();
    let next = b
        .lock("hung")
        .wait(Duration::from_secs(6))
        .await
        .expect("a lock no longer renewed outlived its lease");
    assert!(!hung.is_held());
    next.release().await.unwrap();
    assert!(kept.is_held());
    kept.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_handed_the_lock_in_creation_order() {
    waiters_are_served_in_creation_order(&Tree::new("zk-order").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_waiter_of_another_locker_ends_the_local_turns() {
    consensus_tests::a_fair_waiter_of_another_locker_ends_the_local_turns(
        &Tree::new("zk-fair-local").await,
    )
    .await;
}

/// A node deleted in the background after a failed delete is deleted on the session that made
/// it, or not at all: a node of the same path made by a later session (a token queued again
/// after its session expired, in a container made again whose sequence started over) stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_delete_stays_on_the_session_that_made_the_node() {
    let tree = Tree::new("zk-bg-session").await;
    let backend = tree.backend().await;
    tree.client.create(&format!("{DEFAULT_ROOT}/bg"), &[]).await;
    let path = format!("{DEFAULT_ROOT}/bg/t-node-0000000000");
    let ephemeral = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    let first = backend.inner.sessions.current().await.unwrap();
    first.client.create(&path, &[], &ephemeral).await.unwrap();

    // The session ends, its node with it, and the backend makes a new session, which makes a
    // node of the same path.
    tree.end(&first).await;
    let second = backend.inner.sessions.current().await.unwrap();
    assert_ne!(second.id, first.id);
    second.client.create(&path, &[], &ephemeral).await.unwrap();

    // The first session's background delete ends without touching the second's node.
    let task = backend.delete_in_background(&first, path.clone(), "bg");
    within(task.expect("a runtime")).await.unwrap();
    let stat = tree
        .client
        .stat(&path)
        .await
        .expect("the second session's node");
    assert_eq!(stat.ephemeral_owner, second.id);
}

/// A waiter's watch on the node ahead is set on the session its node was made on: when that
/// session ended between the place and the watch, the watch fails (and the attempt with it)
/// rather than being set on a later session, whose view of a deletion ahead would hand the
/// lock to a node that went with the first session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_never_watches_on_a_session_its_node_was_not_made_on() {
    let tree = Tree::new("zk-watch-session").await;
    let ticket = crate::test_support::fair_ticket("t0123456789abcdef");
    let Queued {
        waiter,
        key,
        waiting: t2,
        ..
    } = tree.held_and_queued(&ticket).await;
    let first = waiter.inner.sessions.current().await.unwrap();
    let id = ZooKeeperBackend::contender_id(&key, &t2);
    assert!(waiter.inner.contenders.lock().contains_key(&id));
    let ahead = format!(
        "{}/{}",
        waiter.lock_path(&key),
        tree.contenders("job").await[0]
    );

    // The waiter's session ends; the backend makes a new one.
    tree.end(&first).await;
    let second = waiter.inner.sessions.current().await.unwrap();
    assert_ne!(second.id, first.id);

    // The watch of the attempt placed on the first session: refused.
    let watched = waiter
        .wait_behind(&first, &key, &id, &ticket, true, ahead, true)
        .await;
    assert!(watched.is_err(), "{watched:?}");
}

/// A waiter whose known node is of a session that ended, and whose attempt on the new session
/// made a node whose answer was lost, gives up: its leave finds and deletes the new node (the
/// session would keep it at the queue, blocking the lock for as long as the process lives).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_leaves_after_a_new_session_deletes_its_node_there() {
    let tree = Tree::new("zk-leave-new-session").await;
    let ticket = crate::test_support::fair_ticket("t0123456789abcdef");
    let Queued {
        holder,
        waiter,
        key,
        held: t1,
        waiting: t2,
    } = tree.held_and_queued(&ticket).await;
    let first = waiter.inner.sessions.current().await.unwrap();

    // The session ends; the next attempt's create on the new session is applied, its answer
    // lost (made here by hand: the backend still knows the first session's node only).
    tree.end(&first).await;
    let second = waiter.inner.sessions.current().await.unwrap();
    let prefix = format!("{}/f-{}-", waiter.lock_path(&key), t2.as_str());
    let options = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let (_, sequence) = second.client.create(&prefix, &[], &options).await.unwrap();
    let made = format!("{prefix}{sequence}");

    waiter.leave(&key, &t2).await.unwrap();
    assert_eq!(
        tree.client.stat(&made).await,
        None,
        "the new session's node stayed"
    );
    assert!(holder.release_lock(&key, &t1).await.unwrap());
}

/// A lock handed to a waiter by the deletion of the holder's node ends at the hand-over's
/// lease when nobody renews it (the waiter never takes the grant, or stops before its first
/// renewal): its node does not stay for the session's life.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_handed_over_and_never_renewed_ends_at_its_lease() {
    use crate::backend::{AttemptOptions, Inbox};
    use crate::token::Token;

    let tree = Tree::new("zk-handover-end").await;
    let mut ticket = crate::test_support::fair_ticket("t0123456789abcdef");
    ticket.handover_lease = Duration::from_secs(1);
    let Queued {
        holder,
        waiter,
        key,
        held: t1,
        ..
    } = tree.held_and_queued(&ticket).await;
    let third = tree.backend().await;
    let inbox = std::sync::Arc::new(Inbox::default());
    assert!(crate::backend::Backend::subscribe(&waiter, &key, &inbox).await);
    inbox.expect(Some(&ticket.id));
    let released = Instant::now();
    assert!(holder.release_lock(&key, &t1).await.unwrap());
    within(inbox.notified()).await;
    inbox
        .take_grant()
        .expect("handed over by the holder's deletion");
    // Nobody takes the grant nor renews the lock: it ends at the hand-over's 1 s lease.
    tree.until_contenders("job", 0).await;
    assert!(
        released.elapsed() >= Duration::from_secs(1),
        "ended {:?} after the release, within the hand-over's 1 s lease",
        released.elapsed()
    );
    let next = third
        .acquire_lock(&key, &Token::generate(), LEASE, AttemptOptions::default())
        .await
        .unwrap();
    assert!(matches!(next, Attempt::Acquired { .. }), "{next:?}");
}

mod inspect;
