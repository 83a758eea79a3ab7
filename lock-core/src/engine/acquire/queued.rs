//! A waiter with a ticket in the backend's queue of its key: its attempts, the handovers a
//! release makes to it, its wait loop, leaving the queue; and fair mode, where every waiter
//! queues so.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::once::{InFlight, guard_for};
use super::{Outcome, Spec, timed_out};
use crate::LockError;
use crate::backend::{Attempt, AttemptOptions, Grant, Inbox, QueueTicket};
use crate::background;
use crate::engine::held::Acquisition;
use crate::engine::wait::Ticket;
use crate::guard::LockGuard;
use crate::key::LockKey;
use crate::locker::LockerInner;
use crate::token::Token;

/// Backoff bounds while release notifications are unavailable.
const DEGRADED_MIN: Duration = Duration::from_millis(5);
const DEGRADED_MAX: Duration = Duration::from_millis(250);
/// Slack added to a holder's remaining lease before trying again (clock granularity).
const EXPIRY_SLACK: Duration = Duration::from_millis(1);
/// How long a queued waiter's ticket stays in the backend's queue without a refresh; waiters
/// refresh it every third of that (more often for short leases). A crashed waiter holds up the
/// queue for at most this long, and a lock handed to it just before its ticket died for at
/// most this long again (the handover lease is at most this too).
const TICKET_TTL: Duration = Duration::from_secs(3);

/// The lease a release hands the lock over with to a waiter that asked for `lease`.
pub(crate) fn handover_lease(lease: Duration) -> Duration {
    lease.min(TICKET_TTL)
}

/// Refreshes of a ticket are never closer than this.
const MIN_REFRESH: Duration = Duration::from_millis(50);
/// How many recent attempts a waiter remembers, to date a handover that names one of them.
const REMEMBERED_ATTEMPTS: usize = 8;

/// Acquires `key` in fair mode: this waiter's own ticket joins the backend's FIFO on its first
/// attempt, and only the queue's head takes a free lock; a release hands the lock to the next
/// live ticket.
pub(super) async fn acquire_fair(
    inner: &Arc<LockerInner>,
    key: &LockKey,
    spec: &Spec,
    start: Instant,
    heard: &AtomicBool,
) -> Result<LockGuard, LockError> {
    let deadline = start + spec.wait;
    // A lock parked in this locker's grace is never taken by a fair request: it goes back to
    // the backend's queue first, where this request takes its place in order.
    if let Some(parked) = inner.queues.unpark(key) {
        let valid = parked.is_held();
        let _ = parked.release_in_backend(valid).await;
    }
    let inbox = Arc::new(Inbox::default());
    let mut queued = QueuedWaiter::new(inner, key, spec, inbox.clone(), true);
    if spec.wait.is_zero() {
        queued.ticket.ttl = Duration::ZERO;
        return queued.attempt(false).await?.or_busy(key);
    }
    queued.own_subscription = true;
    // Subscribed before the first attempt: a release after it hands over to us or wakes us.
    tokio::time::timeout_at(deadline, inner.backend.subscribe(key, &inbox))
        .await
        .map_err(|_| timed_out(key, start))?;
    queued.wait(deadline, start, true, None, Some(heard)).await
}

/// A waiter with a ticket in the backend's queue of its key. Each attempt refreshes the ticket
/// and registers the attempt's token, lease and fencing choice; a release that finds the ticket
/// at the head sets the lock to that token and names the ticket and attempt in its message, so
/// the waiter owns the lock without another round trip. Its lease is counted from the moment
/// that attempt was sent (the handover came after the server saw it), which is why the waiter
/// remembers when it sent each recent attempt.
///
/// Dropping it before the lock was acquired takes the ticket out of the queue in the
/// background, passing the lock on if a release handed it over meanwhile.
pub(super) struct QueuedWaiter {
    inner: Arc<LockerInner>,
    key: LockKey,
    spec: Spec,
    inbox: Arc<Inbox>,
    ticket: QueueTicket,
    token: Token,
    /// Recent attempts of this identity: generation and when it was sent. They all registered
    /// `token` (a new identity starts with an empty list), except on a backend that never
    /// hands a lock over (Redlock), where every attempt has a token of its own.
    sent: VecDeque<(u64, Instant)>,
    /// Whether the backend may hold the ticket (an attempt that could queue was sent), or the
    /// token (an attempt whose answer was lost, on a backend that keeps the token after it).
    registered: bool,
    acquired: bool,
    /// A fair waiter's inbox is its own subscription, dropped with it.
    own_subscription: bool,
}

