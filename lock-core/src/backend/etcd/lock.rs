//! Acquire, release, renew and wait on etcd: the contender keys of a lock, the holder being the
//! one with the lowest create revision.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, TxnOpResponse, TxnResponse, WatchClient, WatchFilterType, WatchOptions,
};
use tokio::time::Instant;

use super::lease::Health;
use super::{Contender, EtcdBackend, Shared, lease_refused, lease_ttl};
use crate::LockError;
use crate::backend::stamp::{self, Since};
use crate::backend::{Attempt, AttemptOptions, Kept, QueueTicket, Renewal, Renewed};
use crate::key::LockKey;
use crate::token::Token;

/// What one acquire transaction found.
enum Taken {
    /// Our key is the holder: its create revision, the lease it is on, and its value when its
    /// stamp still says "queued".
    Ours(i64, i64, Option<Vec<u8>>),
    /// Someone else holds the lock; a single attempt created nothing. The holder's etcd
    /// lease, when the answer named it.
    Busy(Option<i64>),
    /// Our key waits: its create revision and lease, the contender just ahead of it when
    /// the transaction saw it, and our key's value when its stamp says "queued".
    Queued {
        revision: i64,
        lease: i64,
        ahead: Option<Ahead>,
        queued: Option<Vec<u8>>,
    },
}

/// The contender just ahead of ours: its key, the revision to watch its deletion from, and
/// whether it was the holder (then its deletion makes us the holder).
struct Ahead {
    key: Vec<u8>,
    from: i64,
    holder: bool,
}

impl EtcdBackend {
    pub(super) async fn acquire_lock(
        &self,
        key: &LockKey,
        token: &Token,
        lease: Duration,
        options: AttemptOptions<'_>,
    ) -> Result<Attempt, LockError> {
        let ck = self.contender_key(key, token);
        // Registered before it is sent: its key is no orphan while the attempt runs; nor,
        // after a failed attempt of a waiter, while the waiter keeps its token (it tries again
        // and finds its key, or leaves and deletes it).
        let mut pending = self.inner.orphans.attempt(&ck);
        let answer = self.attempt_lock(key, &ck, lease, options).await;
        pending.keep = answer.is_err() && options.ticket.is_some_and(|t| !t.ttl.is_zero());
        answer
    }

    async fn attempt_lock(
        &self,
        key: &LockKey,
        ck: &str,
        lease: Duration,
        options: AttemptOptions<'_>,
    ) -> Result<Attempt, LockError> {
        let ttl = lease_ttl(lease).ok_or_else(|| lease_refused(lease))?;
        let ticket = options.ticket.filter(|t| !t.ttl.is_zero());
        let start = Instant::now();
        let ck = ck.to_owned();
        let leases = &self.inner.leases;
        let mut attempts = 0;
        loop {
            attempts += 1;
            let lease_id = leases.id(ttl, key).await?;
            // The keepalive (when one is needed) runs beside the transaction: the lease then
            // runs at least `lease` from `start`, before which the engine started counting.
            let (taken, cover) = tokio::join!(
                self.take(key, &ck, lease_id, ticket, (lease, options.holder)),
                leases.cover(ttl, lease_id, start, lease, key)
            );
            let lease_gone =
                matches!(cover, Ok(Health::Expired)) || taken.as_ref().is_err_and(lease_not_found);
            if lease_gone {
                leases.forget(ttl, lease_id).await;
                if attempts < 2 {
                    continue;
                }
            }
            if matches!(cover, Ok(Health::Alive)) {
                self.sweep_soon(ttl, lease_id);
            }
            let taken = taken?;
            if lease_gone {
                return Err(LockError::protocol(
                    "acquire",
                    key.user(),
                    "the etcd lease expired as it was granted",
                ));
            }
            return match taken {
                Taken::Busy(holder) => Ok(Attempt::Busy {
                    remaining: match holder {
                        Some(lease) if options.remaining => self.holder_remaining(lease).await,
                        _ => None,
                    },
                }),
                Taken::Ours(revision, on, queued) => {
                    // Ours only with the lease confirmed: else the engine's in-flight release
                    // takes it back.
                    cover?;
                    if on != lease_id && !self.rebind(key, &ck, revision, lease_id).await? {
                        self.inner.contenders.lock().remove(&ck);
                        return Ok(Attempt::Busy { remaining: None });
                    }
                    self.hold(&ck, revision, (ttl, lease_id), lease, queued);
                    if options.unrenewed {
                        self.end_at_lease(key, &ck, lease);
                    }
                    Ok(acquired(revision, options.fenced))
                }
                Taken::Queued {
                    revision,
                    lease: on,
                    ahead,
                    queued,
                } => {
                    let waiter = Waiter {
                        lease,
                        ticket,
                        fenced: options.fenced,
                        covered: matches!(cover, Ok(Health::Alive)),
                    };
                    match self
                        .queue(
                            key,
                            &ck,
                            waiter,
                            (revision, ttl, lease_id, on),
                            ahead,
                            queued,
                        )
                        .await?
                    {
                        true => {
                            cover?;
                            if options.unrenewed {
                                self.end_at_lease(key, &ck, lease);
                            }
                            Ok(acquired(revision, options.fenced))
                        }
                        false => Ok(Attempt::Busy { remaining: None }),
                    }
                }
            };
        }
    }

