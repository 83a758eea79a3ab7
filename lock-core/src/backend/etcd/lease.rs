//! The backend's etcd leases: one per lease length in use, granted lazily, kept alive over one
//! keepalive stream each (rebuilt when it breaks), and dropped once etcd says it expired.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, LeaseKeepAliveStream, LeaseKeeper};
use tokio::sync::watch;
use tokio::time::Instant;

use super::{retried, timed_out};
use crate::LockError;
use crate::key::LockKey;
use crate::sync::Mutex;

/// What a keepalive found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Health {
    /// The lease runs its full length from (at least) the keepalive's sending.
    Alive,
    /// etcd no longer knows the lease: every key on it is gone.
    Expired,
}

pub(super) struct Leases {
    client: Client,
    timeout: Duration,
    slots: Mutex<HashMap<u64, Arc<Slot>>>,
    /// Bumped each time a keepalive stream broke.
    pub(super) reconnects: watch::Sender<u64>,
}

/// The lease of one length, behind an async lock: a grant or a keepalive at a time.
struct Slot {
    ttl: u64,
    state: tokio::sync::Mutex<SlotState>,
}

#[derive(Default)]
struct SlotState {
    id: Option<i64>,
    keeper: Option<(LeaseKeeper, LeaseKeepAliveStream)>,
    /// When the last keepalive (or the grant) etcd confirmed was sent: the lease runs at least
    /// until this instant plus its length.
    confirmed: Option<Instant>,
}

impl Leases {
    pub(super) fn new(client: Client, timeout: Duration) -> Self {
        Leases {
            client,
            timeout,
            slots: Mutex::default(),
            reconnects: watch::Sender::new(0),
        }
    }

    fn slot(&self, ttl: u64) -> Arc<Slot> {
        self.slots
            .lock()
            .entry(ttl)
            .or_insert_with(|| {
                Arc::new(Slot {
                    ttl,
                    state: tokio::sync::Mutex::default(),
                })
            })
            .clone()
    }

    /// The lease of `ttl` seconds, granted now if there is none.
    pub(super) async fn id(&self, ttl: u64, key: &LockKey) -> Result<i64, LockError> {
        let slot = self.slot(ttl);
        let mut state = slot.state.lock().await;
        if let Some(id) = state.id {
            return Ok(id);
        }
        let sent = Instant::now();
        let ttl_secs = i64::try_from(slot.ttl).unwrap_or(i64::MAX);
        // Sent again after a dropped connection: a lease granted twice leaves one unused,
        // which ends on its own.
        let granted = retried(self.timeout, "grant a lease", Some(key), || {
            let mut client = self.client.lease_client();
            async move { client.grant(ttl_secs, None).await }
        })
        .await?;
        if !granted.error().is_empty() || granted.ttl() < ttl_secs {
            return Err(LockError::protocol(
                "grant a lease",
                key.user(),
                format!(
                    "etcd granted {} s (asked for {ttl_secs} s): {}",
                    granted.ttl(),
                    granted.error()
                ),
            ));
        }
        state.id = Some(granted.id());
        state.keeper = None;
        state.confirmed = Some(sent);
        Ok(granted.id())
    }

    /// The lease of `ttl` seconds, if one is granted (no I/O).
    pub(super) async fn current(&self, ttl: u64) -> Option<i64> {
        self.slot(ttl).state.lock().await.id
    }

    /// Makes sure lease `id` (of `ttl` seconds) runs at least until `start + lease`: at once
    /// when a keepalive sent late enough was confirmed, else with a keepalive now.
    pub(super) async fn cover(
        &self,
        ttl: u64,
        id: i64,
        start: Instant,
        lease: Duration,
        key: &LockKey,
    ) -> Result<Health, LockError> {
        let slot = self.slot(ttl);
        let mut state = slot.state.lock().await;
        if state.id != Some(id) {
            return Ok(Health::Expired);
        }
        let length = Duration::from_secs(ttl);
        if state.confirmed.is_some_and(|c| c + length >= start + lease) {
            return Ok(Health::Alive);
        }
        self.send(&mut state, id, Some(key)).await
    }

