//! The idempotency result store: a record (fingerprint, result, TTL) per key beside its lock,
//! written only while that lock is ours, read with the lock's state in one request.

use std::time::Duration;

use crate::{
    IdempotencyState, LockError, Locker, MAX_FINGERPRINT_LEN, MAX_KEY_LEN, MAX_RESULT_LEN,
    MAX_RESULT_TTL,
};

use super::fixture::{Fixture, SOON, assert_invalid_config, assert_invalid_key, eventually};
use super::helpers::{completed, settled, started, state};

const TTL: Duration = Duration::from_secs(60);

/// Whether the backend holds a record for `key`, read by the probe where it can (else asked
/// through the state, which is all the API shows).
async fn record_written(fx: &Fixture, locker: &Locker, key: &str) -> bool {
    match fx.record_ttl(key).await {
        Some(ttl) => ttl.is_some(),
        None => matches!(state(locker, key).await, IdempotencyState::Completed(_)),
    }
}

/// Absent before anything; in flight while the key's lock is held (seen from another locker
/// too); completed once a result is stored, while the lock is still held and after its release.
async fn state_goes_absent_in_flight_completed(fx: Fixture) {
    let a = fx.locker().await;
    let b = fx.locker().await;
    assert_eq!(state(&b, "pay:1").await, IdempotencyState::Absent);
    let guard = a.lock("pay:1").await.expect("acquire");
    assert_eq!(state(&a, "pay:1").await, IdempotencyState::InFlight);
    assert_eq!(state(&b, "pay:1").await, IdempotencyState::InFlight);
    guard
        .store_result("fp-1", b"receipt", TTL)
        .await
        .expect("store while held");
    assert!(guard.is_held(), "storing does not release the lock");
    assert_eq!(completed(state(&b, "pay:1").await).result, b"receipt");
    guard.release().await.expect("release");
    let record = completed(state(&b, "pay:1").await);
    assert_eq!(record.fingerprint, "fp-1");
    assert!(record.expires_in <= TTL && record.expires_in > TTL - SOON);
    // A released lock without a stored result is absent again (a failed first request runs
    // again). On Redlock the release returns once a quorum removed the lock; a server that
    // still has it reads as in flight (the safe side) until its removal lands.
    a.lock("pay:2")
        .await
        .expect("acquire")
        .release()
        .await
        .expect("release");
    eventually("absent after the release", SOON, async || {
        state(&b, "pay:2").await == IdempotencyState::Absent
    })
    .await;
}

/// The stored bytes and fingerprint come back exactly: every byte value, empty, exactly
/// MAX_RESULT_LEN bytes; fingerprints with odd characters, empty, exactly MAX_FINGERPRINT_LEN.
async fn stored_bytes_and_fingerprint_come_back_exactly(fx: Fixture) {
    let a = fx.locker().await;
    let b = fx.locker().await;
    let every_byte: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
    let largest: Vec<u8> = (0..MAX_RESULT_LEN).map(|i| (i % 251) as u8).collect();
    let cases: [(&str, String, Vec<u8>); 5] = [
        ("bin", "sha256:00ff".to_owned(), every_byte),
        ("empty", "fp".to_owned(), Vec::new()),
        ("largest", "fp".to_owned(), largest),
        ("odd-fp", "ключ\n\0\t\"{}🔒".to_owned(), b"\0".to_vec()),
        ("long-fp", "f".repeat(MAX_FINGERPRINT_LEN), b"x".to_vec()),
    ];
    for (key, fingerprint, result) in &cases {
        let guard = a.lock(*key).await.expect("acquire");
        guard
            .store_result(fingerprint, result, TTL)
            .await
            .unwrap_or_else(|e| panic!("{key}: {e}"));
        guard.release().await.expect("release");
        let record = completed(state(&b, key).await);
        assert_eq!(&record.fingerprint, fingerprint, "{key}");
        assert!(
            record.result == *result,
            "{key}: the result came back changed"
        );
    }
    let empty_fp = a.lock("empty-fp").await.expect("acquire");
    empty_fp.store_result("", b"r", TTL).await.expect("store");
    assert_eq!(completed(state(&b, "empty-fp").await).fingerprint, "");
    empty_fp.release().await.expect("release");
}

