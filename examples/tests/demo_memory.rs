//! The demo's invariants on the embedded memory backend, and proof that the lock is what keeps
//! them: the same scenario with locking off oversells.

use lock_examples::demo::{self, DemoConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn seed_scenario_on_memory_holds_every_invariant() {
    let report = demo::run(&DemoConfig::fast().progress(false))
        .await
        .unwrap();
    let mut table = Vec::new();
    report.write_table(&mut table).unwrap();
    let table = String::from_utf8(table).unwrap();

    assert!(report.passed(), "{table}");
    assert_eq!(report.oversold(), 0, "{table}");
    assert_eq!(report.backend, "memory");
    assert_eq!(report.servers, 1);

    // Pessimistic: 20 waiting buyers, 10 items: exactly 10 sales, 10 sold-out answers, no buyer
    // turned away because of the lock.
    let waiting = &report.inventory[0];
    assert_eq!(waiting.requests, 20, "{table}");
    assert_eq!(waiting.successes, 10, "{table}");
    assert_eq!(waiting.sold_out, 10, "{table}");
    assert_eq!(waiting.busy, 0, "{table}");
    assert_eq!((waiting.sold, waiting.left), (10, 0), "{table}");

    // Optimistic: whatever the lock turned away, sales and stock left add up to the stock.
    let eager = &report.inventory[1];
    assert!(eager.successes <= 10, "{table}");
    assert_eq!(eager.sold as i64 + eager.left, 10, "{table}");
    assert_eq!(eager.successes + eager.gave_up, 10, "{table}");

    // Lottery: 12 users, each exactly one draw, every retry answered identically.
    let lottery = &report.lottery;
    assert_eq!(lottery.users, 12, "{table}");
    assert_eq!(lottery.draws, 12, "{table}");
    assert_eq!(lottery.replays, 36, "{table}");
    assert_eq!(lottery.identical_replays, 36, "{table}");
    assert_eq!(lottery.already_entered, 12, "{table}");
    assert!(lottery.awarded <= 4, "{table}");
    assert!(table.contains("oversold = 0"), "{table}");
    let checkout = &report.checkout;
    assert_eq!(
        (checkout.requests, checkout.keys, checkout.handler_runs),
        (40, 10, 10),
        "{table}"
    );
    assert_eq!((checkout.replays, checkout.identical), (30, 30), "{table}");
    assert_eq!(checkout.charged_twice, 0, "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_the_lock_the_same_scenario_oversells_on_memory() {
    // The buyers are released together by a barrier and each reservation works 10 ms between
    // reading the stock and writing it back: any two of the 20 overlapping in that window lose
    // an update, and with 20 buyers for 10 items every lost update is an item sold twice.
    let report = demo::run(&DemoConfig::fast().progress(false).locking(false))
        .await
        .unwrap();
    let mut table = Vec::new();
    report.write_table(&mut table).unwrap();
    let table = String::from_utf8(table).unwrap();

    let waiting = &report.inventory[0];
    assert!(report.oversold() > 0, "{table}");
    assert!(waiting.sold as i64 > waiting.stock, "{table}");
    assert!(waiting.successes > 10, "{table}");
    // Without IdempotencyLayer every retry charges the order again.
    assert_eq!(report.checkout.handler_runs, 40, "{table}");
    assert_eq!(report.checkout.replays, 0, "{table}");
    assert!(!report.passed(), "{table}");
    assert!(table.contains("FAIL"), "{table}");
}
