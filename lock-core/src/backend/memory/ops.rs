//! What the people on call ask of the memory backend: a lock's state, the held locks under a
//! pattern, and a lock freed whoever holds it.

use tokio::time::Instant;

use super::MemoryBackend;
use super::table::Table;
use crate::backend::{KeyPattern, ListPage};
use crate::inspect::LockState;
use crate::key::LockKey;

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
            state.holder = (!e.holder.is_empty()).then(|| e.holder.to_string());
            state.held_for = Some(now - e.since);
        }
        state
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

    /// The held locks after `cursor` (a lock name) in name order, a page at a time.
    pub(super) fn list_now(
        &self,
        prefix: &str,
        pattern: &KeyPattern,
        cursor: Option<&str>,
    ) -> ListPage {
        let now = Instant::now();
        let t = self.table();
        let mut found: Vec<(&str, LockKey)> = t
            .locks
            .iter()
            .filter(|(name, e)| e.expires > now && cursor.is_none_or(|c| name.as_str() > c))
            .filter_map(|(name, _)| {
                let key = LockKey::from_name(prefix, name)?;
                pattern.matches(key.user()).then_some((name.as_str(), key))
            })
            .collect();
        found.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let next = (found.len() > PAGE).then(|| found[PAGE - 1].0.to_owned());
        found.truncate(PAGE);
        ListPage::new(
            found.iter().map(|(_, key)| t.state(key, now)).collect(),
            next,
        )
    }
}
