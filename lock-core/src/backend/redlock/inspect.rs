//! What the people on call ask of a Redlock: a lock's state as a majority of the servers hold
//! it ([`RedlockBackend::inspect_lock`]), that acquisition removed from every server
//! ([`RedlockBackend::force_unlock_lock`]), and the held locks under a pattern, each once, a
//! page at a time ([`RedlockBackend::list_locks`]).
//!
//! Each server answers with its lock's state and the SHA-1 digest of the token it holds
//! (inspect.lua): the token never leaves the servers, and the servers that answer the same
//! digest hold the same acquisition. A lock is held when a quorum of servers hold the same
//! acquisition; free when the servers heard show no quorum and those not heard could not
//! complete one; else the answer is a [`NoQuorum`](super::NoQuorum) error, never a guess.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{RedlockBackend, gather};
use crate::LockError;
use crate::backend::drift;
use crate::backend::redis::{Digest, Seen};
use crate::backend::{KeyPattern, ListPage};
use crate::background;
use crate::inspect::LockState;
use crate::key::LockKey;

/// What the servers hold for a key, judged over the quorum.
#[derive(Debug)]
enum Judged {
    /// No acquisition is held on a quorum (nor could one be on the servers not heard).
    Free(LockState),
    /// One acquisition is held on a quorum: its state, and the digest naming it.
    Held(LockState, Digest),
}

impl RedlockBackend {
    /// Every server's view of `keys` (`None`: not connected, failed, or no answer within the
    /// response timeout), asked of all at once, each in a task of its own (a read left
    /// behind is never cut off half-way on its connection). Not waited for once every key's
    /// verdict is known whatever the rest answer and the servers `needed` answered: a stalled
    /// server does not hold up an answer a quorum settles (its state would only have raised
    /// the lease left and the waiters counted, which are then the lower ones).
    async fn views(&self, keys: &[LockKey], needed: &[usize]) -> Vec<Option<Vec<Seen>>> {
        let bound = self.inner.settings.response_timeout;
        let (quorum, n) = (self.inner.quorum, self.inner.servers.len());
        let shared: Arc<[LockKey]> = keys.into();
        let tasks: Vec<_> = self
            .inner
            .servers
            .iter()
            .map(|s| {
                let (b, keys) = (s.get()?.clone(), shared.clone());
                background::spawn(async move {
                    match tokio::time::timeout(bound, b.redlock_inspect(&keys)).await {
                        Ok(Ok(seen)) if seen.len() == keys.len() => Some(seen),
                        Ok(Err(e)) => {
                            tracing::debug!(error = %e, "a Redlock server failed an inspect");
                            None
                        }
                        _ => None,
                    }
                })
            })
            .collect();
        gather(
            tasks
                .into_iter()
                .map(|t| async move { t?.await.ok().flatten() }),
            |answers| {
                if needed.iter().any(|&i| answers[i].is_none()) {
                    return false;
                }
                let heard: Vec<&Vec<Seen>> = answers.iter().flatten().flatten().collect();
                heard.len() >= quorum
                    && (0..keys.len()).all(|k| {
                        let views: Vec<Option<&Seen>> = heard.iter().map(|v| v.get(k)).collect();
                        let most = most_held(&views).map_or(0, |(_, count)| count);
                        most >= quorum || most + (n - heard.len()) < quorum
                    })
            },
        )
        .await
        .into_iter()
        .map(Option::flatten)
        .collect()
    }

