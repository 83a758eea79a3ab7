//! What the people on call ask of the memory backend: a lock's state, the held locks under a
//! pattern, and a lock freed whoever holds it.

use tokio::time::Instant;

use super::MemoryBackend;
use super::table::Table;
use crate::backend::{KeyPattern, ListPage};
use crate::inspect::LockState;
use crate::key::{LockKey, user_of_name};

/// Locks a listing page holds at most.
const PAGE: usize = 1000;

impl Table {
    /// The state of `key`'s lock now.
    fn state(&self, key: &LockKey, now: Instant) -> LockState {
        let mut state = LockState::free(key.user());
        state.fence = self.fences.get(key.fence()).copied();
        state.waiters = self
            .queues
            .get(key.name())
            .map_or(0, |q| q.iter().filter(|q| q.dies > now).count());
        if let Some(e) = self.locks.get(key.name()).filter(|e| e.expires > now) {
            state.held = true;
            state.remaining = Some(e.expires - now);
            state.holder = (!e.holder.is_empty()).then(|| crate::inspect::shown_holder(&e.holder));
            state.held_for = Some(now - e.since);
            state.since = Some(wall_clock(e.since));
        }
        state
    }
}

/// `at` on the wall clock, by one pairing of the two clocks taken once per process: the same
/// instant always reads the same (`LockState::since` tells holdings apart by it).
fn wall_clock(at: Instant) -> std::time::SystemTime {
    static ANCHOR: std::sync::OnceLock<(Instant, std::time::SystemTime)> =
        std::sync::OnceLock::new();
    let (instant, wall) = *ANCHOR.get_or_init(|| (Instant::now(), std::time::SystemTime::now()));
    match at.checked_duration_since(instant) {
        Some(after) => wall + after,
        None => wall
            .checked_sub(instant.duration_since(at))
            .unwrap_or(std::time::UNIX_EPOCH),
    }
}

impl MemoryBackend {
    pub(super) fn inspect_now(&self, key: &LockKey) -> LockState {
        self.table().state(key, Instant::now())
    }

    pub(super) fn force_unlock_now(&self, key: &LockKey) -> Option<LockState> {
        let now = Instant::now();
        let mut t = self.table();
        let state = t.state(key, now);
        if !state.held {
            return None;
        }
        t.locks.remove(key.name());
        t.hand_over(key, now);
        Some(state)
    }

    pub(super) fn force_unlock_seen_now(&self, key: &LockKey, seen: &LockState) -> crate::Unlocked {
        let now = Instant::now();
        let mut t = self.table();
        let state = t.state(key, now);
        if !state.held {
            return crate::Unlocked::NotHeld;
        }
        if !crate::inspect::same_holding(seen, &state) {
            return crate::Unlocked::ChangedHands(state);
        }
        t.locks.remove(key.name());
        t.hand_over(key, now);
        crate::Unlocked::Removed(state)
    }

    /// The held locks after `cursor` (a lock name) in name order, a page at a time: the
    /// page's names are picked in one pass over the table (no sort of all of them, no key
    /// built but the page's), under the table's lock, which is let go between pages.
    pub(super) fn list_now(
        &self,
        prefix: &str,
        pattern: &KeyPattern,
        cursor: Option<&str>,
    ) -> ListPage {
        let now = Instant::now();
        let t = self.table();
        let mut names: Vec<&str> = t
            .locks
            .iter()
            .filter(|(name, e)| e.expires > now && cursor.is_none_or(|c| name.as_str() > c))
            .map(|(name, _)| name.as_str())
            .filter(|name| user_of_name(prefix, name).is_some_and(|user| pattern.matches(user)))
            .collect();
        let more = names.len() > PAGE;
        if more {
            names.select_nth_unstable(PAGE - 1);
            names.truncate(PAGE);
        }
        names.sort_unstable();
        let next = if more {
            names.last().map(|name| (*name).to_owned())
        } else {
            None
        };
        let locks = names
            .iter()
            .filter_map(|name| LockKey::from_name(prefix, name))
            .map(|key| t.state(&key, now))
            .collect();
        ListPage::new(locks, next)
    }
}
