//! [`Report`]: what the demo measured, the invariants it checked, and the table it prints.

use std::io::{self, Write};
use std::time::Duration;

/// Counts for one inventory phase, summed over the rounds.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct InventoryPhase {
    /// `"wait"` or `"no_wait"`.
    pub mode: &'static str,
    /// Buyers per round (times attempts for `no_wait`), for the label.
    pub label: String,
    /// HTTP requests sent.
    pub requests: u64,
    /// 200 answers (reservations).
    pub successes: u64,
    /// Lock-busy 409 answers.
    pub busy: u64,
    /// Sold-out 409 answers.
    pub sold_out: u64,
    /// Buyers who ran out of attempts while the lock stayed busy.
    pub gave_up: u64,
    /// Transport errors and unexpected statuses.
    pub errors: u64,
    /// Items the SKUs started with.
    pub stock: i64,
    /// Items in the sales ledgers (what was really sold).
    pub sold: u64,
    /// Items in 200 answers, as the buyers counted them.
    pub bought: u64,
    /// Stock counters at the end, summed.
    pub left: i64,
    /// The lowest stock counter of any SKU at the end.
    pub lowest: i64,
    /// Items sold beyond the initial stock, summed over SKUs.
    pub oversold: u64,
    /// Whether every SKU's counter agrees with its ledger.
    pub consistent: bool,
    /// Client-side latency of every request.
    pub latencies: Vec<Duration>,
}

/// Counts for the lottery round(s).
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct LotteryPhase {
    /// Users per round, for the label.
    pub label: String,
    /// Users who entered, over all rounds.
    pub users: u64,
    /// HTTP requests sent.
    pub requests: u64,
    /// Requests that repeated an earlier `Idempotency-Key`.
    pub replays: u64,
    /// Replays answered exactly (status and body) like the first request with that key.
    pub identical_replays: u64,
    /// Second entries under a new key answered 409 already-entered with the user's first entry.
    pub already_entered: u64,
    /// Second entries under a new key (each should be refused).
    pub second_entries: u64,
    /// Lock-busy 409 answers.
    pub busy: u64,
    /// Transport errors and unexpected statuses.
    pub errors: u64,
    /// Users whose entry says they won.
    pub winners: u64,
    /// The prize pools, summed.
    pub prizes: u64,
    /// Prizes in the winners ledgers, summed.
    pub awarded: u64,
    /// The awarded counters (read-modify-written), summed.
    pub award_counter: u64,
    /// Prizes beyond the pools, summed over draws.
    pub over_awarded: u64,
    /// Draws performed per the entries ledgers (one per user when correct).
    pub draws: u64,
    /// Users who drew more than once.
    pub drew_twice: u64,
    /// Client-side latency of every request.
    pub latencies: Vec<Duration>,
}

/// Counts for the checkout round(s): payments behind `IdempotencyLayer`, every request retried.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct CheckoutPhase {
    /// Orders per round, for the label.
    pub label: String,
    /// Distinct `Idempotency-Key`s (one per order).
    pub keys: u64,
    /// HTTP requests sent.
    pub requests: u64,
    /// Charges in the payments ledgers: how many times the handler ran.
    pub handler_runs: u64,
    /// Answers marked `Idempotent-Replayed: true`.
    pub replays: u64,
    /// Retries (answers beyond the first per key) identical, status and body, to the first.
    pub identical: u64,
    /// Orders charged more than once.
    pub charged_twice: u64,
    /// Transport errors and unexpected statuses.
    pub errors: u64,
    /// Client-side latency of every request.
    pub latencies: Vec<Duration>,
}

impl CheckoutPhase {
    /// Requests beyond the first per key: the retries.
    ///
    /// ```
    /// let mut p = lock_examples::demo::CheckoutPhase::default();
    /// p.requests = 40;
    /// p.keys = 10;
    /// assert_eq!(p.retries(), 30);
    /// ```
    pub fn retries(&self) -> u64 {
        self.requests.saturating_sub(self.keys)
    }
}