    /// How long the holder's lock still runs, as a retry hint for a busy single attempt: its
    /// etcd lease's TTL less the second this backend adds to every lease (at least a second).
    /// `None` when etcd does not answer in time or no longer knows the lease.
    async fn holder_remaining(&self, lease: i64) -> Option<Duration> {
        let secs = self.lease_left(lease).await?;
        Some(Duration::from_secs(secs.saturating_sub(1).max(1)))
    }

    /// Deletes `force_unlock`'s mark `mark` (see [`forced_key`]) in the background, once: one
    /// that fails ends with the lease it is on.
    fn forget_mark(&self, mark: String) {
        let inner = Arc::downgrade(&self.inner);
        crate::background::spawn(async move {
            let Some(inner) = inner.upgrade() else { return };
            let txn = Txn::new().and_then([TxnOp::delete(mark, None)]);
            if let Err(e) = (EtcdBackend { inner }).txn("release", None, txn).await {
                tracing::debug!(error = %e, "deleting a removed lock's mark failed; it ends with its lease");
            }
        });
    }

    /// The seconds etcd says lease `lease` still runs; `None` when it does not answer in
    /// time or no longer knows the lease.
    async fn lease_left(&self, lease: i64) -> Option<u64> {
        let mut client = self.inner.client.lease_client();
        let answer =
            tokio::time::timeout(self.inner.request_timeout, client.time_to_live(lease, None))
                .await
                .ok()?
                .ok()?;
        u64::try_from(answer.ttl()).ok().filter(|s| *s > 0)
    }

    /// One acquire transaction. A single attempt creates its key only when the lock has no
    /// contender at all (so a busy answer leaves nothing behind); a waiter creates its key if
    /// it has none (an attempt sent again finds it) and reads the holder, and the contender
    /// ahead of a key it just created. A key is created with its stamp (`backend::stamp`):
    /// "held since now" when the lock has no contender, else "queued since now". `stamping` is
    /// the lock's lease and its taker's identity.
    async fn take(
        &self,
        key: &LockKey,
        ck: &str,
        lease_id: i64,
        waiter: Option<&QueueTicket>,
        stamping: (Duration, &str),
    ) -> Result<Taken, LockError> {
        let prefix = self.queue_prefix(key);
        // A fair waiter says so in its key: holders of other processes hear of it (`announce`).
        let fair = waiter.filter(|t| t.strict).map(|t| t.id.as_str());
        let (lease, holder) = stamping;
        let now = stamp::now_ms();
        let held = stamp::value(fair, Since::Held(now), lease, holder);
        let put_value =
            |value: Vec<u8>| TxnOp::put(ck, value, Some(PutOptions::new().with_lease(lease_id)));
        // With its value: a key found again tells whether its stamp still says "queued".
        let mine = TxnOp::get(ck, None);
        let nobody =
            || Compare::create_revision(prefix.as_str(), CompareOp::Equal, 0).with_prefix();
        if waiter.is_none() {
            // Our own key, created by this attempt sent before (its answer lost), is ours: it
            // was made when the lock had no contender, so it is the first.
            let txn = Txn::new()
                .when([nobody()])
                .and_then([put_value(held)])
                .or_else([
                    mine,
                    TxnOp::get(prefix.as_str(), Some(ordered(SortOrder::Ascend, 1))),
                ]);
            let answer = self.txn("acquire", Some(key), txn).await?;
            if answer.succeeded() {
                return Ok(Taken::Ours(revision_of(&answer, key)?, lease_id, None));
            }
            let ranges = ranges(&answer);
            return Ok(match ranges.first().and_then(|r| r.first()) {
                Some(ours) => Taken::Ours(ours.create_revision(), ours.lease(), queued_of(ours)),
                None => Taken::Busy(
                    ranges
                        .get(1)
                        .and_then(|r| r.first())
                        .map(KeyValue::lease)
                        .filter(|l| *l != 0),
                ),
            });
        }
        let first = TxnOp::get(prefix.as_str(), Some(ordered(SortOrder::Ascend, 1)));
        let known = self
            .inner
            .contenders
            .lock()
            .get(ck)
            .map(|c| c.create_revision);
        if let Some(revision) = known {
            // A waiter's later attempts, while its key is there: a read-only transaction
            // (served by a linearizable read, no Raft write).
            let txn = Txn::new()
                .when([Compare::create_revision(ck, CompareOp::Equal, revision)])
                .and_then([mine.clone(), first.clone()]);
            let answer = self.txn("acquire", Some(key), txn).await?;
            if answer.succeeded() {
                return found(&ranges(&answer), ck, key);
            }
        }
        // Created "held" when nobody contends (it is the first), else "queued": decided in the
        // same transaction, so the stamp never counts a wait as holding.
        let queued = stamp::value(fair, Since::Queued(now), lease, holder);
        let put = TxnOp::txn(
            Txn::new()
                .when([nobody()])
                .and_then([put_value(held)])
                .or_else([put_value(queued.clone())]),
        );
        let txn = Txn::new()
            .when([Compare::create_revision(ck, CompareOp::Equal, 0)])
            .and_then([
                put,
                first.clone(),
                TxnOp::get(prefix.as_str(), Some(ordered(SortOrder::Descend, 2))),
            ])
            .or_else([mine, first]);
        let answer = self.txn("acquire", Some(key), txn).await?;
        let ranges = ranges(&answer);
        if !answer.succeeded() {
            return found(&ranges, ck, key);
        }
        let revision = revision_of(&answer, key)?;
        let [_, first, last] = ranges.as_slice() else {
            return Err(malformed(key));
        };
        if holds(first, ck) {
            return Ok(Taken::Ours(revision, lease_id, None));
        }
        let ahead = last
            .iter()
            .find(|kv| kv.key() != ck.as_bytes())
            .map(|kv| Ahead {
                key: kv.key().to_vec(),
                from: revision + 1,
                holder: holds(first, &String::from_utf8_lossy(kv.key())),
            });
        Ok(Taken::Queued {
            revision,
            lease: lease_id,
            ahead,
            queued: Some(queued),
        })
    }