    /// Sends one keepalive for lease `id` (of `ttl` seconds) now.
    pub(super) async fn keep_alive(&self, ttl: u64, id: i64) -> Result<Health, LockError> {
        let slot = self.slot(ttl);
        let mut state = slot.state.lock().await;
        if state.id != Some(id) {
            return Ok(Health::Expired);
        }
        self.send(&mut state, id, None).await
    }

    /// Forgets lease `id` of `ttl` seconds (etcd said it is gone): the next acquire grants a
    /// new one.
    pub(super) async fn forget(&self, ttl: u64, id: i64) {
        let slot = self.slot(ttl);
        let mut state = slot.state.lock().await;
        if state.id == Some(id) {
            *state = SlotState::default();
        }
    }

    /// The leases granted now (no I/O; a slot busy with a grant or a keepalive is skipped).
    pub(super) fn granted(&self) -> Vec<i64> {
        self.slots
            .lock()
            .values()
            .filter_map(|slot| slot.state.try_lock().ok().and_then(|s| s.id))
            .collect()
    }

    async fn send(
        &self,
        state: &mut SlotState,
        id: i64,
        key: Option<&LockKey>,
    ) -> Result<Health, LockError> {
        let user = key.map(LockKey::user);
        let sent = Instant::now();
        let deadline = sent + self.timeout;
        let mut answer = self.exchange(state, id, user, deadline).await;
        if let Err((_, true)) = answer {
            // The connection dropped (a member restarted, a link came back): once more on a
            // new stream, within the same bound. The broken stream is counted as a reconnect.
            if state.keeper.take().is_some() {
                self.reconnects.send_modify(|n| *n = n.wrapping_add(1));
            }
            answer = self.exchange(state, id, user, deadline).await;
        }
        let answer = answer.map_err(|(e, _)| e);
        match answer {
            Ok(ttl) if ttl > 0 => {
                state.confirmed = Some(sent);
                Ok(Health::Alive)
            }
            Ok(_) => {
                *state = SlotState::default();
                Ok(Health::Expired)
            }
            Err(e) => {
                // An answer may still come on this stream: a later read would take it for the
                // answer to a later keepalive. The next keepalive opens a new stream.
                if state.keeper.take().is_some() {
                    self.reconnects.send_modify(|n| *n = n.wrapping_add(1));
                }
                Err(e)
            }
        }
    }

    /// One keepalive for lease `id` on the stream (opened now if there is none), answered by
    /// `deadline`: the lease's remaining seconds (0: expired), or an error and whether it is a
    /// transport failure worth one more try on a new stream.
    async fn exchange(
        &self,
        state: &mut SlotState,
        id: i64,
        user: Option<&str>,
        deadline: Instant,
    ) -> Result<i64, (LockError, bool)> {
        let failed = |e| (LockError::backend("keep a lease alive", user, e), true);
        let late = || (timed_out("keep a lease alive", user), false);
        match state.keeper.as_mut() {
            Some((keeper, stream)) => {
                let exchange = async {
                    keeper.keep_alive().await?;
                    stream.message().await
                };
                match tokio::time::timeout_at(deadline, exchange).await {
                    Ok(Ok(Some(answer))) if answer.id() == id => Ok(answer.ttl()),
                    Ok(Ok(Some(_))) => Err((
                        LockError::protocol(
                            "keep a lease alive",
                            user,
                            "a keepalive answer for another lease",
                        ),
                        false,
                    )),
                    Ok(Ok(None)) => Err((
                        LockError::protocol(
                            "keep a lease alive",
                            user,
                            "the keepalive stream ended",
                        ),
                        true,
                    )),
                    Ok(Err(e)) => Err(failed(e)),
                    Err(_) => Err(late()),
                }
            }
            None => {
                // Opening the stream sends the first keepalive and reads its answer.
                let mut client = self.client.lease_client();
                match tokio::time::timeout_at(deadline, client.keep_alive(id)).await {
                    Ok(Ok((keeper, stream))) => {
                        state.keeper = Some((keeper, stream));
                        Ok(1)
                    }
                    Ok(Err(etcd_client::Error::LeaseKeepAliveError(_))) => Ok(0),
                    Ok(Err(e)) => Err(failed(e)),
                    Err(_) => Err(late()),
                }
            }
        }
    }
}
