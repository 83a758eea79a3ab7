//! The results table: one row per scenario, with the peers, the floor, the ratio and the goal.

use std::fmt::Write as _;

use super::Results;
use crate::designs::Kind;
use crate::stats::{fmt_ns, fmt_rate, group};

/// Goals from DESIGN.md.
pub(super) const UNCONTENDED_X_PING: f64 = 2.2;
pub(super) const HANDOFF_X_PING: f64 = 2.5;
const MANY_KEYS_SHARE: f64 = 0.40;
const POLLING_SPEEDUP: f64 = 20.0;
const MEMORY_NS: u64 = 2_000;
const LAYER_NS: u64 = 5_000;

/// The header of the results table.
pub(super) const PEER_HEADER: &str = "| Scenario | ours (lock-core) | seed: SET NX + 10 ms sleep | rslock 0.10 | floor | ratio | goal | met? |";

pub(super) struct Row {
    label: String,
    ours: String,
    seed: String,
    rslock: String,
    floor: String,
    ratio: String,
    goal: String,
    met: Option<bool>,
}

impl Row {
    pub(super) fn render(&self) -> String {
        let met = match self.met {
            Some(true) => "**yes**",
            Some(false) => "**NO**",
            None => "—",
        };
        format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            self.label, self.ours, self.seed, self.rslock, self.floor, self.ratio, self.goal, met
        )
    }
}

fn dash() -> String {
    "—".to_owned()
}

pub(super) fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        f64::NAN
    } else {
        a as f64 / b as f64
    }
}

fn of_kind<T: Clone>(v: &[(Kind, T)], kind: Kind) -> Option<T> {
    v.iter().find(|(k, _)| *k == kind).map(|(_, t)| t.clone())
}