impl QueuedWaiter {
    pub(super) fn new(
        inner: &Arc<LockerInner>,
        key: &LockKey,
        spec: &Spec,
        inbox: Arc<Inbox>,
        strict: bool,
    ) -> Self {
        // A handed-over lock starts with a short lease (the watchdog, or the waiter's next
        // attempt, takes it to the full lease), so a waiter that died without leaving its
        // ticket holds the key only briefly.
        let handover_lease = handover_lease(spec.lease);
        let ticket = QueueTicket {
            id: new_ticket_id(inner),
            ttl: TICKET_TTL,
            strict,
            generation: 0,
            handover_lease,
        };
        inbox.expect(Some(&ticket.id));
        inbox.clear_wakeup();
        QueuedWaiter {
            inner: inner.clone(),
            key: key.clone(),
            spec: *spec,
            inbox,
            ticket,
            token: inner.new_token(),
            sent: VecDeque::with_capacity(REMEMBERED_ATTEMPTS),
            registered: false,
            acquired: false,
            own_subscription: false,
        }
    }

    /// How often the ticket is refreshed: often enough that a handover leaves most of its
    /// lease to the new owner.
    fn refresh_every(&self) -> Duration {
        (self.ticket.ttl / 3)
            .min(self.ticket.handover_lease / 4)
            .max(MIN_REFRESH)
    }

    /// The token is spent (an acquisition with it was given up and is being released): the
    /// next attempts register a new token under a new ticket, and older handovers are ignored.
    fn renew_identity(&mut self) {
        let token = std::mem::replace(&mut self.token, self.inner.new_token());
        let ticket = std::mem::replace(&mut self.ticket.id, new_ticket_id(&self.inner));
        self.sent.clear();
        self.inbox.expect(Some(&self.ticket.id));
        if std::mem::take(&mut self.registered) {
            // A later attempt may have queued the old ticket again: take it out, so no release
            // hands the lock to a token nobody waits with.
            leave_in_background(&self.inner, &self.key, ticket, token);
        }
    }

    /// One attempt: acquires, or (re)registers the ticket with this attempt's generation.
    async fn attempt(&mut self, waited: bool) -> Result<Outcome, LockError> {
        self.ticket.generation += 1;
        let sent_at = Instant::now();
        if self.sent.len() == REMEMBERED_ATTEMPTS {
            self.sent.pop_front();
        }
        self.sent.push_back((self.ticket.generation, sent_at));
        self.registered |= !self.ticket.ttl.is_zero();
        let mut in_flight = InFlight {
            inner: &self.inner,
            key: &self.key,
            token: Some(&self.token),
        };
        let answer = self
            .inner
            .call()
            .acquire(
                &self.key,
                &self.token,
                self.spec.lease,
                AttemptOptions {
                    fenced: self.spec.fenced,
                    ticket: Some(&self.ticket),
                    remaining: true,
                    unrenewed: !self.spec.watchdog,
                    holder: &self.inner.config.holder,
                    bounded: false,
                },
            )
            .await;
        let answer = match answer {
            Ok(answer) => answer,
            Err(e) if self.inner.backend.keeps_token_after_failed_attempt() => {
                // The attempt may have run: the next one, with the same token, finds what it
                // did (the waiter keeps its place in the queue). A lock it may have taken is
                // reported only once an attempt says so, and given back by the leave that
                // follows when the waiter gives up.
                in_flight.token = None;
                self.registered = true;
                return Err(e);
            }
            Err(e) => {
                // The attempt may have run: `in_flight` releases its token in the background,
                // so that token must never be used again (nor a handover to it).
                drop(in_flight);
                self.renew_identity();
                return Err(e);
            }
        };
        in_flight.token = None;
        drop(in_flight);
        match answer {
            Attempt::Acquired { fence } => {
                let acquisition = self.acquisition(self.token.clone(), fence, sent_at, waited);
                match guard_for(&self.inner, acquisition, self.spec.watchdog, self.spec.fair) {
                    Some(guard) => {
                        self.acquired = true;
                        Ok(Outcome::Acquired(guard))
                    }
                    None => {
                        self.renew_identity();
                        Ok(Outcome::Busy(None))
                    }
                }
            }
            Attempt::Busy { remaining } => {
                if self.inner.backend.takes_back_failed_attempts() {
                    // Redlock: the refused attempt is being taken back on each server by a
                    // compare-and-delete of its token, and may have left a copy of it (a
                    // take-back that failed, a `SET` that lands late). With the same token the
                    // next attempt could count such a copy, with an older expiry, as a yes, or
                    // have its own key deleted by a late take-back: each attempt gets a token
                    // of its own. (Such a backend never hands a lock over, so no release
                    // names this token.)
                    self.token = self.inner.new_token();
                }
                Ok(Outcome::Busy(remaining))
            }
        }
    }

