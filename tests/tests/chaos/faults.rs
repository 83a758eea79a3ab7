//! The fault schedule: a seeded loop that, every 0.2 to 1.2 s, stops a worker process (on
//! every engine) or hits the lock servers with a fault from the engine's menu
//! ([`Deployment::fault`](crate::engine::Deployment::fault)). Each fault is printed as it
//! happens (a harness failure half-way then shows where it was).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lock_testkit::signal::{Signal, send_signal};
use lock_tests::chaos::{Rng, now_us};
use tokio::task::JoinHandle;

use crate::engine::Deployment;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    /// SIGSTOP of one worker process, SIGCONT at `end`.
    StopWorker,
    ClientKill,
    ClientPause,
    DebugSleep,
    /// SIGSTOP of lock servers (a primary, Redlock servers), SIGCONT at `end`.
    ServerFreeze,
    /// Restart without persistence: the server comes back empty.
    Restart,
    Flushall,
    /// SIGSTOP of a sentinel.
    SentinelFreeze,
    /// A failover on demand (`CLUSTER FAILOVER`, `SENTINEL FAILOVER`).
    Failover,
    /// A primary killed: its replica is promoted; the old one comes back as a replica.
    PrimaryKill,
    /// A key's slot moved to another primary, with its keys, while locks are held.
    SlotMove,
    /// Redlock servers killed and restarted empty after the documented delay.
    ServerKill,
}

#[derive(Debug, Clone)]
pub(crate) struct Fault {
    pub(crate) kind: Kind,
    /// The worker process, for `StopWorker`.
    pub(crate) proc: Option<u32>,
    pub(crate) what: String,
    pub(crate) start: u64,
    pub(crate) end: u64,
    /// Whether the fault may lose acknowledged lock writes (a restart without persistence,
    /// FLUSHALL, a failover to an asynchronous replica): the documented limit of a Redis lock,
    /// under which a stale holder may overlap a new one until it learns.
    pub(crate) loss: bool,
    /// The hash slots whose keys the fault may lose (a cluster primary killed: its own
    /// slots, not the other shards'); `None`: every key.
    pub(crate) slots: Option<Vec<u16>>,
}

impl Fault {
    /// Whether the fault may lose the data of lock key `key` (the name the workers lock).
    pub(crate) fn may_lose(&self, key: &str) -> bool {
        self.loss
            && self
                .slots
                .as_ref()
                .is_none_or(|s| s.contains(&lock_testkit::cluster::key_slot(key)))
    }
}

/// What an engine's fault did: its kind, a description, whether it may lose data, and of
/// which slots (`None`: every key).
pub(crate) struct Done {
    pub(crate) kind: Kind,
    pub(crate) what: String,
    pub(crate) loss: bool,
    pub(crate) slots: Option<Vec<u16>>,
}

pub(crate) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Sends `signal` to a worker process without blocking the runtime (`kill(1)` runs aside).
async fn signal(pid: u32, signal: Signal) {
    tokio::task::spawn_blocking(move || send_signal(pid, signal))
        .await
        .expect("send a signal");
}

/// Injects faults at random on the lock servers and the workers until `until`; returns them.
/// The schedule (kinds, parameters, gaps) depends on the seed alone; how long a fault takes
/// (a failover, a resync) does not.
pub(crate) async fn inject(
    deploy: &mut Deployment,
    pids: &[u32],
    seed: u64,
    keys: u64,
    until: u64,
) -> Vec<Fault> {
    let mut rng = Rng::new(seed);
    let t0 = now_us();
    let mut faults = Vec::new();
    let stopped: Vec<Arc<AtomicBool>> = pids.iter().map(|_| Arc::default()).collect();
    let mut background: Vec<JoinHandle<Fault>> = Vec::new();
    loop {
        // Every parameter is drawn each round, in this order, whatever the fault: the schedule
        // does not depend on timing.
        let gap = rng.range(200, 1200);
        let roll = rng.range(0, 100);
        let dur = rng.range(100, 2000);
        let pick = rng.range(0, 1_000_000);
        tokio::time::sleep(ms(gap)).await;
        if now_us() >= until {
            break;
        }
        if roll < 30 {
            let proc = (pick % pids.len() as u64) as usize;
            let pause = dur + 300;
            let flag = stopped[proc].clone();
            if flag.swap(true, Ordering::SeqCst) {
                continue;
            }
            let pid = pids[proc];
            background.push(tokio::spawn(async move {
                let start = now_us();
                signal(pid, Signal::Stop).await;
                tokio::time::sleep(ms(pause)).await;
                signal(pid, Signal::Cont).await;
                flag.store(false, Ordering::SeqCst);
                Fault {
                    kind: Kind::StopWorker,
                    proc: Some(proc as u32),
                    what: format!("SIGSTOP worker p{proc} for {pause} ms"),
                    start,
                    end: now_us(),
                    loss: false,
                    slots: None,
                }
            }));
            continue;
        }
        let start = now_us();
        println!("fault at +{} ms: roll {roll}", (start - t0) / 1000);
        let done = deploy.fault(roll, dur, pick, keys).await;
        println!("  {} (until +{} ms)", done.what, (now_us() - t0) / 1000);
        faults.push(Fault {
            kind: done.kind,
            proc: None,
            what: done.what,
            start,
            end: now_us(),
            loss: done.loss,
            slots: done.slots,
        });
    }
    for b in background {
        faults.push(b.await.expect("worker stop task"));
    }
    faults.sort_by_key(|f| f.start);
    faults
}