    /// Remembers our key as the holder of a lock of `lease` (no watch needed any more): it
    /// ends a lease from now unless renewed (see `expire_ended`). `on` is the lease length and
    /// etcd lease the key is on; `queued`, its value when its stamp says "queued" (then
    /// rewritten "held since now", in the background).
    fn hold(
        &self,
        ck: &str,
        revision: i64,
        on: (u64, i64),
        lease: Duration,
        queued: Option<Vec<u8>>,
    ) {
        let restamp = {
            let mut contenders = self.inner.contenders.lock();
            let c = note(&mut contenders, ck, revision, on.0, on.1);
            if let Some(watch) = c.watch.take() {
                watch.abort();
            }
            c.ends = Some(Instant::now() + lease);
            let known = c.queued.take();
            queued.or(known)
        };
        if let Some(queued) = restamp {
            let (inner, ck) = (Arc::downgrade(&self.inner), ck.to_owned());
            crate::background::spawn(async move {
                if let Some(inner) = inner.upgrade() {
                    restamp_held(inner, &ck, revision, &queued).await;
                }
            });
        }
    }

    /// Our key waits behind another: watches the deletion of the one just ahead (unless a
    /// watch is already on), looking it up when the transaction did not see it. `Ok(true)`
    /// when the lookup finds nobody ahead any more: the lock is ours. `state` is our key's
    /// create revision, the lease length and lease we want it on, and the lease it is on.
    async fn queue(
        &self,
        key: &LockKey,
        ck: &str,
        waiter: Waiter<'_>,
        state: (i64, u64, i64, i64),
        ahead: Option<Ahead>,
        queued: Option<Vec<u8>>,
    ) -> Result<bool, LockError> {
        let (revision, ttl, lease_id, on) = state;
        if on != lease_id && !self.rebind(key, ck, revision, lease_id).await? {
            // Our key went meanwhile: the next attempt creates it again.
            self.inner.contenders.lock().remove(ck);
            return Ok(false);
        }
        {
            let mut contenders = self.inner.contenders.lock();
            let c = note(&mut contenders, ck, revision, ttl, lease_id);
            if queued.is_some() {
                c.queued = queued;
            }
            if let Some(generation) = waiter.ticket.map(|t| t.generation)
                && waiter.covered
                && lease_id == on
            {
                c.turn.store(generation, Ordering::Release);
            }
            if let Some(ahead) = ahead {
                if let Some(watch) = c.watch.take() {
                    watch.abort();
                }
                c.watch = self.watch_deletion(key, ck, &waiter, revision, ahead, c.turn.clone());
                return Ok(false);
            }
            if c.watch.as_ref().is_some_and(|w| !w.is_finished()) {
                return Ok(false);
            }
        }
        // Who is just ahead of us now (the one we watched left), and who holds the lock?
        let prefix = self.queue_prefix(key);
        let before = ordered(SortOrder::Descend, 1).with_max_create_revision(revision - 1);
        let txn = Txn::new()
            .when([Compare::create_revision(ck, CompareOp::Equal, revision)])
            .and_then([
                TxnOp::get(prefix.as_str(), Some(before)),
                TxnOp::get(prefix.as_str(), Some(ordered(SortOrder::Ascend, 1))),
            ]);
        let answer = self.txn("acquire", Some(key), txn).await?;
        if !answer.succeeded() {
            self.inner.contenders.lock().remove(ck);
            return Ok(false);
        }
        let ranges = ranges(&answer);
        let [before, first] = ranges.as_slice() else {
            return Err(malformed(key));
        };
        let Some(found) = before.first() else {
            // Nobody ahead: ours.
            self.hold(ck, revision, (ttl, lease_id), waiter.lease, None);
            return Ok(true);
        };
        let ahead = Ahead {
            key: found.key().to_vec(),
            from: revision_of(&answer, key)? + 1,
            holder: holds(first, &String::from_utf8_lossy(found.key())),
        };
        let mut contenders = self.inner.contenders.lock();
        if let Some(c) = contenders.get_mut(ck) {
            c.watch = self.watch_deletion(key, ck, &waiter, revision, ahead, c.turn.clone());
        }
        Ok(false)
    }

