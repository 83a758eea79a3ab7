//! The seed scenario, driven over HTTP: waiting buyers, optimistic buyers, lottery retries.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use serde::Deserialize;
use tokio::sync::Barrier;
use tokio::task::JoinSet;

use super::progress::Progress;
use super::{CheckoutPhase, DemoConfig, DemoError, InventoryPhase, LotteryPhase, Report};
use crate::app::Shop;
use crate::checkout::{CheckoutRequest, Payment};
use crate::client::{Reply, ShopClient};
use crate::inventory::{Reservation, ReserveRequest};
use crate::lottery::Entry;
use crate::problem::{ALREADY_ENTERED, SOLD_OUT};

/// Most problems listed in the report.
const MAX_NOTES: usize = 5;

/// What one reservation request came to.
enum Outcome {
    Sold(u32),
    SoldOut,
    Busy,
    Error(String),
}

fn classify(
    url: &str,
    reply: Result<Reply, crate::client::ClientError>,
) -> (Outcome, Option<Duration>) {
    let reply = match reply {
        Ok(reply) => reply,
        Err(e) => return (Outcome::Error(e.to_string()), None),
    };
    let latency = Some(reply.latency);
    let outcome = match reply.status {
        StatusCode::OK => match reply.json::<Reservation>() {
            Some(r) => Outcome::Sold(r.quantity),
            None => Outcome::Error(format!("{url}: 200 without a reservation")),
        },
        StatusCode::CONFLICT => match reply.problem() {
            Some(p) if p.is(SOLD_OUT) => Outcome::SoldOut,
            Some(p) if p.is_lock_conflict() => Outcome::Busy,
            _ => Outcome::Error(format!(
                "{url}: 409 of no documented type: {}",
                String::from_utf8_lossy(&reply.body)
            )),
        },
        status => Outcome::Error(format!(
            "{url}: unexpected {status}: {}",
            String::from_utf8_lossy(&reply.body)
                .chars()
                .take(200)
                .collect::<String>()
        )),
    };
    (outcome, latency)
}

/// Runs every round and reads the final state back through the service.
pub(super) async fn drive(
    shop: &Shop,
    bases: &[String],
    config: &DemoConfig,
    namespace: &str,
) -> Result<Report, DemoError> {
    let s = &config.scenario;
    let per_round = (s.buyers + s.optimistic_buyers + s.users + s.checkouts) as u64;
    let (progress, drawing) =
        Progress::start(per_round * u64::from(config.rounds), config.progress);
    let client = ShopClient::new();
    let mut waiting = InventoryPhase {
        mode: "wait",
        label: format!("{} buyers", s.buyers),
        consistent: true,
        ..InventoryPhase::default()
    };
    let mut eager = InventoryPhase {
        mode: "no_wait",
        label: format!("{} x {}", s.optimistic_buyers, s.attempts),
        consistent: true,
        ..InventoryPhase::default()
    };
    let mut lottery = LotteryPhase {
        label: format!("{} users", s.users),
        ..LotteryPhase::default()
    };
    let mut checkout = CheckoutPhase {
        label: format!("{} orders", s.checkouts),
        ..CheckoutPhase::default()
    };
    let mut notes = Vec::new();
    for round in 1..=config.rounds {
        let tag = format!("round {round}/{}", config.rounds);
        progress.phase(format!(
            "{tag}: {} buyers wait for {} items",
            s.buyers, s.stock
        ));
        let sku = format!("r{round}-wait");
        seed_sku(shop, &sku, s.stock).await?;
        let outcomes = buyers(&client, bases, &sku, s.buyers, 1, config.work, &progress).await;
        tally(&mut waiting, outcomes, &mut notes);
        read_stock(&client, &bases[0], &sku, &mut waiting).await?;

        progress.phase(format!(
            "{tag}: {} buyers x {} attempts, no_wait",
            s.optimistic_buyers, s.attempts
        ));
        let sku = format!("r{round}-nowait");
        seed_sku(shop, &sku, s.stock).await?;
        let outcomes = buyers(
            &client,
            bases,
            &sku,
            s.optimistic_buyers,
            s.attempts,
            config.work,
            &progress,
        )
        .await;
        tally(&mut eager, outcomes, &mut notes);
        read_stock(&client, &bases[0], &sku, &mut eager).await?;

        progress.phase(format!("{tag}: lottery, {} users retrying", s.users));
        let draw = format!("r{round}-draw");
        shop.lottery()
            .seed(&draw, s.prizes)
            .await
            .map_err(|e| DemoError::State(e.to_string()))?;
        lottery_round(
            &client,
            bases,
            &draw,
            config,
            &progress,
            &mut lottery,
            &mut notes,
        )
        .await;
        let view = client
            .draw(&bases[0], &draw)
            .await
            .map_err(|e| DemoError::State(e.to_string()))?;
        let distinct: HashSet<&String> = view.entries.iter().collect();
        lottery.draws += view.entries.len() as u64;
        lottery.drew_twice += (view.entries.len() - distinct.len()) as u64;
        lottery.prizes += u64::from(view.prizes);
        lottery.awarded += view.winners.len() as u64;
        lottery.award_counter += u64::from(view.awarded);
        lottery.over_awarded += u64::from(view.over_awarded());

        progress.phase(format!("{tag}: checkout, {} orders retrying", s.checkouts));
        checkout_round(
            &client,
            bases,
            round,
            config,
            &progress,
            &mut checkout,
            &mut notes,
        )
        .await?;
    }
    drawing.finish();
    notes.truncate(MAX_NOTES);
    Ok(Report {
        backend: shop.store().backend_name(),
        servers: bases.len(),
        locking: config.locking,
        rounds: config.rounds,
        work: config.work,
        namespace: namespace.to_owned(),
        inventory: vec![waiting, eager],
        lottery,
        checkout,
        lottery_concurrent_retries: s.concurrent_retries,
        notes,
        cleaned_keys: None,
        lock_latency: None,
    })
}

