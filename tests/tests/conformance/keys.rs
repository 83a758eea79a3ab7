//! Keys and options: invalid ones are refused with a typed error, odd ones work and keep all
//! of a lock's Redis keys in one hash slot.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lock_core::{
    LockError, LockerBuilder, MAX_KEY_LEN, MAX_LEASE, MAX_PREFIX_LEN, MAX_WAIT, MIN_LEASE,
};
use lock_testkit::RedisServer;

use crate::fixture::{
    Fixture, assert_busy, assert_invalid_config, assert_invalid_key, has_hex_run, lock_name,
};

/// Empty and over-long keys are `InvalidKey`; zero, too short and absurd leases, absurd waits,
/// a zero `max_hold`, a prefix with a brace or too long are `InvalidConfig`; nothing panics and
/// nothing is written to the backend.
async fn invalid_keys_and_options_are_rejected(fx: Fixture) {
    let locker = fx.locker().await;
    // Keys.
    assert_invalid_key(locker.lock("").await);
    assert_invalid_key(locker.try_lock("").await);
    let ran = AtomicUsize::new(0);
    assert_invalid_key(
        locker
            .lock("")
            .run(async {
                ran.fetch_add(1, Ordering::SeqCst);
            })
            .await,
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    let long = "k".repeat(MAX_KEY_LEN + 1);
    match locker.lock(&long).await {
        Err(LockError::InvalidKey { key, reason, .. }) => {
            assert!(key.len() < long.len(), "the error shortens a long key");
            assert!(reason.contains(&MAX_KEY_LEN.to_string()), "{reason}");
        }
        other => panic!("expected InvalidKey, got {other:?}"),
    }
    assert_invalid_key(locker.lock("é".repeat(MAX_KEY_LEN / 2 + 1)).await); // bytes, not chars
    let longest = "k".repeat(MAX_KEY_LEN);
    locker
        .lock(&longest)
        .await
        .expect("a key of exactly MAX_KEY_LEN bytes is fine")
        .release()
        .await
        .expect("release");

    // Per-request options.
    let ms = Duration::from_millis;
    for (what, lease) in [
        ("zero lease", Duration::ZERO),
        ("lease below MIN_LEASE", MIN_LEASE - ms(1)),
        ("lease above MAX_LEASE", MAX_LEASE + ms(1)),
        ("Duration::MAX lease", Duration::MAX),
    ] {
        assert_invalid_config(locker.lock("k").lease(lease).await, what);
    }
    for (what, wait) in [
        ("wait above MAX_WAIT", MAX_WAIT + ms(1)),
        ("Duration::MAX wait", Duration::MAX),
    ] {
        assert_invalid_config(locker.lock("k").wait(wait).await, what);
    }
    assert_invalid_config(
        locker.lock("k").max_hold(Duration::ZERO).await,
        "zero max_hold",
    );

    // Locker options: try_build says so, and a built locker reports it on every attempt.
    type Configure = fn(LockerBuilder) -> LockerBuilder;
    let builders: [(&str, Configure); 6] = [
        ("zero lease", |b| b.lease(Duration::ZERO)),
        ("absurd lease", |b| b.lease(Duration::MAX)),
        ("absurd wait", |b| b.wait(Duration::MAX)),
        ("prefix with {", |b| b.prefix("shop{1}:")),
        ("prefix with }", |b| b.prefix("shop}")),
        ("prefix too long", |b| {
            b.prefix("p".repeat(MAX_PREFIX_LEN + 1))
        }),
    ];
    for (what, configure) in builders {
        assert_invalid_config(configure(fx.builder().await).try_build(), what);
        let built = configure(fx.builder().await).build();
        assert_invalid_config(built.lock("k").await, what);
        assert_invalid_config(built.try_lock("k").run(async {}).await, what);
    }

    // Extending with a bad lease is refused and leaves the lock alone.
    let guard = locker.lock("extend").await.expect("acquire");
    assert_invalid_config(guard.extend(Duration::ZERO).await, "extend zero");
    assert_invalid_config(guard.extend(Duration::MAX).await, "extend absurd");
    assert!(guard.is_held());
    guard.release().await.expect("release");

    assert!(
        fx.is_empty().await,
        "rejected requests must not write to the backend"
    );
}

/// Keys with braces and odd bytes (newlines, NUL, tabs, non-ASCII, a key of exactly
/// MAX_KEY_LEN bytes) lock, exclude and release; keys differing only in braces or suffixes do
/// not collide. On Redis: the key names follow the documented layout and the lock, its fence
/// counter and its release channel share one cluster hash slot, as computed by a real
/// cluster-mode redis-server.
async fn odd_keys_work_and_share_one_slot(fx: Fixture) {
    let a = fx.locker().await;
    let b = fx.locker().await;
    let mut at_limit = String::from("{x}");
    while at_limit.len() + "é".len() <= MAX_KEY_LEN {
        at_limit.push('é');
    }
    while at_limit.len() < MAX_KEY_LEN {
        at_limit.push('}');
    }
    assert_eq!(at_limit.len(), MAX_KEY_LEN);
    let keys = [
        "a}b{c".to_owned(),
        "{order:42}".to_owned(),
        "}{".to_owned(),
        "{}".to_owned(),
        "ключ 🔒\t\r\n\0end".to_owned(),
        "line\nbreak{".to_owned(),
        at_limit,
    ];
    let node = match &fx {
        Fixture::Redis(_) => Some(RedisServer::start_cluster_node()),
        Fixture::Memory(_) => None,
    };
    for key in &keys {
        let guard = a
            .lock(key)
            .fenced()
            .await
            .unwrap_or_else(|e| panic!("{key:?}: {e}"));
        assert_eq!(guard.key(), key);
        let first = guard.fence().expect("fenced");
        if let Fixture::Memory(_) = &fx {
            assert_eq!(first, 1);
        }
        assert_busy(b.try_lock(key).await, key);
        if let (Fixture::Redis(server), Some(node)) = (&fx, &node) {
            let name = lock_name("lock:", key);
            let fence = format!("{name}:fence");
            let channel = format!("{name}:released");
            let token = server
                .get(&name)
                .await
                .unwrap_or_else(|| panic!("{key:?}: no lock at {name:?}"));
            assert!(token.len() == 32 && has_hex_run(&token, 32), "{key:?}");
            assert_eq!(server.get(&fence).await, Some(first.to_string()), "{key:?}");
            let slot = node.keyslot(&name).await;
            assert_eq!(node.keyslot(&fence).await, slot, "{key:?}: fence slot");
            assert_eq!(node.keyslot(&channel).await, slot, "{key:?}: channel slot");
        }
        guard.release().await.expect("release");
        let again = b.try_lock(key).await.expect("free after release");
        again.release().await.expect("release");
    }
    // Names do not collide: these are all different locks, held at once.
    let distinct = ["a", "{a}", "a}", "a:fence", "{a}:fence", "#0", "{#0}"];
    let mut held = Vec::new();
    for key in distinct {
        held.push(
            b.try_lock(key)
                .await
                .unwrap_or_else(|e| panic!("{key:?}: {e}")),
        );
    }
    for g in held {
        g.release().await.expect("release");
    }
    if let Fixture::Redis(server) = &fx {
        // Only the fence counters remain: every lock key was removed by its release.
        let mut expected: Vec<String> = keys
            .iter()
            .map(|k| format!("{}:fence", lock_name("lock:", k)))
            .collect();
        expected.sort();
        assert_eq!(server.keys("*").await, expected);
    }
}

conformance!(
    invalid_keys_and_options_are_rejected,
    odd_keys_work_and_share_one_slot,
);
