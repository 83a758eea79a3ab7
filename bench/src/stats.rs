//! Latency samples, percentiles, formatting, and Redis `INFO commandstats` deltas.

use std::collections::HashMap;
use std::time::Duration;

use redis::aio::ConnectionManager;

use crate::Result;

/// Latency samples in nanoseconds.
#[derive(Debug, Clone, Default)]
pub(crate) struct Latencies {
    sorted: Vec<u64>,
}

impl Latencies {
    pub(crate) fn new(mut ns: Vec<u64>) -> Self {
        ns.sort_unstable();
        Latencies { sorted: ns }
    }

    pub(crate) fn from_durations(d: &[Duration]) -> Self {
        Self::new(
            d.iter()
                .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
                .collect(),
        )
    }

    pub(crate) fn n(&self) -> usize {
        self.sorted.len()
    }

    /// Nearest-rank percentile (`q` in 0..=1), in nanoseconds; 0 when empty.
    pub(crate) fn pct_ns(&self, q: f64) -> u64 {
        if self.sorted.is_empty() {
            return 0;
        }
        let rank = (q * self.sorted.len() as f64).ceil() as usize;
        self.sorted[rank.clamp(1, self.sorted.len()) - 1]
    }

    pub(crate) fn p50(&self) -> u64 {
        self.pct_ns(0.50)
    }

    pub(crate) fn p99(&self) -> u64 {
        self.pct_ns(0.99)
    }

    pub(crate) fn sorted(&self) -> &[u64] {
        &self.sorted
    }

    /// `p50 x / p99 y (n=z)`.
    pub(crate) fn summary(&self) -> String {
        format!(
            "p50 {} / p99 {} (n={})",
            fmt_ns(self.p50()),
            fmt_ns(self.p99()),
            self.n()
        )
    }
}

/// A duration in nanoseconds, in a readable unit.
pub(crate) fn fmt_ns(ns: u64) -> String {
    let f = ns as f64;
    if ns < 1_000 {
        format!("{ns} ns")
    } else if ns < 1_000_000 {
        format!("{:.1} µs", f / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.2} ms", f / 1e6)
    } else {
        format!("{:.2} s", f / 1e9)
    }
}

/// A rate with thousands separators, e.g. `12,345/s`.
pub(crate) fn fmt_rate(per_s: f64) -> String {
    format!("{}/s", group(per_s.round() as u64))
}