    fn acquisition(
        &self,
        token: Token,
        fence: Option<u64>,
        sent_at: Instant,
        waited: bool,
    ) -> Acquisition {
        Acquisition {
            key: self.key.clone(),
            token,
            fence,
            lease: self.spec.lease,
            first_lease: self.spec.lease,
            sent_at,
            received_at: sent_at,
            max_hold: self.spec.max_hold,
            waited,
        }
    }

    /// A release handed the lock to this ticket. Its lease runs from when the attempt the
    /// handover names was sent (the server could only hand over after it saw that attempt).
    /// `None` when the handover cannot be used as it is: an unknown attempt (a stale or
    /// repeated message), too little of the handover lease left to trust (a late message), or
    /// no watchdog to take the short handover lease to the full one. The caller's next attempt
    /// then settles it: the lock still holding this waiter's token is taken with the full lease
    /// and a new fence, measured from that attempt.
    fn take_over(&mut self, grant: Grant) -> Option<LockGuard> {
        let (_, sent_at) = *self.sent.iter().find(|(g, _)| *g == grant.generation)?;
        let lease = self.ticket.handover_lease;
        let valid_until = sent_at + lease.saturating_sub(crate::backend::drift(lease));
        if !self.spec.watchdog || valid_until.saturating_duration_since(Instant::now()) < lease / 2
        {
            return None;
        }
        let fence = if self.spec.fenced { grant.fence } else { None };
        let mut acquisition = self.acquisition(self.token.clone(), fence, sent_at, true);
        acquisition.first_lease = lease;
        acquisition.received_at = Instant::now();
        self.settle(acquisition)
    }

    /// Gives up: takes the ticket out of the backend's queue before the caller hears of the
    /// timeout, so no release hands the lock to a waiter that is gone (a handover that came
    /// meanwhile is passed on). Without an answer, the ticket dies unrefreshed.
    /// While the backend is failing (`trouble`) the leave goes out in the background instead;
    /// a leave still unanswered when the request's bound (wait + [`DEADLINE_SLACK`]) passes is
    /// dropped with the request, whose drop finishes it in the background.
    async fn leave(&mut self, trouble: bool) {
        if !self.registered || self.acquired {
            return;
        }
        if trouble {
            self.registered = false;
            let ticket = self.ticket.id.clone();
            leave_in_background(&self.inner, &self.key, ticket, self.token.clone());
            return;
        }
        // `registered` stays set until the answer: if this future is dropped meanwhile, the
        // drop leaves in the background (a second leave is harmless).
        if let Err(e) = self
            .inner
            .call()
            .leave_queue(&self.key, &self.ticket.id, &self.token)
            .await
        {
            tracing::debug!(error = %e, "leaving the wait queue failed; the ticket expires on its own");
        }
        self.registered = false;
    }

    fn settle(&mut self, acquisition: Acquisition) -> Option<LockGuard> {
        let guard = guard_for(&self.inner, acquisition, self.spec.watchdog, self.spec.fair);
        if guard.is_some() {
            self.acquired = true;
            self.inner.handovers.fetch_add(1, Ordering::Relaxed);
            crate::observe::handed_over(&self.inner, self.spec.class);
        } else {
            self.renew_identity();
        }
        guard
    }

