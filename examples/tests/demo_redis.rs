//! The demo across three server processes sharing one real Redis (locks and state in Redis).

use lock_examples::demo::{self, DemoConfig};
use redis::AsyncCommands;

use lock_testkit::RedisServer;

fn config(redis: &RedisServer) -> DemoConfig {
    DemoConfig::fast()
        .progress(false)
        .redis_url(Some(redis.url()))
        .processes(3)
        .server_exe(env!("CARGO_BIN_EXE_flash-sale").into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn seed_scenario_across_three_processes_on_redis_holds_every_invariant() {
    let redis = RedisServer::start();
    let report = demo::run(&config(&redis).keep_data(true)).await.unwrap();
    let mut table = Vec::new();
    report.write_table(&mut table).unwrap();
    let table = String::from_utf8(table).unwrap();

    assert!(report.passed(), "{table}");
    assert_eq!(report.oversold(), 0, "{table}");
    assert_eq!(report.backend, "redis");
    assert_eq!(report.servers, 3);
    let waiting = &report.inventory[0];
    assert_eq!(
        (waiting.successes, waiting.sold_out, waiting.busy),
        (10, 10, 0),
        "{table}"
    );
    assert_eq!(report.lottery.draws, 12, "{table}");
    assert_eq!(
        report.lottery.identical_replays, report.lottery.replays,
        "{table}"
    );

    // The state really lives in Redis (the processes share nothing else): read it directly.
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let ns = &report.namespace;
    let stock: String = conn
        .get(format!("{ns}inventory:r1-wait:stock"))
        .await
        .unwrap();
    let sales: u64 = conn
        .llen(format!("{ns}inventory:r1-wait:sales"))
        .await
        .unwrap();
    assert_eq!((stock.as_str(), sales), ("0", 10));
    let entries: u64 = conn
        .llen(format!("{ns}lottery:r1-draw:entries"))
        .await
        .unwrap();
    assert_eq!(entries, 12);
    let charges: u64 = conn.llen(format!("{ns}payments:r1-order-0")).await.unwrap();
    assert_eq!(charges, 1);
}

/// Every key a run wrote (state, ledgers, locks' fencing counters, idempotency records) is
/// gone when the demo returns: a run against a user's Redis leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_demo_leaves_no_key_behind_in_redis() {
    let redis = RedisServer::start();
    let report = demo::run(&config(&redis)).await.unwrap();
    let mut table = Vec::new();
    report.write_table(&mut table).unwrap();
    let table = String::from_utf8(table).unwrap();
    assert!(report.passed(), "{table}");
    assert!(report.cleaned_keys.unwrap_or(0) > 0, "{table}");

    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut left: Vec<String> = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .unwrap();
        left.extend(keys);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    assert!(left.is_empty(), "{} keys left behind: {left:?}", left.len());
    assert!(table.contains("cleanup: removed the run's"), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_the_lock_three_processes_oversell_on_redis() {
    let redis = RedisServer::start();
    let report = demo::run(&config(&redis).locking(false)).await.unwrap();
    let mut table = Vec::new();
    report.write_table(&mut table).unwrap();
    let table = String::from_utf8(table).unwrap();

    assert_eq!(report.servers, 3);
    assert!(report.oversold() > 0, "{table}");
    assert!(
        report.inventory[0].sold as i64 > report.inventory[0].stock,
        "{table}"
    );
    assert!(!report.passed(), "{table}");
}
