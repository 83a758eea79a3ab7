//! The checks over a run's records (see the crate's docs for each rule), and the checks
//! themselves on made-up records.

use std::collections::{BTreeMap, HashMap};

use lock_tests::chaos::{Answer, MAX_LEASE_MS, Section};

use crate::faults::{Fault, Kind};

/// Everything the checks read.
/// A worker's lag probe woke `late_us` late at `at` (it slept 10 ms from `at - late_us - 10 ms`).
#[derive(Debug, Clone)]
pub(crate) struct Lag {
    pub(crate) proc: u32,
    pub(crate) at: u64,
    pub(crate) late_us: u64,
}

impl Lag {
    /// A worker's `LAG <µs> <ms>` line.
    pub(crate) fn parse(proc: u32, line: &str) -> Option<Lag> {
        let mut parts = line.strip_prefix("LAG ")?.split(' ');
        let at = parts.next()?.parse().ok()?;
        let late_ms: u64 = parts.next()?.parse().ok()?;
        Some(Lag {
            proc,
            at,
            late_us: late_ms * 1000,
        })
    }
}

/// The worst lag of process `proc` that overlapped `[from, to]`, for messages.
/// The longest time process `proc` was not scheduled between `from` and `to` (µs), as its lag
/// probe measured it.
fn worst_lag(lags: &[Lag], proc: u32, from: u64, to: u64) -> Option<u64> {
    lags.iter()
        .filter(|l| l.proc == proc && l.at >= from && l.at.saturating_sub(l.late_us) <= to)
        .map(|l| l.late_us)
        .max()
}

fn lag_within(lags: &[Lag], proc: u32, from: u64, to: u64) -> String {
    match worst_lag(lags, proc, from, to) {
        Some(us) => format!(
            "; meanwhile p{proc} was not scheduled for up to {} ms (its lag probe, a thread \
             outside the runtime, woke that late: a starved machine)",
            us / 1000
        ),
        None => String::new(),
    }
}

pub(crate) struct Input<'a> {
    pub(crate) sections: &'a [Section],
    pub(crate) faults: &'a [Fault],
    /// When a worker process was not scheduled (its lag probe woke late): shown beside a late
    /// wait, and its length added to that wait's tolerance (a process the machine does not
    /// run cannot return; the probe is a thread outside the runtime, so a runtime blocked by
    /// the library's own code does not delay it).
    pub(crate) lags: &'a [Lag],
    /// Per lock key, the store's log of accepted writes (`"<id> <fence>"`), in order.
    pub(crate) logs: &'a HashMap<String, Vec<String>>,
    pub(crate) tolerance_us: u64,
    /// When the faults stopped and when the workers were told to stop (for the liveness
    /// check); `None` to skip it.
    pub(crate) quiet: Option<(u64, u64)>,
    pub(crate) keys: &'a [String],
}

#[derive(Debug)]
pub(crate) struct Violation {
    pub(crate) rule: &'static str,
    pub(crate) detail: String,
    /// Names of the sections involved (`p0t1n7`).
    pub(crate) sections: Vec<String>,
}

#[derive(Debug, Default)]
pub(crate) struct Report {
    pub(crate) violations: Vec<Violation>,
    /// What was seen, counted by name.
    pub(crate) counts: BTreeMap<String, u64>,
    /// The largest time past its bound of a wait (not excused), in µs.
    pub(crate) worst_wait_over_us: i64,
}

impl Report {
    fn violation(&mut self, rule: &'static str, detail: String, sections: &[&Section]) {
        self.violations.push(Violation {
            rule,
            detail,
            sections: sections.iter().map(|s| s.name()).collect(),
        });
    }

    fn count(&mut self, what: &str) {
        *self.counts.entry(what.to_owned()).or_default() += 1;
    }

    pub(crate) fn rules(&self) -> BTreeMap<&'static str, usize> {
        let mut m = BTreeMap::new();
        for v in &self.violations {
            *m.entry(v.rule).or_default() += 1;
        }
        m
    }
}