    /// Moves our key (created at `revision`) to lease `lease_id`; `false` when it is gone.
    async fn rebind(
        &self,
        key: &LockKey,
        ck: &str,
        revision: i64,
        lease_id: i64,
    ) -> Result<bool, LockError> {
        let txn = Txn::new()
            .when([Compare::create_revision(ck, CompareOp::Equal, revision)])
            .and_then([TxnOp::put(
                ck,
                "",
                Some(PutOptions::new().with_lease(lease_id).with_ignore_value()),
            )]);
        let answer = self.txn("extend", Some(key), txn).await?;
        Ok(answer.succeeded())
    }

    /// Watches the deletion of `ahead` from its revision on, then tells this process's waiter
    /// (the one expecting the ticket). When `ahead` was the holder, its deletion makes our key
    /// (created at `revision`) the holder: the lock is handed to the waiter, naming its latest
    /// attempt whose keepalive was confirmed (`turn`; the lease runs a lock's lease from it),
    /// with our key's revision as the fence, and no round trip. Otherwise, and on any end of
    /// the watch (an error, a compaction, a member without a leader), a turn message wakes it
    /// to try: maybe free. A hand-over rewrites our key's stamp "held since now", after the
    /// waiter was told (see `backend::stamp`).
    fn watch_deletion(
        &self,
        key: &LockKey,
        ck: &str,
        waiter: &Waiter<'_>,
        revision: i64,
        ahead: Ahead,
        turn: Arc<AtomicU64>,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let client = self.inner.client.watch_client();
        let listeners = Arc::downgrade(&self.inner.listeners);
        let (shared, ck) = (Arc::downgrade(&self.inner), ck.to_owned());
        let name = key.name().to_owned();
        let ticket = waiter
            .ticket
            .map_or("released", |t| t.id.as_str())
            .to_owned();
        let fence = if waiter.fenced {
            u64::try_from(revision).unwrap_or(0)
        } else {
            0
        };
        crate::background::spawn(async move {
            let gone = deleted(client, ahead.key, ahead.from).await;
            let Some(listeners) = listeners.upgrade() else {
                return;
            };
            let generation = turn.load(Ordering::Acquire);
            if gone && ahead.holder && generation > 0 && ticket != "released" {
                let grant = format!("{ticket}:{generation}:{fence}");
                listeners.lock().wake(&name, grant.as_bytes());
                drop(listeners);
                let Some(shared) = shared.upgrade() else {
                    return;
                };
                let queued = shared
                    .contenders
                    .lock()
                    .get_mut(&ck)
                    .filter(|c| c.create_revision == revision)
                    .and_then(|c| c.queued.take());
                // A task of its own: this one may be aborted once the lock is held (a lock
                // without the watchdog puts its end's task in its place).
                if let Some(queued) = queued {
                    crate::background::spawn(async move {
                        restamp_held(shared, &ck, revision, &queued).await;
                    });
                }
            } else {
                listeners.lock().wake(&name, ticket.as_bytes());
            }
        })
    }

    /// The compare that says our key is still the one we created (any key of ours when we do
    /// not know its revision: only this token's attempts create a key of this name).
    pub(super) fn still_ours(&self, ck: &str) -> Compare {
        match self.inner.contenders.lock().get(ck) {
            Some(c) => Compare::create_revision(ck, CompareOp::Equal, c.create_revision),
            None => Compare::create_revision(ck, CompareOp::Greater, 0),
        }
    }

