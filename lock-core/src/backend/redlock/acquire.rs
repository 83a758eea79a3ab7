//! The acquire path: one attempt fanned out to every server ([`RedlockBackend::acquire`]), its
//! ballot (what a refused or dropped attempt takes back), and how its votes are counted.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::take_back::{Ours, Part, TakingBack};
use super::{FAIR_REFUSED, FENCING_REFUSED, RedlockBackend, gather};
use crate::LockError;
use crate::backend::drift;
use crate::backend::{Attempt, AttemptOptions};
use crate::background;
use crate::key::LockKey;
use crate::token::Token;

/// A refused attempt that split the vote (some servers said yes, too few, and no quorum said
/// busy) answers busy for a random time up to this: contenders that split a vote retry at
/// different moments, soon, instead of splitting it again. A refused attempt with some yes
/// where a quorum said busy waits a random time up to this before answering (the holder's
/// remaining time).
const SPLIT_JITTER: Duration = Duration::from_millis(20);

/// When `Inner::stragglers` reaches this many entries, the entries whose tasks have all
/// finished are forgotten (they are otherwise removed at the lock's release).
///
/// Not a cap on the entries whose tasks still run: those must be kept (a release waits for
/// them), and cannot grow without bound, because every such task ends on its own within a
/// few response timeouts: an acquire task makes one Redis call, bounded by the connection's
/// response timeout (with one retry after a reconnect). So the entries kept beyond this are
/// at most those of the locks taken within the last few seconds.
const STRAGGLERS_MAX: usize = 4096;

/// The answer of one server to one acquire.
#[derive(Debug, Clone, Copy)]
pub(super) enum Vote {
    Yes,
    Busy(Option<Duration>),
    /// No answer: an error, the per-server timeout, or not connected.
    None,
}