pub(crate) fn group(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Calls per command name from `INFO commandstats`.
#[derive(Debug, Clone, Default)]
pub(crate) struct CommandStats {
    calls: HashMap<String, u64>,
    /// Server-side microseconds spent in each command (`usec=`).
    usec: HashMap<String, u64>,
}

/// Commands a client sends as requests (round trips), as opposed to commands a Lua script runs
/// inside the server: `INFO commandstats` counts both. Which names are requests depends on the
/// design (read from its code): ours sends a plain acquire as one pipelined `SET NX GET` +
/// `PTTL` (one round trip: `set` counted, `pttl` not) and releases and renews with `EVALSHA`
/// (whose `get`/`del`/`spublish`/`pexpire` are internal); fenced acquires (a script calling
/// `SET`) are not used by the bench. The peers send `SET` and release with `EVALSHA`.
pub(crate) const OUR_REQUESTS: &[&str] = &[
    "set",
    "evalsha",
    "eval",
    "script|load",
    "ssubscribe",
    "sunsubscribe",
    "subscribe",
    "unsubscribe",
    "ping",
    "hello",
    "client|setinfo",
    "select",
];
pub(crate) const PEER_REQUESTS: &[&str] = &[
    "set",
    "evalsha",
    "eval",
    "script|load",
    "ping",
    "hello",
    "client|setinfo",
    "select",
];

impl CommandStats {
    pub(crate) async fn fetch(conn: &mut ConnectionManager) -> Result<Self> {
        let text: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(conn)
            .await?;
        Ok(Self::parse(&text))
    }

    pub(crate) fn parse(text: &str) -> Self {
        let mut calls = HashMap::new();
        let mut usec = HashMap::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("cmdstat_") else {
                continue;
            };
            let Some((name, fields)) = rest.split_once(':') else {
                continue;
            };
            let field = |key: &str| -> u64 {
                fields
                    .split(',')
                    .find_map(|f| f.strip_prefix(key))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0)
            };
            calls.insert(name.to_owned(), field("calls="));
            usec.insert(name.to_owned(), field("usec="));
        }
        CommandStats { calls, usec }
    }

    /// Server-side µs per call of `name` since `before` (NaN without calls).
    pub(crate) fn usec_per_call_since(&self, before: &CommandStats, name: &str) -> f64 {
        let calls = self.get(name).saturating_sub(before.get(name));
        let usec = self
            .usec
            .get(name)
            .copied()
            .unwrap_or(0)
            .saturating_sub(before.usec.get(name).copied().unwrap_or(0));
        if calls == 0 {
            f64::NAN
        } else {
            usec as f64 / calls as f64
        }
    }

    /// Server-side µs of every command since `before` (the bench's own `INFO` excluded).
    pub(crate) fn usec_total_since(&self, before: &CommandStats) -> u64 {
        self.usec
            .iter()
            .filter(|(name, _)| name.as_str() != "info")
            .map(|(name, n)| n.saturating_sub(before.usec.get(name).copied().unwrap_or(0)))
            .sum()
    }

    /// `name calls-per-unit` for each request command that changed since `before`, busiest
    /// first, e.g. `evalsha 2.00, ssubscribe 0.25`.
    pub(crate) fn breakdown_since(
        &self,
        before: &CommandStats,
        per: u64,
        names: &[&str],
    ) -> String {
        let mut v: Vec<(u64, &str)> = names
            .iter()
            .map(|n| (self.get(n).saturating_sub(before.get(n)), *n))
            .filter(|(d, _)| *d > 0)
            .collect();
        v.sort_unstable_by(|a, b| b.cmp(a));
        v.iter()
            .map(|(d, n)| format!("{n} {:.2}", *d as f64 / per.max(1) as f64))
            .collect::<Vec<_>>()
            .join(", ")
    }

    pub(crate) fn get(&self, name: &str) -> u64 {
        self.calls.get(name).copied().unwrap_or(0)
    }

    /// Calls of every command since `before`, the bench's own `INFO` excluded.
    pub(crate) fn total_since(&self, before: &CommandStats) -> u64 {
        self.calls
            .iter()
            .filter(|(name, _)| name.as_str() != "info")
            .map(|(name, n)| n.saturating_sub(before.get(name)))
            .sum()
    }

    /// Calls of the commands in `names` since `before`.
    pub(crate) fn sum_since(&self, before: &CommandStats, names: &[&str]) -> u64 {
        names
            .iter()
            .map(|name| self.get(name).saturating_sub(before.get(name)))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let l = Latencies::new((1..=100).rev().collect());
        assert_eq!(l.p50(), 50);
        assert_eq!(l.p99(), 99);
        assert_eq!(l.pct_ns(1.0), 100);
        assert_eq!(Latencies::default().p50(), 0);
    }

    #[test]
    fn commandstats_deltas() {
        let before = CommandStats::parse(
            "# Commandstats\r\ncmdstat_evalsha:calls=10,usec=5\r\ncmdstat_info:calls=1,usec=3\r\n",
        );
        let after = CommandStats::parse(
            "cmdstat_evalsha:calls=14,usec=9\r\ncmdstat_set:calls=4,usec=1\r\ncmdstat_info:calls=9\r\ncmdstat_client|setinfo:calls=2\r\n",
        );
        assert_eq!(after.total_since(&before), 4 + 4 + 2);
        assert_eq!(after.sum_since(&before, OUR_REQUESTS), 4 + 4 + 2);
        assert_eq!(after.usec_total_since(&before), 4 + 1);
        assert_eq!(after.sum_since(&before, PEER_REQUESTS), 4 + 4 + 2);
        assert_eq!(after.usec_per_call_since(&before, "evalsha"), 1.0);
        assert!(after.usec_per_call_since(&before, "ping").is_nan());
        assert_eq!(
            after.breakdown_since(&before, 2, OUR_REQUESTS),
            "set 2.00, evalsha 2.00, client|setinfo 1.00"
        );
    }

    #[test]
    fn formatting() {
        assert_eq!(fmt_ns(950), "950 ns");
        assert_eq!(fmt_ns(12_345), "12.3 µs");
        assert_eq!(fmt_ns(2_500_000), "2.50 ms");
        assert_eq!(group(1_234_567), "1,234,567");
        assert_eq!(group(12), "12");
    }
}
