//! What the Redis family stores, read with the harness's own client: the layout and TTLs
//! beneath the conformance kit's properties (`lock_core::conformance`), on one redis-server
//! (`on_redis::*`; those the shared deployments also have run there, see main.rs).

use std::time::Duration;

use lock_core::conformance::helpers::{completed, lock_fenced, odd_keys, renewed, state};
use lock_core::{DEFAULT_LEASE, IdempotencyState};
use lock_testkit::RedisServer;

use crate::fixture::{Fixture, SOON, Store, lock_name};

const ORDER: &str = "order:42";
const KEY: &str = "fenced";
const TTL: Duration = Duration::from_secs(60);

/// Every fence of one history of [`KEY`], in order: fenced acquires through two lockers
/// around an unfenced one, and one after an expiry.
async fn fence_history(fx: &Fixture) -> Vec<u64> {
    let (a, b) = (fx.locker().await, fx.locker().await);
    let mut fences = Vec::new();
    for locker in [&a, &b] {
        let g = locker.lock(KEY).fenced().await.expect("acquire");
        fences.extend(g.fence());
        g.release().await.expect("release");
    }
    a.lock(KEY)
        .await
        .expect("unfenced")
        .release()
        .await
        .expect("release");
    let expiring = a
        .lock(KEY)
        .fenced()
        .lease(Duration::from_millis(150))
        .watchdog(false)
        .await
        .expect("acquire");
    fences.extend(expiring.fence());
    let g = b
        .lock(KEY)
        .fenced()
        .wait(SOON)
        .await
        .expect("acquire after expiry");
    fences.extend(g.fence());
    g.release().await.expect("release");
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    fences
}

/// The Redis name of a key's record, from the documented layout (not from lock-core).
fn record_name(prefix: &str, key: &str) -> String {
    format!("{}:result", lock_name(prefix, key))
}

/// Redis stores a held lock as a 32-character token and its stamp (`|<since>|<holder>|`),
/// whose TTL is the lease (30 s by default).
async fn held_lock_is_stored_as_a_token_with_the_lease_as_ttl(fx: Fixture) {
    let locker = fx.locker().await;
    let _held = locker
        .lock(ORDER)
        .lease(DEFAULT_LEASE)
        .await
        .expect("acquire");
    let stored = fx.stored(ORDER).await.expect("read from Redis");
    let value = stored
        .token
        .clone()
        .expect("the lock key exists while held");
    assert_stamped(&value, locker.holder());
    assert!(stored.pttl > 0 && stored.pttl <= 30_000, "{stored:?}");
}

/// `value` is a lock's value: 32 lowercase hex digits (128 random bits), then `|<since>|`
/// (ms since 1970, within the last minute) and `<holder>|`.
#[track_caller]
fn assert_stamped(value: &str, holder: &str) {
    let hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
    let (token, stamp) = value.split_at(32.min(value.len()));
    assert!(token.len() == 32 && token.bytes().all(hex), "{value:?}");
    let stamp = stamp
        .strip_prefix('|')
        .and_then(|s| s.strip_suffix(&format!("|{holder}|")))
        .unwrap_or_else(|| panic!("no stamp of {holder:?} after the token: {value:?}"));
    let since: u128 = stamp.parse().unwrap_or_else(|_| panic!("{value:?}"));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    assert!(
        since <= now && now - since < 60_000,
        "since {since}, now {now}"
    );
}

/// The name of [`KEY`]'s fence counter in Redis.
fn counter() -> String {
    format!("{}:fence", lock_name("lock:", KEY))
}

/// Redis's fence counter keeps the last fence drawn.
async fn fence_counter_keeps_the_last_fence(fx: Fixture) {
    let fences = fence_history(&fx).await;
    let last = fences.last().copied().unwrap_or_default();
    assert_eq!(fx.server().get(&counter()).await, Some(last.to_string()));
}

/// Redis's fence counter has no TTL (DESIGN: tokens must never go backwards): while the
/// server keeps its data, the next token is the last one plus one at least, whatever its clock
/// does, long after the lock's lease ran out.
async fn fence_counter_has_no_ttl(fx: Fixture) {
    fence_history(&fx).await;
    let pttl = fx.server().pttl(&counter()).await;
    assert_eq!(pttl, -1, "the fence counter has no TTL");
}