    /// The quorum's view of `key` from each server's (`views`, in server order; `None`: not
    /// heard), read `elapsed` ago at most.
    ///
    /// Held: the servers holding the acquisition name its holder and age (the median of
    /// theirs: one server's clock off does not move it); the lease left is the one a client
    /// could count on, the quorum-th longest of theirs less the time the reads took and the
    /// drift allowance; the waiters are the most any server counts (a waiter announces
    /// itself on every server). No fence: Redlock keeps no counter (`fenced()` is refused).
    fn judge(
        &self,
        operation: &'static str,
        key: &LockKey,
        views: &[Option<&Seen>],
        elapsed: Duration,
    ) -> Result<Judged, LockError> {
        let (quorum, n) = (self.inner.quorum, views.len());
        let heard: Vec<&Seen> = views.iter().flatten().copied().collect();
        if heard.len() < quorum {
            return Err(self.no_quorum(operation, Some(key.user()), heard.len()));
        }
        let mut state = LockState::free(key.user());
        state.waiters = heard.iter().map(|s| s.state.waiters).max().unwrap_or(0);
        let best = most_held(views);
        let most = best.map_or(0, |(_, count)| count);
        let Some((digest, _)) = best.filter(|_| most >= quorum) else {
            if most + (n - heard.len()) >= quorum {
                // The servers not heard may hold it too: neither held nor free is known.
                return Err(self.no_quorum(operation, Some(key.user()), heard.len()));
            }
            return Ok(Judged::Free(state));
        };
        let holding: Vec<&LockState> = heard
            .iter()
            .filter(|s| s.digest.as_ref() == Some(digest))
            .map(|s| &s.state)
            .collect();
        state.held = true;
        state.holder = holding.iter().find_map(|s| s.holder.clone());
        // The acquisition's stamp (one value written to every server): tells this holding from
        // a later one by the same holder.
        state.since = holding.iter().find_map(|s| s.since);
        let mut ages: Vec<Duration> = holding.iter().filter_map(|s| s.held_for).collect();
        ages.sort_unstable();
        state.held_for = ages.get(ages.len().saturating_sub(1) / 2).copied();
        // Longest first; a key without expiry (`None`) counts as longest of all.
        let mut left: Vec<Option<Duration>> = holding.iter().map(|s| s.remaining).collect();
        left.sort_unstable_by_key(|r| std::cmp::Reverse(r.unwrap_or(Duration::MAX)));
        state.remaining = left
            .get(quorum - 1)
            .copied()
            .flatten()
            .map(|r| r.saturating_sub(elapsed).saturating_sub(drift(r)));
        Ok(Judged::Held(state, digest.clone()))
    }

    pub(crate) async fn inspect_lock(&self, key: &LockKey) -> Result<LockState, LockError> {
        let started = Instant::now();
        let views = self.views(std::slice::from_ref(key), &[]).await;
        let views: Vec<Option<&Seen>> = views.iter().map(|v| v.as_ref()?.first()).collect();
        match self.judge("inspect", key, &views, started.elapsed())? {
            Judged::Free(state) | Judged::Held(state, _) => Ok(state),
        }
    }

    /// The acquisition a quorum holds (as [`inspect_lock`](Self::inspect_lock) finds it) is
    /// removed on every server that still holds it, by force_unlock.lua given its digest: a
    /// server where another acquisition holds the key (a contender's minority) is left alone.
    /// Each server's call is sent once (a lost answer counts as unknown, it is not resent),
    /// in a task of its own that runs to its end whatever the caller does. Its state as
    /// inspected; `None` when no quorum held it, or when no server heard removed it (released
    /// meanwhile). A [`NoQuorum`](super::NoQuorum) error when the servers not heard may still
    /// hold it on a quorum.
    pub(crate) async fn force_unlock_lock(
        &self,
        key: &LockKey,
    ) -> Result<Option<LockState>, LockError> {
        let started = Instant::now();
        let views = self.views(std::slice::from_ref(key), &[]).await;
        let views: Vec<Option<&Seen>> = views.iter().map(|v| v.as_ref()?.first()).collect();
        let (state, digest) = match self.judge("force_unlock", key, &views, started.elapsed())? {
            Judged::Free(_) => return Ok(None),
            Judged::Held(state, digest) => (state, digest),
        };
        let bound = self.inner.settings.response_timeout * 2;
        let quorum = self.inner.quorum;
        let tasks: Vec<_> = self
            .inner
            .servers
            .iter()
            .map(|s| {
                let b = s.get()?.clone();
                let (key, digest) = (key.clone(), digest.clone());
                background::spawn(async move { b.redlock_force_unlock(&key, &digest).await })
            })
            .collect();
        let answers = gather(
            tasks.into_iter().map(|t| async move {
                match tokio::time::timeout(bound, t?).await {
                    Ok(Ok(Ok(removed))) => Some(removed),
                    Ok(Ok(Err(e))) => {
                        tracing::debug!(error = %e, "a Redlock server failed a force_unlock");
                        None
                    }
                    _ => None,
                }
            }),
            // Decided once fewer than a quorum are unheard: a stalled server is not waited for
            // (its removal still reaches it, in its task).
            |answers| {
                answers
                    .iter()
                    .filter(|a| !matches!(a, Some(Some(_))))
                    .count()
                    < quorum
            },
        )
        .await;
        let removed = answers
            .iter()
            .filter(|a| matches!(a, Some(Some(true))))
            .count();
        let heard = answers
            .iter()
            .filter(|a| matches!(a, Some(Some(_))))
            .count();
        let unknown = answers.len() - heard;
        if unknown >= quorum {
            // The servers not heard may still hold it on a quorum.
            if removed > 0 {
                tracing::warn!(
                    target: "lock_core::audit",
                    key = %key.display(),
                    holder = state.holder.as_deref().unwrap_or("(unrecorded)"),
                    removed_on = removed,
                    unknown_on = unknown,
                    "force_unlock removed the lock on some Redlock servers only; inspect it"
                );
            }
            return Err(self.no_quorum("force_unlock", Some(key.user()), heard));
        }
        // Now held on fewer than a quorum whatever the servers not heard did.
        Ok((removed > 0).then_some(state))
    }