    pub(super) async fn release_lock(
        &self,
        key: &LockKey,
        token: &Token,
    ) -> Result<bool, LockError> {
        let ck = self.contender_key(key, token);
        let ours = self.still_ours(&ck);
        let lease = self.inner.contenders.lock().get(&ck).map(|c| c.lease_id);
        // No orphan while the release runs: the sweep would delete the key under our compare,
        // and the release would report a loss.
        let _releasing = self.inner.orphans.attempt(&ck);
        // Forgotten whatever the answer: a release sent again deletes our key if it exists
        // (only this token's attempts create a key of this name, and a token released is
        // never used again), and a failed delete goes on in the background.
        self.inner.contenders.lock().remove(&ck);
        // When our key is gone, the same transaction reads whether an operator removed it
        // (`force_unlock` leaves a mark: see `forced_key`).
        let mark = forced_key(&ck);
        let (deleted, resent, forced) = self
            .delete_or_read(key, &ck, ours, "release", Some(&mark))
            .await?;
        if forced {
            // The mark has told what it had to: gone with it, in the background.
            self.forget_mark(mark);
            return Ok(false);
        }
        if deleted || !resent {
            return Ok(deleted);
        }
        // Sent again after a connection dropped: the first delete may have gone through, its
        // answer lost. Nothing but this backend deletes a contender key while its lease lives
        // (a release, a leave, the sweep of keys nobody uses; etcd ends it with the lease)
        // without a mark (`force_unlock` leaves one on the key's lease, read above), and none of
        // ours but this release would delete this one: while our lease lives, the key went by
        // this release's hand.
        Ok(match lease {
            Some(lease) => self.lease_left(lease).await.is_some(),
            None => false,
        })
    }

    /// A waiter gives up: deletes its key (when a release made it the holder meanwhile, this
    /// passes the lock on).
    pub(super) async fn leave(&self, key: &LockKey, token: &Token) -> Result<(), LockError> {
        let ck = self.contender_key(key, token);
        self.inner.contenders.lock().remove(&ck);
        self.inner.orphans.forget(&ck);
        let any = Compare::create_revision(ck.as_str(), CompareOp::Greater, 0);
        self.delete(key, &ck, any, "leave the queue").await?;
        Ok(())
    }

    /// Deletes our key `ck` if `ours` holds, then wakes this process's listeners of `key`:
    /// whether it was deleted, and whether that answer is to a delete sent again. A delete without an answer goes on in the background until
    /// etcd answers: this process's other locks may keep the key's lease alive for as long as
    /// it runs, so the key would not end on its own.
    pub(super) async fn delete(
        &self,
        key: &LockKey,
        ck: &str,
        ours: Compare,
        operation: &'static str,
    ) -> Result<(bool, bool), LockError> {
        let (deleted, resent, _) = self.delete_or_read(key, ck, ours, operation, None).await?;
        Ok((deleted, resent))
    }

    /// [`delete`](Self::delete), which also reads key `otherwise` when `ours` does not hold,
    /// in the same transaction: the third answer says whether that key exists.
    async fn delete_or_read(
        &self,
        key: &LockKey,
        ck: &str,
        ours: Compare,
        operation: &'static str,
        otherwise: Option<&str>,
    ) -> Result<(bool, bool, bool), LockError> {
        let read = otherwise.map(|k| TxnOp::get(k, Some(GetOptions::new().with_keys_only())));
        let txn = Txn::new()
            .when([ours.clone()])
            .and_then([TxnOp::delete(ck, None)])
            .or_else(read.into_iter().collect::<Vec<_>>());
        match self.txn_sent(operation, Some(key), txn.clone()).await {
            Ok((answer, resent)) => {
                if answer.succeeded() {
                    self.inner.listeners.lock().wake(key.name(), b"released");
                }
                let found = !answer.succeeded() && ranges(&answer).iter().any(|r| !r.is_empty());
                Ok((answer.succeeded(), resent, found))
            }
            Err(e) => {
                let (inner, name) = (Arc::downgrade(&self.inner), key.name().to_owned());
                crate::background::spawn(async move {
                    let mut pause = Duration::from_millis(100);
                    loop {
                        tokio::time::sleep(pause).await;
                        // A backend dropped meanwhile keeps no lease alive: the key ends.
                        let Some(inner) = inner.upgrade() else { return };
                        let mut kv = inner.client.kv_client();
                        let sent = tokio::time::timeout(inner.request_timeout, kv.txn(txn.clone()));
                        if let Ok(Ok(answer)) = sent.await {
                            if answer.succeeded() {
                                inner.listeners.lock().wake(&name, b"released");
                            }
                            return;
                        }
                        pause = (pause * 2).min(Duration::from_secs(5));
                    }
                });
                Err(e)
            }
        }
    }

