//! Renewals of several locks at once (issue 29, items 1-3): each lock of a watchdog call gets
//! its own verdict, each is judged by its own per-server bound, and every server asked gets
//! the call (an `extend` answers at a quorum, the other servers still get it).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use lock_core::RedlockBackendBuilder;

use super::*;

/// Until `key` is on every server (an acquire answers at a quorum; the last servers' answers
/// land just after), then gone from every server not in `keep`: the lock is held on exactly
/// those (as if the others had been down at the acquire, or lost it).
async fn held_on(servers: &[RedisServer], key: &str, keep: &[usize]) {
    let name = format!("lock:{{{key}}}");
    for s in servers {
        eventually(
            "the lock is on every server",
            Duration::from_secs(2),
            async || s.exists(&name).await,
        )
        .await;
    }
    for (i, s) in servers.iter().enumerate() {
        if !keep.contains(&i) {
            assert_eq!(s.del(&name).await, 1);
        }
    }
}

/// Until `server` has just renewed `key` (its TTL is within `fresh` of `lease`): the next
/// watchdog renewal is then about lease/3 away.
async fn just_renewed(server: &RedisServer, key: &str, lease: Duration, fresh: Duration) {
    let name = format!("lock:{{{key}}}");
    let floor = i64::try_from((lease - fresh).as_millis()).unwrap();
    eventually("a fresh renewal", lease, async || {
        server.pttl(&name).await > floor
    })
    .await;
}

/// Item 1(a): a lock held on all 5 servers shares the watchdog's calls with a lock held on
/// exactly 3; one of the 3 dies. The second is undecided from then on (2 yes, 2 no, one
/// silent) and is lost at its deadline; the first, renewed by 4 servers, must stay held (the
/// whole batch used to fail with the undecided lock, and the first was lost with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_on_every_server_survives_a_loss_beside_an_undecided_lock() {
    let mut servers = servers(5);
    let lease = Duration::from_millis(1500);
    let locker = locker(&servers, lease).await;
    all_reachable(&locker, &servers).await;
    // Taken first: its deadline comes first, so the undecided lock's loss cannot free it.
    let everywhere = locker.lock("everywhere").await.unwrap();
    let majority = locker.lock("majority").await.unwrap();
    held_on(&servers, "everywhere", &[0, 1, 2, 3, 4]).await;
    held_on(&servers, "majority", &[2, 3, 4]).await;
    servers[4].stop();
    tokio::time::timeout(lease * 2, majority.lost())
        .await
        .expect("the undecided lock is lost by its deadline");
    assert!(
        tokio::time::timeout(lease * 2, everywhere.lost())
            .await
            .is_err(),
        "a lock renewed by 4 of 5 servers was reported lost"
    );
    assert!(everywhere.is_held());
    for s in &servers[..4] {
        assert!(s.pttl("lock:{everywhere}").await > 0);
    }
    everywhere.release().await.unwrap();
    servers[4].restart();
}

/// Item 1(b): a lock that a renewal finds on a minority (deleted from 3 of 5 servers, another
/// locker takes it at once) shares the call with an undecided lock. It must be told lost at
/// that renewal (lease/3 after its last one), not at its deadline: until then there are two
/// holders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_found_on_a_minority_is_lost_at_that_renewal_beside_an_undecided_lock() {
    let mut servers = servers(5);
    let lease = Duration::from_secs(3);
    let a = locker(&servers, lease).await;
    let b = locker(&servers, lease).await;
    all_reachable(&a, &servers).await;
    let undecided = a.lock("undecided").await.unwrap();
    let minority = a.lock("minority").await.unwrap();
    held_on(&servers, "undecided", &[2, 3, 4]).await;
    held_on(&servers, "minority", &[0, 1, 2, 3, 4]).await;
    // Right after a renewal: the next one is lease/3 away, the deadline a whole lease.
    just_renewed(&servers[0], "minority", lease, Duration::from_millis(150)).await;
    servers[4].pause();
    for s in &servers[..3] {
        assert_eq!(s.del("lock:{minority}").await, 1);
    }
    let second = b.try_lock("minority").await.unwrap();
    let taken = Instant::now();
    // The next renewal (lease/3 after the last) plus its per-server bound and slack for a
    // loaded machine; the deadline is about 2 s later than this.
    let bound = lease / 3 + Duration::from_millis(700);
    tokio::time::timeout(bound, minority.lost())
        .await
        .expect("told at the renewal that found the lock on a minority, not at its deadline");
    println!(
        "the first holder was told {:?} after the second took the lock",
        taken.elapsed()
    );
    assert!(!minority.is_held());
    assert!(second.is_held());
    servers[4].resume();
    second.release().await.unwrap();
    drop(undecided);
}

