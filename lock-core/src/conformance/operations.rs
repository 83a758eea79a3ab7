//! What the people on call do: a lock inspected from another process (holder, lease, fence,
//! age, waiters; never the token), freed whoever holds it, and the held locks listed.

use std::time::{Duration, Instant};

use crate::{LockError, LockState, Locker};

use super::fixture::{Fixture, SOON, eventually, soon};

/// The holder identity the checks give their holding locker.
const HOLDER: &str = "conformance holder a";

/// The states of the held locks matching `pattern`, sorted by key.
async fn listed(locker: &Locker, pattern: &str) -> Vec<LockState> {
    let mut held = locker.list(pattern);
    let mut states = Vec::new();
    while let Some(state) = soon("a listing page", held.next()).await {
        states.push(state.expect("list"));
    }
    states.sort_by(|a, b| a.key.cmp(&b.key));
    states
}

#[track_caller]
fn assert_free(state: &LockState, key: &str) {
    assert_eq!(state.key, key);
    assert!(!state.held, "{state:?}");
    assert!(
        state.holder.is_none() && state.remaining.is_none() && state.held_for.is_none(),
        "a free lock shows no holder: {state:?}"
    );
}

async fn inspect_shows_holder_lease_and_age_and_nothing_after_release(fx: Fixture) {
    let a = fx.builder().await.holder(HOLDER).build();
    let b = fx.locker().await;
    assert_free(&b.inspect("inspected").await.expect("inspect"), "inspected");
    let before = Instant::now();
    let g = a.lock("inspected").await.expect("acquire");
    let state = b.inspect("inspected").await.expect("inspect");
    assert!(state.held, "{state:?}");
    assert_eq!(state.key, "inspected");
    assert_eq!(state.holder.as_deref(), Some(HOLDER));
    let remaining = state.remaining.expect("the lease left");
    assert!(
        remaining > Duration::ZERO && remaining <= a.lease(),
        "{remaining:?} left of a {:?} lease",
        a.lease()
    );
    let held_for = state.held_for.expect("how long it has been held");
    assert!(
        held_for <= before.elapsed() + Duration::from_millis(100),
        "held for {held_for:?}, taken {:?} ago",
        before.elapsed()
    );
    assert_eq!(state.waiters, 0, "{state:?}");
    g.release().await.expect("release");
    assert_free(&b.inspect("inspected").await.expect("inspect"), "inspected");
}

async fn inspect_shows_the_last_fence(fx: Fixture) {
    let (a, b) = (fx.locker().await, fx.locker().await);
    let g = a.lock("fenced").fenced().await.expect("acquire");
    let fence = g.fence();
    assert_eq!(b.inspect("fenced").await.expect("inspect").fence, fence);
    g.release().await.expect("release");
    let after = b.inspect("fenced").await.expect("inspect").fence;
    if fx.last_fence_kept() {
        // The counter outlives its lock.
        assert_eq!(after, fence);
    } else {
        // Nothing kept of it: no fence rather than a made-up one.
        assert_eq!(
            after, None,
            "a released lock's fence on a backend that keeps none"
        );
    }
}

async fn inspect_counts_the_queued_waiters(fx: Fixture) {
    let holder = fx.locker().await;
    let g = holder.lock("queued").await.expect("acquire");
    let mut waiters = Vec::new();
    for _ in 0..2 {
        let locker = fx.locker().await;
        waiters.push(tokio::spawn(async move {
            let g = locker
                .lock("queued")
                .fair()
                .wait(SOON)
                .await
                .expect("served");
            g.release().await.expect("release");
        }));
    }
    let inspector = fx.locker().await;
    eventually("two fair waiters counted", SOON, async || {
        inspector.inspect("queued").await.expect("inspect").waiters == 2
    })
    .await;
    g.release().await.expect("release");
    for w in waiters {
        soon("a waiter served", w).await.expect("waiter task");
    }
    eventually("no waiter counted", SOON, async || {
        inspector.inspect("queued").await.expect("inspect").waiters == 0
    })
    .await;
}

