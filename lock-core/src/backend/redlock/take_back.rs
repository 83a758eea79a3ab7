//! What this process's refused attempts left on each server, while their take-backs run and a
//! moment after: a quorum of busy votes that includes such keys is not a holder's quorum.
//!
//! A refused attempt's key on a server (granted there, or a `SET` that lands after the attempt
//! was decided, say when a stalled server resumes) answers busy to every later attempt until
//! its take-back deletes it, announcing nothing. A waiter told "held, for the holder's lease"
//! then would sleep until its next ticket refresh with the lock free a moment later; a busy
//! vote from such a key is answered like a split vote instead (see `acquire`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use super::acquire::Vote;
use crate::token::Token;

/// How long an entry whose take-backs all ended is kept: an attempt that was in flight when a
/// take-back ended may still count that server's busy vote as this process's own key. Longer
/// than an attempt's usual per-server bound (at most 200 ms unless configured higher); an
/// attempt slower than this only loses the short retry (it waits for a release message or
/// its next ticket refresh, as for a holder).
const KEEP_ENDED: Duration = Duration::from_secs(1);

/// The fewest entries at which the map is pruned (see [`TakeBacks::insert`]).
const PRUNE_FROM: usize = 64;

/// One server's part of a refused attempt.
#[derive(Debug, Default)]
pub(super) struct Part {
    /// The server granted the attempt: its key there held the attempt's token. Set by the
    /// attempt's task when the server answers yes (before or after the attempt was decided),
    /// and by the take-back when its delete found the key.
    pub(super) granted: AtomicBool,
    /// The server answered the attempt (its task has its reply; `granted` is set before).
    pub(super) answered: AtomicBool,
    /// When the take-back there ended; unset while it runs.
    ended: OnceLock<Instant>,
}

impl Part {
    /// The take-back there ended (`deleted`: its delete found the attempt's key).
    pub(super) fn end(&self, deleted: bool) {
        if deleted {
            self.granted.store(true, Ordering::Release);
        }
        let _ = self.ended.set(Instant::now());
    }

    fn running(&self) -> bool {
        self.ended.get().is_none()
    }

    /// Whether a busy vote of this server, to an attempt begun at `started`, may have been
    /// this key: the server granted it and its take-back had not ended when that attempt
    /// began. Unsure while the take-back runs and the server's reply to this attempt is
    /// delivered but not yet read by its task (replies on one connection come in order, so
    /// it is read within moments of a later reply).
    fn may_have_answered(&self, started: Instant) -> Ours {
        let ended = self.ended.get();
        if ended.is_some_and(|ended| *ended < started) {
            return Ours::No;
        }
        if self.granted.load(Ordering::Acquire) {
            return Ours::Yes;
        }
        if ended.is_none() && !self.answered.load(Ordering::Acquire) {
            return Ours::Unsure;
        }
        Ours::No
    }
}

/// Whether a quorum of busy votes may include this process's own refused attempts' keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ours {
    Yes,
    No,
    /// A server that answered busy has a take-back running for an attempt whose reply there
    /// is not read yet: ask again in a moment.
    Unsure,
}

/// A refused attempt's parts, one per server: `None` where nothing is taken back (the server
/// answered busy, or had no connection).
pub(super) struct TakingBack {
    /// The lock's name.
    pub(super) key: String,
    pub(super) parts: Vec<Option<Arc<Part>>>,
}

/// Still of use: a take-back runs, or one ended within [`KEEP_ENDED`].
fn live(parts: &[Option<Arc<Part>>], now: Instant) -> bool {
    parts.iter().flatten().any(|p| {
        p.running()
            || p.ended
                .get()
                .is_some_and(|e| now.saturating_duration_since(*e) < KEEP_ENDED)
    })
}

/// A refused attempt's token and its parts.
type Entry = (Token, Vec<Option<Arc<Part>>>);

/// The entries by lock name, then by the refused attempt's token (each attempt has a token of
/// its own): a busy check looks at its own key's entries only.
#[derive(Default)]
pub(super) struct TakeBacks {
    by_key: HashMap<String, Vec<Entry>>,
    /// Entries in all.
    len: usize,
    /// The size at which the next insert prunes every key: twice what the last prune kept (at
    /// least [`PRUNE_FROM`]), so pruning costs a constant per insert, amortized, and the map
    /// holds at most twice the entries still of use.
    prune_at: usize,
}

impl TakeBacks {
    pub(super) fn insert(&mut self, token: Token, back: TakingBack) {
        if self.len >= self.prune_at.max(PRUNE_FROM) {
            let now = Instant::now();
            self.by_key.retain(|_, list| {
                list.retain(|(_, parts)| live(parts, now));
                !list.is_empty()
            });
            self.len = self.by_key.values().map(Vec::len).sum();
            self.prune_at = self.len * 2;
        }
        self.by_key
            .entry(back.key)
            .or_default()
            .push((token, back.parts));
        self.len += 1;
    }