/// A TCP proxy to the server on `upstream` that delays every request by `delay` milliseconds
/// (read when the request passes; answers pass at once): the server answers that late without
/// stalling. Returns its `redis://` URL.
async fn slow_proxy(upstream: u16, delay: Arc<AtomicU64>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let delay = delay.clone();
            tokio::spawn(async move {
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                else {
                    return;
                };
                let (mut from_client, mut to_client) = client.into_split();
                let (mut from_server, mut to_server) = server.into_split();
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n @ 1..) = from_client.read(&mut buf).await {
                        let delay = Duration::from_millis(delay.load(Ordering::Relaxed));
                        let due = tokio::time::Instant::now() + delay;
                        if tx.send((due, buf[..n].to_vec())).is_err() {
                            return;
                        }
                    }
                });
                tokio::spawn(async move {
                    while let Some((due, bytes)) = rx.recv().await {
                        tokio::time::sleep_until(due).await;
                        if to_server.write_all(&bytes).await.is_err() {
                            return;
                        }
                    }
                });
                let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
            });
        }
    });
    format!("redis://127.0.0.1:{port}/")
}

/// A backend on `servers`, 3 and 4 through [`slow_proxy`]s delaying by `delay`; `builder`
/// makes the builder (its server timeout), the other timeouts are generous.
async fn slow_backend(
    servers: &[RedisServer],
    delay: &Arc<AtomicU64>,
    builder: impl FnOnce(&[&str]) -> RedlockBackendBuilder,
) -> RedlockBackend {
    let mut urls = urls(servers);
    for (url, s) in urls.iter_mut().zip(servers).skip(3) {
        *url = slow_proxy(s.port(), delay.clone()).await;
    }
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    builder(&urls)
        .response_timeout(Duration::from_secs(3))
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap()
}

/// Item 2: a renewal's per-server bound is each lock's own. Servers 3 and 4 answer 100 ms
/// late (a proxy delays every request); the backend keeps its default bound (a tenth of the
/// lease, at most 200 ms). A lock of 2.5 s held on servers 2-4 (bound 200 ms) must be renewed
/// by their late answers, although it shares the watchdog's calls with a lock of 400 ms
/// (bound 40 ms; renewed by servers 0-2, which answer at once): it was judged by the short
/// lock's bound, found undecided at every renewal, and lost at its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_lease_does_not_shorten_another_locks_renewal_bound() {
    let servers = servers(5);
    let delay = Arc::new(AtomicU64::new(100));
    let locker =
        Locker::builder(slow_backend(&servers, &delay, RedlockBackend::builder).await).build();
    all_reachable(&locker, &servers).await;
    let lease = Duration::from_millis(2500);
    let long = locker.lock("long").lease(lease).await.unwrap();
    held_on(&servers, "long", &[2, 3, 4]).await;
    let short = locker
        .lock("short")
        .lease(Duration::from_millis(400))
        .await
        .unwrap();
    assert!(
        tokio::time::timeout(lease * 2, long.lost()).await.is_err(),
        "the long lock was lost: its renewals were judged by the short lock's bound"
    );
    assert!(long.is_held());
    assert!(short.is_held(), "the short lock lost its renewals");
    for s in &servers[2..] {
        assert!(s.pttl("lock:{long}").await > 0);
    }
}

/// The short lease of [`two_classes`].
const SHORT_LEASE: Duration = Duration::from_millis(600);

/// Two lease classes held by one locker (server timeout 1 s) on 5 servers, 3 and 4 behind
/// [`slow_proxy`]s (no delay yet): `long`, a lock of that lease on servers 2-4, and `short`, one
/// of [`SHORT_LEASE`] on all 5.
struct TwoClasses {
    servers: Vec<RedisServer>,
    delay: Arc<AtomicU64>,
    locker: Locker,
    long: lock_core::LockGuard,
    short: lock_core::LockGuard,
}

async fn two_classes(long: Duration) -> TwoClasses {
    let servers = servers(5);
    let delay = Arc::new(AtomicU64::new(0));
    let backend = slow_backend(&servers, &delay, |urls| {
        RedlockBackend::builder(urls).server_timeout(Duration::from_secs(1))
    })
    .await;
    let locker = Locker::builder(backend).build();
    all_reachable(&locker, &servers).await;
    let long = locker.lock("long").lease(long).await.unwrap();
    held_on(&servers, "long", &[2, 3, 4]).await;
    let short = locker.lock("short").lease(SHORT_LEASE).await.unwrap();
    held_on(&servers, "short", &[0, 1, 2, 3, 4]).await;
    TwoClasses {
        servers,
        delay,
        locker,
        long,
        short,
    }
}