    /// One page of the held locks: a `SCAN` step on one server, then the quorum's view of each
    /// key found. A lock held on a quorum is on at least one of any N − quorum + 1 servers, so
    /// only that many are scanned, in turn (the first that answer: one down at the start of
    /// its turn is passed over and the next scanned instead); a lock found on server `i` is
    /// listed when `i` holds the quorum's acquisition and no server scanned before it does,
    /// so each is listed once with nothing remembered between pages (a server scanned before
    /// that does not answer then makes the page an error: it may have listed the lock). The
    /// cursor is
    /// `<server> <scan cursor> <servers passed over, or ->`.
    pub(crate) async fn list_locks(
        &self,
        prefix: &str,
        pattern: &KeyPattern,
        cursor: Option<&str>,
    ) -> Result<ListPage, LockError> {
        let n = self.inner.servers.len();
        let need = n - self.inner.quorum + 1;
        let (mut server, at, mut skipped) = match cursor {
            None => (0, 0, Vec::new()),
            Some(c) => parse_cursor(c, n, need).ok_or_else(|| bad_cursor(c))?,
        };
        let bound = self.inner.settings.response_timeout;
        let (next, keys) = loop {
            if n - skipped.len() < need || server >= n {
                // Too few left to find every lock held on a quorum (each failure is logged).
                return Err(self.no_quorum("list", None, n - skipped.len()));
            }
            let step = match self.inner.servers[server].get() {
                Some(b) => tokio::time::timeout(bound, b.redlock_scan(prefix, pattern, at))
                    .await
                    .unwrap_or_else(|_| Err(unanswered(server))),
                None => Err(unanswered(server)),
            };
            match step {
                Ok(found) => break found,
                // Not yet scanned: another server takes its turn.
                Err(e) if at == 0 => {
                    tracing::debug!(error = %e, server, "a Redlock server could not be scanned; the next one is");
                    skipped.push(server);
                    server += 1;
                }
                // Half scanned: what it listed already cannot be told apart from the rest.
                Err(e) => return Err(e),
            }
        };
        let mut locks = Vec::new();
        if !keys.is_empty() {
            let started = Instant::now();
            // The servers scanned so far, this one included, must answer (or fail): whether
            // an earlier one holds a key's acquisition decides where it is listed.
            let scanned: Vec<usize> = (0..=server).filter(|j| !skipped.contains(j)).collect();
            let views = self.views(&keys, &scanned).await;
            if views[server].is_none() {
                return Err(unanswered(server));
            }
            for (k, key) in keys.iter().enumerate() {
                let seen: Vec<Option<&Seen>> = views.iter().map(|v| v.as_ref()?.get(k)).collect();
                let Judged::Held(state, digest) =
                    self.judge("list", key, &seen, started.elapsed())?
                else {
                    continue;
                };
                let holds = |j: usize| seen[j].and_then(|s| s.digest.as_ref()) == Some(&digest);
                let scanned_before = (0..server).filter(|j| !skipped.contains(j));
                if !holds(server) || scanned_before.clone().any(holds) {
                    continue;
                }
                // A server scanned before that does not answer now may be where this lock was
                // listed already: it cannot be told, so the page is an error, not a repeat.
                if let Some(j) = scanned_before.clone().find(|&j| seen[j].is_none()) {
                    return Err(scanned_unheard(j));
                }
                locks.push(state);
            }
        }
        let next = if next != 0 {
            Some(format_cursor(server, next, &skipped))
        } else if server + 1 - skipped.len() < need {
            Some(format_cursor(server + 1, 0, &skipped))
        } else {
            None
        };
        Ok(ListPage::new(locks, next))
    }
}