impl RedlockBackend {
    pub(crate) async fn acquire(
        &self,
        key: &LockKey,
        token: &Token,
        lease: Duration,
        options: AttemptOptions<'_>,
    ) -> Result<Attempt, LockError> {
        if options.fenced {
            return Err(LockError::config(FENCING_REFUSED));
        }
        if options.ticket.is_some_and(|t| t.strict) {
            return Err(LockError::config(FAIR_REFUSED));
        }
        let start = Instant::now();
        let bound = self.server_timeout(lease);
        let n = self.inner.servers.len();
        let parts: Vec<Arc<Part>> = (0..n).map(|_| Arc::default()).collect();
        let quorum = self.inner.quorum;
        // A waiter (a ticket that may queue) is announced in each server's queue, so releases
        // there publish; it is never handed the lock (see `redlock_waiter.lua`).
        let waiter = options
            .ticket
            .filter(|t| !t.ttl.is_zero())
            .map(|t| (t.id.clone(), t.ttl));
        let unrenewed = options.unrenewed;
        let holder: Arc<str> = Arc::from(options.holder);
        // One stamp on every server: each server holds one value for this acquisition, and
        // `inspect` answers one `since` whichever servers it hears.
        let since = std::time::SystemTime::now();
        // Each server's attempt is a task of its own: one that is slow is not cut off half-way
        // when the outcome is decided without it (a lock that succeeds gets every server it
        // can), and whatever it did is known before anything is given back there.
        let mut ballot = Ballot {
            backend: self.clone(),
            key: key.clone(),
            token: token.clone(),
            // Every attempt has a token of its own (a waiter draws a new one after each
            // refusal, see `BackendKind::takes_back_failed_attempts`): nothing an earlier
            // attempt left or still sends can be counted as this one's or delete its key.
            tasks: self
                .inner
                .servers
                .iter()
                .zip(&parts)
                .map(|(s, part)| {
                    let b = s.get()?.clone();
                    let (key, token) = (key.clone(), token.clone());
                    let waiter = waiter.clone();
                    let (part, holder) = (part.clone(), holder.clone());
                    background::spawn(async move {
                        let plain = AttemptOptions {
                            fenced: false,
                            ticket: None,
                            remaining: true,
                            unrenewed,
                            holder: &holder,
                            // Spawned: it outlives its caller's deadline.
                            bounded: false,
                        };
                        // A waiter is announced before its attempt, on the same connection: a
                        // release after the attempt publishes.
                        let attempt = b.acquire_stamped(&key, &token, lease, plain, Some(since));
                        let answer = match &waiter {
                            Some((ticket, ttl)) => {
                                let announce = b.redlock_waiter(&key, ticket, *ttl, true);
                                let (announced, answer) = tokio::join!(announce, attempt);
                                if let Err(e) = announced {
                                    tracing::debug!(error = %e, "a Redlock server failed to announce a waiter");
                                }
                                answer
                            }
                            None => attempt.await,
                        };
                        if let Ok(Attempt::Acquired { .. }) = answer {
                            // Known to a take-back even when the attempt was decided without
                            // this answer.
                            part.granted.store(true, Ordering::Release);
                        }
                        part.answered.store(true, Ordering::Release);
                        match answer {
                            Ok(Attempt::Acquired { .. }) => Vote::Yes,
                            Ok(Attempt::Busy { remaining }) => Vote::Busy(remaining),
                            Err(e) => {
                                tracing::debug!(error = %e, "a Redlock server failed an acquire");
                                Vote::None
                            }
                        }
                    })
                })
                .collect(),
            parts,
            votes: Vec::new(),
            armed: true,
        };
        let votes = gather(
            ballot.tasks.iter_mut().map(|t| async move {
                let Some(t) = t else {
                    return Vote::None;
                };
                match tokio::time::timeout(bound, t).await {
                    Ok(Ok(vote)) => vote,
                    _ => Vote::None,
                }
            }),
            |votes| {
                let count = Count::of(votes);
                let pending = n - count.answered() - count.silent;
                count.yes >= quorum
                    || (count.yes + pending < quorum
                        && (count.answered() >= quorum || count.answered() + pending < quorum))
            },
        )
        .await;
        ballot.votes.clone_from(&votes);
        let count = Count::of(&votes);
        // The core counts validity from before this call (lease − elapsed − drift) and refuses
        // a lock whose validity is gone by the time it gets it; checked here too, so such a
        // lock is given back at once.
        if count.yes >= quorum && start.elapsed() + drift(lease) < lease {
            ballot.armed = false;
            let running: Vec<_> = std::mem::take(&mut ballot.tasks)
                .into_iter()
                .enumerate()
                .filter_map(|(i, t)| Some((i, t.filter(|t| !t.is_finished())?)))
                .collect();
            if !running.is_empty() {
                let mut stragglers = self.inner.stragglers.lock();
                if stragglers.len() >= STRAGGLERS_MAX {
                    stragglers.retain(|_, tasks| tasks.iter().any(|(_, t)| !t.is_finished()));
                }
                stragglers.insert(token.clone(), running);
            }
            if let Some((ticket, _)) = &waiter {
                self.leave_everywhere(key, ticket);
            }
            return Ok(Attempt::Acquired { fence: None });
        }
        // Not ours: `ballot`, dropped, takes back whatever may have been taken.
        drop(ballot);
        if count.yes >= quorum {
            tracing::debug!(key = %key.display(), "Redlock quorum came after the validity ran out; released");
            return Ok(Attempt::Busy { remaining: None });
        }
        if count.answered() < quorum {
            return Err(self.no_quorum("acquire", Some(key.user()), count.answered()));
        }
        if count.yes > 0 && count.busy < quorum {
            // A split vote (some servers said yes, and no quorum said busy: nobody holds it on
            // a quorum of those that answered): contenders that split it retry soon, each after
            // a pause of its own drawn at random, so that they do not split the next one too.
            // The pause is the answer's `remaining`: a waiter retries after it. (Its take-backs
            // announce nothing, so without it a waiter would sleep until its next ticket
            // refresh.)
            let pause = SPLIT_JITTER.min(bound).mul_f64(rand::random::<f64>());
            return Ok(Attempt::Busy {
                remaining: Some(pause.max(Duration::from_millis(1))),
            });
        }
        let check = || {
            self.inner
                .taking_back
                .lock()
                .busy_was_ours(key.name(), token, &votes, start)
        };
        let mut ours = check();
        if ours == Ours::Unsure {
            // A reply already delivered, not yet read by its task: a moment settles it.
            tokio::time::sleep(Duration::from_millis(1)).await;
            ours = check();
        }
        if ours == Ours::Yes {
            // A quorum said busy, but some of those keys may be this process's own refused
            // attempts on the key (another token: a waiter's earlier attempt, whose `SET` may
            // even have landed after it was decided), that a server had granted and that are
            // being deleted, announcing nothing: the lock may be free in a moment, so this is
            // answered as a split vote is, not with a holder's lease (a waiter would sleep
            // until its next ticket refresh).
            let pause = SPLIT_JITTER.min(bound).mul_f64(rand::random::<f64>());
            return Ok(Attempt::Busy {
                remaining: Some(pause.max(Duration::from_millis(1))),
            });
        }
        if count.yes > 0 {
            // Some servers said yes, but a quorum said busy (a holder on a quorum, or a
            // contender about to have one): pause at random before answering, so that
            // contenders do not meet again at once; the holder's time is the answer.
            let pause = SPLIT_JITTER.min(bound).mul_f64(rand::random::<f64>());
            tokio::time::sleep(pause).await;
        }
        Ok(Attempt::Busy {
            remaining: remaining(&votes, quorum),
        })
    }
}

