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
    /// When the take-back there ended; unset while it runs, and where none runs.
    ended: OnceLock<Instant>,
    /// A take-back runs (or ran) there.
    taken_back: AtomicBool,
}

impl Part {
    /// The take-back there starts.
    pub(super) fn start(&self) {
        self.taken_back.store(true, Ordering::Release);
    }

    /// The take-back there ended (`deleted`: its delete found the attempt's key).
    pub(super) fn end(&self, deleted: bool) {
        if deleted {
            self.granted.store(true, Ordering::Release);
        }
        let _ = self.ended.set(Instant::now());
    }

    fn running(&self) -> bool {
        self.taken_back.load(Ordering::Acquire) && self.ended.get().is_none()
    }

    /// A busy vote of this server, to an attempt begun at `started`, may have been this key:
    /// the server granted it and its take-back had not ended when that attempt began.
    fn may_have_answered(&self, started: Instant) -> bool {
        self.taken_back.load(Ordering::Acquire)
            && self.granted.load(Ordering::Acquire)
            && self.ended.get().is_none_or(|ended| *ended >= started)
    }
}

/// A refused attempt's parts, one per server.
pub(super) struct TakingBack {
    /// The lock's name.
    pub(super) key: String,
    pub(super) parts: Vec<Arc<Part>>,
}

impl TakingBack {
    /// Still of use: a take-back runs, or one ended within [`KEEP_ENDED`].
    fn live(&self, now: Instant) -> bool {
        self.parts.iter().any(|p| {
            p.running()
                || p.ended
                    .get()
                    .is_some_and(|e| now.saturating_duration_since(*e) < KEEP_ENDED)
        })
    }
}

/// The entries by the refused attempt's token (each attempt has a token of its own).
#[derive(Default)]
pub(super) struct TakeBacks {
    entries: HashMap<Token, TakingBack>,
    /// The size at which the next insert prunes: twice what the last prune kept (at least
    /// [`PRUNE_FROM`]), so pruning costs a constant per insert, amortized, and the map holds
    /// at most twice the entries still of use.
    prune_at: usize,
}

impl TakeBacks {
    pub(super) fn insert(&mut self, token: Token, back: TakingBack) {
        if self.entries.len() >= self.prune_at.max(PRUNE_FROM) {
            let now = Instant::now();
            self.entries.retain(|_, t| t.live(now));
            self.prune_at = self.entries.len() * 2;
        }
        self.entries.insert(token, back);
    }

    /// Whether a server that answered busy (`votes`) to an attempt on `key` begun at
    /// `started` may have answered with the key of another refused attempt of this process,
    /// one it granted and that was being deleted when the attempt began. A take-back waiting
    /// on a stalled server does not count until that server answers (it may last a few
    /// response timeouts, and a waiter told to retry soon meanwhile would retry every few
    /// milliseconds). Entries of no more use are dropped on the way.
    pub(super) fn busy_was_ours(
        &mut self,
        key: &str,
        token: &Token,
        votes: &[Option<Vote>],
        started: Instant,
    ) -> bool {
        let now = Instant::now();
        let mut found = false;
        self.entries.retain(|t, back| {
            found |= t != token
                && back.key == key
                && back.parts.iter().zip(votes).any(|(part, vote)| {
                    matches!(vote, Some(Vote::Busy(_))) && part.may_have_answered(started)
                });
            back.live(now)
        });
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refused attempt's entry on one server: granted there or not, its take-back running
    /// or ended.
    fn entry(granted: bool, ended: bool) -> TakingBack {
        let part = Arc::new(Part::default());
        part.start();
        part.granted.store(granted, Ordering::Release);
        if ended {
            part.end(false);
        }
        TakingBack {
            key: "lock:{hot}".to_owned(),
            parts: vec![part],
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
        assert!(!map.busy_was_ours("lock:{hot}", &me, &busy, started));
        // Running on a server that never answered it (stalled): not counted, or a waiter
        // would poll for as long as the stall lasts.
        let stalled = Token::new(false);
        map.insert(stalled.clone(), entry(false, false));
        assert!(!map.busy_was_ours("lock:{hot}", &me, &busy, started));
        // Granted, and ended after the attempt began (the key may have answered it): counted.
        let late = Token::new(false);
        map.insert(late.clone(), entry(true, false));
        tokio::time::advance(Duration::from_millis(1)).await;
        map.entries[&late].parts[0].end(true);
        assert!(map.busy_was_ours("lock:{hot}", &me, &busy, started));
        // Not on another key, nor the attempt's own entry, nor a server that answered yes.
        assert!(!map.busy_was_ours("lock:{cold}", &me, &busy, started));
        assert!(!map.busy_was_ours("lock:{hot}", &late, &busy, started));
        assert!(!map.busy_was_ours("lock:{hot}", &me, &[Some(Vote::Yes)], started));
        // Running and granted: counted for any attempt, and kept however old.
        let running = Token::new(false);
        map.insert(running.clone(), entry(true, false));
        tokio::time::advance(KEEP_ENDED * 3).await;
        assert!(map.busy_was_ours("lock:{hot}", &me, &busy, Instant::now()));
        // Entries whose take-backs ended over KEEP_ENDED ago are dropped on the way.
        assert!(map.entries.contains_key(&running));
        assert!(map.entries.contains_key(&stalled));
        assert!(!map.entries.contains_key(&ended));
        assert!(!map.entries.contains_key(&late));
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
        assert!(map.entries.len() <= 2 * PRUNE_FROM, "{}", map.entries.len());
        assert!(map.entries.contains_key(&running));
    }
}