    /// Whether a server that answered busy (`votes`) to an attempt on `key` begun at
    /// `started` may have answered with the key of another refused attempt of this process,
    /// one it granted and that was being deleted when the attempt began. A take-back waiting
    /// on a stalled server does not count until that server answers (it may last a few
    /// response timeouts, and a waiter told to retry soon meanwhile would retry every few
    /// milliseconds). The key's entries of no more use are dropped on the way.
    pub(super) fn busy_was_ours(
        &mut self,
        key: &str,
        token: &Token,
        votes: &[Option<Vote>],
        started: Instant,
    ) -> Ours {
        let Some(list) = self.by_key.get_mut(key) else {
            return Ours::No;
        };
        let now = Instant::now();
        let before = list.len();
        let mut found = Ours::No;
        list.retain(|(t, parts)| {
            if t != token {
                for (part, vote) in parts.iter().zip(votes) {
                    let Some(part) = part else { continue };
                    if matches!(vote, Some(Vote::Busy(_))) && found != Ours::Yes {
                        match part.may_have_answered(started) {
                            Ours::No => {}
                            other => found = other,
                        }
                    }
                }
            }
            live(parts, now)
        });
        self.len -= before - list.len();
        if list.is_empty() {
            self.by_key.remove(key);
        }
        found
    }

    /// Whether an entry of `token` is kept.
    #[cfg(test)]
    fn has(&self, token: &Token) -> bool {
        self.by_key.values().flatten().any(|(t, _)| t == token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refused attempt's entry on one server: granted there or not, its take-back running
    /// or ended.
    fn entry(granted: bool, ended: bool) -> TakingBack {
        let part = Arc::new(Part::default());
        part.granted.store(granted, Ordering::Release);
        if ended {
            part.end(false);
        }
        TakingBack {
            key: "lock:{hot}".to_owned(),
            parts: vec![Some(part)],
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_vote_counts_as_ours_only_from_a_granted_key_not_deleted_before_the_attempt() {
        let busy = [Some(Vote::Busy(Some(Duration::from_secs(10))))];
        let me = Token::new(false);
        let mut map = TakeBacks::default();
        // Ended before the attempt began: its key was gone when the server answered.
        let ended = Token::new(false);
        map.insert(ended.clone(), entry(true, true));
        tokio::time::advance(Duration::from_millis(5)).await;
        let started = Instant::now();
        assert_eq!(
            Ours::No,
            map.busy_was_ours("lock:{hot}", &me, &busy, started)
        );
        // Running, its reply from the server not read yet: unsure (asked again in a moment).
        let stalled = Token::new(false);
        let back = entry(false, false);
        let unread = back.parts[0].clone().unwrap();
        map.insert(stalled.clone(), back);
        assert_eq!(
            Ours::Unsure,
            map.busy_was_ours("lock:{hot}", &me, &busy, started)
        );
        // Read, not granted (the server said busy to it, or failed), its take-back still
        // running: not counted, or a waiter would poll for as long as that take-back lasts.
        unread.answered.store(true, Ordering::Release);
        assert_eq!(
            Ours::No,
            map.busy_was_ours("lock:{hot}", &me, &busy, started)
        );
        // Granted, and ended after the attempt began (the key may have answered it): counted.
        let late = Token::new(false);
        let back = entry(true, false);
        let part = back.parts[0].clone().unwrap();
        map.insert(late.clone(), back);
        tokio::time::advance(Duration::from_millis(1)).await;
        part.end(true);
        assert_eq!(
            Ours::Yes,
            map.busy_was_ours("lock:{hot}", &me, &busy, started)
        );
        // Not on another key, nor the attempt's own entry, nor a server that answered yes.
        assert_eq!(
            Ours::No,
            map.busy_was_ours("lock:{cold}", &me, &busy, started)
        );
        assert_eq!(
            Ours::No,
            map.busy_was_ours("lock:{hot}", &late, &busy, started)
        );
        assert_eq!(
            Ours::No,
            map.busy_was_ours("lock:{hot}", &me, &[Some(Vote::Yes)], started)
        );
        // Running and granted: counted for any attempt, and kept however old.
        let running = Token::new(false);
        map.insert(running.clone(), entry(true, false));
        tokio::time::advance(KEEP_ENDED * 3).await;
        assert_eq!(
            Ours::Yes,
            map.busy_was_ours("lock:{hot}", &me, &busy, Instant::now())
        );
        // Entries whose take-backs ended over KEEP_ENDED ago are dropped on the way.
        assert!(map.has(&running));
        assert!(map.has(&stalled));
        assert!(!map.has(&ended));
        assert!(!map.has(&late));
        assert_eq!(map.len, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn inserts_prune_entries_of_no_more_use_at_twice_what_was_kept() {
        let mut map = TakeBacks::default();
        let running = Token::new(false);
        map.insert(running.clone(), entry(true, false));
        for _ in 0..1000 {
            map.insert(Token::new(false), entry(true, true));
            tokio::time::advance(KEEP_ENDED / 10).await;
        }
        // Each prune keeps the running entry and the ended ones of the last KEEP_ENDED.
        assert!(map.len <= 2 * PRUNE_FROM, "{}", map.len);
        assert_eq!(map.len, map.by_key.values().map(Vec::len).sum::<usize>());
        assert!(map.has(&running));
    }
}
