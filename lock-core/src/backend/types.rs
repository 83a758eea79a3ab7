//! The vocabulary of the [`Backend`](super::Backend) trait: what the engine asks of a backend,
//! and what a backend answers.

use std::time::Duration;

use crate::key::LockKey;
use crate::token::Token;

/// What an acquire attempt asks of the backend besides the lock itself.
///
/// ```
/// let options = lock_core::backend::AttemptOptions::default();
/// assert!(!options.fenced && options.ticket.is_none());
/// ```
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub struct AttemptOptions<'a> {
    /// Draw a fencing token with the lock (the engine asks only when
    /// [`Backend::refuses`](super::Backend::refuses) let a fenced request through).
    pub fenced: bool,
    /// A place in the key's cross-process queue, taken when the lock is held. A backend
    /// without a queue ignores it.
    pub ticket: Option<&'a QueueTicket>,
    /// Report how long a holder's lease still runs when the lock is busy (a request that does
    /// not wait tells its caller; one that waits learns it from its queued attempts, so the
    /// Redis backend saves a command). A backend may always report it, or never.
    pub remaining: bool,
    /// The watchdog will not renew this lock (`watchdog(false)`): it must end at its lease even
    /// while this process lives and renews other locks. A backend whose lease is shared
    /// between locks (etcd's, kept alive for all of them) ends such a lock itself.
    pub unrenewed: bool,
    /// Who takes the lock ([`LockerBuilder::holder`](crate::LockerBuilder::holder)): a backend
    /// records it with the lock, and with a queued waiter for the hand-over, for
    /// [`Backend::inspect`](super::Backend::inspect) to show; empty when not given.
    pub holder: &'a str,
    /// The caller bounds this attempt itself: it drops the attempt's future at its own
    /// deadline (a request that waits, under its wait). A backend then need not arm a bound
    /// of its own on the attempt (the Redis backend skips the timer of a request it queues
    /// for a batch); without it, the backend bounds every wait it adds.
    pub bounded: bool,
}

/// The answer to [`Backend::keep_if_alone`](super::Backend::keep_if_alone).
///
/// ```
/// use lock_core::backend::Kept;
/// assert_ne!(Kept::Alone, Kept::Released);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    /// Still ours, and nobody of another process queues for it.
    Alone,
    /// Someone queued: the lock was released to them (handed over or announced).
    Released,
    /// It was no longer ours.
    NotOurs,
}

/// The answer to one acquire attempt.
///
/// ```
/// use lock_core::backend::Attempt;
/// let got = Attempt::Acquired { fence: Some(7) };
/// assert!(matches!(got, Attempt::Acquired { fence: Some(7) }));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// Ours now; the fencing token when one was asked for (strictly increasing per key).
    Acquired {
        /// The fencing token, when [`AttemptOptions::fenced`] asked for one.
        fence: Option<u64>,
    },
    /// Held by someone else.
    Busy {
        /// How long the holder's lease still runs, when known.
        remaining: Option<Duration>,
    },
}

/// A waiter's place in the backend's cross-process queue of a key. While it is there, a release
/// hands the lock straight to it (the lock is set to the ticket's registered token and the
/// release message says so), which saves the waiter its own acquire round trip.
///
/// Made by the engine; a backend reads it.
///
/// ```
/// fn lives(ticket: &lock_core::backend::QueueTicket) -> std::time::Duration {
///     ticket.ttl
/// }
/// # let _ = lives;
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct QueueTicket {
    /// Random, not secret: it is published to name the waiter a lock was handed to.
    pub id: String,
    /// How long the ticket stays alive without a refresh (each attempt refreshes it); zero for
    /// a single attempt that must not join the queue.
    pub ttl: Duration,
    /// Fair mode: the lock is taken only in queue order. Otherwise (the head of a local queue
    /// in the default mode) the ticket takes a free lock whatever its place.
    pub strict: bool,
    /// Counts this ticket's attempts; a handover names the attempt it was decided on, so the
    /// waiter knows from when to count the lease.
    pub generation: u64,
    /// The lease a handover sets: the requested lease capped at the ticket lifetime (3 s), so a
    /// waiter that died unseen holds the key only briefly; the new owner's watchdog, or its
    /// next attempt, sets the full lease.
    pub handover_lease: Duration,
}

/// One lock's answer to a batched renewal (or an extend): each lock of a batch gets its own,
/// so one lock's state never decides another's.
///
/// ```
/// use lock_core::backend::Renewed;
/// assert_eq!(Renewed::from_bools(vec![true, false]), [Renewed::Yes, Renewed::Lost]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewed {
    /// Still ours: the lease was reset.
    Yes,
    /// Known not ours (expired, deleted, taken by another owner): the lock is lost.
    Lost,
    /// Not known either way (a server or a slot did not answer, or too few answered for a
    /// quorum): the caller retries while the lease is locally valid, and nothing is extended
    /// locally.
    Unknown,
}

impl Renewed {
    /// The verdicts of a backend that answers every lock of a batch yes or no.
    ///
    /// ```
    /// use lock_core::backend::Renewed;
    /// assert_eq!(Renewed::from_bools(vec![true]), [Renewed::Yes]);
    /// ```
    pub fn from_bools(answers: Vec<bool>) -> Vec<Renewed> {
        answers
            .into_iter()
            .map(|ok| if ok { Renewed::Yes } else { Renewed::Lost })
            .collect()
    }
}

/// One lock to renew (or extend) in a batch.
///
/// ```
/// fn lease_of(item: &lock_core::backend::Renewal) -> std::time::Duration {
///     item.lease
/// }
/// # let _ = lease_of;
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Renewal {
    /// The lock.
    pub key: LockKey,
    /// Its owner token: only a lock still holding it is renewed.
    pub token: Token,
    /// The lease to set, from now.
    pub lease: Duration,
}