/// The time the process `proc` spent stopped by the driver within `[from, to]`, in µs.
pub(crate) fn stopped_within(faults: &[Fault], proc: u32, from: u64, to: u64) -> u64 {
    faults
        .iter()
        .filter(|f| f.kind == Kind::StopWorker && f.proc == Some(proc))
        .map(|f| f.end.min(to).saturating_sub(f.start.max(from)))
        .sum()
}

/// When the holder stopped believing it held: told of the loss, or its body ended.
fn learned(s: &Section) -> u64 {
    let end = s.end.unwrap_or(s.ret);
    s.told.map_or(end, |t| t.min(end))
}

/// A section that ended as if nothing happened: acquired, never told of a loss, `run`
/// returned `Ok` or the guard's release did.
fn clean(s: &Section) -> bool {
    s.acq.is_some()
        && s.told.is_none()
        && s.result == "ok"
        && s.release.as_deref().is_none_or(|r| r == "ok")
}

/// Runs every check over the records. The argument behind `two-holders`, without data loss:
/// A acquired (on the server) at some point in `[A.call, A.acq]`, B in `[B.call, B.acq]`, and
/// `A.acq <= B.acq`. A `true` from `is_held()` at `t` means the lease's local deadline, which
/// is never later than the server's expiry of that lock, is after `t`, and the lock is not
/// released before the body ends. If A's `is_held()` was true at some `t >= B.acq`, A's lock
/// lived on the server from A's acquisition to past `t`; if B's `is_held()` was true at all
/// (at some `tb >= B.acq >= A.acq`), B's lived from B's acquisition to past `tb`. Whichever
/// acquired second did so while the other's lock lived: two holders.
pub(crate) fn check(input: &Input<'_>) -> Report {
    let mut r = Report::default();
    for _ in input.lags {
        r.count("times a worker was not scheduled for over 50 ms (lag probe)");
    }

    // Which writes the store accepted, and where in its log.
    let mut accepted: HashMap<&str, usize> = HashMap::new();
    for entries in input.logs.values() {
        for (i, e) in entries.iter().enumerate() {
            let id = e.split(' ').next().unwrap_or_default();
            accepted.insert(id, i + 1);
        }
    }

    // records: results as expected, the workers' view agrees with the store.
    for s in input.sections {
        r.count(&format!("attempt result {}", s.result));
        if s.acq.is_some() {
            r.count("acquired");
        }
        if let Some(how) = &s.how {
            r.count(&format!("told by {how}"));
        }
        match s.result.as_str() {
            "ok" | "Busy" | "Timeout" | "Backend" => {}
            "LeaseLost" if s.acq.is_some() => {}
            "HUNG" => r.violation(
                "process",
                format!(
                    "{}: the attempt did not end within the worker's bound",
                    s.name()
                ),
                &[s],
            ),
            other => r.violation(
                "records",
                format!("{}: unexpected result {other}", s.name()),
                &[s],
            ),
        }
        if let Some(rel) = s.release.as_deref()
            && !matches!(rel, "ok" | "LeaseLost" | "Backend")
        {
            r.violation(
                "records",
                format!("{}: unexpected release result {rel}", s.name()),
                &[s],
            );
        }
        if let Some(inner) = s.inner.as_deref()
            && !matches!(inner, "ok" | "LeaseLost")
        {
            r.violation(
                "records",
                format!(
                    "{}: the nested reentrant run answered {inner} (it never waits)",
                    s.name()
                ),
                &[s],
            );
        }
        for w in &s.writes {
            let in_log = accepted.contains_key(w.id.as_str());
            r.count(if in_log {
                "writes accepted"
            } else {
                "writes rejected or lost"
            });
            let mismatch = match w.answer {
                Answer::Accepted => !in_log,
                Answer::Rejected => in_log,
                Answer::Failed | Answer::Unknown => false,
            };
            if mismatch {
                r.violation(
                    "records",
                    format!(
                        "{}: write {} answered {:?} but the store's log {} it",
                        s.name(),
                        w.id,
                        w.answer,
                        if in_log { "holds" } else { "lacks" }
                    ),
                    &[s],
                );
            }
        }
    }

    // Per key, the sections that held the lock, by the time they held it.
    let mut held: BTreeMap<&str, Vec<&Section>> = BTreeMap::new();
    for s in input.sections.iter().filter(|s| s.acq.is_some()) {
        held.entry(s.key.as_str()).or_default().push(s);
    }
    for list in held.values_mut() {
        list.sort_by_key(|s| (s.acq, s.call));
    }
    let acq = |s: &Section| s.acq.unwrap_or_default();

    for (key, list) in &held {
        for (i, a) in list.iter().enumerate() {
            let a_end = a.end.unwrap_or(a.ret);
            let a_last_check = a.writes.iter().map(|w| w.check).max();
            for b in &list[i + 1..] {
                let b_acq = acq(b);
                let overlaps = b_acq < a_end;
                let believed_late = a_last_check.is_some_and(|t| t >= b_acq);
                if !overlaps && !believed_late {
                    // Sorted by acq: no later section overlaps A either.
                    break;
                }
                if overlaps && clean(a) && clean(b) {
                    r.violation(
                        "untold-overlap",
                        format!(
                            "{key}: {} and {} overlapped ({} acquired before {} ended) and both \
                             ended as if nothing happened (run/release Ok, no loss seen)",
                            a.name(),
                            b.name(),
                            b.name(),
                            a.name()
                        ),
                        &[a, b],
                    );
                }
                // A's writes checked (is_held() true) after B held, and B's writes (each one
                // checked true): both held at once.
                let a_late: Vec<_> = a.writes.iter().filter(|w| w.check >= b_acq).collect();
                if a_late.is_empty() || b.writes.is_empty() {
                    if overlaps {
                        r.count(
                            "overlaps without a proven second holder (frozen, told, or silent)",
                        );
                    }
                    continue;
                }
                // A fault that may lose this key's data under way at some point between A's
                // call and B's acquire: a failover loses what the old primary acknowledges
                // until it is demoted, seconds after the fault began; a cluster primary killed
                // loses its own shard's keys only.
                let loss = input
                    .faults
                    .iter()
                    .find(|f| f.loss && f.start <= b_acq && f.end >= a.call && f.may_lose(key));
                let Some(loss) = loss else {
                    r.violation(
                        "two-holders",
                        format!(
                            "{key}: {} believed it held (is_held() true) after {} acquired, and \
                             {} believed it held too; no data loss in between",
                            a.name(),
                            b.name(),
                            b.name()
                        ),
                        &[a, b],
                    );
                    continue;
                };
                r.count("two holders after data loss (the documented Redis limit)");
                // The stale holder learns within its lease of the loss's end (a locker may
                // follow a new primary as late as the failover's end).
                let lease_us = a.lease_ms * 1000;
                let bound = loss.end
                    + lease_us
                    + input.tolerance_us
                    + stopped_within(input.faults, a.proc, loss.start, loss.end + lease_us);
                if learned(a) > bound {
                    r.violation(
                        "stale-learned-late",
                        format!(
                            "{key}: {} still believed it held {} ms after the data loss ({}) \
                             ended, past its lease of {} ms",
                            a.name(),
                            learned(a).saturating_sub(loss.end) / 1000,
                            loss.what,
                            a.lease_ms
                        ),
                        &[a, b],
                    );
                }
                if a.mode.fenced() {
                    let pos = |ws: &[&lock_tests::chaos::Write]| -> Vec<usize> {
                        ws.iter()
                            .filter_map(|w| accepted.get(w.id.as_str()).copied())
                            .collect()
                    };
                    let a_pos = pos(&a_late);
                    let b_all: Vec<_> = b.writes.iter().collect();
                    let b_pos = pos(&b_all);
                    if a_pos.is_empty() || b_pos.is_empty() {
                        r.count("stale fenced holder after data loss: its writes rejected");
                        continue;
                    }
                    let (lo, hi) = match a.fence.cmp(&b.fence) {
                        std::cmp::Ordering::Less => (&a_pos, &b_pos),
                        std::cmp::Ordering::Greater => (&b_pos, &a_pos),
                        std::cmp::Ordering::Equal => {
                            r.violation(
                                "fence-serial",
                                format!(
                                    "{key}: {} and {} held at once with the same fence {:?}, \
                                     and the store accepted writes of both",
                                    a.name(),
                                    b.name(),
                                    a.fence
                                ),
                                &[a, b],
                            );
                            continue;
                        }
                    };
                    let serial = lo.iter().max() < hi.iter().min();
                    if serial {
                        r.count("stale fenced holder after data loss: writes serialized by fence");
                    } else {
                        r.violation(
                            "fence-serial",
                            format!(
                                "{key}: the store interleaved the accepted writes of {} (fence \
                                 {:?}) and {} (fence {:?})",
                                a.name(),
                                a.fence,
                                b.name(),
                                b.fence
                            ),
                            &[a, b],
                        );
                    }
                } else {
                    r.count("stale unfenced holder wrote after data loss (documented limit)");
                }
            }
        }
    }

    // fence-backwards: a fence drawn after another was returned is larger; none twice.
    for (key, list) in &held {
        let mut fenced: Vec<&Section> =
            list.iter().copied().filter(|s| s.fence.is_some()).collect();
        fenced.sort_by_key(|s| s.acq);
        let mut seen: HashMap<u64, &Section> = HashMap::new();
        for s in &fenced {
            let f = s.fence.unwrap_or_default();
            if let Some(first) = seen.insert(f, s) {
                r.violation(
                    "fence-backwards",
                    format!(
                        "{key}: fence {f} was drawn twice, by {} and {}{}",
                        first.name(),
                        s.name(),
                        losses_between(input.faults, acq(first), acq(s))
                    ),
                    &[first, s],
                );
            }
        }
        // Prefix maxima over the sections in acquisition order: for B, every A whose acquire
        // returned before B's request was made drew its fence first.
        let mut best: Vec<(u64, &Section)> = Vec::with_capacity(fenced.len());
        for s in &fenced {
            let f = s.fence.unwrap_or_default();
            let prev = best.last().copied();
            best.push(match prev {
                Some((pf, ps)) if pf >= f => (pf, ps),
                _ => (f, s),
            });
        }
        for b in &fenced {
            let before = fenced.partition_point(|a| acq(a) < b.call);
            if before == 0 {
                continue;
            }
            let (max_f, a) = best[before - 1];
            let fb = b.fence.unwrap_or_default();
            if max_f >= fb && a.name() != b.name() {
                r.violation(
                    "fence-backwards",
                    format!(
                        "{key}: {} drew fence {fb} after {} had returned fence {max_f}{}",
                        b.name(),
                        a.name(),
                        losses_between(input.faults, acq(a), acq(b))
                    ),
                    &[a, b],
                );
            }
        }
    }

    // wait-bound: every wait returns within its bound, whatever the server does.
    let mut worst = i64::MIN;
    for s in input.sections {
        let Some(wait_ms) = s.wait_ms else { continue };
        let back = s.acq.unwrap_or(s.ret);
        let took = back.saturating_sub(s.call);
        if stopped_within(input.faults, s.proc, s.call, back) > 0 {
            r.count("waits not checked: their process was stopped");
            continue;
        }
        let over = took as i64 - (wait_ms * 1000) as i64;
        worst = worst.max(over);
        let starved = worst_lag(input.lags, s.proc, s.call, back).unwrap_or(0);
        if over > input.tolerance_us as i64 && over <= (input.tolerance_us + starved) as i64 {
            r.count("waits past the tolerance by less than their process's measured starvation");
        } else if over > input.tolerance_us as i64 {
            r.violation(
                "wait-bound",
                format!(
                    "{}: wait({wait_ms} ms) returned {} after {} ms ({} ms past the bound){}",
                    s.name(),
                    if s.acq.is_some() {
                        "the lock"
                    } else {
                        s.result.as_str()
                    },
                    took / 1000,
                    over / 1000,
                    overlapping_faults(input.faults, s.proc, s.call, back),
                ) + &lag_within(input.lags, s.proc, s.call, back),
                &[s],
            );
        }
    }
    r.worst_wait_over_us = worst;

    // liveness: every key is locked again once the faults stopped, unless a holder from before
    // kept it (renewing) until too late in the quiet period for the next one to be due: a
    // lock whose holder is gone ends within its lease, so the next acquire is due one
    // `MAX_LEASE_MS` after that holder's body ended, or was told of a loss.
    if let Some((quiet, stop)) = input.quiet {
        for key in input.keys {
            let of_key = || input.sections.iter().filter(|s| s.key == *key);
            if of_key().any(|s| s.acq.is_some_and(|a| a >= quiet)) {
                continue;
            }
            let held_until = |s: &Section| {
                let end = s.end.unwrap_or(s.ret);
                s.told.map_or(end, |t| t.min(end))
            };
            let kept = of_key()
                .filter(|s| s.acq.is_some())
                .max_by_key(|s| held_until(s));
            match kept {
                Some(s) if held_until(s) + MAX_LEASE_MS * 1000 > stop => {
                    r.count("keys held through the quiet period by an earlier holder");
                }
                last => r.violation(
                    "liveness",
                    format!(
                        "{key}: not locked by anyone in the {} ms after the faults stopped{}",
                        (stop - quiet) / 1000,
                        last.map_or_else(String::new, |s| format!(
                            "; its last holder {} held it until {:+} ms from then",
                            s.name(),
                            (i128::from(held_until(s)) - i128::from(quiet)) / 1000
                        ))
                    ),
                    &last.into_iter().collect::<Vec<_>>(),
                ),
            }
        }
    }
    r
}