    /// Waits for the lock until `deadline`: attempts (which refresh the ticket), handovers,
    /// release messages, the holder's lease running out. `first` when no attempt was made yet:
    /// a backend that fails the very first attempt fails the request at once.
    /// `local`: the head's place in the locker's local queue, where a lock passed by local
    /// hand-off may come too.
    pub(super) async fn wait(
        &mut self,
        deadline: Instant,
        start: Instant,
        first: bool,
        local: Option<&Ticket>,
        heard: Option<&AtomicBool>,
    ) -> Result<LockGuard, LockError> {
        let key = self.key.clone();
        let timeout =
            |trouble: Option<LockError>| trouble.unwrap_or_else(|| timed_out(&key, start));
        let refresh = self.refresh_every();
        let mut backoff = DEGRADED_MIN;
        let mut trouble = None;
        let mut waited = !first;
        let mut remaining;
        loop {
            if let Some(guard) = self.inbox.take_grant().and_then(|g| self.take_over(g)) {
                return Ok(guard);
            }
            if let Some(held) = local.and_then(Ticket::take_handed) {
                return Ok(super::received(held));
            }
            let answer = self.attempt(waited).await;
            let answer = if waited {
                patient(answer, &mut trouble)
            } else {
                answer
            };
            match answer? {
                Outcome::Acquired(guard) => return Ok(guard),
                Outcome::Busy(r) => remaining = r,
            }
            if let Some(heard) = heard {
                heard.store(true, Ordering::Relaxed);
            }
            waited = true;
            if Instant::now() >= deadline {
                // A handover that came during the last attempt still counts.
                if let Some(guard) = self.inbox.take_grant().and_then(|g| self.take_over(g)) {
                    return Ok(guard);
                }
                self.leave(trouble.is_some()).await;
                return Err(timeout(trouble));
            }
            // The holder's lease bounds every wait: a key that expires publishes nothing.
            let mut nap = remaining.map_or(refresh, |r| (r + EXPIRY_SLACK).min(refresh));
            if !self.inner.backend.notifications_healthy() || trouble.is_some() {
                // The key's subscription may have gone with its connection since this head
                // found it made: asked for again (in the background) once it may work.
                if let Some(ticket) = local {
                    ticket.heard_or_ask_again();
                }
                nap = nap.min(jittered(backoff));
                backoff = (backoff * 2).min(DEGRADED_MAX);
            } else {
                backoff = DEGRADED_MIN;
            }
            let inbox = self.inbox.clone();
            let woken = inbox.notified();
            tokio::select! {
                biased;
                () = woken => {}
                () = tokio::time::sleep(nap) => {}
                () = tokio::time::sleep_until(deadline) => {
                    // A handover that came at the very end still counts.
                    if let Some(guard) = self.inbox.take_grant().and_then(|g| self.take_over(g)) {
                        return Ok(guard);
                    }
                    self.leave(trouble.is_some()).await;
                    return Err(timeout(trouble));
                }
            }
        }
    }
}

impl Drop for QueuedWaiter {
    fn drop(&mut self) {
        if self.own_subscription {
            self.inner.backend.unsubscribe(&self.key, &self.inbox);
        } else {
            self.inbox.forget(&self.ticket.id);
        }
        if self.acquired || !self.registered {
            return;
        }
        let ticket = std::mem::take(&mut self.ticket.id);
        leave_in_background(&self.inner, &self.key, ticket, self.token.clone());
    }
}

/// Takes a ticket out of the key's queue (passing the lock on if a release handed it to
/// `token` meanwhile): at once in memory, in the background on Redis. Best effort: an
/// unrefreshed ticket dies on its own.
fn leave_in_background(inner: &Arc<LockerInner>, key: &LockKey, ticket: String, token: Token) {
    if inner.backend.leave_queue_at_once(key, &ticket, &token) {
        inner.calls.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let (inner, key) = (inner.clone(), key.clone());
    background::spawn(async move {
        if let Err(e) = inner.call().leave_queue(&key, &ticket, &token).await {
            tracing::debug!(error = %e, "leaving the wait queue failed; the ticket expires on its own");
        }
    });
}

/// A ticket names the waiter a release hands the lock to, so on a shared backend it is drawn
/// like an owner token, from the OS: a forked child must never draw its parent's tickets (both
/// would take one hand-over message as theirs: two holders).
fn new_ticket_id(inner: &LockerInner) -> String {
    format!("t{}", &inner.new_token().as_str()[..16])
}

/// Inside a wait, a transport failure is not the end: the backend may be back before the
/// deadline (a restart, a dropped connection). It counts as "busy, for an unknown time" and is
/// remembered, to be returned if the wait ends without the lock. Other errors end the wait.
fn patient(
    answer: Result<Outcome, LockError>,
    trouble: &mut Option<LockError>,
) -> Result<Outcome, LockError> {
    match answer {
        Err(e @ LockError::Backend { .. }) => {
            tracing::debug!(error = %e, "lock attempt failed while waiting; retrying until the deadline");
            *trouble = Some(e);
            Ok(Outcome::Busy(None))
        }
        Ok(answer) => {
            *trouble = None;
            Ok(answer)
        }
        Err(e) => Err(e),
    }
}

fn jittered(d: Duration) -> Duration {
    let r: u32 = rand::random();
    // Between d/2 and d.
    d / 2 + d.mul_f64(f64::from(r) / f64::from(u32::MAX) / 2.0)
}
