//! The etcd backend against real etcd processes (issue 31, section 4): safety and fences
//! through leader kills, pauses and a whole-cluster restart, a holder cut off past its lease,
//! the fair queue (order, one wake-up per release, waiters that leave or die), lost replies
//! to an acquire and to a release, and a client left on a minority.
//!
//! "Processes" here are mostly lockers in this test process, each on its own `EtcdBackend` (its
//! own gRPC connections, etcd lease and contender keys): to etcd they are separate clients, as
//! separate processes would be. `processes.rs` runs the load and the fair queue again with
//! real OS processes (`lock-worker` on etcd) and a fence-checking store in Redis. Tests that inject no cluster fault share one 3-member cluster
//! (each in its own namespace, cutting only its own proxies); the others start their own.
//! Bounds asserted are correctness bounds (served within a lease, an error within a wait),
//! not speed claims.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout,
    reason = "test code: a failed expectation fails the test; figures are printed for the notes"
)]

#[path = "../support/consensus.rs"]
mod consensus;
mod failover;
mod lease;
mod load;
mod processes;
mod queue;
mod retry;

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use lock_core::{ETCD_MIN_LEASE, EtcdBackend, LockGuard, Locker};
use lock_testkit::etcd::{EtcdClient, EtcdCluster, KeyValue};
use lock_testkit::eventually;
use lock_testkit::proxy::Proxy;

use consensus::FenceStore;

/// Every lock here but the fair queue's ([`QUEUE_LEASE`]): etcd's shortest (its etcd lease
/// runs one second longer).
const LEASE: Duration = ETCD_MIN_LEASE;

/// The lease of the fair-queue tests' locks. A queued waiter also makes an attempt on a timer
/// (refreshing its place in the queue: every quarter of the lease, or every 750 ms if sooner),
/// which the tests would count as a call of a waiter still queued: with this lease the timer
/// waits 750 ms after each attempt, longer than queueing the four waiters and serving them
/// take (about 200 ms here).
const QUEUE_LEASE: Duration = Duration::from_secs(4);

/// How long one etcd request may take before the backend gives up on it.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

/// The cluster shared by the tests that inject no cluster fault, started by the first of
/// them and killed when the last one running drops it.
static SHARED: Mutex<Weak<EtcdCluster>> = Mutex::new(Weak::new());
static STARTING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn shared() -> Arc<EtcdCluster> {
    let _starting = STARTING.lock().await;
    if let Some(cluster) = SHARED.lock().unwrap().upgrade() {
        return cluster;
    }
    let cluster = Arc::new(EtcdCluster::start().await);
    *SHARED.lock().unwrap() = Arc::downgrade(&cluster);
    cluster
}

/// A backend of its own (one "process") on `urls`, keys under `namespace`.
async fn backend(urls: &[String], namespace: &str) -> EtcdBackend {
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    EtcdBackend::builder(&urls)
        .connect_timeout(Duration::from_secs(5))
        .request_timeout(REQUEST_TIMEOUT)
        .namespace(namespace)
        .connect()
        .await
        .expect("connect to etcd")
}

/// A locker of its own on `urls`, with [`LEASE`].
async fn locker(urls: &[String], namespace: &str) -> Locker {
    Locker::builder(backend(urls, namespace).await)
        .lease(LEASE)
        .build()
}

/// [`consensus::lock_through_faults`] for up to 20 s.
async fn lock_through_faults(locker: &Locker, key: &str) -> (LockGuard, usize) {
    consensus::lock_through_faults(locker, key, Duration::from_secs(20)).await
}

/// Takes the fair queue's lock `queue` on `holder` (fair, fenced, [`QUEUE_LEASE`]).
async fn hold_queue(holder: &Locker) -> LockGuard {
    holder
        .lock("queue")
        .lease(QUEUE_LEASE)
        .fair()
        .fenced()
        .await
        .expect("lock")
}

/// Client URLs reaching the cluster through `proxies`.
fn through(proxies: &[Proxy]) -> Vec<String> {
    proxies
        .iter()
        .map(|p| format!("http://{}", p.addr()))
        .collect()
}

/// The contender keys of every lock under `namespace`, in create order.
async fn contenders(etcd: &EtcdClient, namespace: &str) -> Vec<KeyValue> {
    let mut keys: Vec<KeyValue> = etcd
        .range_prefix(namespace)
        .await
        .into_iter()
        .filter(|kv| kv.key_str().contains("/q/"))
        .collect();
    keys.sort_by_key(|kv| kv.create_revision);
    keys
}

/// The fences of the contenders under `namespace` (their keys' create revisions), in queue
/// order.
async fn queue_fences(etcd: &EtcdClient, namespace: &str) -> Vec<u64> {
    contenders(etcd, namespace)
        .await
        .iter()
        .map(|kv| u64::try_from(kv.create_revision).unwrap())
        .collect()
}

/// Waits (bounded) until `n` contender keys are under `namespace`: the last waiter queued.
async fn until_contenders(etcd: &EtcdClient, namespace: &str, n: usize) {
    eventually(
        &format!("{n} contenders queued"),
        Duration::from_secs(5),
        async || contenders(etcd, namespace).await.len() == n,
    )
    .await;
}

/// One fault round of the load tests: kills the leader and restarts it, pauses the new leader
/// past the election timeout and resumes it, then waits for the cluster to serve again.
async fn fault_round(cluster: &mut EtcdCluster) {
    let killed = cluster.kill_leader().await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    cluster.restart(killed).await;
    let paused = cluster.pause_leader().await;
    // Longer than the election timeout: the others elect a new leader meanwhile.
    tokio::time::sleep(cluster.election_timeout() * 4).await;
    cluster.resume(paused);
    // The contract's bound once the faults end: the next waiter is served within the lease
    // plus an election (a lock whose holder's release was lost in a fault ends with its
    // lease); a request stuck in the paused member ends within its timeout.
    tokio::time::sleep(LEASE + cluster.election_timeout() + Duration::from_secs(1)).await;
}