/// The faults that may lose data under way at some point between `from` and `to`, for
/// messages.
pub(crate) fn losses_between(faults: &[Fault], from: u64, to: u64) -> String {
    let losses: Vec<&str> = faults
        .iter()
        .filter(|f| f.loss && f.start <= to.max(from) && f.end >= from.min(to))
        .map(|f| f.what.as_str())
        .collect();
    if losses.is_empty() {
        String::new()
    } else {
        format!(" (in between: {})", losses.join(", "))
    }
}

/// The faults active during `[from, to]` that can concern process `proc` (the stops of other
/// worker processes cannot), for messages.
pub(crate) fn overlapping_faults(faults: &[Fault], proc: u32, from: u64, to: u64) -> String {
    let during: Vec<&str> = faults
        .iter()
        .filter(|f| f.start <= to && f.end >= from)
        .filter(|f| f.kind != Kind::StopWorker || f.proc == Some(proc))
        .map(|f| f.what.as_str())
        .collect();
    if during.is_empty() {
        String::new()
    } else {
        format!("; faults meanwhile: {}", during.join(", "))
    }
}

// ---------------------------------------------------------------------------------------------
// The checks themselves, on made-up records: each rule fires on what it must catch, and stays
// quiet on what a correct library does under faults.

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::Kind;
    use lock_tests::chaos::Mode;
    use lock_tests::chaos::Write;

    const MS: u64 = 1000;

    fn held(proc: u32, n: u64, mode: Mode, acq: u64, end: u64, fence: Option<u64>) -> Section {
        let mut s = Section::new(proc, 0, n, "chaos:k0", mode, "run", Some(1000), 1000);
        s.call = acq - 5 * MS;
        s.acq = Some(acq);
        s.end = Some(end);
        s.ret = end + MS;
        s.fence = fence;
        s.result = "ok".into();
        s
    }

    fn write(s: &mut Section, at: u64, answer: Answer) {
        s.writes.push(Write {
            id: format!("{}w{}", s.name(), s.writes.len()),
            check: at,
            done: Some(at + MS),
            answer,
        });
    }

    fn run(sections: &[Section], faults: &[Fault]) -> Report {
        // The store's log: every write the records say was accepted, in check order.
        let mut all: Vec<&Write> = sections
            .iter()
            .flat_map(|s| &s.writes)
            .filter(|w| w.answer == Answer::Accepted)
            .collect();
        all.sort_by_key(|w| w.check);
        let logs = HashMap::from([(
            "chaos:k0".to_owned(),
            all.iter().map(|w| format!("{} -", w.id)).collect(),
        )]);
        check(&Input {
            sections,
            faults,
            lags: &[],
            logs: &logs,
            tolerance_us: 150 * MS,
            quiet: None,
            keys: &[],
        })
    }

    fn restart_at(t: u64) -> Fault {
        Fault {
            kind: Kind::Restart,
            proc: None,
            what: "restart".into(),
            start: t,
            end: t + 50 * MS,
            loss: true,
            slots: None,
        }
    }

    fn rules(r: &Report) -> Vec<&'static str> {
        r.rules().into_keys().collect()
    }

    #[test]
    fn one_holder_after_another_is_fine() {
        let mut a = held(0, 1, Mode::Plain, 1000 * MS, 1200 * MS, None);
        write(&mut a, 1010 * MS, Answer::Accepted);
        let mut b = held(1, 1, Mode::Plain, 1300 * MS, 1400 * MS, None);
        b.call = 1100 * MS;
        write(&mut b, 1310 * MS, Answer::Accepted);
        assert!(run(&[a, b], &[]).violations.is_empty());
    }

    #[test]
    fn two_writers_without_data_loss_are_two_holders() {
        let mut a = held(0, 1, Mode::Plain, 1000 * MS, 1500 * MS, None);
        write(&mut a, 1400 * MS, Answer::Accepted);
        a.told = Some(1450 * MS);
        let mut b = held(1, 1, Mode::Plain, 1300 * MS, 1600 * MS, None);
        write(&mut b, 1310 * MS, Answer::Accepted);
        assert_eq!(rules(&run(&[a, b], &[])), ["two-holders"]);
    }

    #[test]
    fn a_frozen_holder_that_writes_nothing_after_is_not_a_second_holder() {
        // A is stopped past its lease; B takes the key; A wakes, sees is_held() false.
        let mut a = held(0, 1, Mode::Plain, 1000 * MS, 3000 * MS, None);
        write(&mut a, 1010 * MS, Answer::Accepted);
        a.tell(3000 * MS, "is_held");
        a.result = "LeaseLost".into();
        let mut b = held(1, 1, Mode::Plain, 2100 * MS, 2200 * MS, None);
        write(&mut b, 2110 * MS, Answer::Accepted);
        assert!(run(&[a, b], &[]).violations.is_empty());
    }

    #[test]
    fn overlapping_sections_that_both_end_ok_are_caught() {
        let a = held(0, 1, Mode::Plain, 1000 * MS, 1500 * MS, None);
        let b = held(1, 1, Mode::Plain, 1300 * MS, 1600 * MS, None);
        assert_eq!(
            rules(&run(&[a, b], &[restart_at(1100 * MS)])),
            ["untold-overlap"]
        );
    }

    #[test]
    fn a_stale_unfenced_writer_after_a_restart_is_the_documented_limit_if_it_learns_in_time() {
        let mut a = held(0, 1, Mode::Plain, 1000 * MS, 1500 * MS, None);
        write(&mut a, 1400 * MS, Answer::Accepted);
        a.tell(1500 * MS, "lost");
        let mut b = held(1, 1, Mode::Plain, 1300 * MS, 1600 * MS, None);
        write(&mut b, 1310 * MS, Answer::Accepted);
        let ok = run(&[a.clone(), b.clone()], &[restart_at(1100 * MS)]);
        assert!(ok.violations.is_empty(), "{:?}", ok.violations);
        assert_eq!(
            ok.counts
                .get("stale unfenced holder wrote after data loss (documented limit)"),
            Some(&1)
        );
        // Told 3 s after the restart, with a 1 s lease: too late.
        a.told = Some(4200 * MS);
        a.end = Some(4200 * MS);
        b.end = Some(4300 * MS);
        write(&mut a, 4100 * MS, Answer::Accepted);
        assert_eq!(
            rules(&run(&[a, b], &[restart_at(1100 * MS)])),
            ["stale-learned-late"]
        );
    }

    /// A failover loses what the old primary acknowledged until it is demoted, seconds after
    /// `SENTINEL FAILOVER` began: an acquire the old primary answered after the fault began
    /// and before it ended is lost too (a Sentinel chaos run: A answered by the old primary
    /// 2.3 s into the failover, B by the new one 5 ms later). Excused only while such a fault
    /// is under way between A's call and B's acquire.
    #[test]
    fn two_holders_while_a_failover_is_under_way_are_the_documented_limit() {
        let failover = |start: u64, end: u64| Fault {
            kind: Kind::Failover,
            proc: None,
            what: "SENTINEL FAILOVER".into(),
            start,
            end,
            loss: true,
            slots: None,
        };
        let mut a = held(0, 1, Mode::Plain, 1000 * MS, 1500 * MS, None);
        write(&mut a, 1400 * MS, Answer::Accepted);
        a.tell(1500 * MS, "lost");
        let mut b = held(1, 1, Mode::Plain, 1300 * MS, 1600 * MS, None);
        write(&mut b, 1310 * MS, Answer::Accepted);
        // Began before A's call, ended after B's acquire.
        let ok = run(&[a.clone(), b.clone()], &[failover(900 * MS, 2000 * MS)]);
        assert!(ok.violations.is_empty(), "{:?}", ok.violations);
        assert_eq!(
            ok.counts
                .get("two holders after data loss (the documented Redis limit)"),
            Some(&1)
        );
        // Ended before A's call: nothing was lost in between.
        assert_eq!(
            rules(&run(
                &[a.clone(), b.clone()],
                &[failover(500 * MS, 990 * MS)]
            )),
            ["two-holders"]
        );
        // The stale holder still learns within its lease of the failover's end.
        a.told = Some(3300 * MS);
        a.end = Some(3300 * MS);
        b.end = Some(3400 * MS);
        write(&mut a, 3200 * MS, Answer::Accepted);
        assert_eq!(
            rules(&run(&[a, b], &[failover(900 * MS, 2000 * MS)])),
            ["stale-learned-late"]
        );
    }

    /// A cluster primary killed loses only its own shard's keys: two holders of a key served by
    /// another shard are no documented limit, however long the kill, the promotion and the
    /// restart take (seconds, all of them a window now that a loss under way counts).
    #[test]
    fn a_primary_killed_excuses_two_holders_of_its_own_slots_only() {
        let kill = |slots: Vec<u16>| Fault {
            kind: Kind::PrimaryKill,
            proc: None,
            what: "primary node 0 killed".into(),
            start: 900 * MS,
            end: 4000 * MS,
            loss: true,
            slots: Some(slots),
        };
        let mut a = held(0, 1, Mode::Plain, 1000 * MS, 1500 * MS, None);
        write(&mut a, 1400 * MS, Answer::Accepted);
        a.tell(1500 * MS, "lost");
        let mut b = held(1, 1, Mode::Plain, 1300 * MS, 1600 * MS, None);
        write(&mut b, 1310 * MS, Answer::Accepted);
        let slot = lock_testkit::cluster::key_slot("chaos:k0");
        let ok = run(&[a.clone(), b.clone()], &[kill(vec![slot])]);
        assert!(ok.violations.is_empty(), "{:?}", ok.violations);
        // Another shard's primary killed: chaos:k0 lost nothing.
        assert_eq!(
            rules(&run(&[a, b], &[kill(vec![(slot + 1) % 16384])])),
            ["two-holders"]
        );
    }

    #[test]
    fn fences_that_go_backwards_or_repeat_are_caught() {
        let a = held(0, 1, Mode::Fenced, 1000 * MS, 1100 * MS, Some(7));
        let mut b = held(1, 1, Mode::Fenced, 1300 * MS, 1400 * MS, Some(1));
        b.call = 1200 * MS;
        let r = run(&[a.clone(), b], &[restart_at(1150 * MS)]);
        assert_eq!(rules(&r), ["fence-backwards"]);
        let mut c = held(1, 2, Mode::Fenced, 1300 * MS, 1400 * MS, Some(7));
        c.call = 1200 * MS;
        assert_eq!(rules(&run(&[a, c], &[])), ["fence-backwards"]);
    }

    #[test]
    fn a_stale_fenced_writer_is_fine_when_the_store_rejects_it() {
        let mut a = held(0, 1, Mode::Fenced, 1000 * MS, 1500 * MS, Some(3));
        write(&mut a, 1010 * MS, Answer::Accepted);
        write(&mut a, 1400 * MS, Answer::Rejected);
        a.tell(1500 * MS, "run");
        a.result = "LeaseLost".into();
        let mut b = held(1, 1, Mode::Fenced, 1300 * MS, 1600 * MS, Some(4));
        b.call = 1200 * MS;
        write(&mut b, 1310 * MS, Answer::Accepted);
        let r = run(&[a.clone(), b.clone()], &[restart_at(1100 * MS)]);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        // The same writes accepted with one fence: the store could not tell them apart.
        a.fence = Some(4);
        a.writes[1].answer = Answer::Accepted;
        b.writes[0].check = 1350 * MS;
        a.writes[1].check = 1400 * MS;
        let r = run(&[a, b], &[restart_at(1100 * MS)]);
        assert!(rules(&r).contains(&"fence-serial"), "{:?}", r.violations);
    }

    #[test]
    fn a_wait_past_its_bound_is_caught_unless_its_process_was_stopped() {
        let mut s = Section::new(0, 0, 1, "chaos:k0", Mode::Plain, "run", Some(1000), 1000);
        s.call = 1000 * MS;
        s.ret = 2400 * MS;
        s.result = "Timeout".into();
        assert_eq!(rules(&run(std::slice::from_ref(&s), &[])), ["wait-bound"]);
        let stop = Fault {
            kind: Kind::StopWorker,
            proc: Some(0),
            what: "SIGSTOP".into(),
            start: 1500 * MS,
            end: 2000 * MS,
            loss: false,
            slots: None,
        };
        assert!(run(&[s], &[stop]).violations.is_empty());
    }

    #[test]
    fn a_late_wait_is_excused_only_up_to_its_processs_measured_starvation() {
        let mut s = Section::new(0, 0, 1, "chaos:k0", Mode::Plain, "run", Some(1000), 1000);
        s.call = 1000 * MS;
        // 300 ms past the bound: 150 ms more than the tolerance.
        s.ret = 2300 * MS;
        s.result = "Timeout".into();
        let with_lag = |late_us: u64| {
            let lags = [Lag {
                proc: 0,
                at: 1800 * MS,
                late_us,
            }];
            check(&Input {
                sections: std::slice::from_ref(&s),
                faults: &[],
                lags: &lags,
                logs: &HashMap::new(),
                tolerance_us: 150 * MS,
                quiet: None,
                keys: &["chaos:k0".to_owned()],
            })
        };
        assert_eq!(rules(&with_lag(100 * MS)), ["wait-bound"]);
        assert!(with_lag(160 * MS).violations.is_empty());
    }

    fn liveness(sections: &[Section], quiet: (u64, u64)) -> Report {
        check(&Input {
            sections,
            faults: &[],
            lags: &[],
            logs: &HashMap::new(),
            tolerance_us: 150 * MS,
            quiet: Some(quiet),
            keys: &["chaos:k0".to_owned()],
        })
    }

    #[test]
    fn a_key_nobody_locks_after_the_faults_is_caught_unless_its_holder_kept_it() {
        let quiet = (10_000 * MS, 13_000 * MS);
        // Locked again in the quiet period.
        let again = held(1, 2, Mode::Plain, 10_500 * MS, 10_600 * MS, None);
        let before = held(0, 1, Mode::Plain, 9_000 * MS, 9_500 * MS, None);
        assert!(
            liveness(&[before.clone(), again], quiet)
                .violations
                .is_empty()
        );
        // Released before the quiet period, and nobody took it since.
        assert_eq!(rules(&liveness(&[before], quiet)), ["liveness"]);
        // Kept (renewed) by a lingering holder until 1.5 s before the stop: not yet due.
        let lingering = held(0, 1, Mode::Plain, 9_000 * MS, 11_500 * MS, None);
        assert!(
            liveness(std::slice::from_ref(&lingering), quiet)
                .violations
                .is_empty()
        );
        // The same holder told of a loss early in the quiet period: the key was free since.
        let mut lost = lingering;
        lost.tell(10_100 * MS, "lost");
        assert_eq!(rules(&liveness(&[lost], quiet)), ["liveness"]);
        // Never locked at all.
        assert_eq!(rules(&liveness(&[], quiet)), ["liveness"]);
    }
}
