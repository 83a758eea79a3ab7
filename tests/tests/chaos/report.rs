//! The run's report: counts, the fault timeline and the offending records, printed.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use lock_tests::chaos::Section;

use crate::Config;
use crate::check::{Input, Report};
use crate::faults::Kind;

/// At most this many examples of one rule are printed in full.
const EXAMPLES: usize = 8;

/// Milliseconds since `t0`, signed, with one decimal.
fn rel(t0: u64, t: u64) -> String {
    format!("{:+.1}", (t as f64 - t0 as f64) / 1000.0)
}

fn describe(s: &Section, t0: u64, accepted: &HashMap<&str, usize>) -> String {
    let opt = |t: Option<u64>| t.map_or_else(|| "-".to_owned(), |t| rel(t0, t));
    let mut out = format!(
        "{} key={} mode={} api={} wait={} lease={}ms call={} acq={} fence={} end={} ret={} \
         told={}{} result={} release={} inner={}",
        s.name(),
        s.key,
        s.mode.as_str(),
        s.api,
        s.wait_ms
            .map_or_else(|| "no_wait".to_owned(), |w| format!("{w}ms")),
        s.lease_ms,
        rel(t0, s.call),
        opt(s.acq),
        s.fence.map_or_else(|| "-".to_owned(), |f| f.to_string()),
        opt(s.end),
        rel(t0, s.ret),
        opt(s.told),
        s.how
            .as_deref()
            .map_or_else(String::new, |h| format!("({h})")),
        s.result,
        s.release.as_deref().unwrap_or("-"),
        s.inner.as_deref().unwrap_or("-"),
    );
    for w in &s.writes {
        let _ = write!(
            out,
            "\n      write {} checked {} answered {} {:?}, store: {}",
            w.id,
            rel(t0, w.check),
            opt(w.done),
            w.answer,
            accepted
                .get(w.id.as_str())
                .map_or_else(|| "not in the log".to_owned(), |p| format!("accepted #{p}"))
        );
    }
    if !s.msg.is_empty() {
        let _ = write!(out, "\n      msg: {}", s.msg);
    }
    out
}

pub(crate) fn print_report(
    cfg: &Config,
    t0: u64,
    input: &Input<'_>,
    report: &Report,
    extra: &[(String, String)],
) {
    println!("\n=== chaos report: seed {} ===", cfg.seed);
    println!("replay: {}", cfg.replay());
    let mut kinds: BTreeMap<Kind, usize> = BTreeMap::new();
    for f in input.faults {
        *kinds.entry(f.kind).or_default() += 1;
    }
    println!("faults: {} {kinds:?}", input.faults.len());
    println!("sections: {}", input.sections.len());
    for (what, n) in &report.counts {
        println!("  {n:>6}  {what}");
    }
    println!(
        "worst wait past its bound (unexcused waits): {:.1} ms (tolerance {} ms)",
        report.worst_wait_over_us as f64 / 1000.0,
        cfg.tolerance_ms
    );
    let rules = report.rules();
    if rules.is_empty() && extra.is_empty() {
        println!("no violations");
        return;
    }
    println!(
        "\nVIOLATIONS: {rules:?}{}",
        if extra.is_empty() {
            ""
        } else {
            " + others below"
        }
    );
    println!("\nfault timeline (ms since the start):");
    for f in input.faults {
        println!("  {} .. {}  {}", rel(t0, f.start), rel(t0, f.end), f.what);
    }
    let mut accepted: HashMap<&str, usize> = HashMap::new();
    for entries in input.logs.values() {
        for (i, e) in entries.iter().enumerate() {
            accepted.insert(e.split(' ').next().unwrap_or_default(), i + 1);
        }
    }
    let by_name: HashMap<String, &Section> = input.sections.iter().map(|s| (s.name(), s)).collect();
    let mut shown: BTreeMap<&str, usize> = BTreeMap::new();
    for v in &report.violations {
        let n = shown.entry(v.rule).or_default();
        *n += 1;
        if *n > EXAMPLES {
            continue;
        }
        println!("\n[{}] {}", v.rule, v.detail);
        for name in &v.sections {
            if let Some(s) = by_name.get(name) {
                println!("    {}", describe(s, t0, &accepted));
            }
        }
    }
    for (rule, n) in &rules {
        if *n > EXAMPLES {
            println!("\n[{rule}] ... and {} more", n - EXAMPLES);
        }
    }
    for (rule, detail) in extra {
        println!("\n[{rule}] {detail}");
    }
}