/// The acquisition held on the most of the servers heard (`None`: not heard), and on how many
/// (a majority can hold one only).
fn most_held<'a>(views: &[Option<&'a Seen>]) -> Option<(&'a Digest, usize)> {
    let mut best: Option<(&Digest, usize)> = None;
    for digest in views.iter().flatten().filter_map(|s| s.digest.as_ref()) {
        let count = views
            .iter()
            .flatten()
            .filter(|s| s.digest.as_ref() == Some(digest))
            .count();
        if best.is_none_or(|(_, most)| count > most) {
            best = Some((digest, count));
        }
    }
    best
}

/// `<server> <scan cursor> <servers passed over, comma-separated, or ->`.
fn format_cursor(server: usize, at: u64, skipped: &[usize]) -> String {
    let skipped = if skipped.is_empty() {
        "-".to_owned()
    } else {
        let list: Vec<String> = skipped.iter().map(usize::to_string).collect();
        list.join(",")
    };
    format!("{server} {at} {skipped}")
}

/// The cursor's parts, checked against `n` servers of which `need` are scanned.
fn parse_cursor(cursor: &str, n: usize, need: usize) -> Option<(usize, u64, Vec<usize>)> {
    let mut parts = cursor.split(' ');
    let (Some(server), Some(at), Some(skipped), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    let server: usize = server.parse().ok()?;
    let at: u64 = at.parse().ok()?;
    let skipped: Vec<usize> = if skipped == "-" {
        Vec::new()
    } else {
        skipped
            .split(',')
            .map(|s| s.parse().ok())
            .collect::<Option<_>>()?
    };
    let ordered = skipped.windows(2).all(|w| w[0] < w[1]);
    let scanned = server.checked_sub(skipped.len())?;
    (server < n && ordered && skipped.last().is_none_or(|s| *s < server) && scanned < need)
        .then_some((server, at, skipped))
}

fn bad_cursor(cursor: &str) -> LockError {
    LockError::config(format!(
        "listing cursor {cursor:?} was not made by this backend"
    ))
}

/// Server `i`, scanned earlier in the listing, did not answer for a lock found later.
fn scanned_unheard(i: usize) -> LockError {
    LockError::backend(
        "list",
        None,
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "Redlock server {} of the list, scanned earlier in this listing, did not answer: \
                 whether it listed a lock already cannot be told; list again from the start",
                i + 1
            ),
        ),
    )
}

/// Server `i` did not answer (not connected, or not within the response timeout).
fn unanswered(i: usize) -> LockError {
    LockError::backend(
        "list",
        None,
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("Redlock server {} of the list did not answer", i + 1),
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_foreign_ones_are_refused() {
        for (server, at, skipped) in [(0, 0, vec![]), (2, 17, vec![0, 1]), (1, 5, vec![0])] {
            let c = format_cursor(server, at, &skipped);
            assert_eq!(parse_cursor(&c, 5, 3), Some((server, at, skipped)), "{c}");
        }
        for bad in [
            "", "0", "0 0", "0 0 - x", "5 0 -", "x 0 -", "0 x -", "1 0 1", "2 0 1,0", "3 0 -",
            "0 0 ,", "2 0 0,0",
        ] {
            assert_eq!(parse_cursor(bad, 5, 3), None, "{bad:?}");
        }
        // Server 3 after two passed over: its turn is the first scan.
        assert!(parse_cursor("3 0 0,1", 5, 3).is_some());
    }
}