/// A record expires after its TTL (and not long before): then the key is absent again.
async fn record_expires_after_its_ttl(fx: Fixture) {
    let locker = fx.locker().await;
    let ttl = Duration::from_millis(300);
    let guard = locker.lock("short").await.expect("acquire");
    // Read before the store is sent: the server starts the TTL when it runs the write, after
    // this; read after the store returns, a loaded machine's late answer made the record look
    // expired early (a Sentinel run: more than 5 ms between the write and its answer).
    let stored_at = std::time::Instant::now();
    guard
        .store_result("fp", b"soon gone", ttl)
        .await
        .expect("store");
    guard.release().await.expect("release");
    let record = completed(state(&locker, "short").await);
    assert!(record.expires_in <= ttl, "{:?}", record.expires_in);
    if fx.record_ttl("short").await.is_some() {
        // On Redlock the store returns once a quorum has the record; a server's write may land
        // just after. A loaded machine may read only after the record's TTL ran out: its TTL
        // is checked whenever it is read in time.
        let mut read = None;
        eventually("the record is in the store", SOON, async || {
            read = fx.record_ttl("short").await.flatten();
            read.is_some() || stored_at.elapsed() >= ttl
        })
        .await;
        if let Some(left) = read {
            assert!(
                left > Duration::ZERO && left <= ttl,
                "the record's TTL is {left:?}"
            );
        }
    }
    eventually("the record expires", SOON, async || {
        state(&locker, "short").await == IdempotencyState::Absent
    })
    .await;
    // Never before its TTL ran out (by this process's clock, which started before the store).
    assert!(stored_at.elapsed() >= ttl - Duration::from_millis(5));
    assert!(!record_written(&fx, &locker, "short").await);
}