async fn seed_sku(shop: &Shop, sku: &str, stock: u32) -> Result<(), DemoError> {
    shop.inventory()
        .seed(sku, i64::from(stock))
        .await
        .map_err(|e| DemoError::State(e.to_string()))
}

/// What one buyer did: every request's outcome and latency, and whether it gave up.
struct Buyer {
    outcomes: Vec<(Outcome, Option<Duration>)>,
    gave_up: bool,
}

/// `count` buyers released at once; each tries up to `attempts` times (`attempts > 1` sends
/// `Prefer: wait=0` and retries after a jittered pause while the lock is busy).
async fn buyers(
    client: &ShopClient,
    bases: &[String],
    sku: &str,
    count: usize,
    attempts: u32,
    work: Duration,
    progress: &Progress,
) -> Vec<Result<Buyer, String>> {
    let start = Arc::new(Barrier::new(count));
    let mut tasks = JoinSet::new();
    for i in 0..count {
        let client = client.clone();
        let base = bases[i % bases.len()].clone();
        let sku = sku.to_owned();
        let start = Arc::clone(&start);
        let progress = progress.clone();
        let no_wait = attempts > 1;
        tasks.spawn(async move {
            let request = ReserveRequest {
                user: format!("buyer-{i}"),
                quantity: 1,
            };
            start.wait().await;
            let mut buyer = Buyer {
                outcomes: Vec::new(),
                gave_up: false,
            };
            for attempt in 1..=attempts {
                let reply = client.reserve(&base, &sku, &request, no_wait).await;
                let (outcome, latency) = classify(&base, reply);
                let busy = matches!(outcome, Outcome::Busy);
                buyer.outcomes.push((outcome, latency));
                if !busy {
                    break;
                }
                if attempt == attempts {
                    buyer.gave_up = true;
                } else {
                    tokio::time::sleep(jitter(work)).await;
                }
            }
            progress.tick();
            buyer
        });
    }
    let mut out = Vec::with_capacity(count);
    while let Some(joined) = tasks.join_next().await {
        out.push(joined.map_err(|e| format!("a buyer task failed: {e}")));
    }
    out
}

fn tally(phase: &mut InventoryPhase, buyers: Vec<Result<Buyer, String>>, notes: &mut Vec<String>) {
    for buyer in buyers {
        let buyer = match buyer {
            Ok(buyer) => buyer,
            Err(e) => {
                phase.errors += 1;
                notes.push(e);
                continue;
            }
        };
        phase.gave_up += u64::from(buyer.gave_up);
        for (outcome, latency) in buyer.outcomes {
            phase.requests += 1;
            phase.latencies.extend(latency);
            match outcome {
                Outcome::Sold(quantity) => {
                    phase.successes += 1;
                    phase.bought += u64::from(quantity);
                }
                Outcome::SoldOut => phase.sold_out += 1,
                Outcome::Busy => phase.busy += 1,
                Outcome::Error(e) => {
                    phase.errors += 1;
                    notes.push(e);
                }
            }
        }
    }
}

