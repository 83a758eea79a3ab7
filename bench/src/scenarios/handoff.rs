//! Contended handoff across two processes.
//!
//! Process A (this one) takes the lock and tells process B (a child) to go; B writes `started`
//! and starts waiting in its design's own way. A keeps the lock for a random 2-12 ms (so a
//! polling waiter is at a random phase of its sleep), reads the shared clock (`t0`) and releases.
//! B reads the shared clock as soon as its acquire returns (`t1`). The sample is `t1 - t0`: A's
//! release, the wake-up of B (notification or poll), and B's successful acquire.
//!
//! Ours is measured in chunks interleaved with its floors (the notified handoff without a lock,
//! the goal's floor, and back-to-back PINGs), so a burst of load on this shared machine hits
//! all of them alike.

use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;

use super::{Op, Plan, random_between};
use crate::Result;
use crate::child::{ChildProc, LEASE, sharded_pubsub};
use crate::clock::shared_now_ns;
use crate::designs::{Design, Kind};
use crate::server::Target;
use crate::stats::Latencies;

const WAIT: Duration = Duration::from_secs(30);
/// Ours and its floors are measured in this many interleaved chunks.
const CHUNKS: usize = 10;
const RAW_CHANNEL: &str = "bench:{raw-handoff}:released";

/// Handoff latencies of one design.
#[derive(Debug, Clone, Default)]
pub(crate) struct Handoff {
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
    /// Back-to-back PINGs from process A, in bursts between the chunks (context: the round
    /// trip at the same times as the handoffs; it drifts over a run).
    pub(crate) hot_ping: Latencies,
    /// SPUBLISH in A → a redis-rs subscriber in B wakes → one round trip; no lock at all.
    pub(crate) notified: Latencies,
    /// SPUBLISH in A → the waiting task in B has the message (no round trip after it): the
    /// floor of a handover, where the message itself hands over the lock.
    pub(crate) woken: Latencies,
}

/// What A does to hand over: release a lock of some design, or publish (no lock).
enum Releaser {
    Lock(Design, String),
    Publish(ConnectionManager, &'static str),
}

/// One handoff loop (a design's, or the notified floor's), resumable chunk by chunk.
struct Run {
    releaser: Releaser,
    child: ChildProc,
    out: Handoff,
}

impl Run {
    /// A design's loop. `observe`: B also runs an observer subscription that dates the release
    /// message (diagnostics only: a second subscriber in B adds its own wake-ups).
    async fn lock(target: &Target, kind: Kind, observe: bool) -> Result<Self> {
        let key = format!(
            "handoff:{}{}",
            kind.name(),
            if observe { ":observed" } else { "" }
        );
        let design = Design::connect(kind, target, LEASE).await?;
        let args = [
            "handoff",
            kind.name(),
            &key,
            if observe { "1" } else { "0" },
        ];
        let child = ChildProc::spawn(&args, &target.url).await?;
        let releaser = Releaser::Lock(design, key);
        Ok(Run {
            releaser,
            child,
            out: Handoff::default(),
        })
    }

    /// The notified-handoff floor on this machine, without a lock: A publishes on a channel
    /// after the same random idle; B, subscribed with redis-rs, wakes on the message and does
    /// one round trip. Latency from the instant before A sends the publish to B's answer back.
    async fn publish(target: &Target) -> Result<Self> {
        let mut conn = target.manager().await?;
        let sharded = sharded_pubsub(&mut conn).await?;
        let releaser = Releaser::Publish(conn, if sharded { "SPUBLISH" } else { "PUBLISH" });
        let child = ChildProc::spawn(&["raw", RAW_CHANNEL], &target.url).await?;
        Ok(Run {
            releaser,
            child,
            out: Handoff::default(),
        })
    }

    /// `n` handoffs; kept unless `warm_up`.
    async fn run(&mut self, plan: &Plan, n: usize, warm_up: bool) -> Result<()> {
        for _ in 0..n {
            let held = match &self.releaser {
                Releaser::Lock(design, key) => Some(design.lock(key, WAIT).await?),
                Releaser::Publish(..) => None,
            };
            self.child.send("go").await;
            let started = self.child.recv_tagged("started ").await?[0];
            tokio::time::sleep(random_between(plan.hold.0, plan.hold.1)).await;
            let t0 = shared_now_ns();
            match (&mut self.releaser, held) {
                (Releaser::Lock(design, _), Some(held)) => design.release(held).await?,
                (Releaser::Publish(conn, publish), _) => {
                    let mut publish = redis::cmd(publish);
                    publish.arg(RAW_CHANNEL).arg("released");
                    publish.query_async::<i64>(conn).await?;
                }
                (Releaser::Lock(..), None) => {}
            }
            let released = shared_now_ns();
            let answer = self.child.recv_tagged("acquired ").await?;
            let (t1, notified) = (answer[0], answer.get(1).copied().unwrap_or(0));
            if warm_up {
                continue;
            }
            if started >= t0 || t1 <= t0 {
                self.out.discarded += 1;
                continue;
            }
            self.out.latencies.record(t1 - t0);
            self.out.release_rtt.record(released - t0);
            if notified > t0 && notified <= t1 {
                self.out.delivery.record(notified - t0);
                self.out.wake_to_acquired.record(t1 - notified);
            }
        }
        Ok(())
    }

    async fn finish(self) -> Result<Handoff> {
        self.child.finish().await?;
        Ok(self.out)
    }
}

/// `n` back-to-back PINGs from this process, after 5 not kept (from idle).
async fn pings(ping: &Op, n: usize, out: &mut Latencies) -> Result<()> {
    let warm = 5;
    for i in 0..n + warm {
        let t = Instant::now();
        ping.once("").await?;
        if i >= warm {
            out.record_since(t);
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
        "  ours ({n} samples), interleaved with its floors (notified handoff without a lock, PING)"
    ));
    let mut ours = Run::lock(target, Kind::Ours, false).await?;
    let mut raw = Run::publish(target).await?;
    let ping = Op::Ping(target.manager().await?);
    let mut floors = HandoffFloors::default();
    ours.run(plan, plan.handoff_warm, true).await?;
    raw.run(plan, plan.handoff_warm, true).await?;
    for chunk in 0..CHUNKS {
        let share = |total: usize| total * (chunk + 1) / CHUNKS - total * chunk / CHUNKS;
        ours.run(plan, share(n), false).await?;
        raw.run(plan, share(n), false).await?;
        pings(&ping, share(n), &mut floors.hot_ping).await?;
    }
    let raw = raw.finish().await?;
    (floors.notified, floors.woken) = (raw.latencies, raw.delivery);
    // The split into delivery and wake-up, in a pass of its own with the observer in B.
    let mut observed = Run::lock(target, Kind::Ours, true).await?;
    observed.run(plan, plan.handoff_warm, true).await?;
    observed.run(plan, n / 2, false).await?;
    let observed = observed.finish().await?;
    let ours = Handoff {
        release_rtt: observed.release_rtt,
        delivery: observed.delivery,
        wake_to_acquired: observed.wake_to_acquired,
        ..ours.finish().await?
    };
    Ok((ours, floors))
}

/// A peer design's handoffs, in one pass.
pub(crate) async fn peer(plan: &Plan, target: &Target, kind: Kind, n: usize) -> Result<Handoff> {
    crate::progress(&format!("  {} ({n} samples)", kind.name()));
    let mut run = Run::lock(target, kind, false).await?;
    run.run(plan, plan.handoff_warm, true).await?;
    run.run(plan, n, false).await?;
    run.finish().await
}
