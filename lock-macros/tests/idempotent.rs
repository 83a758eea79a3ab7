//! `#[distributed_lock(idempotent)]` on the memory backend: the body runs at most once per key
//! within the TTL, and every call gets the first `Ok` value; `Err` is not stored; a record of
//! another type is a typed error; a store refused after a lost lease is not a success.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::Duration;

use lock_core::{
    DEFAULT_RESULT_TTL, IdempotencyState, LockError, Locker, MemoryBackend, distributed_lock,
};
use serde::{Deserialize, Serialize};

#[derive(Debug)]
enum PayError {
    Lock(LockError),
    Declined,
}

impl From<LockError> for PayError {
    fn from(e: LockError) -> Self {
        PayError::Lock(e)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Receipt {
    order: u64,
    /// Which run produced it: equal receipts come from one run.
    run: u64,
    lines: Vec<String>,
}

/// Counts runs; each run's receipt carries its number, so a replay is told from a rerun.
#[derive(Default)]
struct Bank {
    runs: AtomicU64,
}

impl Bank {
    fn run(&self, order: u64) -> Receipt {
        let run = self.runs.fetch_add(1, SeqCst) + 1;
        Receipt {
            order,
            run,
            lines: vec![format!("charged order {order}")],
        }
    }
}

#[distributed_lock(key = "charge:{order}", locker = locker, wait = "30s", idempotent)]
async fn charge(locker: &Locker, order: u64, bank: &Bank) -> Result<Receipt, PayError> {
    // Long enough for concurrent callers to pile up behind the first.
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(bank.run(order))
}

#[tokio::test]
async fn sequential_calls_run_the_body_once_and_get_its_value() {
    let (locker, bank) = (Locker::memory(), Bank::default());
    let first = charge(&locker, 1, &bank).await.unwrap();
    for _ in 0..5 {
        assert_eq!(charge(&locker, 1, &bank).await.unwrap(), first);
    }
    assert_eq!(bank.runs.load(SeqCst), 1);
    // Another key runs on its own.
    assert_eq!(charge(&locker, 2, &bank).await.unwrap().run, 2);
    // The record is there for other processes, under the default TTL.
    let IdempotencyState::Completed(record) = locker.idempotency_state("charge:1").await.unwrap()
    else {
        panic!("no record stored");
    };
    assert!(record.expires_in <= DEFAULT_RESULT_TTL && record.expires_in > DEFAULT_RESULT_TTL / 2);
    assert_eq!(
        serde_json::from_slice::<Receipt>(&record.result).unwrap(),
        first
    );
    assert_eq!(
        record.fingerprint,
        format!(
            "json2:idempotent::charge -> {}",
            std::any::type_name::<Receipt>()
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_calls_run_the_body_once_and_all_get_its_value() {
    const TASKS: usize = 12;
    let (locker, bank) = (Locker::memory(), Arc::new(Bank::default()));
    let barrier = Arc::new(tokio::sync::Barrier::new(TASKS));
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (locker, bank, barrier) = (locker.clone(), bank.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            charge(&locker, 7, &bank).await.unwrap()
        }));
    }
    let mut receipts = Vec::new();
    for task in tasks {
        receipts.push(task.await.unwrap());
    }
    assert_eq!(bank.runs.load(SeqCst), 1);
    assert!(receipts.iter().all(|r| *r == receipts[0]), "{receipts:?}");
}

#[distributed_lock(key = "flaky:{order}", locker = locker, idempotent)]
async fn flaky(locker: &Locker, order: u64, bank: &Bank, fail: bool) -> Result<Receipt, PayError> {
    let receipt = bank.run(order);
    if fail {
        Err(PayError::Declined)
    } else {
        Ok(receipt)
    }
}

#[tokio::test]
async fn an_err_is_not_stored_and_the_next_call_runs_again() {
    let (locker, bank) = (Locker::memory(), Bank::default());
    assert!(matches!(
        flaky(&locker, 1, &bank, true).await,
        Err(PayError::Declined)
    ));
    assert!(matches!(
        flaky(&locker, 1, &bank, true).await,
        Err(PayError::Declined)
    ));
    assert!(matches!(
        locker.idempotency_state("flaky:1").await.unwrap(),
        IdempotencyState::Absent
    ));
    let ok = flaky(&locker, 1, &bank, false).await.unwrap();
    assert_eq!(ok.run, 3);
    // Stored now: a later failure-bound call does not run.
    assert_eq!(flaky(&locker, 1, &bank, true).await.unwrap(), ok);
    assert_eq!(bank.runs.load(SeqCst), 3);
}

#[distributed_lock(key = "short:{order}", locker = locker, idempotent = "1s")]
async fn short(locker: &Locker, order: u64, bank: &Bank) -> Result<Receipt, PayError> {
    Ok(bank.run(order))
}

#[tokio::test(start_paused = true)]
async fn the_record_expires_after_its_ttl_and_the_body_runs_again() {
    let (locker, bank) = (Locker::memory(), Bank::default());
    let first = short(&locker, 1, &bank).await.unwrap();
    tokio::time::advance(Duration::from_millis(900)).await;
    assert_eq!(short(&locker, 1, &bank).await.unwrap(), first);
    tokio::time::advance(Duration::from_millis(200)).await;
    let second = short(&locker, 1, &bank).await.unwrap();
    assert_eq!((first.run, second.run), (1, 2));
}

#[distributed_lock(key = "shared:{order}", locker = locker, idempotent)]
async fn as_number(locker: &Locker, order: u64) -> Result<u64, PayError> {
    Ok(order)
}

#[distributed_lock(key = "shared:{order}", locker = locker, idempotent)]
async fn as_text(locker: &Locker, order: u64) -> Result<String, PayError> {
    Ok(order.to_string())
}

#[tokio::test]
async fn a_record_of_another_type_is_a_typed_error() {
    let locker = Locker::memory();
    assert_eq!(as_number(&locker, 1).await.unwrap(), 1);
    match as_text(&locker, 1).await {
        Err(PayError::Lock(LockError::IdempotencyKeyReused {
            key,
            stored,
            caller,
            ..
        })) => {
            assert_eq!(key, "shared:1");
            assert_eq!(stored, "json2:idempotent::as_number -> u64");
            assert_eq!(caller, "json2:idempotent::as_text -> alloc::string::String");
        }
        other => panic!("expected IdempotencyKeyReused, got {other:?}"),
    }
    // A record of the previous format (`json:<type>`), bytes that do not deserialize (the
    // type changed between deploys).
    let guard = locker.lock("shared:2").await.unwrap();
    let fingerprint = format!("json:{}", std::any::type_name::<u64>());
    guard
        .store_result(&fingerprint, b"\"not a number\"", DEFAULT_RESULT_TTL)
        .await
        .unwrap();
    guard.release().await.unwrap();
    match as_number(&locker, 2).await {
        Err(PayError::Lock(LockError::InvalidConfig { what, .. })) => {
            assert!(what.contains("does not deserialize"), "{what}")
        }
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
}

#[distributed_lock(key = "busy:{order}", locker = locker, no_wait, idempotent)]
async fn no_wait_charge(locker: &Locker, order: u64, bank: &Bank) -> Result<Receipt, PayError> {
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(bank.run(order))
}

#[tokio::test]
async fn no_wait_duplicates_in_flight_are_busy_and_later_ones_replay() {
    let (locker, bank) = (Locker::memory(), Bank::default());
    let first = no_wait_charge(&locker, 1, &bank);
    let duplicate = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        no_wait_charge(&locker, 1, &bank).await
    };
    let (first, duplicate) = tokio::join!(first, duplicate);
    let first = first.unwrap();
    assert!(
        matches!(duplicate, Err(PayError::Lock(LockError::Busy { .. }))),
        "{duplicate:?}"
    );
    assert_eq!(no_wait_charge(&locker, 1, &bank).await.unwrap(), first);
    assert_eq!(bank.runs.load(SeqCst), 1);
}

#[distributed_lock(key = "lost:{order}", locker = locker, idempotent)]
async fn lose_the_lock(
    locker: &Locker,
    backend: &MemoryBackend,
    order: u64,
    bank: &Bank,
) -> Result<Receipt, PayError> {
    // An operator's DEL while the body runs: the lock is no longer ours when it stores.
    assert!(backend.force_delete(&format!("lost:{order}")));
    Ok(bank.run(order))
}

#[tokio::test]
async fn a_store_refused_after_a_lost_lease_is_not_a_success() {
    let backend = MemoryBackend::new();
    let locker = Locker::builder(backend.clone()).build();
    let (bank, order) = (Bank::default(), 1);
    let lost = lose_the_lock(&locker, &backend, order, &bank).await;
    assert!(
        matches!(lost, Err(PayError::Lock(LockError::LeaseLost { .. }))),
        "{lost:?}"
    );
    assert!(!matches!(
        locker.idempotency_state("lost:1").await.unwrap(),
        IdempotencyState::Completed(_)
    ));
    assert_eq!(bank.runs.load(SeqCst), 1);
}

#[distributed_lock(key = "nested:{order}", locker = locker, idempotent)]
async fn outer(locker: &Locker, order: u64, bank: &Bank) -> Result<Receipt, PayError> {
    // Reentrant: the inner call of the same key runs under this lock and stores its value,
    // which the outer call then overwrites with the same value.
    charge_nested(locker, order, bank).await
}

#[distributed_lock(key = "nested:{order}", locker = locker, idempotent)]
async fn charge_nested(locker: &Locker, order: u64, bank: &Bank) -> Result<Receipt, PayError> {
    Ok(bank.run(order))
}

#[tokio::test]
async fn reentrant_idempotent_calls_do_not_deadlock() {
    let (locker, bank) = (Locker::memory(), Bank::default());
    let first = tokio::time::timeout(Duration::from_secs(5), outer(&locker, 1, &bank))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(outer(&locker, 1, &bank).await.unwrap(), first);
    // The record is the outer function's: the inner one, called alone, is another function.
    let inner = charge_nested(&locker, 1, &bank).await;
    assert!(
        matches!(
            inner,
            Err(PayError::Lock(LockError::IdempotencyKeyReused { .. }))
        ),
        "{inner:?}"
    );
    assert_eq!(bank.runs.load(SeqCst), 1);
}

#[distributed_lock(key = "huge:{order}", locker = locker, idempotent)]
async fn huge(locker: &Locker, order: u64, bank: &Bank) -> Result<String, PayError> {
    let receipt = bank.run(order);
    Ok("x".repeat(lock_core::MAX_RESULT_LEN + receipt.run as usize))
}

#[tokio::test]
async fn a_result_too_large_to_store_is_recorded_and_the_body_does_not_run_again() {
    let (locker, bank) = (Locker::memory(), Bank::default());
    let first = huge(&locker, 1, &bank).await;
    assert!(
        matches!(first, Err(PayError::Lock(LockError::RecordTooLarge { .. }))),
        "{first:?}"
    );
    for _ in 0..2 {
        let again = huge(&locker, 1, &bank).await;
        match again {
            Err(PayError::Lock(LockError::InvalidConfig { what, .. })) => {
                assert!(what.contains("not stored"), "{what}");
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(bank.runs.load(SeqCst), 1, "the body ran once");
}

#[distributed_lock(key = "unencodable:{order}", locker = locker, idempotent)]
async fn unencodable(
    locker: &Locker,
    order: u64,
    bank: &Bank,
) -> Result<std::collections::BTreeMap<Vec<u8>, u64>, PayError> {
    let receipt = bank.run(order);
    // JSON map keys must be strings: this value does not serialize.
    Ok([(vec![1_u8], receipt.run)].into_iter().collect())
}

#[distributed_lock(key = "some-unit:{order}", locker = locker, idempotent)]
async fn some_unit(locker: &Locker, order: u64, bank: &Bank) -> Result<Option<()>, PayError> {
    bank.run(order);
    // JSON writes `Some(())` as `null`, which reads back as `None`.
    Ok(Some(()))
}

#[distributed_lock(key = "not-finite:{order}", locker = locker, idempotent)]
async fn not_finite(locker: &Locker, order: u64, bank: &Bank) -> Result<f64, PayError> {
    bank.run(order);
    // JSON writes NaN as `null`, which does not read back as a float.
    Ok(f64::NAN)
}

/// A number read back as another variant of an untagged enum (`Int(1)` as `Float(1.0)`).
#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
enum Amount {
    Float(f64),
    Int(i64),
}

#[distributed_lock(key = "untagged:{order}", locker = locker, idempotent)]
async fn untagged(locker: &Locker, order: u64, bank: &Bank) -> Result<Amount, PayError> {
    bank.run(order);
    Ok(Amount::Int(1))
}

/// A field left out when empty and required when read back.
#[derive(Debug, Serialize, Deserialize)]
struct Lines {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    lines: Vec<u32>,
}

#[distributed_lock(key = "skipped:{order}", locker = locker, idempotent)]
async fn skipped(locker: &Locker, order: u64, bank: &Bank) -> Result<Lines, PayError> {
    bank.run(order);
    Ok(Lines { lines: Vec::new() })
}

#[distributed_lock(key = "float:{order}", locker = locker, idempotent)]
async fn float(locker: &Locker, order: u64, bank: &Bank) -> Result<f64, PayError> {
    bank.run(order);
    Ok(0.378_050_700_362_922_76)
}

/// A float is replayed bit for bit. Found by review: serde_json parsed floats "best effort"
/// (without its `float_roundtrip` feature), and about one f64 in ten came back one ULP off:
/// this one was replayed as 0.3780507003629227.
#[tokio::test]
async fn a_float_is_replayed_bit_for_bit() {
    let (locker, bank) = (Locker::memory(), Bank::default());
    let first = float(&locker, 1, &bank).await.unwrap();
    let replayed = float(&locker, 1, &bank).await.unwrap();
    assert_eq!(replayed.to_bits(), first.to_bits(), "{first} -> {replayed}");
    assert_eq!(bank.runs.load(SeqCst), 1);
}

/// A body whose `Ok` value JSON cannot give back as it is (not encodable at all; encoded as
/// another value: `Some(())` read back as `None`, NaN as an error; read back as another
/// value or not at all: an untagged enum, a field skipped when empty) ran once: the first
/// call gets `InvalidConfig`, later ones "not stored", and none of them a changed value.
/// Found by an outside audit and its review: `Ok(Some(()))` was replayed as `Ok(None)`,
/// `Int(1)` as `Float(1.0)`, and NaN or a skipped field failed every later call with "the
/// type changed".
#[tokio::test]
async fn a_result_json_cannot_keep_is_recorded_and_the_body_does_not_run_again() {
    async fn check<T: std::fmt::Debug, Fut>(what: &str, call: impl Fn() -> Fut)
    where
        Fut: std::future::Future<Output = Result<T, PayError>>,
    {
        let first = call().await;
        assert!(
            matches!(first, Err(PayError::Lock(LockError::InvalidConfig { .. }))),
            "{what}: {first:?}"
        );
        match call().await {
            Err(PayError::Lock(LockError::InvalidConfig { what: why, .. })) => {
                assert!(why.contains("not stored"), "{what}: {why}");
            }
            other => panic!("{what}: {other:?}"),
        }
    }
    let (locker, bank) = (Locker::memory(), Bank::default());
    check("a map with byte keys", || unencodable(&locker, 1, &bank)).await;
    check("Some(())", || some_unit(&locker, 2, &bank)).await;
    check("NaN", || not_finite(&locker, 3, &bank)).await;
    check("an untagged enum", || untagged(&locker, 4, &bank)).await;
    check("a field skipped when empty", || skipped(&locker, 5, &bank)).await;
    assert_eq!(bank.runs.load(SeqCst), 5, "each body ran once");
}

#[tokio::test]
async fn a_call_cancelled_mid_body_leaves_the_outcome_unknown() {
    // Documented: the body borrows its parameters, so it cannot be spawned and runs inside the
    // caller's future; dropping that future mid-body cancels the body, stores nothing and
    // releases the lock. Its "started" mark stays (the body may have done part of its work):
    // later calls get OutcomeUnknown and never run it again (issue 29, item 9).
    let (locker, bank) = (Locker::memory(), Bank::default());
    let cancelled =
        tokio::time::timeout(Duration::from_millis(10), charge(&locker, 9, &bank)).await;
    assert!(cancelled.is_err());
    let bank_runs_after_cancel = bank.runs.load(SeqCst);
    assert_eq!(
        bank_runs_after_cancel, 0,
        "cancelled before the body's effect"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    for _ in 0..2 {
        match charge(&locker, 9, &bank).await {
            Err(PayError::Lock(LockError::OutcomeUnknown { key, .. })) => {
                assert_eq!(key, "charge:9");
            }
            other => panic!("expected OutcomeUnknown, got {other:?}"),
        }
    }
    assert_eq!(bank.runs.load(SeqCst), 0, "the body never ran again");
}

/// A receipt holding hash collections, nested: a map of sets, inside a list of maps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Ledger {
    run: u64,
    by_account: std::collections::HashMap<String, std::collections::HashSet<u64>>,
    batches: Vec<std::collections::HashMap<u64, String>>,
}

#[distributed_lock(key = "ledger:{order}", locker = locker, idempotent)]
async fn ledger(locker: &Locker, order: u64, bank: &Bank) -> Result<Ledger, PayError> {
    let run = bank.run(order).run;
    // Enough entries that a map read back iterates in another order.
    let by_account = (0..32)
        .map(|a| (format!("account-{a}"), (0..16).map(|n| n * a).collect()))
        .collect();
    let batches = (0..4)
        .map(|b| (0..32).map(|n| (n * b, format!("line {n}"))).collect())
        .collect();
    Ok(Ledger {
        run,
        by_account,
        batches,
    })
}

#[distributed_lock(key = "tags:{order}", locker = locker, idempotent)]
async fn tags(
    locker: &Locker,
    order: u64,
    bank: &Bank,
) -> Result<std::collections::HashSet<String>, PayError> {
    bank.run(order);
    Ok((0..64).map(|n| format!("tag-{n}")).collect())
}

/// A value holding a `HashMap` or a `HashSet` is stored and replayed: it reads back as the
/// same value, whatever order its entries iterate in. Issue 29, item 10: the read-back check
/// compared bytes, so every such value was refused (`InvalidConfig`) and its key blocked for
/// the record's TTL.
#[tokio::test]
async fn values_holding_hash_maps_and_sets_are_stored_and_replayed() {
    let (locker, bank) = (Locker::memory(), Bank::default());
    let first = ledger(&locker, 1, &bank).await.unwrap();
    assert_eq!(ledger(&locker, 1, &bank).await.unwrap(), first);
    let first_tags = tags(&locker, 2, &bank).await.unwrap();
    assert_eq!(tags(&locker, 2, &bank).await.unwrap(), first_tags);
    assert_eq!(bank.runs.load(SeqCst), 2, "each body ran once");
}

/// Entries written as a JSON map, one key twice; read back through a `HashMap`, so the key
/// keeps only its last value. Its JSON value (a map) is the same before and after.
#[derive(Debug)]
struct Twice(Vec<(String, u64)>);

impl Serialize for Twice {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

impl<'de> Deserialize<'de> for Twice {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map = std::collections::HashMap::<String, u64>::deserialize(d)?;
        Ok(Twice(map.into_iter().collect()))
    }
}

#[distributed_lock(key = "twice:{order}", locker = locker, idempotent)]
async fn twice(locker: &Locker, order: u64, bank: &Bank) -> Result<Twice, PayError> {
    let run = bank.run(order).run;
    Ok(Twice(vec![("a".into(), run), ("a".into(), run + 1)]))
}

#[tokio::test]
async fn a_map_key_written_twice_is_not_stored_as_the_same_value() {
    let (locker, bank) = (Locker::memory(), Bank::default());
    let first = twice(&locker, 1, &bank).await;
    assert!(
        matches!(first, Err(PayError::Lock(LockError::InvalidConfig { .. }))),
        "{first:?}"
    );
    assert!(twice(&locker, 1, &bank).await.is_err());
    assert_eq!(bank.runs.load(SeqCst), 1);
}

#[distributed_lock(key = "order:{order}", locker = locker, idempotent)]
async fn charge_order(locker: &Locker, order: u64, bank: &Bank) -> Result<Receipt, PayError> {
    Ok(bank.run(order))
}

#[distributed_lock(key = "order:{order}", locker = locker, idempotent)]
async fn refund_order(locker: &Locker, order: u64, bank: &Bank) -> Result<Receipt, PayError> {
    Ok(bank.run(order))
}

/// Two idempotent functions on one key template, returning one type: the second gets an
/// error, never the first one's value, and its body does not run. Issue 29, item 11: the
/// fingerprint named only the return type, and `refund` returned `charge`'s receipt.
#[tokio::test]
async fn another_function_under_the_same_key_is_an_error_not_a_replay() {
    let (locker, bank) = (Locker::memory(), Bank::default());
    let charged = charge_order(&locker, 1, &bank).await.unwrap();
    for _ in 0..2 {
        match refund_order(&locker, 1, &bank).await {
            Err(PayError::Lock(LockError::IdempotencyKeyReused {
                key,
                stored,
                caller,
                ..
            })) => {
                assert_eq!(key, "order:1");
                assert!(
                    stored.ends_with("::charge_order -> idempotent::Receipt"),
                    "{stored}"
                );
                assert!(
                    caller.ends_with("::refund_order -> idempotent::Receipt"),
                    "{caller}"
                );
            }
            other => panic!("refund replayed charge's value: {other:?}"),
        }
    }
    assert_eq!(charge_order(&locker, 1, &bank).await.unwrap(), charged);
    assert_eq!(bank.runs.load(SeqCst), 1, "only charge ran");
}

struct Payments {
    locker: Locker,
}

struct Refunds {
    locker: Locker,
}

impl Payments {
    #[distributed_lock(key = "settle:{order}", locker = self.locker, idempotent)]
    async fn settle(&self, order: u64, bank: &Bank) -> Result<Receipt, PayError> {
        Ok(bank.run(order))
    }
}

impl Refunds {
    #[distributed_lock(key = "settle:{order}", locker = self.locker, idempotent)]
    async fn settle(&self, order: u64, bank: &Bank) -> Result<Receipt, PayError> {
        Ok(bank.run(order))
    }
}

/// Methods of one name on two types, in one module, are two functions.
#[tokio::test]
async fn methods_of_one_name_on_two_types_are_two_functions() {
    let (locker, bank) = (Locker::memory(), Bank::default());
    let payments = Payments {
        locker: locker.clone(),
    };
    let refunds = Refunds { locker };
    let settled = payments.settle(1, &bank).await.unwrap();
    match refunds.settle(1, &bank).await {
        Err(PayError::Lock(LockError::IdempotencyKeyReused { stored, caller, .. })) => {
            assert_eq!(
                stored,
                "json2:idempotent::Payments::settle -> idempotent::Receipt"
            );
            assert_eq!(
                caller,
                "json2:idempotent::Refunds::settle -> idempotent::Receipt"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(payments.settle(1, &bank).await.unwrap(), settled);
    assert_eq!(bank.runs.load(SeqCst), 1);
}

/// A record written before functions were named (fingerprint `json:<type>`) is still replayed
/// (to any function returning that type, as before) until it expires.
#[tokio::test]
async fn a_record_of_the_previous_format_is_replayed() {
    let (locker, bank) = (Locker::memory(), Bank::default());
    let stored = Receipt {
        order: 3,
        run: 99,
        lines: vec!["stored before the upgrade".into()],
    };
    let guard = locker.lock("order:3").await.unwrap();
    let fingerprint = format!("json:{}", std::any::type_name::<Receipt>());
    let json = serde_json::to_vec(&stored).unwrap();
    guard
        .store_result(&fingerprint, &json, DEFAULT_RESULT_TTL)
        .await
        .unwrap();
    guard.release().await.unwrap();
    assert_eq!(charge_order(&locker, 3, &bank).await.unwrap(), stored);
    assert_eq!(bank.runs.load(SeqCst), 0);
}

/// A list whose order is its meaning (a ranking), read back sorted by its `Deserialize`: the
/// same elements, another value. Its JSON value differs only in the order of a list, which
/// the read-back check ignores for the sake of `HashSet`s.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct Ranking(Vec<u64>);

impl<'de> Deserialize<'de> for Ranking {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut ranks = Vec::<u64>::deserialize(d)?;
        ranks.sort_unstable();
        Ok(Ranking(ranks))
    }
}

#[distributed_lock(key = "ranking:{order}", locker = locker, idempotent)]
async fn ranking(locker: &Locker, order: u64, bank: &Bank) -> Result<Ranking, PayError> {
    let run = bank.run(order).run;
    Ok(Ranking(vec![run + 30, run + 10, run + 20]))
}

/// Every call gets the same value, even when `T`'s `Deserialize` reorders a list: the first
/// call's value is the one a replay reads back. Review of issue 29, item 10: the read-back
/// check compared lists in any order, so the first call got `[31, 11, 21]` and every replay
/// `[11, 21, 31]`.
#[tokio::test]
async fn a_list_reordered_when_read_back_is_the_same_value_on_every_call() {
    let (locker, bank) = (Locker::memory(), Bank::default());
    let first = ranking(&locker, 1, &bank).await.unwrap();
    let replay = ranking(&locker, 1, &bank).await.unwrap();
    assert_eq!(
        first, replay,
        "the replay is another value than the first call's"
    );
    assert_eq!(bank.runs.load(SeqCst), 1);
}

/// The stored and the caller's fingerprints of an `IdempotencyKeyReused` error; anything else
/// (another function's value replayed, above all) as an error to unwrap.
fn reused<T: std::fmt::Debug>(result: Result<T, PayError>) -> Result<(String, String), String> {
    match result {
        Err(PayError::Lock(LockError::IdempotencyKeyReused { stored, caller, .. })) => {
            Ok((stored, caller))
        }
        other => Err(format!("expected IdempotencyKeyReused, got {other:?}")),
    }
}

impl Payments {
    #[distributed_lock(key = "close:{order}", locker = locker, idempotent)]
    async fn close(locker: &Locker, order: u64, bank: &Bank) -> Result<Receipt, PayError> {
        Ok(bank.run(order))
    }
}

impl Refunds {
    #[distributed_lock(key = "close:{order}", locker = locker, idempotent)]
    async fn close(locker: &Locker, order: u64, bank: &Bank) -> Result<Receipt, PayError> {
        Ok(bank.run(order))
    }
}

/// Associated functions (no `self`) of one name on two types are two functions. Review of
/// issue 29, item 11: without a receiver the fingerprint named the module and the function
/// only, and `Refunds::close` replayed `Payments::close`'s receipt.
#[tokio::test]
async fn associated_functions_of_one_name_on_two_types_are_two_functions() {
    let (locker, bank) = (Locker::memory(), Bank::default());
    let closed = Payments::close(&locker, 1, &bank).await.unwrap();
    assert_eq!(
        reused(Refunds::close(&locker, 1, &bank).await).unwrap(),
        (
            "json2:idempotent::Payments::close -> idempotent::Receipt".to_owned(),
            "json2:idempotent::Refunds::close -> idempotent::Receipt".to_owned()
        )
    );
    assert_eq!(Payments::close(&locker, 1, &bank).await.unwrap(), closed);
    assert_eq!(bank.runs.load(SeqCst), 1);
}

/// Functions declared inside two functions under one name are two functions, as are a
/// trait's methods implemented for two types. Review of issue 29, item 11: both were named
/// by their module and name only.
#[tokio::test]
async fn nested_functions_and_trait_impls_of_one_name_are_distinct() {
    async fn by_charge(locker: &Locker, bank: &Bank) -> Result<Receipt, PayError> {
        #[distributed_lock(key = "nested:{order}", locker = locker, idempotent)]
        async fn step(locker: &Locker, order: u64, bank: &Bank) -> Result<Receipt, PayError> {
            Ok(bank.run(order))
        }
        step(locker, 1, bank).await
    }
    async fn by_refund(locker: &Locker, bank: &Bank) -> Result<Receipt, PayError> {
        #[distributed_lock(key = "nested:{order}", locker = locker, idempotent)]
        async fn step(locker: &Locker, order: u64, bank: &Bank) -> Result<Receipt, PayError> {
            Ok(bank.run(order))
        }
        step(locker, 1, bank).await
    }
    let (locker, bank) = (Locker::memory(), Bank::default());
    let first = by_charge(&locker, &bank).await.unwrap();
    let (_, caller) = reused(by_refund(&locker, &bank).await).unwrap();
    assert!(caller.contains("::by_refund::"), "{caller}");
    assert_eq!(by_charge(&locker, &bank).await.unwrap(), first);

    trait Settle {
        async fn settle_all(locker: &Locker, bank: &Bank) -> Result<Receipt, PayError>;
    }
    impl Settle for Payments {
        #[distributed_lock(key = "all", locker = locker, idempotent)]
        async fn settle_all(locker: &Locker, bank: &Bank) -> Result<Receipt, PayError> {
            Ok(bank.run(0))
        }
    }
    impl Settle for Refunds {
        #[distributed_lock(key = "all", locker = locker, idempotent)]
        async fn settle_all(locker: &Locker, bank: &Bank) -> Result<Receipt, PayError> {
            Ok(bank.run(0))
        }
    }
    let settled = <Payments as Settle>::settle_all(&locker, &bank)
        .await
        .unwrap();
    let (_, caller) = reused(<Refunds as Settle>::settle_all(&locker, &bank).await).unwrap();
    assert!(caller.contains("Refunds as "), "{caller}");
    assert_eq!(
        <Payments as Settle>::settle_all(&locker, &bank)
            .await
            .unwrap(),
        settled
    );
    assert_eq!(
        bank.runs.load(SeqCst),
        2,
        "by_charge's step and Payments' settle_all"
    );
}

/// Two untagged variants that JSON writes alike: `Premium(n)` reads back as `Basic(n)`, which
/// writes the same bytes, so no check on JSON can tell them apart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
enum Tier {
    Basic(u64),
    Premium(u64),
}

#[distributed_lock(key = "tier:{order}", locker = locker, idempotent)]
async fn tier(locker: &Locker, order: u64, bank: &Bank) -> Result<Tier, PayError> {
    Ok(Tier::Premium(bank.run(order).run))
}

/// Every call gets the same value, even when it reads back as another value writing the same
/// bytes: the first call's value is the one every replay reads back. Review of issue 29, item
/// 10: the first call got `Premium(1)` and every replay `Basic(1)`.
#[tokio::test]
async fn an_untagged_variant_read_back_as_another_is_the_same_on_every_call() {
    let (locker, bank) = (Locker::memory(), Bank::default());
    let first = tier(&locker, 1, &bank).await.unwrap();
    let replay = tier(&locker, 1, &bank).await.unwrap();
    assert_eq!(
        first, replay,
        "the replay is another value than the first call's"
    );
    assert_eq!(bank.runs.load(SeqCst), 1);
}

/// A trait whose provided (default) method is idempotent: one body, run for each type that
/// takes the default.
trait Close {
    fn ledger() -> &'static str;

    #[distributed_lock(key = "close-all:{order}", locker = locker, idempotent)]
    async fn close_all(locker: &Locker, order: u64, bank: &Bank) -> Result<Receipt, PayError> {
        let mut receipt = bank.run(order);
        receipt.lines.push(Self::ledger().to_owned());
        Ok(receipt)
    }
}

impl Close for Payments {
    fn ledger() -> &'static str {
        "payments"
    }
}

impl Close for Refunds {
    fn ledger() -> &'static str {
        "refunds"
    }
}

/// A provided method without `self`, taken by two types, is two functions: one body, but
/// `Self` differs. Review of issue 29, item 11: the fingerprint named the trait's method only,
/// and `Refunds::close_all` returned the receipt of `Payments::close_all` (ledger "payments").
#[tokio::test]
async fn a_provided_trait_method_is_one_function_per_type() {
    let (locker, bank) = (Locker::memory(), Bank::default());
    let closed = Payments::close_all(&locker, 1, &bank).await.unwrap();
    let (stored, caller) = reused(Refunds::close_all(&locker, 1, &bank).await).unwrap();
    assert_eq!(
        stored,
        "json2:<idempotent::Payments as idempotent::Close>::close_all -> idempotent::Receipt"
    );
    assert_eq!(
        caller,
        "json2:<idempotent::Refunds as idempotent::Close>::close_all -> idempotent::Receipt"
    );
    assert_eq!(
        Payments::close_all(&locker, 1, &bank).await.unwrap(),
        closed
    );
    assert_eq!(bank.runs.load(SeqCst), 1);
}

#[distributed_lock(key = "generic:{order}", locker = locker, idempotent)]
async fn generic(
    locker: &Locker,
    order: impl std::fmt::Display,
    bank: &Bank,
) -> Result<Receipt, PayError> {
    Ok(bank.run(0))
}

/// A generic function is one function, whatever its arguments: a retry that passes the order
/// as a `String` gets the value stored by the call that passed a `u64`.
#[tokio::test]
async fn a_generic_function_is_one_function_whatever_its_arguments() {
    let (locker, bank) = (Locker::memory(), Bank::default());
    let first = generic(&locker, 1_u64, &bank).await.unwrap();
    assert_eq!(
        generic(&locker, "1".to_owned(), &bank).await.unwrap(),
        first
    );
    assert_eq!(bank.runs.load(SeqCst), 1);
    let record = match locker.idempotency_state("generic:1").await.unwrap() {
        IdempotencyState::Completed(record) => record,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        record.fingerprint,
        "json2:idempotent::generic -> idempotent::Receipt"
    );
}
