//! Fencing tokens: they strictly increase, and owner tokens never show in debug output.

use std::time::Duration;

use lock_core::{current_fence, current_lock};

use crate::fixture::{Fixture, SOON, has_hex_run, lock_name, soon};

/// Fencing tokens strictly increase per key across release, expiry, background release and
/// lockers; unfenced acquisitions do not disturb them; each key counts on its own; on Redis the
/// counter key has no TTL.
async fn fencing_tokens_strictly_increase(fx: Fixture) {
    let a = fx.locker().await;
    let b = fx.locker().await;
    let mut fences = Vec::new();

    let g = a.lock("fenced").fenced().await.expect("acquire");
    fences.push(g.fence().expect("fenced lock has a token"));
    g.release().await.expect("release");

    let g = b.lock("fenced").fenced().await.expect("acquire on b");
    fences.push(g.fence().expect("token"));
    g.release().await.expect("release");

    let g = a.lock("fenced").await.expect("unfenced acquire");
    assert_eq!(g.fence(), None);
    g.release().await.expect("release");

    // Across expiry.
    let expiring = a
        .lock("fenced")
        .fenced()
        .lease(Duration::from_millis(150))
        .watchdog(false)
        .await
        .expect("acquire");
    fences.push(expiring.fence().expect("token"));
    let g = b
        .lock("fenced")
        .fenced()
        .wait(SOON)
        .await
        .expect("acquire after expiry");
    fences.push(g.fence().expect("token"));
    // Across a background release (drop).
    drop(g);
    let g = a
        .lock("fenced")
        .fenced()
        .wait(SOON)
        .await
        .expect("acquire after drop");
    fences.push(g.fence().expect("token"));
    g.release().await.expect("release");
    // Inside run, through current_fence().
    let inner = a
        .lock("fenced")
        .fenced()
        .run(async { current_fence() })
        .await
        .expect("run");
    fences.push(inner.expect("current_fence inside a fenced run"));

    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens must strictly increase: {fences:?}"
    );
    let other = a.lock("fenced-other").fenced().await.expect("acquire");
    match &fx {
        Fixture::Memory(_) => assert_eq!(other.fence(), Some(1), "each key has its own counter"),
        Fixture::Redis(server) => {
            let counter = format!("{}:fence", lock_name("lock:", "fenced-other"));
            assert_eq!(
                server.get(&counter).await,
                other.fence().map(|f| f.to_string()),
                "each key has its own counter"
            );
        }
    }
    other.release().await.expect("release");

    if let Fixture::Redis(server) = &fx {
        // The counter keeps the last token, never below the server's clock in microseconds
        // (so tokens rise across data loss), and expires: it needs no life of its own.
        let counter = format!("{}:fence", lock_name("lock:", "fenced"));
        let last = fences.last().copied().unwrap_or_default();
        assert_eq!(server.get(&counter).await, Some(last.to_string()));
        let pttl = server.pttl(&counter).await;
        assert!(pttl > 0, "the fence counter has a TTL: {pttl}");
        let time: Vec<String> = server.query(redis::cmd("TIME").clone()).await;
        let now_us = time[0].parse::<u64>().expect("secs") * 1_000_000
            + time[1].parse::<u64>().expect("micros");
        assert!(
            fences
                .iter()
                .all(|&f| f > now_us - 60_000_000 && f <= now_us),
            "tokens follow the server's clock in microseconds: {fences:?} (now {now_us})"
        );
    }
    drop(expiring);
}

/// Owner tokens never show in `Debug` or `Display` of guards, lock infos, lockers, backends or
/// errors (on Redis the real token is read from the server and searched for).
async fn tokens_never_appear_in_debug_output(fx: Fixture) {
    let a = fx.locker().await;
    let b = fx.locker().await;
    let guard = a.lock("secret").fenced().await.expect("acquire");
    let token = fx.stored("secret").await.and_then(|s| s.token);
    if let Some(t) = &token {
        assert!(has_hex_run(t, 32), "the detector recognises a real token");
    }
    let busy = b.try_lock("secret").await.expect_err("busy");
    let timeout = b
        .lock("secret")
        .wait(Duration::from_millis(50))
        .await
        .expect_err("timeout");
    let inside = a
        .lock("secret-run")
        .run(async {
            format!(
                "{:?} {:?}",
                current_lock(),
                current_lock().map(|i| i.key().to_owned())
            )
        })
        .await
        .expect("run");
    let stale = a
        .lock("secret-stale")
        .lease(Duration::from_millis(50))
        .watchdog(false)
        .await
        .expect("acquire");
    let stale_token = fx.stored("secret-stale").await.and_then(|s| s.token);
    let stale_dbg = format!("{stale:?}");
    soon("stale lost", stale.lost()).await;
    let lost = stale.release().await.expect_err("stale release");
    let texts = [
        format!("{guard:?}"),
        format!("{guard:#?}"),
        format!("{:?}", guard.info()),
        format!("{a:?}"),
        format!("{:#?}", a.backend()),
        format!("{busy:?} {busy}"),
        format!("{timeout:?} {timeout}"),
        format!("{lost:?} {lost}"),
        stale_dbg,
        inside,
    ];
    for text in &texts {
        assert!(!has_hex_run(text, 32), "a token-like value leaked: {text}");
        for t in token.iter().chain(stale_token.iter()) {
            assert!(!text.contains(t.as_str()), "the token leaked: {text}");
        }
    }
    guard.release().await.expect("release");
}

conformance!(
    fencing_tokens_strictly_increase,
    tokens_never_appear_in_debug_output,
);