/// Item 2, the other way round: a lock with a short lease is not kept waiting for a long
/// lock's bound. Server timeout 1 s; a 6 s lock on servers 2-4 (bound 1 s), a 600 ms lock on
/// all 5 (bound 300 ms); then servers 3 and 4 answer 1.5 s late. The long lock is undecided
/// at every renewal (its answers come after its bound); the short one is decided by servers
/// 0-2 at once and must stay held: in one call with the long lock, its verdict came only at
/// the long lock's bound, after its own deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_leases_bound_does_not_delay_a_short_leases_renewal() {
    let TwoClasses {
        servers: _servers,
        delay,
        locker: _locker,
        long,
        short,
    } = two_classes(Duration::from_secs(6)).await;
    delay.store(1500, Ordering::Relaxed);
    assert!(
        tokio::time::timeout(Duration::from_secs(3), short.lost())
            .await
            .is_err(),
        "the short lock was lost: its renewals waited for the long lock's bound"
    );
    assert!(short.is_held());
    drop(long);
}

/// The lease of the extend tests, as in redsync's.
const EXTEND_LEASE: Duration = Duration::from_secs(8);

/// 8 servers (redsync's test count) and a locker of [`EXTEND_LEASE`] that reaches them all.
/// Its per-server bound is 1 s: 64 extends at once on a loaded machine can take longer than
/// the other tests' 100 ms, and an extend undecided is an error.
async fn eight_servers() -> (Vec<RedisServer>, Locker) {
    let servers = servers(8);
    let urls = urls(&servers);
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let backend = RedlockBackend::builder(&urls)
        .server_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    let locker = Locker::builder(backend).lease(EXTEND_LEASE).build();
    all_reachable(&locker, &servers).await;
    (servers, locker)
}

/// Until every server has `key`'s extended deadline, for an extend to [`EXTEND_LEASE`] (8 s)
/// made at `since` or later, 1 s or more after the lock was taken. A server that got it
/// expires the key 8 s after `since` at the earliest; one the extend never reached keeps its
/// old deadline, 7 s after `since` at the latest. So the remaining time plus the time since
/// `since` (read after the answer) tells them apart, whatever time the reads themselves take
/// (a fixed threshold failed on a loaded machine: reading 64 keys on 8 servers took longer
/// than the 0.8 s between the two deadlines).
async fn extended_everywhere(servers: &[RedisServer], key: &str, since: Instant) {
    let name = format!("lock:{{{key}}}");
    for (i, s) in servers.iter().enumerate() {
        eventually(
            &format!("{key}: server {i} has the extended deadline"),
            Duration::from_secs(1),
            async || {
                let left = s.pttl(&name).await;
                let passed = i64::try_from(since.elapsed().as_millis()).unwrap_or(i64::MAX);
                left.saturating_add(passed) > 7_500
            },
        )
        .await;
    }
}

/// Item 3: redsync's own extend test, ported (`TestMutexExtend`: 8 masters, a lease of 8 s
/// without the watchdog, `extend` after 1 s idle, then every server's TTL): the extend answers
/// at a quorum of 5, and every server must still get it (the calls not yet sent were dropped:
/// one server kept its old deadline in 6 of 14 runs, and the lock survived one server fewer).
/// Several rounds, so that a pass by luck is unlikely.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_reaches_every_server() {
    let (servers, locker) = eight_servers().await;
    let lease = EXTEND_LEASE;
    let every: Vec<usize> = (0..servers.len()).collect();
    for round in 0..8 {
        let key = format!("extend{round}");
        let guard = locker.lock(&key).watchdog(false).await.unwrap();
        held_on(&servers, &key, &every).await;
        // Idle, as in redsync's test: about 7 s left on every server.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let since = Instant::now();
        guard.extend(lease).await.unwrap();
        // The new deadline on every server soon after: redsync reads it at once; the calls
        // still on their way when the quorum answered are let finish.
        extended_everywhere(&servers, &key, since).await;
        guard.release().await.unwrap();
    }
}

/// Item 3 under load: 64 locks extended at once (their calls queue on each server's
/// connection); every server must get every extend. Before, most were dropped from the
/// connections' queues unsent once a quorum had answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extends_at_once_reach_every_server() {
    let (servers, locker) = eight_servers().await;
    let lease = EXTEND_LEASE;
    let every: Vec<usize> = (0..servers.len()).collect();
    let keys: Vec<String> = (0..64).map(|i| format!("many{i}")).collect();
    let mut guards = Vec::new();
    for key in &keys {
        guards.push(locker.lock(key).watchdog(false).await.unwrap());
    }
    for key in &keys {
        held_on(&servers, key, &every).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let since = Instant::now();
    let extends: Vec<_> = guards
        .into_iter()
        .map(|g| {
            tokio::spawn(async move {
                let extended = g.extend(lease).await;
                (g, extended)
            })
        })
        .collect();
    let mut guards = Vec::new();
    for e in extends {
        let (g, extended) = e.await.unwrap();
        extended.unwrap();
        guards.push(g);
    }
    for key in &keys {
        extended_everywhere(&servers, key, since).await;
    }
    drop(guards);
}