    pub(super) async fn keep_alone(&self, key: &LockKey, token: &Token) -> Result<Kept, LockError> {
        let ck = self.contender_key(key, token);
        let prefix = self.queue_prefix(key);
        let txn = Txn::new()
            .when([self.still_ours(&ck)])
            .and_then([TxnOp::get(
                prefix.as_str(),
                Some(GetOptions::new().with_prefix().with_count_only()),
            )]);
        let answer = self.txn("keep the lock", Some(key), txn).await?;
        if !answer.succeeded() {
            self.inner.contenders.lock().remove(&ck);
            return Ok(Kept::NotOurs);
        }
        let count = match answer.op_responses().first() {
            Some(TxnOpResponse::Get(range)) => range.count(),
            _ => return Err(malformed(key)),
        };
        if count <= 1 {
            return Ok(Kept::Alone);
        }
        Ok(if self.release_lock(key, token).await? {
            Kept::Released
        } else {
            Kept::NotOurs
        })
    }

    /// One keepalive per distinct lease of the batch, beside one read of every item's key:
    /// `Yes` only when the key is still the one we created, on the lease just kept alive.
    pub(super) async fn renew_locks(&self, items: &[Renewal]) -> Result<Vec<Renewed>, LockError> {
        let Some(first) = items.first() else {
            return Ok(Vec::new());
        };
        let mut verdicts = vec![Renewed::Unknown; items.len()];
        let mut wanted = Vec::with_capacity(items.len());
        for item in items {
            wanted.push(lease_ttl(item.lease).ok_or_else(|| lease_refused(item.lease))?);
        }
        let cks: Vec<String> = items
            .iter()
            .map(|i| self.contender_key(&i.key, &i.token))
            .collect();
        // Items asking for another lease length (an extend): their key moves to that lease.
        for (i, item) in items.iter().enumerate() {
            let known = self
                .inner
                .contenders
                .lock()
                .get(&cks[i])
                .map(|c| (c.create_revision, c.ttl));
            let Some((revision, ttl)) = known else {
                continue;
            };
            if ttl == wanted[i] {
                continue;
            }
            let moved = async {
                let id = self.inner.leases.id(wanted[i], &item.key).await?;
                let moved = self.rebind(&item.key, &cks[i], revision, id).await?;
                Ok::<_, LockError>((id, moved))
            };
            match moved.await {
                Ok((id, true)) => {
                    if let Some(c) = self.inner.contenders.lock().get_mut(&cks[i]) {
                        c.ttl = wanted[i];
                        c.lease_id = id;
                    }
                }
                Ok((_, false)) => verdicts[i] = Renewed::Lost,
                Err(e) => {
                    tracing::debug!(key = %item.key.display(), error = %e, "moving a lock to another lease failed");
                }
            }
        }
        let mut ttls: Vec<u64> = wanted.clone();
        ttls.sort_unstable();
        ttls.dedup();
        let mut ids = Vec::with_capacity(ttls.len());
        for ttl in &ttls {
            ids.push(self.inner.leases.current(*ttl).await);
        }
        let keepalives = async {
            let mut health = Vec::with_capacity(ttls.len());
            let sends = ttls.iter().zip(&ids).map(|(ttl, id)| async move {
                match id {
                    Some(id) => Some(self.inner.leases.keep_alive(*ttl, *id).await),
                    None => None,
                }
            });
            for h in crate::backend::join_all(sends.map(|f| Box::pin(f) as _).collect()).await {
                health.push(h);
            }
            health
        };
        // One read of every key, in transactions of at most `MAX_TXN_OPS` reads (etcd refuses
        // a larger one whole), sent together; a chunk that fails leaves its items `Unknown`.
        let chunks: Vec<&[Renewal]> = items.chunks(MAX_TXN_OPS).collect();
        let reads = cks.chunks(MAX_TXN_OPS).zip(&chunks).map(|(cks, chunk)| {
            let check = Txn::new().and_then(
                cks.iter()
                    .map(|ck| TxnOp::get(ck.as_str(), Some(GetOptions::new().with_keys_only())))
                    .collect::<Vec<_>>(),
            );
            let key = &chunk[0].key;
            Box::pin(async move {
                let read = self.txn("renew", Some(key), check).await?;
                let ranges = ranges(&read);
                if ranges.len() == cks.len() {
                    Ok(ranges)
                } else {
                    Err(malformed(key))
                }
            }) as _
        });
        let (health, reads) = tokio::join!(
            keepalives,
            crate::backend::join_all::<Result<Vec<Vec<KeyValue>>, LockError>>(reads.collect())
        );
        for ((ttl, id), h) in ttls.iter().zip(&ids).zip(&health) {
            if let (Some(id), Some(Ok(Health::Alive))) = (id, h) {
                self.sweep_soon(*ttl, *id);
            }
        }
        if reads.iter().all(Result::is_err) {
            return Err(reads
                .into_iter()
                .find_map(Result::err)
                .unwrap_or_else(|| malformed(&first.key)));
        }
        let ranges: Vec<Option<Vec<KeyValue>>> = reads
            .into_iter()
            .zip(&chunks)
            .flat_map(|(read, chunk)| match read {
                Ok(ranges) => ranges.into_iter().map(Some).collect(),
                Err(e) => {
                    tracing::debug!(error = %e, "reading some renewed locks failed");
                    vec![None; chunk.len()]
                }
            })
            .collect();
        for (i, item) in items.iter().enumerate() {
            if verdicts[i] == Renewed::Lost {
                continue;
            }
            let Some(range) = &ranges[i] else {
                verdicts[i] = Renewed::Unknown;
                continue;
            };
            let slot = ttls.binary_search(&wanted[i]).unwrap_or(0);
            // The verdict, and the end it moves, under one lock: an end reached meanwhile
            // (`expire_ended`, the unrenewed end) has taken the entry out, and a "yes" for a
            // key it is deleting is never given.
            let mut contenders = self.inner.contenders.lock();
            let known = contenders
                .get(&cks[i])
                .map(|c| (c.create_revision, c.lease_id));
            let found = range.first();
            verdicts[i] = match (found, known) {
                (None, _) => Renewed::Lost,
                (Some(kv), Some((revision, _))) if kv.create_revision() != revision => {
                    Renewed::Lost
                }
                (Some(kv), Some((_, lease_id)))
                    if Some(lease_id) == ids[slot] && kv.lease() == lease_id =>
                {
                    match health.get(slot) {
                        Some(Some(Ok(Health::Alive))) => Renewed::Yes,
                        Some(Some(Ok(Health::Expired))) => Renewed::Lost,
                        _ => Renewed::Unknown,
                    }
                }
                _ => Renewed::Unknown,
            };
            if verdicts[i] == Renewed::Yes
                && let Some(c) = contenders.get_mut(&cks[i])
            {
                // Renewed (or extended): it ends a lease from now, unless renewed again.
                c.ends = Some(Instant::now() + item.lease);
            }
            if verdicts[i] == Renewed::Lost {
                tracing::debug!(key = %item.key.display(), "lock lost: its etcd key or lease is gone");
                contenders.remove(&cks[i]);
            }
        }
        Ok(verdicts)
    }
}