/// One acquire attempt's tasks, one per server. Unless disarmed (the lock is ours), dropping
/// it takes back what the attempt may have taken, on every server that did not answer "held
/// by someone else": each server's take-back waits for that server's attempt to end (so it can
/// never run before a `SET` still on its way), then deletes the key if it still holds our
/// token, announcing nothing: a lock that was never ours on a quorum was never announced, and
/// a release message would wake every waiter of the key in every process for nothing (whose
/// attempts could split the next vote, and so on). While they run, a busy vote of a server
/// still deleting this attempt's key is not taken for a holder's (see `take_back`).
struct Ballot {
    backend: RedlockBackend,
    key: LockKey,
    token: Token,
    tasks: Vec<Option<tokio::task::JoinHandle<Vote>>>,
    /// What each server did with the attempt, as far as known (see `take_back::Part`).
    parts: Vec<Arc<Part>>,
    /// The votes known when the attempt was decided (empty if it never was).
    votes: Vec<Option<Vote>>,
    armed: bool,
}

impl Drop for Ballot {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let bound = self.backend.inner.settings.response_timeout * 2;
        let mut taken = vec![None; self.tasks.len()];
        for (i, task) in self.tasks.iter_mut().enumerate() {
            let known = self.votes.get(i).copied().flatten();
            let server = self.backend.inner.servers[i].get().cloned();
            let (Some(server), false) = (server, matches!(known, Some(Vote::Busy(_)))) else {
                continue;
            };
            taken[i] = Some(self.parts[i].clone());
            // Ended however the task ends: dropped unpolled by a runtime shutting down, or
            // never spawned (outside a runtime), it must not look as if it ran forever.
            let ending = Ending(self.parts[i].clone());
            // A task still running (not answered, or past the per-server timeout) is awaited
            // first, whatever the attempt decided without it.
            let running = task.take().filter(|t| !t.is_finished());
            let (key, token) = (self.key.clone(), self.token.clone());
            background::spawn(async move {
                let ending = ending;
                if let Some(task) = running
                    && let Ok(Ok(Vote::Busy(_))) = tokio::time::timeout(bound, task).await
                {
                    return;
                }
                match server.redlock_take_back(&key, &token).await {
                    Ok(deleted) => ending.0.end(deleted),
                    Err(e) => {
                        tracing::debug!(error = %e, "taking back a failed Redlock attempt failed on one server; its lease ends it");
                    }
                }
            });
        }
        if taken.iter().any(Option::is_some) {
            let back = TakingBack {
                key: self.key.name().to_owned(),
                parts: taken,
            };
            let mut taking_back = self.backend.inner.taking_back.lock();
            taking_back.insert(self.token.clone(), back);
        }
    }
}

/// Answers counted.
#[derive(Debug, Default)]
pub(super) struct Count {
    pub(super) yes: usize,
    pub(super) busy: usize,
    pub(super) silent: usize,
}

impl Count {
    pub(super) fn of(votes: &[Option<Vote>]) -> Self {
        let mut count = Count::default();
        for v in votes.iter().flatten() {
            match v {
                Vote::Yes => count.yes += 1,
                Vote::Busy(_) => count.busy += 1,
                Vote::None => count.silent += 1,
            }
        }
        count
    }

    pub(super) fn answered(&self) -> usize {
        self.yes + self.busy
    }
}

/// How long until a quorum of servers may be free: the servers that did not answer busy may
/// be free now; of the busy ones, enough to make a quorum must see their holder's lease end.
pub(super) fn remaining(votes: &[Option<Vote>], quorum: usize) -> Option<Duration> {
    let mut busy: Vec<Option<Duration>> = votes
        .iter()
        .filter_map(|v| match v {
            Some(Vote::Busy(r)) => Some(*r),
            _ => None,
        })
        .collect();
    let free = votes.len() - busy.len();
    let needed = quorum.checked_sub(free).filter(|n| *n > 0)?;
    // Unknown remainders sort last: a holder whose lease is unknown is waited for by message.
    busy.sort_by_key(|r| r.unwrap_or(Duration::MAX));
    busy.get(needed - 1).copied().flatten()
}

/// Marks a take-back ended when its task ends, whichever way (a delete that found the key
/// marks it first, with what it found).
struct Ending(Arc<Part>);

impl Drop for Ending {
    fn drop(&mut self) {
        self.0.end(false);
    }
}