/// Item 3's spawned per-server calls: a call of an `extend` that outlived the extend is resent
/// after `NOSCRIPT` (the server's script cache was empty: a restart with `appendonly`, the
/// documented mode, keeps the keys and drops the scripts), so it lands after a later renewal
/// of the same lock. All 3 servers answer 100 ms late (a proxy), the per-server bound is
/// 150 ms. `extend(300 ms)` on a 3 s lock: `NOSCRIPT`, `SCRIPT LOAD`, then the extend again,
/// 300 ms in all, so it is undecided at 150 ms and the watchdog renews at once with the 3 s
/// lease: that renewal arrives after the load and before the resent extend, and is answered
/// within its bound on every server: the lock counts as renewed for 3 s, while every server
/// then sets the extend's 300 ms. A lease renewed locally must not be shortened on the
/// servers by an older call: another locker took the lock 300 ms later, two holders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_extend_landing_late_does_not_shorten_a_renewed_lease() {
    let servers = servers(3);
    let delay = Arc::new(AtomicU64::new(0));
    let mut proxied = Vec::new();
    for s in &servers {
        proxied.push(slow_proxy(s.port(), delay.clone()).await);
    }
    let proxied: Vec<&str> = proxied.iter().map(String::as_str).collect();
    let backend = RedlockBackend::builder(&proxied)
        .server_timeout(Duration::from_millis(150))
        .response_timeout(Duration::from_secs(3))
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let first = Locker::builder(backend)
        .lease(Duration::from_secs(3))
        .build();
    let second = locker(&servers, Duration::from_secs(3)).await;
    all_reachable(&first, &servers).await;
    let guard = first.lock("flushed").await.unwrap();
    held_on(&servers, "flushed", &[0, 1, 2]).await;
    for s in &servers {
        let _: () = s.query(redis::cmd("SCRIPT").arg("FLUSH").clone()).await;
    }
    delay.store(100, Ordering::Relaxed);
    assert!(
        guard.extend(Duration::from_millis(300)).await.is_err(),
        "the extend was undecided (its answers come after the bound)"
    );
    // Past the extend's 300 ms on the servers, well before the 3 s renewal's next one.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let held = guard.is_held();
    let taken = second.try_lock("flushed").await;
    assert!(
        !(held && taken.is_ok()),
        "two holders: the first still counts its lock renewed, and the second took it"
    );
}

/// Until `server` has renewed `key` (a lock of `lease`) at least once since it was taken:
/// its TTL went down by a fifth, then back up. The renewal script is then loaded there.
async fn renewed_since_taken(server: &RedisServer, key: &str, lease: Duration) {
    let name = format!("lock:{{{key}}}");
    let fifth = i64::try_from((lease * 4 / 5).as_millis()).unwrap();
    eventually("a fifth of the lease gone", lease, async || {
        server.pttl(&name).await < fifth
    })
    .await;
    just_renewed(server, key, lease, lease / 6).await;
}

/// Item 2, when the long lock is due alone: the scheduler does not wait for one lease class's
/// call before renewing another. Server timeout 1 s; a 1.5 s lock on servers 2-4 (bound
/// 750 ms: renewed by their answers only), a 600 ms lock on all 5 (bound 300 ms, renewed by
/// servers 0-2 at once); then servers 3 and 4 answer 600 ms late. The long lock is renewed
/// within its bound, 600 ms after each call, and is due again at once, mostly with the short
/// one not due: its call was awaited by the scheduler itself, which renewed nothing else for
/// those 600 ms, and the short lock (392 ms of validity left a third into its lease) was lost
/// (5 of 5 runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_lock_renewed_alone_does_not_hold_up_a_short_lock() {
    let TwoClasses {
        servers,
        delay,
        locker: _locker,
        long,
        short,
    } = two_classes(Duration::from_millis(1500)).await;
    // No NOSCRIPT round trips on the slow servers afterwards.
    for s in &servers[3..] {
        renewed_since_taken(s, "short", SHORT_LEASE).await;
    }
    delay.store(600, Ordering::Relaxed);
    assert!(
        tokio::time::timeout(Duration::from_secs(5), short.lost())
            .await
            .is_err(),
        "the short lock was lost: the scheduler waited for the long lock's renewal"
    );
    assert!(short.is_held());
    assert!(long.is_held(), "the long lock lost its (late) renewals");
}
