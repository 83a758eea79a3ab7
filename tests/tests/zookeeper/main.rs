//! The ZooKeeper backend against real ZooKeeper processes (issue 32): safety and fences
//! through leader kills, pauses and a whole-ensemble restart, a holder cut off past its
//! session, the fair queue (order, one wake-up per release, waiters that leave or die), lost
//! replies to an acquire and to a release, a client left on a minority, a follower cut off
//! from the quorum while its clients still reach it, and the bounds a session and a request
//! timeout set (a lease within the session granted, a single attempt within two request
//! timeouts).
//!
//! "Processes" here are mostly lockers in this test process, each on its own
//! `ZooKeeperBackend` (its own ZooKeeper session, hence its own ephemeral contender nodes): to
//! ZooKeeper they are separate clients, as separate processes would be. `processes.rs` runs the
//! load and the fair queue again with real OS processes (`lock-worker` on ZooKeeper) and a
//! fence-checking store in Redis. Tests that inject no ensemble fault share
//! one 3-member ensemble (each under its own chroot, cutting only its own proxies); the others
//! start their own. Sessions last [`SESSION`] so that waiting for one to expire stays short.
//! Bounds asserted are correctness bounds (served within a session, an error within a wait),
//! not speed claims.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout,
    reason = "test code: a failed expectation fails the test; figures are printed for the notes"
)]

mod bounds;
#[path = "../support/consensus.rs"]
mod consensus;
mod failover;
mod lease;
mod load;
mod partition;
mod processes;
mod queue;
mod retry;

use std::time::Duration;

use lock_core::{LockGuard, Locker, ZooKeeperBackend};
use lock_testkit::eventually;
use lock_testkit::zookeeper::{ZkClient, ZooKeeperEnsemble};

use consensus::FenceStore;

/// The session timeout every backend here asks for (the kit's servers grant it).
const SESSION: Duration = Duration::from_secs(4);

/// Every lock's lease: three quarters of [`SESSION`], the most the backend accepts.
const LEASE: Duration = Duration::from_secs(3);

/// How long one ZooKeeper request may take before the backend gives up on it.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

/// How long a backend may take to get a session.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A backend of its own (one "process", one session) on `hosts` (a connect string, maybe
/// with a chroot), locks under the default root.
async fn backend(hosts: &str) -> ZooKeeperBackend {
    backend_with(hosts, SESSION, REQUEST_TIMEOUT).await
}

/// [`backend`] with another session timeout and request timeout.
async fn backend_with(hosts: &str, session: Duration, request: Duration) -> ZooKeeperBackend {
    ZooKeeperBackend::builder(hosts)
        .session_timeout(session)
        .connect_timeout(CONNECT_TIMEOUT)
        .request_timeout(request)
        .connect()
        .await
        .expect("connect to ZooKeeper")
}

/// A locker of its own on `hosts`, with [`LEASE`].
async fn locker(hosts: &str) -> Locker {
    let backend = backend(hosts).await;
    assert_eq!(backend.session_timeout(), SESSION, "the session granted");
    Locker::builder(backend).lease(LEASE).build()
}

/// A test's own tree in the shared ensemble: its connect string (with the chroot).
async fn tree(name: &str) -> String {
    ZooKeeperEnsemble::shared().await.chroot(name).await
}

/// The node of lock `key` (default prefix and root), relative to the backend's chroot.
fn lock_dir(key: &str) -> String {
    format!("/lock-core/lock:{{{key}}}")
}

/// One contender node of a lock: its name (`<kind>-<token>-<sequence>`: `q` for a waiter, `f`
/// for a fair one, `t` for a single attempt), czxid and session.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Node {
    name: String,
    czxid: i64,
    owner: i64,
}

impl Node {
    fn fence(&self) -> u64 {
        u64::try_from(self.czxid).unwrap()
    }

    /// The token part of its name.
    fn token(&self) -> &str {
        let rest = &self.name[2..];
        rest.rsplit_once('-').unwrap().0
    }
}

/// Brings the member serving `zk` up to date with the leader (it may lag behind): reads
/// after this see every write done before it.
async fn sync(zk: &ZkClient) {
    let synced = tokio::time::timeout(Duration::from_secs(10), zk.inner().sync("/")).await;
    assert!(matches!(synced, Ok(Ok(()))), "sync: {synced:?}");
}

/// Whether node `path` exists, as the leader has it.
async fn exists(zk: &ZkClient, path: &str) -> bool {
    sync(zk).await;
    zk.stat(path).await.is_some()
}

/// The contender nodes of lock `key`, in queue order (by sequence), as the leader has them.
async fn contenders(zk: &ZkClient, key: &str) -> Vec<Node> {
    let dir = lock_dir(key);
    sync(zk).await;
    let mut names: Vec<String> = zk
        .children(&dir)
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|c| ["q-", "f-", "t-"].iter().any(|kind| c.starts_with(kind)))
        .collect();
    names.sort_by_key(|n| n.rsplit_once('-').unwrap().1.parse::<i64>().unwrap());
    let mut nodes = Vec::new();
    for name in names {
        // One may go between the listing and its stat.
        if let Some(stat) = zk.stat(&format!("{dir}/{name}")).await {
            nodes.push(Node {
                name,
                czxid: stat.czxid,
                owner: stat.ephemeral_owner,
            });
        }
    }
    nodes
}

/// The fences of the fair queue's lock `queue`, in queue order (the holder's first), checking
/// that every contender node is a fair one's (`f-`).
async fn queue_fences(zk: &ZkClient) -> Vec<u64> {
    let queue = contenders(zk, "queue").await;
    assert!(
        queue.iter().all(|n| n.name.starts_with("f-")),
        "fair waiters' nodes say so: {queue:?}"
    );
    queue.iter().map(Node::fence).collect()
}

/// Waits (bounded) until `n` contender nodes are under lock `key`: the last waiter queued.
async fn until_contenders(zk: &ZkClient, key: &str, n: usize) {
    eventually(
        &format!("{n} contenders queued"),
        Duration::from_secs(5),
        async || contenders(zk, key).await.len() == n,
    )
    .await;
}

/// Takes the fair queue's lock `queue` on `holder` (fair, fenced).
async fn hold_queue(holder: &Locker) -> LockGuard {
    holder.lock("queue").fair().fenced().await.expect("lock")
}

/// [`consensus::lock_through_faults`] for up to 30 s.
async fn lock_through_faults(locker: &Locker, key: &str) -> (LockGuard, usize) {
    consensus::lock_through_faults(locker, key, Duration::from_secs(30)).await
}

/// One fault round of the load tests: kills the leader and restarts it, pauses the new leader
/// past the followers' sync limit (they elect another) and resumes it, then waits until a
/// leader is elected and a session more for the ensemble to serve again (a node whose release
/// was lost in a fault goes with its lease, at the latest with its session).
///
/// The two members left may elect no leader while the third is paused (seen: none for 8 s,
/// and for 4 s after the resume), so the round waits for one rather than counting on it.
async fn fault_round(ensemble: &mut ZooKeeperEnsemble) {
    let killed = ensemble.kill_leader().await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    ensemble.restart(killed).await;
    let paused = ensemble.pause_leader().await;
    tokio::time::sleep(ensemble.sync_timeout() * 3).await;
    ensemble.resume(paused);
    ensemble.wait_for_leader().await;
    tokio::time::sleep(SESSION).await;
}