/// The mark `force_unlock` leaves when it removes contender key `ck` (`N K/q/<token>`):
/// `N K/forced/<token>`, on the removed key's etcd lease, in the same transaction. The evicted
/// holder's release reads it when it finds its key gone (so a release sent again after a
/// dropped connection tells an operator's removal from its own first delete) and deletes it;
/// a holder whose process ended takes it with its lease. It is no contender key (not under
/// `K/q/`), so no listing, inspection or sweep counts it.
pub(super) fn forced_key(ck: &str) -> String {
    match ck.rsplit_once("/q/") {
        Some((name, token)) => format!("{name}/forced/{token}"),
        None => format!("{ck}/forced"),
    }
}

/// The most operations etcd takes in one transaction by default (`--max-txn-ops`): a renewal
/// reads its locks in transactions of at most this many.
const MAX_TXN_OPS: usize = 128;

/// Our key `ck` as etcd has it now: created at `revision`, on lease `lease_id` of `ttl`
/// seconds. A watch made for an earlier key of the name (created at another revision) ends.
fn note<'m>(
    contenders: &'m mut HashMap<String, Contender>,
    ck: &str,
    revision: i64,
    ttl: u64,
    lease_id: i64,
) -> &'m mut Contender {
    let c = contenders.entry(ck.to_owned()).or_insert(Contender {
        create_revision: revision,
        ttl,
        lease_id,
        watch: None,
        ends: None,
        turn: Arc::default(),
        queued: None,
    });
    if c.create_revision != revision {
        if let Some(watch) = c.watch.take() {
            watch.abort();
        }
        c.create_revision = revision;
        c.turn = Arc::default();
        c.queued = None;
    }
    c.ttl = ttl;
    c.lease_id = lease_id;
    c
}

/// Whether the first contender of a range in create order is `ck`.
fn holds(first: &[KeyValue], ck: &str) -> bool {
    first.first().is_some_and(|kv| kv.key() == ck.as_bytes())
}