async fn read_stock(
    client: &ShopClient,
    base: &str,
    sku: &str,
    phase: &mut InventoryPhase,
) -> Result<(), DemoError> {
    let view = client
        .stock(base, sku)
        .await
        .map_err(|e| DemoError::State(e.to_string()))?;
    let first = phase.stock == 0;
    phase.stock += view.initial;
    phase.sold += view.sold;
    phase.left += view.stock;
    phase.lowest = if first {
        view.stock
    } else {
        phase.lowest.min(view.stock)
    };
    phase.oversold += view.oversold();
    phase.consistent &= view.consistent();
    Ok(())
}

/// What one lottery user saw.
struct UserRun {
    /// Answers to the same key: the concurrent ones, then the late retry.
    same_key: Vec<Result<Reply, String>>,
    /// The answer to an entry under a new key.
    new_key: Result<Reply, String>,
}

async fn lottery_round(
    client: &ShopClient,
    bases: &[String],
    draw: &str,
    config: &DemoConfig,
    progress: &Progress,
    phase: &mut LotteryPhase,
    notes: &mut Vec<String>,
) {
    let users = config.scenario.users;
    let together = config.scenario.concurrent_retries + 1;
    let start = Arc::new(Barrier::new(users));
    let mut tasks = JoinSet::new();
    for i in 0..users {
        let client = client.clone();
        let bases = bases.to_vec();
        let draw = draw.to_owned();
        let start = Arc::clone(&start);
        let progress = progress.clone();
        tasks.spawn(async move {
            let user = format!("user-{i}");
            let key = format!("{draw}-{user}-entry");
            start.wait().await;
            // The first request and its impatient retries, together, spread over the servers.
            let mut first = JoinSet::new();
            for j in 0..together {
                let client = client.clone();
                let base = bases[(i + j) % bases.len()].clone();
                let (draw, user, key) = (draw.clone(), user.clone(), key.clone());
                first.spawn(async move {
                    client
                        .enter(&base, &draw, &user, &key)
                        .await
                        .map_err(|e| e.to_string())
                });
            }
            let mut same_key = Vec::with_capacity(together + 1);
            while let Some(joined) = first.join_next().await {
                same_key.push(joined.map_err(|e| e.to_string()).and_then(|r| r));
            }
            // A late retry, after every answer came back, on yet another server.
            let base = &bases[(i + together) % bases.len()];
            same_key.push(
                client
                    .enter(base, &draw, &user, &key)
                    .await
                    .map_err(|e| e.to_string()),
            );
            // The same user trying to draw again under a new key.
            let base = &bases[(i + together + 1) % bases.len()];
            let new_key = client
                .enter(base, &draw, &user, &format!("{key}-again"))
                .await
                .map_err(|e| e.to_string());
            progress.tick();
            UserRun { same_key, new_key }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        let run = match joined {
            Ok(run) => run,
            Err(e) => {
                phase.errors += 1;
                notes.push(format!("a lottery user task failed: {e}"));
                continue;
            }
        };
        score_user(run, phase, notes);
    }
}

fn score_user(run: UserRun, phase: &mut LotteryPhase, notes: &mut Vec<String>) {
    phase.users += 1;
    phase.requests += run.same_key.len() as u64 + 1;
    let mut answers = Vec::with_capacity(run.same_key.len());
    for answer in run.same_key {
        match answer {
            Ok(reply) => {
                phase.latencies.push(reply.latency);
                answers.push(reply);
            }
            Err(e) => {
                phase.errors += 1;
                notes.push(e);
            }
        }
    }
    let entry = match answers.first() {
        Some(first) if first.status == StatusCode::CREATED => first.json::<Entry>(),
        Some(first) if first.status == StatusCode::CONFLICT => {
            phase.busy += 1;
            None
        }
        _ => None,
    };
    let Some((first, replays)) = answers.split_first() else {
        return;
    };
    if entry.is_none() {
        phase.errors += 1;
        notes.push(format!(
            "lottery: first answer {} {}",
            first.status,
            String::from_utf8_lossy(&first.body)
        ));
    }
    phase.replays += replays.len() as u64;
    phase.identical_replays += replays
        .iter()
        .filter(|r| r.status == first.status && r.body == first.body)
        .count() as u64;
    if let Some(entry) = &entry {
        phase.winners += u64::from(entry.won);
    }
    phase.second_entries += 1;
    match run.new_key {
        Ok(reply) => {
            phase.latencies.push(reply.latency);
            let refused = reply.status == StatusCode::CONFLICT
                && reply.problem().is_some_and(|p| {
                    let existing = p
                        .existing
                        .as_deref()
                        .and_then(|v| Entry::deserialize(v).ok());
                    p.is(ALREADY_ENTERED) && entry.is_some() && existing == entry
                });
            phase.already_entered += u64::from(refused);
        }
        Err(e) => {
            phase.errors += 1;
            notes.push(e);
        }
    }
}

/// `checkouts` clients pay their orders at once; each sends its request together with
/// `concurrent_retries` copies (same `Idempotency-Key`, spread over the servers), then one late
/// retry. Every answer per key must be the first one, and the payments ledger must hold one
/// charge per order: the handler ran once per key, every retry was a replay.
async fn checkout_round(
    client: &ShopClient,
    bases: &[String],
    round: u32,
    config: &DemoConfig,
    progress: &Progress,
    phase: &mut CheckoutPhase,
    notes: &mut Vec<String>,
) -> Result<(), DemoError> {
    let count = config.scenario.checkouts;
    let together = config.scenario.concurrent_retries + 1;
    let start = Arc::new(Barrier::new(count));
    let mut tasks = JoinSet::new();
    for i in 0..count {
        let client = client.clone();
        let bases = bases.to_vec();
        let start = Arc::clone(&start);
        let progress = progress.clone();
        let request = CheckoutRequest {
            order: format!("r{round}-order-{i}"),
            user: format!("buyer-{i}"),
            amount_cents: 1999 + i as u64,
        };
        let key = format!("r{round}-checkout-{i}");
        tasks.spawn(async move {
            start.wait().await;
            let mut first = JoinSet::new();
            for j in 0..together {
                let client = client.clone();
                let base = bases[(i + j) % bases.len()].clone();
                let (key, request) = (key.clone(), request.clone());
                first.spawn(async move {
                    client
                        .checkout(&base, &key, &request)
                        .await
                        .map_err(|e| e.to_string())
                });
            }
            let mut answers = Vec::with_capacity(together + 1);
            while let Some(joined) = first.join_next().await {
                answers.push(joined.map_err(|e| e.to_string()).and_then(|r| r));
            }
            let base = &bases[(i + together) % bases.len()];
            answers.push(
                client
                    .checkout(base, &key, &request)
                    .await
                    .map_err(|e| e.to_string()),
            );
            progress.tick();
            (request.order, answers)
        });
    }
    let mut orders = Vec::with_capacity(count);
    while let Some(joined) = tasks.join_next().await {
        let (order, answers) = match joined {
            Ok(done) => done,
            Err(e) => {
                phase.errors += 1;
                notes.push(format!("a checkout task failed: {e}"));
                continue;
            }
        };
        phase.keys += 1;
        phase.requests += answers.len() as u64;
        let mut replies = Vec::with_capacity(answers.len());
        for answer in answers {
            match answer {
                Ok(reply) => {
                    phase.latencies.push(reply.latency);
                    phase.replays += u64::from(reply.replayed);
                    replies.push(reply);
                }
                Err(e) => {
                    phase.errors += 1;
                    notes.push(e);
                }
            }
        }
        // The first answer is the one the handler gave (not replayed); the others must match it.
        let first = replies.iter().position(|r| !r.replayed).unwrap_or_default();
        if let Some(reference) = replies.get(first) {
            if reference.status != StatusCode::CREATED || reference.json::<Payment>().is_none() {
                phase.errors += 1;
                notes.push(format!(
                    "checkout: first answer {} {}",
                    reference.status,
                    String::from_utf8_lossy(&reference.body)
                ));
            }
            phase.identical += replies
                .iter()
                .enumerate()
                .filter(|(k, r)| {
                    *k != first && r.status == reference.status && r.body == reference.body
                })
                .count() as u64;
        }
        orders.push(order);
    }
    for order in orders {
        let charges = client
            .payments(&bases[0], &order)
            .await
            .map_err(|e| DemoError::State(e.to_string()))?;
        phase.handler_runs += charges.len() as u64;
        phase.charged_twice += u64::from(charges.len() > 1);
    }
    Ok(())
}

/// A pause of `work` +- 50 % (`work` counted as at least 2 ms) before an optimistic buyer tries again.
fn jitter(work: Duration) -> Duration {
    let base = work.max(Duration::from_millis(2));
    let percent = getrandom::u32().map(|n| 50 + n % 101).unwrap_or(100);
    base * percent / 100
}
