//! Renewals on a cluster: the locks of one shard in one round trip (one renew call per hash
//! slot, pipelined to the shard's primary), the shards concurrently (the watchdog sends one
//! group per shard, see `RedisBackend::renewal_groups`).

use std::collections::BTreeMap;

use redis::Value;
use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};

use super::conn::Conn;
use super::{RENEW, RedisBackend, millis, renew_answers};
use crate::LockError;
use crate::backend::Renewal;
use crate::backend::cluster::key_slot;
use crate::backend::join_all;

impl RedisBackend {
    /// Renews `items` (the locks of one shard, as far as the slot map knows): one pipeline of
    /// renew calls, one per slot (a script's keys must share a slot), sent to the primary of
    /// the first slot. When anything goes wrong with it (a slot moved: the whole pipeline is
    /// redirected; a script missing; a node down), each slot is renewed by its own call,
    /// routed by its keys, and the slot map is read again.
    pub(super) async fn renew_shard(&self, items: &[Renewal]) -> Result<Vec<bool>, LockError> {
        let mut slots: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        for (i, r) in items.iter().enumerate() {
            slots
                .entry(key_slot(r.key.name().as_bytes()))
                .or_default()
                .push(i);
        }
        // The shard's own connection: redis-rs holds every request of one cluster connection
        // while one node does not answer, so a stalled shard would hold the others' renewals.
        let conn = match (&self.inner.topology, slots.keys().next()) {
            (Some(topology), Some(&slot)) => topology
                .renewer(slot)
                .await
                .map_or_else(|| self.inner.conn.clone(), Conn::Cluster),
            _ => self.inner.conn.clone(),
        };
        if slots.len() <= 1 {
            return self.renew_batch_on(conn, items).await;
        }
        if let Some(answers) = self.renew_pipelined(&conn, items, &slots).await {
            return Ok(answers);
        }
        if let (Some(topology), Conn::Cluster(conn)) = (&self.inner.topology, &conn) {
            topology.refresh(&mut conn.clone()).await;
        }
        let groups: Vec<Vec<Renewal>> = slots
            .values()
            .map(|idx| idx.iter().map(|&i| items[i].clone()).collect())
            .collect();
        let calls = groups
            .iter()
            .map(|group| {
                Box::pin(self.renew_batch_on(conn.clone(), group))
                    as std::pin::Pin<
                        Box<dyn Future<Output = Result<Vec<bool>, LockError>> + Send + '_>,
                    >
            })
            .collect();
        let mut answers = vec![false; items.len()];
        for (idx, answer) in slots.values().zip(join_all(calls).await) {
            let answer = answer.map_err(|e| {
                tracing::debug!(error = %e, locks = items.len(), "renewal on a shard failed");
                e
            })?;
            for (&i, ok) in idx.iter().zip(answer) {
                answers[i] = ok;
            }
        }
        Ok(answers)
    }

    /// The one-round-trip attempt; `None` when it did not fully succeed.
    async fn renew_pipelined(
        &self,
        conn: &Conn,
        items: &[Renewal],
        slots: &BTreeMap<u16, Vec<usize>>,
    ) -> Option<Vec<bool>> {
        let Conn::Cluster(conn) = conn else {
            return None;
        };
        let mut pipe = redis::pipe();
        for idx in slots.values() {
            let cmd = pipe.cmd("EVALSHA").arg(RENEW.get_hash()).arg(idx.len());
            for &i in idx {
                cmd.arg(items[i].key.name());
            }
            for &i in idx {
                cmd.arg(items[i].token.as_str()).arg(millis(items[i].lease));
            }
        }
        let first_slot = *slots.keys().next()?;
        let route = SingleNodeRoutingInfo::SpecificNode(Route::new(first_slot, SlotAddr::Master));
        let replies: Vec<Value> = match conn
            .clone()
            .inner()
            .route_pipeline(pipe, 0, slots.len(), route)
            .await
        {
            Ok(replies) => replies,
            Err(e) => {
                tracing::debug!(error = %e, "pipelined renewal of a shard failed; renewing per slot");
                return None;
            }
        };
        if replies.len() != slots.len() {
            return None;
        }
        let mut answers = vec![false; items.len()];
        for (idx, reply) in slots.values().zip(&replies) {
            let first = idx.first().map(|&i| items[i].key.user());
            let parsed = renew_answers(reply, idx.len(), first).ok()?;
            for (&i, ok) in idx.iter().zip(parsed) {
                answers[i] = ok;
            }
        }
        Some(answers)
    }
}