/// What a read of our existing key `ck` and of the lock's first contender says.
fn found(ranges: &[Vec<KeyValue>], ck: &str, key: &LockKey) -> Result<Taken, LockError> {
    let [ours, first] = ranges else {
        return Err(malformed(key));
    };
    let Some(ours) = ours.first() else {
        return Err(malformed(key));
    };
    if holds(first, ck) {
        return Ok(Taken::Ours(
            ours.create_revision(),
            ours.lease(),
            queued_of(ours),
        ));
    }
    Ok(Taken::Queued {
        revision: ours.create_revision(),
        lease: ours.lease(),
        ahead: None,
        queued: queued_of(ours),
    })
}

/// The value of our key `kv` when its stamp says "queued" (to be rewritten once it holds).
fn queued_of(kv: &KeyValue) -> Option<Vec<u8>> {
    stamp::queued_at(kv.value()).map(|_| kv.value().to_vec())
}

/// Our key `ck` (created at `revision`, its value `queued`, a stamp saying "queued") holds the
/// lock: its stamp is rewritten "held since now" (the clock read after the lock was ours, so
/// the age shown never counts the wait). One transaction that changes neither the fence (the
/// create revision) nor the lease (`ignore_lease`), made only while the key is the one created
/// with that value: a key deleted meanwhile (released, forced) is never created again. Best
/// effort: until it lands, or if it fails, `inspect` shows no age.
async fn restamp_held(inner: Arc<Shared>, ck: &str, revision: i64, queued: &[u8]) {
    let Some(held) = stamp::held_since(queued, stamp::now_ms()) else {
        return;
    };
    let txn = Txn::new()
        .when([
            Compare::create_revision(ck, CompareOp::Equal, revision),
            Compare::value(ck, CompareOp::Equal, queued),
        ])
        .and_then([TxnOp::put(
            ck,
            held,
            Some(PutOptions::new().with_ignore_lease()),
        )]);
    if let Err(e) = (EtcdBackend { inner })
        .txn("stamp the holder", None, txn)
        .await
    {
        tracing::debug!(error = %e, "rewriting a new holder's stamp failed; inspect shows no age for it");
    }
}

/// What `queue` needs of a waiter's attempt: its lease, its ticket, whether it asked for a
/// fence, and whether its keepalive was confirmed.
struct Waiter<'a> {
    lease: Duration,
    ticket: Option<&'a QueueTicket>,
    fenced: bool,
    covered: bool,
}

fn acquired(revision: i64, fenced: bool) -> Attempt {
    Attempt::Acquired {
        fence: fenced.then(|| u64::try_from(revision).unwrap_or(0)),
    }
}

/// A range over a lock's contenders in create order, keys only.
fn ordered(order: SortOrder, limit: i64) -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, order)
        .with_limit(limit)
        .with_keys_only()
}

/// The revision a transaction's writes were made at.
fn revision_of(answer: &TxnResponse, key: &LockKey) -> Result<i64, LockError> {
    answer
        .header()
        .map(etcd_client::ResponseHeader::revision)
        .filter(|r| *r > 0)
        .ok_or_else(|| malformed(key))
}

/// The key-values of each range of a transaction's answer (an empty list for its other ops).
pub(super) fn ranges(answer: &TxnResponse) -> Vec<Vec<KeyValue>> {
    answer
        .op_responses()
        .into_iter()
        .map(|op| match op {
            TxnOpResponse::Get(mut range) => range.take_kvs(),
            _ => Vec::new(),
        })
        .collect()
}

fn malformed(key: &LockKey) -> LockError {
    LockError::protocol(
        "acquire",
        key.user(),
        "etcd answered a transaction without its ranges",
    )
}

/// Whether a write failed because its lease is gone.
fn lease_not_found(e: &LockError) -> bool {
    let LockError::Backend { source, .. } = e else {
        return false;
    };
    source.to_string().contains("requested lease not found")
}

/// Waits for `key` to be deleted (from revision `from` on): `true`; or for the watch to end
/// otherwise: `false`.
async fn deleted(mut client: WatchClient, key: Vec<u8>, from: i64) -> bool {
    let options = WatchOptions::new()
        .with_start_revision(from)
        .with_filters([WatchFilterType::NoPut]);
    let Ok(mut stream) = client.watch(key, Some(options)).await else {
        return false;
    };
    loop {
        match stream.message().await {
            Ok(Some(answer)) => {
                if answer
                    .events()
                    .iter()
                    .any(|e| e.event_type() == EventType::Delete)
                {
                    return true;
                }
                if answer.canceled() {
                    return false;
                }
            }
            Ok(None) | Err(_) => return false,
        }
    }
}
