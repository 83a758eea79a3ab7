//! Renewals of several locks at once (issue 29, items 1-3): each lock of a watchdog call gets
//! its own verdict, each is judged by its own per-server bound, and every server asked gets
//! the call (an `extend` answers at a quorum, the other servers still get it).

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
