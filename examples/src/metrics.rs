//! `GET /metrics`: the locks' metrics (lock-core's and lock-tower's `metrics` feature) in
//! Prometheus text, from a `metrics-exporter-prometheus` recorder installed once per process,
//! and the quantiles the demo's report reads back from that text.
//!
//! Histograms are exported as Prometheus summaries (quantiles 0, 0.5, 0.9, 0.95, 0.99, 0.999
//! and 1 over a rolling window, with `_sum` and `_count`), so the p50 and p99 of the lock's wait
//! and hold are series of their own: `examples/grafana/flash-sale.json` plots them.
//!
//! ```
//! let text = lock_examples::metrics::render().unwrap_or_default();
//! # drop(text);
//! ```

use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// The class of the SKU lock (`LockLayer::class`), the label the report reads.
pub const SKU_CLASS: &str = "inventory:{sku}";

/// The process's Prometheus recorder, installed at the first call. `None` when another
/// recorder was installed first (then `/metrics` answers 404).
///
/// ```
/// assert!(lock_examples::metrics::handle().is_some());
/// ```
pub fn handle() -> Option<&'static PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| PrometheusBuilder::new().install_recorder().ok())
        .as_ref()
}

/// The metrics in Prometheus text, after the recorder's upkeep (drains histogram samples
/// into their summaries; run at each scrape, no background task needed).
///
/// ```
/// assert!(lock_examples::metrics::render().is_some());
/// ```
pub fn render() -> Option<String> {
    let handle = handle()?;
    handle.run_upkeep();
    Some(handle.render())
}

/// The value of `name` whose labels include every pair of `labels`, in Prometheus `text`,
/// summed over the series that match (one series: its value).
///
/// ```
/// let text = "lock_held{class=\"a\",backend=\"memory\"} 2\nlock_held{class=\"b\",backend=\"memory\"} 1\n";
/// use lock_examples::metrics::value;
/// assert_eq!(value(text, "lock_held", &[("class", "a")]), Some(2.0));
/// assert_eq!(value(text, "lock_held", &[]), Some(3.0));
/// assert_eq!(value(text, "lock_waiters", &[]), None);
/// ```
pub fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut total = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, number)) = line.rsplit_once(' ') else {
            continue;
        };
        let (metric, rest) = series.split_once('{').unwrap_or((series, "}"));
        if metric != name {
            continue;
        }
        let all = labels
            .iter()
            .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")));
        if let (true, Ok(n)) = (all, number.parse::<f64>()) {
            total = Some(total.unwrap_or(0.0) + n);
        }
    }
    total
}

/// The SKU lock's wait and hold quantiles (p50, p99), in seconds, as a report line.
///
/// ```
/// let text = "lock_acquire_duration_seconds{class=\"inventory:{sku}\",backend=\"memory\",outcome=\"acquired\",quantile=\"0.5\"} 0.001\n";
/// let line = lock_examples::metrics::lock_latency_line(text);
/// assert!(line.starts_with("lock inventory:{sku}"), "{line}");
/// assert!(line.contains("wait p50 1.0 ms"), "{line}");
/// ```
pub fn lock_latency_line(text: &str) -> String {
    let q = |name: &str, extra: &[(&str, &str)], quantile: &str| {
        let mut labels = vec![("class", SKU_CLASS), ("quantile", quantile)];
        labels.extend_from_slice(extra);
        value(text, name, &labels)
            .map(|s| format!("{:.1} ms", s * 1e3))
            .unwrap_or_else(|| "n/a".into())
    };
    let wait = [("outcome", "acquired")];
    let acquire = "lock_acquire_duration_seconds";
    let held = "lock_held_duration_seconds";
    format!(
        "lock {SKU_CLASS} (from /metrics): wait p50 {} p99 {}, hold p50 {} p99 {}",
        q(acquire, &wait, "0.5"),
        q(acquire, &wait, "0.99"),
        q(held, &[], "0.5"),
        q(held, &[], "0.99"),
    )
}
