//! Contended handoff across two processes.
//!
//! Process A (this one) takes the lock and tells process B (a child) to go; B writes `started`
//! and starts waiting in its design's own way. A keeps the lock for a random 2-12 ms (so a
//! polling waiter is at a random phase of its sleep), reads the shared clock (`t0`) and releases.
//! B reads the shared clock as soon as its acquire returns (`t1`). The sample is `t1 - t0`: A's
//! release, the wake-up of B (notification or poll), and B's successful acquire.
//!
//! Ours is measured in chunks interleaved with its two floors (a PING after the same idle, and
//! the notified handoff without a lock), so a burst of load on this shared machine hits all
//! three alike.

use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;

use super::{Plan, random_between};
use crate::Result;
use crate::child::{ChildProc, sharded_pubsub};
use crate::clock::shared_now_ns;
use crate::designs::{Design, Kind};
use crate::server::Target;
use crate::stats::Latencies;

const LEASE: Duration = Duration::from_secs(10);
const WAIT: Duration = Duration::from_secs(30);
/// Ours and its floors are measured in this many interleaved chunks.
const CHUNKS: usize = 10;

/// Handoff latencies of one design.
#[derive(Debug, Clone)]
pub(crate) struct Handoff {
    pub(crate) kind: Kind,
    pub(crate) latencies: Latencies,
    /// Ours only: the instant before A's release → A's release returned (one round trip).
    pub(crate) release_rtt: Latencies,
    /// Ours only: the instant before A's release → the release notification reached
    /// process B (an independent observer connection there).
    pub(crate) delivery: Latencies,
    /// Ours only: notification reached B → B's acquire returned (wake-up + acquire round trip).
    pub(crate) wake_to_acquired: Latencies,
    /// Samples dropped because B had not started waiting before A released (B's `started`
    /// later than `t0`), or the clock readings were out of order. Reported, never hidden.
    pub(crate) discarded: usize,
}

/// The floors measured beside ours.
#[derive(Debug, Clone, Default)]
pub(crate) struct HandoffFloors {
    /// PING from process A after the same random idle as the holder's (a handoff starts from
    /// idle processes; a PING in a tight loop does not).
    pub(crate) idle_ping: Latencies,
    /// Back-to-back PINGs from process A, in bursts between the chunks: the round trip the
    /// handoff's goal is a ratio to, measured at the same times as the handoffs (the machine's
    /// round trip drifts over a run).
    pub(crate) hot_ping: Latencies,
    /// SPUBLISH in A → a redis-rs subscriber in B wakes → one round trip; no lock at all.
    pub(crate) notified: Latencies,
    /// SPUBLISH in A → the waiting task in B has the message (no round trip after it): the
    /// floor of a handover, where the message itself hands over the lock.
    pub(crate) woken: Latencies,
}