/// One invariant and whether it held.
#[derive(Debug, Clone)]
pub struct Check {
    /// What must hold.
    pub name: String,
    /// Whether it did.
    pub ok: bool,
    /// The figures behind the verdict.
    pub detail: String,
}

/// Everything one demo run measured.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Report {
    /// `"memory"` or `"redis"`.
    pub backend: &'static str,
    /// How many servers answered (1 in-process, or N processes).
    pub servers: usize,
    /// Whether the service locked.
    pub locking: bool,
    /// Rounds run.
    pub rounds: u32,
    /// The service's work time between read and write.
    pub work: Duration,
    /// The key namespace of this run (in Redis: where to look).
    pub namespace: String,
    /// The two inventory phases: pessimistic (`wait`), optimistic (`no_wait`).
    pub inventory: Vec<InventoryPhase>,
    /// The lottery.
    pub lottery: LotteryPhase,
    /// The checkout.
    pub checkout: CheckoutPhase,
    /// Retries each lottery user sent together with its first request.
    pub lottery_concurrent_retries: usize,
    /// Problems met on the way (first few transport errors, unexpected answers).
    pub notes: Vec<String>,
    /// Keys removed from the backend after the run (`None`: kept, or the cleanup failed).
    pub cleaned_keys: Option<u64>,
    /// The SKU lock's wait and hold p50/p99, read from the first server's `/metrics` after the
    /// run (`None`: not read).
    pub lock_latency: Option<String>,
}

impl Report {
    /// Items sold beyond the stock, over every SKU of the run.
    ///
    /// ```no_run
    /// # fn f(report: lock_examples::demo::Report) { assert_eq!(report.oversold(), 0); }
    /// ```
    pub fn oversold(&self) -> u64 {
        self.inventory.iter().map(|p| p.oversold).sum()
    }

    /// The invariants, each with its verdict.
    ///
    /// ```no_run
    /// # fn f(report: lock_examples::demo::Report) {
    /// for check in report.checks() { println!("{} {}", check.ok, check.name); }
    /// # }
    /// ```
    pub fn checks(&self) -> Vec<Check> {
        let inv = &self.inventory;
        let stock: i64 = inv.iter().map(|p| p.stock).sum();
        let sold: u64 = inv.iter().map(|p| p.sold).sum();
        let bought: u64 = inv.iter().map(|p| p.bought).sum();
        let left: i64 = inv.iter().map(|p| p.left).sum();
        let lowest = inv.iter().map(|p| p.lowest).min().unwrap_or(0);
        let oversold = self.oversold();
        let errors: u64 = inv.iter().map(|p| p.errors).sum::<u64>() + self.lottery.errors;
        let lot = &self.lottery;
        let pay = &self.checkout;
        vec![
            Check {
                name: "stock never below zero".into(),
                ok: lowest >= 0,
                detail: format!("lowest final stock: {lowest}"),
            },
            Check {
                name: format!("oversold = {oversold}"),
                ok: oversold == 0,
                detail: format!("{sold} items sold of {stock} in stock"),
            },
            Check {
                name: "every sale counted once".into(),
                ok: inv.iter().all(|p| p.consistent) && sold == bought,
                detail: format!(
                    "{bought} bought by buyers = {sold} in the sales ledgers = {stock} stock - {left} left"
                ),
            },
            Check {
                name: "every request answered as documented".into(),
                ok: errors == 0,
                detail: format!("{errors} transport errors or unexpected answers"),
            },
            Check {
                name: "each user drew at most once per draw".into(),
                ok: lot.drew_twice == 0
                    && lot.draws == lot.users
                    && lot.already_entered == lot.second_entries,
                detail: format!(
                    "{} users, {} draws; {} of {} second entries refused as already entered",
                    lot.users, lot.draws, lot.already_entered, lot.second_entries
                ),
            },
            Check {
                name: "same Idempotency-Key, same answer".into(),
                ok: lot.identical_replays == lot.replays,
                detail: format!(
                    "{} of {} retries answered identically",
                    lot.identical_replays, lot.replays
                ),
            },
            Check {
                name: "prize pool never over-awarded".into(),
                ok: lot.over_awarded == 0
                    && lot.awarded == lot.winners
                    && lot.awarded == lot.award_counter,
                detail: format!(
                    "{} prizes in the winners ledgers of {} in the pools; counters say {}; {} winners told",
                    lot.awarded, lot.prizes, lot.award_counter, lot.winners
                ),
            },
            Check {
                name: "each payment charged once".into(),
                ok: pay.handler_runs == pay.keys && pay.charged_twice == 0,
                detail: format!(
                    "{} handler runs for {} Idempotency-Keys; {} orders charged twice",
                    pay.handler_runs, pay.keys, pay.charged_twice
                ),
            },
            Check {
                name: "retries answered by replay".into(),
                ok: pay.replays == pay.retries() && pay.identical == pay.retries(),
                detail: format!(
                    "{} of {} retries replayed, {} identical to the first answer",
                    pay.replays,
                    pay.retries(),
                    pay.identical
                ),
            },
        ]
    }