/// A holder whose lock is no longer its own never writes a record: the key was deleted behind
/// its back, another owner took it, or the lease ran out. The store is `LeaseLost`, nothing is
/// written, and the guard knows it lost the lock.
async fn a_store_after_the_lease_was_lost_is_refused(fx: Fixture) {
    let a = fx.locker().await;
    let b = fx.locker().await;

    // Deleted behind its back (the local deadline is still far: only the backend can tell).
    let guard = a.lock("deleted").await.expect("acquire");
    fx.force_delete("deleted").await;
    assert!(guard.is_held(), "nothing told the holder yet");
    match guard.store_result("fp", b"stale", TTL).await {
        Err(LockError::LeaseLost { key, .. }) => assert_eq!(key, "deleted"),
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    assert!(!guard.is_held(), "the refused store marks the lock lost");
    assert!(!record_written(&fx, &a, "deleted").await);
    assert_eq!(state(&b, "deleted").await, IdempotencyState::Absent);
    drop(guard);

    // Another owner took it meanwhile: its record is never overwritten by the stale holder.
    let stale = a.lock("taken").await.expect("acquire");
    fx.force_delete("taken").await;
    let owner = b.try_lock("taken").await.expect("the key is free for b");
    assert!(matches!(
        stale.store_result("stale", b"stale", TTL).await,
        Err(LockError::LeaseLost { .. })
    ));
    assert_eq!(state(&a, "taken").await, IdempotencyState::InFlight);
    owner
        .store_result("fresh", b"fresh", TTL)
        .await
        .expect("the owner stores");
    assert!(matches!(
        stale.store_result("stale", b"stale", TTL).await,
        Err(LockError::LeaseLost { .. })
    ));
    let record = completed(state(&a, "taken").await);
    assert_eq!(
        (record.fingerprint.as_str(), record.result.as_slice()),
        ("fresh", &b"fresh"[..])
    );
    owner.release().await.expect("release");
    drop(stale);

    // The lease (50 ms, or the backend's floor) ran out (no watchdog).
    let lease = fx.short_lease(Duration::from_millis(50));
    let expiring = a
        .lock("expired")
        .lease(lease.lease())
        .watchdog(false)
        .await
        .expect("acquire");
    lease.soon("the lease runs out", expiring.lost()).await;
    assert!(matches!(
        expiring.store_result("fp", b"late", TTL).await,
        Err(LockError::LeaseLost { .. })
    ));
    eventually("the expired lock is gone", lease.soon_after(), async || {
        state(&b, "expired").await == IdempotencyState::Absent
    })
    .await;
    assert!(!record_written(&fx, &a, "expired").await);
}

/// A reentrant guard (inside `run`, or from `guard.scope`) stores for the outer lock; once
/// the outer lock is released, the reentrant guard can no longer store.
async fn a_reentrant_guard_stores_for_the_outer_lock(fx: Fixture) {
    let locker = fx.locker().await;
    let inner_locker = locker.clone();
    locker
        .lock("nested")
        .run(async move {
            let inner = inner_locker.lock("nested").await.expect("reentrant");
            assert!(inner.is_reentrant());
            inner
                .store_result("fp", b"from inside", TTL)
                .await
                .expect("a reentrant guard stores");
        })
        .await
        .expect("run");
    assert_eq!(
        completed(state(&locker, "nested").await).result,
        b"from inside"
    );

    let outer = locker.lock("scoped").await.expect("acquire");
    let inner = outer
        .scope(async { locker.try_lock("scoped").await })
        .await
        .expect("reentrant");
    assert!(inner.is_reentrant());
    inner
        .store_result("fp", b"first", TTL)
        .await
        .expect("store");
    outer.release().await.expect("release");
    assert!(matches!(
        inner
            .store_result("fp", b"after the outer lock ended", TTL)
            .await,
        Err(LockError::LeaseLost { .. })
    ));
    assert_eq!(completed(state(&locker, "scoped").await).result, b"first");
}

/// Bad input is a typed error, never a panic, and writes nothing: a result above
/// MAX_RESULT_LEN or a fingerprint above MAX_FINGERPRINT_LEN (`RecordTooLarge`), a zero or
/// absurd TTL (`InvalidConfig`), a bad key or a locker with a bad prefix for the state.
async fn bad_input_is_a_typed_error(fx: Fixture) {
    let locker = fx.locker().await;
    let guard = locker.lock("bad").await.expect("acquire");
    let too_big = vec![7u8; MAX_RESULT_LEN + 1];
    match guard.store_result("fp", &too_big, TTL).await {
        Err(LockError::RecordTooLarge {
            key,
            what,
            len,
            max,
            ..
        }) => {
            assert_eq!(
                (key.as_str(), what, len, max),
                ("bad", "result", MAX_RESULT_LEN + 1, MAX_RESULT_LEN)
            );
        }
        other => panic!("expected RecordTooLarge, got {other:?}"),
    }
    let long_fp = "f".repeat(MAX_FINGERPRINT_LEN + 1);
    assert!(matches!(
        guard.store_result(&long_fp, b"r", TTL).await,
        Err(LockError::RecordTooLarge {
            what: "fingerprint",
            ..
        })
    ));
    for (what, ttl) in [
        ("zero TTL", Duration::ZERO),
        (
            "TTL above MAX_RESULT_TTL",
            MAX_RESULT_TTL + Duration::from_millis(1),
        ),
        ("Duration::MAX TTL", Duration::MAX),
    ] {
        assert_invalid_config(guard.store_result("fp", b"r", ttl).await, what);
    }
    assert!(guard.is_held(), "a refused record leaves the lock alone");
    assert_eq!(state(&locker, "bad").await, IdempotencyState::InFlight);
    guard.release().await.expect("release");

    assert_invalid_key(locker.idempotency_state("").await);
    assert_invalid_key(locker.idempotency_state("k".repeat(MAX_KEY_LEN + 1)).await);
    let bad_prefix = fx.builder().await.prefix("a{b").build();
    assert_invalid_config(
        bad_prefix.idempotency_state("k").await,
        "prefix with a brace",
    );
    fx.assert_empty("refused input must write nothing").await;
}

/// Records of different keys (odd ones too) and prefixes never meet: each comes back as it was
/// stored.
async fn records_of_different_keys_and_prefixes_never_meet(fx: Fixture) {
    let plain = fx.locker().await;
    // Another prefix, of this check's own.
    let shop = fx
        .builder()
        .await
        .prefix(format!("{}shop:", fx.prefix()))
        .build();
    let keys = ["order:42", "a}b{c", "{order:42}", "ключ 🔒\n\0"];
    for key in keys {
        for (prefix, locker) in [("lock:", &plain), ("shop:", &shop)] {
            let guard = locker.lock(key).await.expect("acquire");
            guard
                .store_result(prefix, key.as_bytes(), TTL)
                .await
                .unwrap_or_else(|e| panic!("{key:?}: {e}"));
            guard.release().await.expect("release");
        }
    }
    for key in keys {
        for (prefix, locker) in [("lock:", &plain), ("shop:", &shop)] {
            let record = completed(state(locker, key).await);
            assert_eq!(
                (record.fingerprint.as_str(), record.result.as_slice()),
                (prefix, key.as_bytes())
            );
        }
    }
}

/// `idempotency_state` is one request to the backend: one counted call.
async fn idempotency_state_is_one_request(fx: Fixture) {
    let locker = fx.locker().await;
    let held = locker.lock("one:held").await.expect("acquire");
    let done = locker.lock("one:done").await.expect("acquire");
    done.store_result("fp", b"r", TTL).await.expect("store");
    done.release().await.expect("release");
    // Warm: the prefix's permission check and the script load are behind us.
    state(&locker, "one:absent").await;
    let calls = locker.stats().backend_calls;
    assert_eq!(state(&locker, "one:absent").await, IdempotencyState::Absent);
    assert_eq!(state(&locker, "one:held").await, IdempotencyState::InFlight);
    completed(state(&locker, "one:done").await);
    assert_eq!(
        locker.stats().backend_calls - calls,
        3,
        "one backend call per state"
    );
    held.release().await.expect("release");
}

/// Issue 29, item 9: the durable "started" mark, written under the lock before the work.
/// While the lock is held the key is in flight; released without a result it is `Started`
/// (with its fingerprint and the record's TTL) for every locker, and a new holder's mark is
/// refused with `OutcomeUnknown`: the work never runs again. A result replaces the mark, and
/// a mark never replaces a result. `clear_started` takes a mark back (never a result). Both
/// are owner-checked like a result; a holder that writes its mark twice wrote it once.
async fn the_started_mark_lets_the_work_run_at_most_once(fx: Fixture) {
    let a = fx.locker().await;
    let b = fx.locker().await;

    // Started, then no result (the holder died, or its store failed): outcome unknown.
    let guard = a.lock("mark:1").await.expect("acquire");
    guard.mark_started("fp-1", TTL).await.expect("mark");
    guard
        .mark_started("fp-1", TTL)
        .await
        .expect("the holder's own mark, written again, is written once");
    assert_eq!(state(&b, "mark:1").await, IdempotencyState::InFlight);
    guard.release().await.expect("release");
    let (fingerprint, expires_in) = started(settled(&b, "mark:1").await);
    assert_eq!(fingerprint, "fp-1");
    assert!(
        expires_in <= TTL && expires_in > TTL - SOON,
        "{expires_in:?}"
    );
    let retry = b.lock("mark:1").await.expect("the lock is free");
    match retry.mark_started("fp-1", TTL).await {
        Err(LockError::OutcomeUnknown {
            key, fingerprint, ..
        }) => assert_eq!((key.as_str(), fingerprint.as_str()), ("mark:1", "fp-1")),
        other => panic!("expected OutcomeUnknown, got {other:?}"),
    }
    assert!(retry.is_held(), "a refused mark keeps the lock");
    retry.release().await.expect("release");
    assert_eq!(started(settled(&a, "mark:1").await).0, "fp-1");

    // The result replaces the mark; a mark never replaces a result.
    let guard = a.lock("mark:2").await.expect("acquire");
    guard.mark_started("fp-2", TTL).await.expect("mark");
    guard
        .store_result("fp-2", b"done", TTL)
        .await
        .expect("store");
    guard.release().await.expect("release");
    assert_eq!(completed(state(&b, "mark:2").await).result, b"done");
    let guard = b.lock("mark:2").await.expect("acquire");
    assert_invalid_config(guard.mark_started("fp-2", TTL).await, "stored result");
    guard.clear_started().await.expect("no mark to take back");
    guard.release().await.expect("release");
    assert_eq!(completed(state(&a, "mark:2").await).result, b"done");

    // Taken back under the lock (an error that is not stored): the key runs again.
    let guard = a.lock("mark:3").await.expect("acquire");
    guard.mark_started("fp-3", TTL).await.expect("mark");
    guard.clear_started().await.expect("take the mark back");
    guard
        .clear_started()
        .await
        .expect("no mark left: not an error");
    guard.release().await.expect("release");
    assert_eq!(settled(&b, "mark:3").await, IdempotencyState::Absent);

    // Owner-checked: a holder whose lock is gone writes no mark, and takes none back.
    let guard = a.lock("mark:4").await.expect("acquire");
    fx.force_delete("mark:4").await;
    assert!(matches!(
        guard.mark_started("fp-4", TTL).await,
        Err(LockError::LeaseLost { .. })
    ));
    assert!(!guard.is_held(), "the refused mark marks the lock lost");
    assert_eq!(settled(&b, "mark:4").await, IdempotencyState::Absent);
    drop(guard);
    let guard = a.lock("mark:5").await.expect("acquire");
    guard.mark_started("fp-5", TTL).await.expect("mark");
    fx.force_delete("mark:5").await;
    assert!(matches!(
        guard.clear_started().await,
        Err(LockError::LeaseLost { .. })
    ));
    assert_eq!(started(settled(&b, "mark:5").await).0, "fp-5");
    drop(guard);

    // Bad input is a typed error and writes nothing.
    let guard = a.lock("mark:6").await.expect("acquire");
    assert_invalid_config(guard.mark_started("fp", Duration::ZERO).await, "TTL");
    let long = "f".repeat(MAX_FINGERPRINT_LEN + 1);
    assert!(matches!(
        guard.mark_started(&long, TTL).await,
        Err(LockError::RecordTooLarge { .. })
    ));
    guard.release().await.expect("release");
    assert_eq!(settled(&b, "mark:6").await, IdempotencyState::Absent);
}

/// Issue 29, item 9 (review): `clear_started` takes back the caller's own mark only. A holder
/// whose `mark_started` found an earlier request's mark (`OutcomeUnknown`) and then takes
/// "its" mark back on its error path (as `mark_started` itself does after a write that got
/// no answer) must leave the earlier mark in place: removed, the next request would run the
/// work a second time.
async fn clear_started_never_takes_another_requests_mark(fx: Fixture) {
    let a = fx.locker().await;
    let b = fx.locker().await;
    let first = a.lock("mark:other").await.expect("acquire");
    first.mark_started("fp", TTL).await.expect("mark");
    first.release().await.expect("release");
    let retry = b.lock("mark:other").await.expect("the lock is free");
    assert!(matches!(
        retry.mark_started("fp", TTL).await,
        Err(LockError::OutcomeUnknown { .. })
    ));
    retry
        .clear_started()
        .await
        .expect("no mark of ours: nothing to take back, not an error");
    retry.release().await.expect("release");
    assert_eq!(
        started(settled(&a, "mark:other").await).0,
        "fp",
        "the earlier request's mark survives another holder's clear_started"
    );
    let third = a.lock("mark:other").await.expect("acquire");
    assert!(matches!(
        third.mark_started("fp", TTL).await,
        Err(LockError::OutcomeUnknown { .. })
    ));
    third.release().await.expect("release");
}

checks!(
    state_goes_absent_in_flight_completed,
    stored_bytes_and_fingerprint_come_back_exactly,
    record_expires_after_its_ttl,
    a_store_after_the_lease_was_lost_is_refused: [Probe, ShortLease],
    a_reentrant_guard_stores_for_the_outer_lock,
    bad_input_is_a_typed_error,
    records_of_different_keys_and_prefixes_never_meet,
    idempotency_state_is_one_request,
    the_started_mark_lets_the_work_run_at_most_once: [Probe],
    clear_started_never_takes_another_requests_mark,
);