fn child_args(mode: &str, kind: Kind, key: &str, observe: bool) -> Vec<String> {
    [
        mode,
        "--design",
        kind.name(),
        "--key",
        key,
        "--lease-ms",
        &LEASE.as_millis().to_string(),
        "--observe",
        if observe { "1" } else { "0" },
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

/// One design's handoff loop, resumable chunk by chunk.
struct LockHandoff {
    kind: Kind,
    key: String,
    design: Design,
    child: ChildProc,
    samples: Vec<u64>,
    release_rtt: Vec<u64>,
    delivery: Vec<u64>,
    wake: Vec<u64>,
    discarded: usize,
}

impl LockHandoff {
    /// `observe`: B also runs an observer subscription that dates the release message
    /// (diagnostics only: a second subscriber in B adds its own wake-ups).
    async fn start(target: &Target, kind: Kind, observe: bool) -> Result<Self> {
        let key = format!(
            "handoff:{}{}",
            kind.name(),
            if observe { ":observed" } else { "" }
        );
        let design = Design::connect(kind, target, LEASE).await?;
        let child =
            ChildProc::spawn(&child_args("handoff", kind, &key, observe), &target.url).await?;
        Ok(LockHandoff {
            kind,
            key,
            design,
            child,
            samples: Vec::new(),
            release_rtt: Vec::new(),
            delivery: Vec::new(),
            wake: Vec::new(),
            discarded: 0,
        })
    }

    /// `n` handoffs; kept unless `warm_up`.
    async fn run(&mut self, plan: &Plan, n: usize, warm_up: bool) -> Result<()> {
        for _ in 0..n {
            let held = self.design.lock(&self.key, WAIT).await?;
            self.child.send("go").await?;
            let started = self.child.recv_tagged("started ").await?[0];
            tokio::time::sleep(random_between(plan.hold.0, plan.hold.1)).await;
            let t0 = shared_now_ns();
            self.design.release(held).await?;
            let released = shared_now_ns();
            let answer = self.child.recv_tagged("acquired ").await?;
            let (t1, notified) = (answer[0], answer.get(1).copied().unwrap_or(0));
            if warm_up {
                continue;
            }
            if started >= t0 || t1 <= t0 {
                self.discarded += 1;
                continue;
            }
            self.samples.push(t1 - t0);
            if self.kind == Kind::Ours {
                self.release_rtt.push(released - t0);
                if notified > t0 && notified <= t1 {
                    self.delivery.push(notified - t0);
                    self.wake.push(t1 - notified);
                }
            }
        }
        Ok(())
    }

    async fn finish(self) -> Result<Handoff> {
        self.child.finish().await?;
        Ok(Handoff {
            kind: self.kind,
            latencies: Latencies::new(self.samples),
            release_rtt: Latencies::new(self.release_rtt),
            delivery: Latencies::new(self.delivery),
            wake_to_acquired: Latencies::new(self.wake),
            discarded: self.discarded,
        })
    }
}

/// The notified-handoff floor on this machine, without a lock: A publishes on a channel after
/// the same random idle; B, subscribed with redis-rs, wakes on the message and does one round
/// trip. Latency from the instant before A sends the publish to B's answer back.
struct RawHandoff {
    conn: ConnectionManager,
    publish: &'static str,
    child: ChildProc,
    samples: Vec<u64>,
    woken: Vec<u64>,
}

const RAW_CHANNEL: &str = "bench:{raw-handoff}:released";

impl RawHandoff {
    async fn start(target: &Target) -> Result<Self> {
        let mut conn = target.manager().await?;
        let publish = if sharded_pubsub(&mut conn).await? {
            "SPUBLISH"
        } else {
            "PUBLISH"
        };
        let child = ChildProc::spawn(
            &child_args("raw", Kind::Ours, RAW_CHANNEL, false),
            &target.url,
        )
        .await?;
        Ok(RawHandoff {
            conn,
            publish,
            child,
            samples: Vec::new(),
            woken: Vec::new(),
        })
    }

    async fn run(&mut self, plan: &Plan, n: usize, warm_up: bool) -> Result<()> {
        for _ in 0..n {
            self.child.send("go").await?;
            let started = self.child.recv_tagged("started ").await?[0];
            tokio::time::sleep(random_between(plan.hold.0, plan.hold.1)).await;
            let t0 = shared_now_ns();
            redis::cmd(self.publish)
                .arg(RAW_CHANNEL)
                .arg("released")
                .query_async::<i64>(&mut self.conn)
                .await?;
            let answer = self.child.recv_tagged("acquired ").await?;
            let (t1, woke) = (answer[0], answer.get(1).copied().unwrap_or(0));
            if !warm_up && started < t0 && t1 > t0 {
                self.samples.push(t1 - t0);
                if woke > t0 && woke <= t1 {
                    self.woken.push(woke - t0);
                }
            }
        }
        Ok(())
    }
}

/// PINGs from this process, each after the holder's random idle.
async fn idle_pings(
    plan: &Plan,
    conn: &mut ConnectionManager,
    n: usize,
    out: &mut Vec<Duration>,
) -> Result<()> {
    for _ in 0..n {
        tokio::time::sleep(random_between(plan.hold.0, plan.hold.1)).await;
        let t = Instant::now();
        redis::cmd("PING").query_async::<String>(conn).await?;
        out.push(t.elapsed());
    }
    Ok(())
}

/// A burst of back-to-back PINGs; the first few, from idle, are not kept.
async fn hot_pings(conn: &mut ConnectionManager, n: usize, out: &mut Vec<Duration>) -> Result<()> {
    const WARM: usize = 5;
    for i in 0..n + WARM {
        let t = Instant::now();
        redis::cmd("PING").query_async::<String>(conn).await?;
        if i >= WARM {
            out.push(t.elapsed());
        }
    }
    Ok(())
}

/// Ours and its floors, interleaved in chunks.
pub(crate) async fn ours_and_floors(
    plan: &Plan,
    target: &Target,
) -> Result<(Handoff, HandoffFloors)> {
    let n = plan.handoff_n[0];
    crate::progress(&format!(
        "  ours ({n} samples), interleaved with its floors (idle PING, notified handoff without a lock, {} each)",
        n / 2
    ));
    let mut ours = LockHandoff::start(target, Kind::Ours, false).await?;
    let mut raw = RawHandoff::start(target).await?;
    let mut conn = target.manager().await?;
    let mut idle = Vec::new();
    let mut hot = Vec::new();
    ours.run(plan, plan.handoff_warm, true).await?;
    raw.run(plan, plan.handoff_warm, true).await?;
    idle_pings(plan, &mut conn, plan.handoff_warm, &mut Vec::new()).await?;
    for chunk in 0..CHUNKS {
        let share = |total: usize| total * (chunk + 1) / CHUNKS - total * chunk / CHUNKS;
        ours.run(plan, share(n), false).await?;
        raw.run(plan, share(n / 2), false).await?;
        idle_pings(plan, &mut conn, share(n / 2), &mut idle).await?;
        hot_pings(&mut conn, share(n), &mut hot).await?;
    }
    raw.child.finish().await?;
    // The split into delivery and wake-up, in a pass of its own with the observer in B.
    let mut observed = LockHandoff::start(target, Kind::Ours, true).await?;
    observed.run(plan, plan.handoff_warm, true).await?;
    observed.run(plan, n / 2, false).await?;
    let observed = observed.finish().await?;
    let mut ours = ours.finish().await?;
    ours.release_rtt = observed.release_rtt;
    ours.delivery = observed.delivery;
    ours.wake_to_acquired = observed.wake_to_acquired;
    let floors = HandoffFloors {
        idle_ping: Latencies::from_durations(&idle),
        hot_ping: Latencies::from_durations(&hot),
        notified: Latencies::new(raw.samples),
        woken: Latencies::new(raw.woken),
    };
    Ok((ours, floors))
}

/// A peer design's handoffs, in one pass.
pub(crate) async fn peer(plan: &Plan, target: &Target, kind: Kind, n: usize) -> Result<Handoff> {
    crate::progress(&format!("  {} ({n} samples)", kind.name()));
    let mut run = LockHandoff::start(target, kind, false).await?;
    run.run(plan, plan.handoff_warm, true).await?;
    run.run(plan, n, false).await?;
    run.finish().await
}
