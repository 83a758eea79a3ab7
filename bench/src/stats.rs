//! Latency histograms, number formatting, and Redis `INFO commandstats` deltas.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use redis::aio::ConnectionManager;

use crate::Result;

/// Latency samples in nanoseconds, kept to 3 significant digits, from 1 ns to an hour.
#[derive(Debug, Clone)]
pub(crate) struct Latencies(Histogram<u64>);

impl Default for Latencies {
    fn default() -> Self {
        // Valid bounds (1 <= low, high >= 2 * low) and digits (0..=5): creation cannot fail.
        let hist = Histogram::new_with_bounds(1, 3_600_000_000_000, 3);
        Latencies(hist.unwrap_or_else(|e| unreachable!("{e}")))
    }
}

impl FromIterator<u64> for Latencies {
    fn from_iter<I: IntoIterator<Item = u64>>(ns: I) -> Self {
        let mut l = Latencies::default();
        ns.into_iter().for_each(|v| l.0.saturating_record(v));
        l
    }
}

impl Latencies {
    pub(crate) fn record(&mut self, ns: u64) {
        self.0.saturating_record(ns);
    }

    pub(crate) fn record_since(&mut self, start: Instant) {
        self.record_duration(start.elapsed());
    }

    pub(crate) fn record_duration(&mut self, d: Duration) {
        self.record(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }

    pub(crate) fn n(&self) -> u64 {
        self.0.len()
    }

    /// Nearest-rank percentiles, in nanoseconds; 0 when empty.
    pub(crate) fn p50(&self) -> u64 {
        self.0.value_at_quantile(0.50)
    }

    pub(crate) fn p99(&self) -> u64 {
        self.0.value_at_quantile(0.99)
    }

    pub(crate) fn max(&self) -> u64 {
        self.0.max()
    }

    /// The empirical CDF: (value in ns, fraction of samples at or below it), ascending.
    pub(crate) fn cdf(&self) -> Vec<(u64, f64)> {
        let hist = &self.0;
        hist.iter_recorded()
            .map(|v| (v.value_iterated_to(), v.quantile()))
            .collect()
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
    match ns {
        ..1_000 => format!("{ns} ns"),
        1_000..1_000_000 => format!("{:.1} µs", f / 1e3),
        1_000_000..1_000_000_000 => format!("{:.2} ms", f / 1e6),
        _ => format!("{:.2} s", f / 1e9),
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

/// Commands a client sends as requests (round trips), as opposed to commands a Lua script runs
/// inside the server: `INFO commandstats` counts both. Which names are requests depends on the
/// design (read from its code): ours sends a plain acquire as one pipelined `SET NX GET` +
/// `PTTL` (one round trip: `set` counted, `pttl` not) and releases and renews with `EVALSHA`
/// (whose `get`/`del`/`spublish`/`pexpire` are internal); fenced acquires (a script calling
/// `SET`) are not used by the bench. The peers send `SET` and release with `EVALSHA`.
pub(crate) const PEER_REQUESTS: &str =
    "set evalsha eval script|load ping hello client|setinfo select";
pub(crate) const OUR_REQUESTS: &str = "set evalsha eval script|load ping hello client|setinfo select \
     ssubscribe sunsubscribe subscribe unsubscribe";
/// The commands a client sends in an uncontended lock cycle, of every design: `SET` (ours:
/// pipelined with `PTTL` when it asks for the holder's remaining lease) and the release
/// script's `EVALSHA` (or `EVAL`). Their usec already covers the calls the script makes
/// inside, which commandstats also lists under their own names (`GET`, `DEL`, `LINDEX`):
/// those are left out. (None of the release scripts calls `SET` or `PTTL` inside.)
pub(crate) const CYCLE_REQUESTS: &str = "set pttl evalsha eval";

/// Calls and server-side microseconds (`usec=`) per command name from `INFO commandstats`.
#[derive(Debug, Clone, Default)]
pub(crate) struct CommandStats(HashMap<String, (u64, u64)>);

impl CommandStats {
    pub(crate) async fn fetch(conn: &mut ConnectionManager) -> Result<Self> {
        let text: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(conn)
            .await?;
        Ok(Self::parse(&text))
    }

    pub(crate) fn parse(text: &str) -> Self {
        let stats = text.lines().filter_map(|line| {
            let (name, fields) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |key: &str| -> u64 {
                let mut values = fields.split(',').filter_map(|f| f.strip_prefix(key));
                values
                    .next()
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0)
            };
            Some((name.to_owned(), (field("calls="), field("usec="))))
        });
        CommandStats(stats.collect())
    }

    /// What changed since `before`, the bench's own `INFO` left out.
    pub(crate) fn since(&self, before: &CommandStats) -> CommandStats {
        let delta = self.0.iter().filter(|(name, _)| *name != "info");
        let delta = delta.map(|(name, (calls, usec))| {
            let (c0, u0) = before.0.get(name).copied().unwrap_or_default();
            let change = (calls.saturating_sub(c0), usec.saturating_sub(u0));
            (name.clone(), change)
        });
        CommandStats(delta.collect())
    }

    /// Both deltas added up.
    pub(crate) fn plus(&self, other: &CommandStats) -> CommandStats {
        let mut sum = self.0.clone();
        for (name, (calls, usec)) in &other.0 {
            let entry = sum.entry(name.clone()).or_default();
            *entry = (entry.0 + calls, entry.1 + usec);
        }
        CommandStats(sum)
    }

    /// The names of the commands that ran, separated by spaces.
    pub(crate) fn names(&self) -> String {
        let mut names: Vec<&str> = self
            .0
            .iter()
            .filter(|c| c.1.0 > 0)
            .map(|c| c.0.as_str())
            .collect();
        names.sort_unstable();
        names.join(" ")
    }

    pub(crate) fn calls(&self, name: &str) -> u64 {
        self.0.get(name).map_or(0, |c| c.0)
    }

    /// Calls of every command.
    pub(crate) fn total(&self) -> u64 {
        self.0.values().map(|c| c.0).sum()
    }

    /// Calls of the commands in `names` (separated by spaces).
    pub(crate) fn sum(&self, names: &str) -> u64 {
        names.split_whitespace().map(|name| self.calls(name)).sum()
    }

    /// Server-side µs of the commands in `names` (separated by spaces).
    pub(crate) fn usec(&self, names: &str) -> u64 {
        let usec = |name| self.0.get(name).map_or(0, |c| c.1);
        names.split_whitespace().map(usec).sum()
    }

    /// `name calls-per-unit` for each command of `names` that ran, busiest first, e.g.
    /// `evalsha 2.00, ssubscribe 0.25`.
    pub(crate) fn breakdown(&self, per: u64, names: &str) -> String {
        let names = names.split_whitespace();
        let mut v: Vec<(u64, &str)> = names.map(|n| (self.calls(n), n)).collect();
        v.retain(|(calls, _)| *calls > 0);
        v.sort_unstable_by(|a, b| b.cmp(a));
        let v: Vec<String> = v
            .iter()
            .map(|(calls, n)| format!("{n} {:.2}", *calls as f64 / per.max(1) as f64))
            .collect();
        v.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let l: Latencies = (1..=100).rev().collect();
        assert_eq!((l.p50(), l.p99(), l.n()), (50, 99, 100));
        assert_eq!(Latencies::default().p50(), 0);
        assert_eq!(l.cdf()[49], (50, 0.5));
        // 3 significant digits (the bucket's top) at any scale.
        let l: Latencies = [171_300, 2_500_000_000].into_iter().collect();
        for (got, value) in [(l.p50(), 171_300), (l.p99(), 2_500_000_000)] {
            assert!(
                got >= value && got - value <= value / 1000,
                "{got} for {value}"
            );
        }
    }

    #[test]
    fn commandstats_deltas() {
        let before = CommandStats::parse(
            "# Commandstats\r\ncmdstat_evalsha:calls=10,usec=5\r\ncmdstat_info:calls=1,usec=3\r\n",
        );
        let after = CommandStats::parse(
            "cmdstat_evalsha:calls=14,usec=9\r\ncmdstat_set:calls=4,usec=1\r\ncmdstat_info:calls=9\r\ncmdstat_client|setinfo:calls=2\r\n",
        );
        let d = after.since(&before);
        assert_eq!(d.total(), 4 + 4 + 2);
        assert_eq!(d.sum(OUR_REQUESTS), 4 + 4 + 2);
        assert_eq!(d.sum(PEER_REQUESTS), 4 + 4 + 2);
        assert_eq!(d.usec(CYCLE_REQUESTS), 4 + 1);
        assert_eq!(d.usec("ping"), 0);
        assert_eq!(
            d.breakdown(2, OUR_REQUESTS),
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