/// Redis fences are never below the server's clock in microseconds (so they rise across data
/// loss), and never above it.
async fn fences_follow_the_servers_clock_in_microseconds(fx: Fixture) {
    let fences = fence_history(&fx).await;
    let time: Vec<String> = fx.server().query(redis::cmd("TIME").clone()).await;
    let now_us =
        time[0].parse::<u64>().expect("secs") * 1_000_000 + time[1].parse::<u64>().expect("micros");
    assert!(
        fences
            .iter()
            .all(|&f| f > now_us - 60_000_000 && f <= now_us),
        "tokens follow the server's clock in microseconds: {fences:?} (now {now_us})"
    );
}

/// On Redis the retaken key holds the second owner's token (not the first's), with a TTL.
async fn retaken_key_holds_the_new_owners_token(fx: Fixture) {
    let expired = fx.expire_and_retake("expiring").await;
    let now = fx.stored("expiring").await.expect("read from Redis");
    assert!(expired.stale_token.is_some());
    assert_ne!(
        now.token, expired.stale_token,
        "the key now holds the second owner's token"
    );
    assert!(now.pttl > 0);
}

/// On Redis each renewal sets the TTL to the lease again, no more: after 2.5 leases it is
/// still within (0, 600 ms].
async fn renewals_keep_the_ttl_within_the_lease(fx: Fixture) {
    let (a, b) = (fx.locker().await, fx.locker().await);
    let (_, guard) = renewed(&a, &b, Duration::from_millis(600)).await;
    let s = fx.stored("renewed").await.expect("read from Redis");
    assert!(s.pttl > 0 && s.pttl <= 600, "{s:?}");
    guard.release().await.expect("release");
}

/// On Redis an odd key's lock lives at its documented name, holding a 32-hex-digit token and
/// its stamp.
async fn odd_keys_follow_the_documented_layout(fx: Fixture) {
    let a = fx.locker().await;
    for key in &odd_keys() {
        let (guard, _) = lock_fenced(&a, key).await;
        let name = lock_name("lock:", key);
        let token = fx
            .server()
            .get(&name)
            .await
            .unwrap_or_else(|| panic!("{key:?}: no lock at {name:?}"));
        assert_stamped(&token, a.holder());
        guard.release().await.expect("release");
    }
}

/// On Redis an odd key's lock, fence counter and release channel share one cluster hash slot,
/// as computed by a real cluster-mode redis-server.
async fn odd_keys_keep_lock_fence_and_channel_in_one_slot(fx: Fixture) {
    let node = RedisServer::start_cluster_node();
    let a = fx.locker().await;
    for key in &odd_keys() {
        let (guard, _) = lock_fenced(&a, key).await;
        let name = lock_name("lock:", key);
        let slot = node.keyslot(&name).await;
        assert_eq!(
            node.keyslot(&format!("{name}:fence")).await,
            slot,
            "{key:?}: fence slot"
        );
        assert_eq!(
            node.keyslot(&format!("{name}:released")).await,
            slot,
            "{key:?}: channel slot"
        );
        guard.release().await.expect("release");
    }
}

/// On Redis the record is a hash `P{T}S:result` beside the lock, in its hash slot (as a real
/// cluster-mode server computes it), with a TTL, for odd keys and another prefix too. (That
/// records of different keys and prefixes never meet is the kit's
/// `records_of_different_keys_and_prefixes_never_meet`, on every backend.)
async fn the_record_shares_the_locks_hash_slot(fx: Fixture) {
    let plain = fx.locker().await;
    let shop = fx.builder().await.prefix("shop:").build();
    let node = match fx.store() {
        Store::Redis(_) => Some(RedisServer::start_cluster_node()),
        // The cluster computes the slots itself: a record outside its lock's slot would be
        // refused (CROSSSLOT) by the store script.
        Store::Memory(_) | Store::Cluster(_) => None,
    };
    let keys = ["order:42", "a}b{c", "{order:42}", "ключ 🔒\n\0"];
    for key in keys {
        for (prefix, locker) in [("lock:", &plain), ("shop:", &shop)] {
            let guard = locker.lock(key).await.expect("acquire");
            guard
                .store_result(prefix, key.as_bytes(), TTL)
                .await
                .unwrap_or_else(|e| panic!("{key:?}: {e}"));
            if let (Store::Redis(server), Some(node)) = (fx.store(), &node) {
                let lock = lock_name(prefix, key);
                let record = record_name(prefix, key);
                let kind: String = server.query(redis::cmd("TYPE").arg(&record).clone()).await;
                assert_eq!(kind, "hash", "{key:?}");
                let fields: Vec<Vec<u8>> = server
                    .query(
                        redis::cmd("HMGET")
                            .arg(&record)
                            .arg("fingerprint")
                            .arg("result")
                            .clone(),
                    )
                    .await;
                assert_eq!(fields, [prefix.as_bytes(), key.as_bytes()], "{key:?}");
                let pttl = server.pttl(&record).await;
                assert!(pttl > 0 && pttl <= 60_000, "{key:?}: PTTL {pttl}");
                assert_eq!(
                    node.keyslot(&record).await,
                    node.keyslot(&lock).await,
                    "{key:?}"
                );
            }
            guard.release().await.expect("release");
        }
    }
}