    /// Whether every invariant held.
    ///
    /// ```no_run
    /// # fn f(report: lock_examples::demo::Report) { std::process::exit(if report.passed() { 0 } else { 1 }); }
    /// ```
    pub fn passed(&self) -> bool {
        self.checks().iter().all(|c| c.ok)
    }

    /// Writes the table, the invariants and the verdict.
    ///
    /// # Errors
    /// When `out` fails.
    ///
    /// ```no_run
    /// # fn f(report: lock_examples::demo::Report) {
    /// report.write_table(&mut std::io::stdout()).unwrap();
    /// # }
    /// ```
    pub fn write_table(&self, out: &mut dyn Write) -> io::Result<()> {
        let servers = if self.servers == 1 {
            "1 (in-process)".to_owned()
        } else {
            format!("{} processes", self.servers)
        };
        writeln!(
            out,
            "flash-sale: backend {}, servers {servers}, locking {}, rounds {}, work between read and write {} ms",
            self.backend,
            if self.locking {
                "ON"
            } else {
                "OFF (--no-lock)"
            },
            self.rounds,
            self.work.as_millis(),
        )?;
        writeln!(out)?;
        let inventory: Vec<Vec<String>> = self
            .inventory
            .iter()
            .map(|p| {
                vec![
                    format!("{} ({})", p.mode, p.label),
                    p.requests.to_string(),
                    p.successes.to_string(),
                    p.busy.to_string(),
                    p.sold_out.to_string(),
                    p.gave_up.to_string(),
                    p.stock.to_string(),
                    p.sold.to_string(),
                    p.left.to_string(),
                    p.oversold.to_string(),
                    ms(percentile(&p.latencies, 50)),
                    ms(percentile(&p.latencies, 99)),
                ]
            })
            .collect();
        table(
            out,
            &[
                "inventory",
                "requests",
                "successes",
                "conflicts",
                "sold out",
                "gave up",
                "stock",
                "sold",
                "final stock",
                "oversold",
                "p50",
                "p99",
            ],
            &inventory,
        )?;
        writeln!(
            out,
            "  conflicts: 409 lock busy (no_wait); sold out: 409 sold-out; gave up: every attempt met a busy lock"
        )?;
        writeln!(out)?;
        let l = &self.lottery;
        let lottery = vec![vec![
            format!("draw ({})", l.label),
            l.requests.to_string(),
            l.draws.to_string(),
            l.replays.to_string(),
            l.identical_replays.to_string(),
            l.second_entries.to_string(),
            l.already_entered.to_string(),
            l.busy.to_string(),
            l.winners.to_string(),
            l.prizes.to_string(),
            l.over_awarded.to_string(),
            ms(percentile(&l.latencies, 50)),
            ms(percentile(&l.latencies, 99)),
        ]];
        table(
            out,
            &[
                "lottery",
                "requests",
                "draws",
                "retries",
                "same answer",
                "new keys",
                "refused",
                "conflicts",
                "winners",
                "prizes",
                "over-awarded",
                "p50",
                "p99",
            ],
            &lottery,
        )?;
        writeln!(
            out,
            "  retries: same Idempotency-Key, {} at once with the first request and 1 later; new keys: the same user again, to be refused",
            self.lottery_concurrent_retries
        )?;
        writeln!(out)?;
        let c = &self.checkout;
        let checkout = vec![vec![
            format!("pay ({})", c.label),
            c.requests.to_string(),
            c.keys.to_string(),
            c.handler_runs.to_string(),
            c.replays.to_string(),
            c.identical.to_string(),
            c.charged_twice.to_string(),
            ms(percentile(&c.latencies, 50)),
            ms(percentile(&c.latencies, 99)),
        ]];
        table(
            out,
            &[
                "checkout",
                "requests",
                "keys",
                "handler runs",
                "replays",
                "same answer",
                "charged twice",
                "p50",
                "p99",
            ],
            &checkout,
        )?;
        writeln!(
            out,
            "  POST /checkout behind IdempotencyLayer, each request retried like the lottery's; handler runs: charges in the payments ledger"
        )?;
        writeln!(out)?;
        if let Some(line) = &self.lock_latency {
            writeln!(out, "{line}")?;
            writeln!(out)?;
        }
        let checks = self.checks();
        writeln!(out, "invariants")?;
        for check in &checks {
            writeln!(
                out,
                "  {:<4}  {:<40} {}",
                if check.ok { "ok" } else { "FAIL" },
                check.name,
                check.detail
            )?;
        }
        for note in &self.notes {
            writeln!(out, "  note: {note}")?;
        }
        if let (Some(n), "redis") = (self.cleaned_keys, self.backend) {
            writeln!(
                out,
                "  cleanup: removed the run's {n} keys ({}*) from Redis",
                self.namespace
            )?;
        }
        writeln!(out)?;
        let broken = checks.iter().filter(|c| !c.ok).count();
        if broken == 0 {
            writeln!(out, "PASS: every invariant holds")?;
        } else if self.locking {
            writeln!(out, "FAIL: {broken} invariant(s) broken")?;
        } else {
            writeln!(
                out,
                "FAIL: {broken} invariant(s) broken; this is what the lock prevents (run again without --no-lock)"
            )?;
        }
        Ok(())
    }
}

/// The `p`-th percentile (nearest rank) of `samples`; zero when there are none.
///
/// ```
/// use std::time::Duration;
/// let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
/// assert_eq!(lock_examples::demo::percentile(&samples, 50), Duration::from_millis(50));
/// assert_eq!(lock_examples::demo::percentile(&samples, 99), Duration::from_millis(99));
/// ```
pub fn percentile(samples: &[Duration], p: u32) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let rank = (sorted.len() * p.min(100) as usize).div_ceil(100).max(1);
    sorted[rank - 1]
}

/// Writes `rows` under `headers`, columns as wide as their widest cell; the first column is
/// aligned left, the others right.
fn table(out: &mut dyn Write, headers: &[&str], rows: &[Vec<String>]) -> io::Result<()> {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.len());
        }
    }
    let header: Vec<String> = headers.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, (cell, width)) in row.iter().zip(&widths).enumerate() {
            if i == 0 {
                line.push_str(&format!("{cell:<width$}"));
            } else {
                line.push_str(&format!("  {cell:>width$}"));
            }
        }
        writeln!(out, "{line}")?;
    }
    Ok(())
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}