pub(super) fn rows(r: &Results) -> Vec<Row> {
    let u = &r.uncontended;
    let ping = u.ping.p50();
    let mut rows = Vec::new();
    rows.push(Row {
        label: "Baseline: PING round trip".into(),
        ours: format!("redis-rs ConnectionManager: {}", u.ping.summary()),
        seed: dash(),
        rslock: dash(),
        floor: "this is the floor".into(),
        ratio: "1.00×".into(),
        goal: dash(),
        met: None,
    });
    rows.push(Row {
        label: "Baseline: SET round trip".into(),
        ours: format!("redis-rs ConnectionManager: {}", u.set.summary()),
        seed: dash(),
        rslock: dash(),
        floor: format!("PING p50 {}", fmt_ns(ping)),
        ratio: format!("{:.2}× PING", ratio(u.set.p50(), ping)),
        goal: dash(),
        met: None,
    });
    let lr = |k| of_kind(&u.lock_release, k).unwrap_or_default();
    let ours_uc = lr(Kind::Ours);
    let x = ratio(ours_uc.p50(), ping);
    rows.push(Row {
        label: "Uncontended lock + release (Redis)".into(),
        ours: ours_uc.summary(),
        seed: lr(Kind::Seed).summary(),
        rslock: lr(Kind::Rslock).summary(),
        floor: format!("2 round trips; PING p50 {}", fmt_ns(ping)),
        ratio: format!(
            "{x:.2}× PING (seed {:.2}×, rslock {:.2}×)",
            ratio(lr(Kind::Seed).p50(), ping),
            ratio(lr(Kind::Rslock).p50(), ping)
        ),
        goal: format!("p50 ≤ {UNCONTENDED_X_PING}× PING"),
        met: Some(x <= UNCONTENDED_X_PING),
    });
    let m = &r.memory.lock_release;
    rows.push(Row {
        label: "Uncontended lock + release (memory)".into(),
        ours: m.summary(),
        seed: "n/a".into(),
        rslock: "n/a".into(),
        floor: dash(),
        ratio: dash(),
        goal: format!("p50 < {}", fmt_ns(MEMORY_NS)),
        met: Some(m.p50() < MEMORY_NS),
    });
    for mk in &r.many {
        let rate = |k| of_kind(&mk.cycles, k).unwrap_or(0.0);
        let ours = rate(Kind::Ours);
        let (floor, ratio_s, met) = match mk.redis_benchmark {
            Some(b) => (
                format!(
                    "redis-benchmark SET {} (-c {}); redis-rs SET {}",
                    fmt_rate(b),
                    mk.tasks,
                    fmt_rate(mk.redisrs_set)
                ),
                format!(
                    "{:.0} % of redis-benchmark SET ({:.0} % of redis-rs SET)",
                    100.0 * ours / b,
                    100.0 * ours / mk.redisrs_set
                ),
                Some(ours / b >= MANY_KEYS_SHARE),
            ),
            None => (
                format!(
                    "redis-benchmark not installed; redis-rs SET {}",
                    fmt_rate(mk.redisrs_set)
                ),
                format!("{:.0} % of redis-rs SET", 100.0 * ours / mk.redisrs_set),
                None,
            ),
        };
        rows.push(Row {
            label: format!("Many keys in parallel, {} tasks (lock cycles/s)", mk.tasks),
            ours: fmt_rate(ours),
            seed: fmt_rate(rate(Kind::Seed)),
            rslock: fmt_rate(rate(Kind::Rslock)),
            floor,
            ratio: ratio_s,
            goal: format!("≥ {:.0} % of redis-benchmark SET", MANY_KEYS_SHARE * 100.0),
            met,
        });
    }
    let h = |k: Kind| r.handoffs.iter().find(|h| h.kind == k);
    let cell = |k: Kind| {
        h(k).map_or_else(dash, |h| {
            let mut s = h.latencies.summary();
            if h.discarded > 0 {
                let _ = write!(s, ", {} discarded", h.discarded);
            }
            s
        })
    };
    let ours_h = h(Kind::Ours).map(|h| h.latencies.p50()).unwrap_or(0);
    let cold_ping = r.handoff_floors.idle_ping.p50();
    // The PING measured between the handoff chunks: the round trip drifts over a run on a
    // shared machine, and the latency section's PING was taken minutes earlier.
    let beside = r.handoff_floors.hot_ping.p50();
    let hx = ratio(ours_h, beside);
    rows.push(Row {
        label: "Contended handoff across 2 processes (latency)".into(),
        ours: cell(Kind::Ours),
        seed: cell(Kind::Seed),
        rslock: cell(Kind::Rslock),
        floor: format!(
            "A's release round trip, B told by the message; PING p50 {} (back-to-back, between the handoff chunks; {} in the latency section); \
             PING after a {:?}-{:?} idle like the holder's: p50 {}; \
             notification floor without a lock (SPUBLISH → B's waiting task has the message): {}; \
             the same + 1 round trip (a waiter that must then acquire): {}",
            fmt_ns(beside),
            fmt_ns(ping),
            r.plan.hold.0,
            r.plan.hold.1,
            fmt_ns(cold_ping),
            r.handoff_floors.woken.summary(),
            r.handoff_floors.notified.summary()
        ),
        ratio: format!(
            "{hx:.2}× PING ({:.2}× the idle PING, {:.2}× the notification floor)",
            ratio(ours_h, cold_ping),
            ratio(ours_h, r.handoff_floors.woken.p50())
        ),
        goal: format!("p50 ≤ {HANDOFF_X_PING}× PING"),
        met: Some(hx <= HANDOFF_X_PING),
    });
    let speed = |k: Kind| ratio(h(k).map(|h| h.latencies.p50()).unwrap_or(0), ours_h);
    let (sx, rx) = (speed(Kind::Seed), speed(Kind::Rslock));
    rows.push(Row {
        label: "Handoff: speed-up over the polling designs (p50)".into(),
        ours: "1×".into(),
        seed: format!("ours is {sx:.0}× faster"),
        rslock: format!("ours is {rx:.0}× faster"),
        floor: dash(),
        ratio: format!("{:.0}×", sx.min(rx)),
        goal: format!("≥ {POLLING_SPEEDUP:.0}× faster than both"),
        met: Some(sx >= POLLING_SPEEDUP && rx >= POLLING_SPEEDUP),
    });
    for processes in [1, 2] {
        let reference = r
            .hot
            .iter()
            .find(|f| f.kind == Kind::Ours && f.processes == processes && f.waiters == 1)
            .map(|f| f.requests_per_handoff);
        for &waiters in &r.plan.waiters {
            let fig = |k: Kind| {
                r.hot
                    .iter()
                    .find(|f| f.kind == k && f.processes == processes && f.waiters == waiters)
            };
            let cell = |k: Kind| {
                fig(k).map_or_else(dash, |f| {
                    if f.handoffs_per_s == 0.0 {
                        return format!(
                            "0 handoffs/s ({} acq/s): the waiters starved for the whole window",
                            group(f.acquisitions_per_s.round() as u64)
                        );
                    }
                    format!(
                        "{} handoffs/s ({} acq/s); {:.1} cmds, {:.1} req per handoff",
                        group(f.handoffs_per_s.round() as u64),
                        group(f.acquisitions_per_s.round() as u64),
                        f.commands_per_handoff,
                        f.requests_per_handoff
                    )
                })
            };
            let ours_req = fig(Kind::Ours).map_or(f64::NAN, |f| f.requests_per_handoff);
            let (ratio_s, goal, met) = match reference {
                Some(base) if waiters > 1 => (
                    format!("{:.2}× the 1-waiter requests/handoff", ours_req / base),
                    "Redis work per handoff independent of waiters (≤ 1.5× the 1-waiter figure)"
                        .to_owned(),
                    Some(ours_req <= 1.5 * base),
                ),
                _ => (
                    format!("{:.2}× the floor", ours_req / 2.0),
                    "reference for the rows below".to_owned(),
                    None,
                ),
            };
            rows.push(Row {
                label: format!(
                    "Hot key, {waiters} waiter{}, {processes} process{}",
                    if waiters == 1 { "" } else { "s" },
                    if processes == 1 { "" } else { "es" }
                ),
                ours: cell(Kind::Ours),
                seed: cell(Kind::Seed),
                rslock: cell(Kind::Rslock),
                floor: "2 requests per handoff (an acquire or queue attempt + the release)".into(),
                ratio: ratio_s,
                goal,
                met,
            });
        }
    }
    let w = &r.watchdog;
    let period = w.lease.as_secs_f64() / 3.0;
    let expected_per_s = 1.0 / period;
    let allowed = ((w.window.as_secs_f64() / period).floor() + 1.0) / w.window.as_secs_f64();
    rows.push(Row {
        label: format!(
            "Watchdog: {} held locks, renewal traffic",
            group(w.locks as u64)
        ),
        ours: format!(
            "{:.2} EVALSHA/s ({} cmds/s incl. in-script); stats().renewal_calls {:.2}/s",
            w.ours.evalsha_per_s,
            group(w.ours.commands_per_s.round() as u64),
            w.ours_renewal_calls_per_s
        ),
        seed: "n/a (no renewal: the lock just expires)".into(),
        rslock: format!(
            "{:.1} EVALSHA/s ({} cmds/s incl. in-script)",
            w.rslock.evalsha_per_s,
            group(w.rslock.commands_per_s.round() as u64)
        ),
        floor: format!(
            "1 batched call per lease/3 = {expected_per_s:.2}/s (lease {:?})",
            w.lease
        ),
        ratio: format!(
            "rslock sends {:.0}× more calls",
            w.rslock.evalsha_per_s / w.ours.evalsha_per_s.max(1e-9)
        ),
        goal: "one batched call per lease/3 per Locker".into(),
        met: Some(w.ours.evalsha_per_s <= allowed + 1e-9),
    });
    let l = &r.layer;
    let bare = l.bare.p50();
    for (label, lat) in [
        (
            "Layer overhead per request (memory, distinct keys)",
            &l.memory_distinct,
        ),
        (
            "Layer overhead per request (memory, one hot key)",
            &l.memory_hot,
        ),
    ] {
        let over = lat.p50().saturating_sub(bare);
        rows.push(Row {
            label: label.into(),
            ours: format!("{} per request (layered {})", fmt_ns(over), lat.summary()),
            seed: "n/a".into(),
            rslock: "n/a".into(),
            floor: format!("bare service p50 {}", fmt_ns(bare)),
            ratio: format!("{:.1}× the bare service", ratio(lat.p50(), bare)),
            goal: format!("overhead < {}", fmt_ns(LAYER_NS)),
            met: Some(over < LAYER_NS),
        });
    }
    let over = l.redis_distinct.p50().saturating_sub(bare);
    rows.push(Row {
        label: "Layer overhead per request (Redis, distinct keys)".into(),
        ours: format!(
            "{} per request (layered {})",
            fmt_ns(over),
            l.redis_distinct.summary()
        ),
        seed: "n/a".into(),
        rslock: "n/a".into(),
        floor: format!("2 round trips; PING p50 {}", fmt_ns(ping)),
        ratio: format!("{:.2}× PING", ratio(over, ping)),
        goal: "— (the lock's own two round trips)".into(),
        met: None,
    });
    rows
}