/// `idempotency_state` is one request to the backend: one counted call, and on Redis one
/// EVALSHA and no other command sent (the script's own reads are counted as its internals).
async fn idempotency_state_is_one_evalsha(fx: Fixture) {
    let locker = fx.locker().await;
    let held = locker.lock("one:held").await.expect("acquire");
    let done = locker.lock("one:done").await.expect("acquire");
    done.store_result("fp", b"r", TTL).await.expect("store");
    done.release().await.expect("release");
    // Warm: the prefix's permission check and the script load are behind us.
    state(&locker, "one:absent").await;
    if let Store::Redis(server) = fx.store() {
        server.reset_stats().await;
    }
    let calls = locker.stats().backend_calls;
    assert_eq!(state(&locker, "one:absent").await, IdempotencyState::Absent);
    assert_eq!(state(&locker, "one:held").await, IdempotencyState::InFlight);
    completed(state(&locker, "one:done").await);
    assert_eq!(
        locker.stats().backend_calls - calls,
        3,
        "one backend call per state"
    );
    if let Store::Redis(server) = fx.store() {
        let stats = server.commandstats().await;
        println!("3 idempotency_state calls: {stats:?}");
        assert_eq!(stats.get("evalsha"), Some(&3), "{stats:?}");
        // Nothing but the three EVALSHA and their internals (absent: HGET, EXISTS; in flight:
        // HGET, EXISTS; completed: HGET, HGET, PTTL); the harness's CONFIG RESETSTAT aside, and
        // what sentinels send a primary they watch meanwhile (PING every second, PUBLISH of
        // their hello every two, INFO, and HELLO and CLIENT on their new connections).
        let watching = ["ping", "publish", "info", "hello"];
        let sent: std::collections::BTreeMap<&str, u64> = stats
            .iter()
            .filter(|(c, _)| !c.starts_with("config|") && !c.starts_with("client|"))
            .filter(|(c, _)| !watching.contains(&c.as_str()))
            .map(|(c, n)| (c.as_str(), *n))
            .collect();
        let expected = [("evalsha", 3), ("exists", 2), ("hget", 4), ("pttl", 1)];
        assert_eq!(sent, expected.into_iter().collect(), "{stats:?}");
    }
    held.release().await.expect("release");
}

/// The Redis-only checks, by name, for the shared deployments (main.rs).
pub(crate) fn checks() -> Vec<crate::fixture::Check> {
    vec![
        (
            "held_lock_is_stored_as_a_token_with_the_lease_as_ttl",
            |fx| Box::pin(held_lock_is_stored_as_a_token_with_the_lease_as_ttl(fx)),
        ),
        ("retaken_key_holds_the_new_owners_token", |fx| {
            Box::pin(retaken_key_holds_the_new_owners_token(fx))
        }),
        ("renewals_keep_the_ttl_within_the_lease", |fx| {
            Box::pin(renewals_keep_the_ttl_within_the_lease(fx))
        }),
        ("the_record_shares_the_locks_hash_slot", |fx| {
            Box::pin(the_record_shares_the_locks_hash_slot(fx))
        }),
        ("idempotency_state_is_one_evalsha", |fx| {
            Box::pin(idempotency_state_is_one_evalsha(fx))
        }),
    ]
}

/// Runs each listed check on a redis-server of its own.
macro_rules! on_redis {
    ($($check:ident),* $(,)?) => {
        mod on_redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $check() {
                    super::$check(crate::fixture::Fixture::redis()).await;
                }
            )*
        }
    };
}

on_redis!(
    held_lock_is_stored_as_a_token_with_the_lease_as_ttl,
    fence_counter_keeps_the_last_fence,
    fence_counter_has_no_ttl,
    fences_follow_the_servers_clock_in_microseconds,
    retaken_key_holds_the_new_owners_token,
    renewals_keep_the_ttl_within_the_lease,
    odd_keys_follow_the_documented_layout,
    odd_keys_keep_lock_fence_and_channel_in_one_slot,
    the_record_shares_the_locks_hash_slot,
    idempotency_state_is_one_evalsha,
);