async fn force_unlock_hands_the_lock_on_and_the_old_holder_learns(fx: Fixture) {
    let stuck = fx.builder().await.holder(HOLDER).build();
    let held = stuck.lock("stuck").fenced().await.expect("acquire");
    let old = held.fence().expect("fenced");
    // A waiter whose wait ends long before the stuck holder's lease: only the force unlock
    // can serve it.
    let waiter = fx.locker().await;
    let waiting = tokio::spawn(async move { waiter.lock("stuck").fenced().wait(SOON).await });
    let operator = fx.locker().await;
    let removed = operator
        .force_unlock("stuck")
        .await
        .expect("force_unlock")
        .expect("a held lock was removed");
    assert!(removed.held, "{removed:?}");
    assert_eq!(removed.holder.as_deref(), Some(HOLDER));
    assert_eq!(removed.fence, Some(old));
    let next = soon("the waiter served", waiting)
        .await
        .expect("waiter task")
        .expect("the waiter gets the lock");
    assert!(next.fence().expect("fenced") > old, "{next:?} after {old}");
    match held.release().await {
        Err(LockError::LeaseLost { .. }) => {}
        other => panic!("the evicted holder's release: {other:?}"),
    }
    // Its release touched nothing of the new holder's.
    assert!(operator.inspect("stuck").await.expect("inspect").held);
    next.release().await.expect("release");
}

async fn force_unlock_of_a_free_lock_removes_nothing(fx: Fixture) {
    let (a, operator) = (fx.locker().await, fx.locker().await);
    assert_eq!(
        operator.force_unlock("free").await.expect("force_unlock"),
        None
    );
    let g = a.lock("free").await.expect("the key is free");
    g.release().await.expect("release");
    assert_eq!(
        operator.force_unlock("free").await.expect("force_unlock"),
        None
    );
}

async fn list_streams_the_held_locks_under_a_pattern(fx: Fixture) {
    let a = fx.builder().await.holder(HOLDER).build();
    let keys = ["list:1", "list:2", "list:{3}", "other:1"];
    let mut guards = Vec::new();
    for key in keys {
        guards.push(a.lock(key).await.expect("acquire"));
    }
    let b = fx.locker().await;
    let states = listed(&b, "list:*").await;
    let listed_keys: Vec<&str> = states.iter().map(|s| s.key.as_str()).collect();
    assert_eq!(listed_keys, ["list:1", "list:2", "list:{3}"]);
    for state in &states {
        assert!(state.held, "{state:?}");
        assert_eq!(state.holder.as_deref(), Some(HOLDER), "{state:?}");
    }
    assert_eq!(listed(&b, "*").await.len(), keys.len());
    assert!(listed(&b, "none:*").await.is_empty());
    for g in guards {
        g.release().await.expect("release");
    }
    assert!(listed(&b, "*").await.is_empty(), "released locks listed");
}

/// `force_unlock_seen` removes the holding seen and nothing else: a new acquire by the same
/// holder (same identity, same fence: unfenced) is another holding, left alone. A backend that
/// cannot compare in one step says so (`InvalidConfig`) and touches nothing.
async fn force_unlock_seen_removes_only_the_holding_seen(fx: Fixture) {
    let holder = fx.builder().await.holder(HOLDER).build();
    let operator = fx.locker().await;
    let first = holder.lock("seen").await.expect("acquire");
    let seen = operator.inspect("seen").await.expect("inspect");
    first.release().await.expect("release");
    // A stamp to the millisecond needs a new millisecond.
    tokio::time::sleep(Duration::from_millis(2)).await;
    let second = holder.lock("seen").await.expect("acquire again");
    match operator.force_unlock_seen(&seen).await {
        Err(LockError::InvalidConfig { .. }) => {
            assert!(second.is_held());
            second.release().await.expect("release");
            return;
        }
        Ok(crate::Unlocked::ChangedHands(now)) => {
            assert_eq!(now.holder.as_deref(), Some(HOLDER), "{now:?}");
        }
        other => panic!("a new holding removed or misread: {other:?}"),
    }
    assert!(operator.inspect("seen").await.expect("inspect").held);
    let now = operator.inspect("seen").await.expect("inspect");
    match operator.force_unlock_seen(&now).await {
        Ok(crate::Unlocked::Removed(removed)) => {
            assert_eq!(removed.holder.as_deref(), Some(HOLDER));
        }
        other => panic!("the holding seen: {other:?}"),
    }
    assert_eq!(
        operator
            .force_unlock_seen(&now)
            .await
            .expect("force_unlock_seen"),
        crate::Unlocked::NotHeld
    );
    match second.release().await {
        Err(LockError::LeaseLost { .. }) => {}
        other => panic!("the evicted holder's release: {other:?}"),
    }
}

checks! {
    inspect_shows_holder_lease_and_age_and_nothing_after_release: [Operations],
    inspect_shows_the_last_fence: [Operations, Fencing],
    inspect_counts_the_queued_waiters: [Operations, Fair],
    force_unlock_hands_the_lock_on_and_the_old_holder_learns: [Operations, Fencing],
    force_unlock_of_a_free_lock_removes_nothing: [Operations],
    force_unlock_seen_removes_only_the_holding_seen: [Operations],
    list_streams_the_held_locks_under_a_pattern: [Operations],
}
