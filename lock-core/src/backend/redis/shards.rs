//! Renewals on a cluster: the locks each primary serves in one script call on that primary's
//! own connection, whatever their slots (`renew_node.lua`, Redis 7's `allow-cross-slot-keys`),
//! the primaries concurrently (the watchdog sends one group per primary, see
//! `RedisBackend::renewal_groups`). A slot whose primary says it does not serve it (moved, or
//! being moved) is renewed one slot per call through the cluster connection, which follows
//! MOVED and ASK, until the slot map settles. Every lock gets its own verdict: a primary that
//! fails leaves its own locks undecided, never another primary's.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use redis::{Script, Value};

use super::{RedisBackend, millis};
use crate::LockError;
use crate::backend::cluster::{Target, Topology, key_slot};
use crate::backend::{Renewal, Renewed, join_all};

/// The shebang sets the script's flags (it must be the first line).
static RENEW_NODE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        "#!lua flags=allow-cross-slot-keys,allow-oom\n",
        include_str!("scripts/renew_one.lua"),
        include_str!("scripts/renew_node.lua")
    ))
});

type Verdicts = Result<Vec<Renewed>, LockError>;
type Call<'a> = std::pin::Pin<Box<dyn Future<Output = Verdicts> + Send + 'a>>;

impl RedisBackend {
    /// Renews `items` where each lives (normally all on one primary: the watchdog's group):
    /// one call per primary and one per unsettled slot, concurrently. `Err` only when every
    /// call failed (then every lock is undecided).
    pub(super) async fn renew_shard(&self, topology: &Topology, items: &[Renewal]) -> Verdicts {
        let mut targets: HashMap<Target, Vec<usize>> = HashMap::new();
        for (i, r) in items.iter().enumerate() {
            targets
                .entry(topology.target(key_slot(r.key.name().as_bytes())))
                .or_default()
                .push(i);
        }
        let targets: Vec<(Target, Vec<usize>)> = targets.into_iter().collect();
        // The watchdog's group: one target, no copy.
        if let [(target, _)] = targets.as_slice() {
            return self.renew_at(topology, target, items).await;
        }
        let calls: Vec<Call<'_>> = targets
            .iter()
            .map(|(target, idx)| {
                let part: Vec<Renewal> = idx.iter().map(|&i| items[i].clone()).collect();
                Box::pin(async move { self.renew_at(topology, target, &part).await }) as Call<'_>
            })
            .collect();
        let answers = join_all(calls).await;
        merge(
            items.len(),
            targets.iter().map(|(_, idx)| idx.as_slice()).zip(answers),
        )
    }

    /// `items`, all bound for `target`.
    async fn renew_at(&self, topology: &Topology, target: &Target, items: &[Renewal]) -> Verdicts {
        match target {
            Target::Node(addr) => match self.renew_on_node(topology, addr, items).await {
                Some(verdicts) => verdicts,
                None => self.renew_elsewhere(topology, addr, items).await,
            },
            Target::Slot(_) => self.renew_slot(items).await,
        }
    }

    /// One slot's locks through the cluster connection (routed by the first key, following
    /// MOVED and ASK).
    async fn renew_slot(&self, items: &[Renewal]) -> Verdicts {
        self.renew_batch_on(self.inner.conn.clone(), items)
            .await
            .map(Renewed::from_bools)
    }

    /// The locks the primary at `addr` serves, in one script call on its own connection. A
    /// lock whose slot it does not serve is undecided and its slot unsettled (renewed per slot
    /// from now on), and the map is read again from this node. A failed call drops the
    /// connection and reads the map from another node. `None` when the node answered but no
    /// lock got a verdict (a refused call: an error reply; or none of the slots served there):
    /// the map was read again, and the caller renews them at once where it sends them now
    /// ([`RedisBackend::renew_elsewhere`]; nothing else waits for them).
    async fn renew_on_node(
        &self,
        topology: &Topology,
        addr: &Arc<str>,
        items: &[Renewal],
    ) -> Option<Verdicts> {
        let first = items.first().map(|r| r.key.user());
        let Some(mut conn) = topology.renewer(addr).await else {
            topology.refresh(None, Some(addr)).await;
            return Some(Err(LockError::backend(
                "renew",
                first,
                std::io::Error::other(format!("cannot connect to the primary {addr}")),
            )));
        };
        let mut call = RENEW_NODE.prepare_invoke();
        for r in items {
            call.arg(r.key.name())
                .arg(r.token.as_str())
                .arg(millis(r.lease));
        }
        let reply = match call.invoke_async::<Value>(&mut conn).await {
            Ok(reply) => reply,
            Err(e) if answered(&e) => {
                // The node answered with an error (a replica now: READONLY; a cluster down):
                // no lock got a verdict, so they are renewed at once where the map read again
                // sends them.
                tracing::debug!(primary = %addr, error = %e, "a primary refused a renewal; renewing where the slot map says now");
                topology.refresh(None, Some(addr)).await;
                return None;
            }
            Err(e) => {
                // No answer: never sent through the cluster connection (a stalled node would
                // hold its other requests too).
                topology.forget(addr);
                topology.refresh(None, Some(addr)).await;
                return Some(Err(LockError::backend("renew", first, e)));
            }
        };
        let Some(answers) = node_answers(&reply, items.len()) else {
            return Some(Err(LockError::protocol(
                "renew",
                first,
                format!("renew script answered {reply:?} for {} locks", items.len()),
            )));
        };
        let mut verdicts = Vec::with_capacity(items.len());
        let mut elsewhere = Vec::new();
        for (i, (r, answer)) in items.iter().zip(answers).enumerate() {
            verdicts.push(match answer {
                Some(true) => Renewed::Yes,
                Some(false) => Renewed::Lost,
                None => {
                    topology.unsettled(key_slot(r.key.name().as_bytes()), addr);
                    elsewhere.push(i);
                    Renewed::Unknown
                }
            });
        }
        if elsewhere.is_empty() {
            return Some(Ok(verdicts));
        }
        tracing::debug!(primary = %addr, locks = elsewhere.len(), "a primary does not serve some locks' slots; renewing them per slot");
        topology.refresh(Some(addr), None).await;
        if elsewhere.len() == items.len() {
            return None;
        }
        Some(Ok(verdicts))
    }

    /// `items`, which `addr` refused, renewed where the slot map (just read again) sends them
    /// when that is another primary: on its own connection, not through the cluster connection
    /// (whose own map refresh after a MOVED may wait for a stalled node); the others, and those
    /// that primary refuses too, per slot through the cluster connection.
    async fn renew_elsewhere(
        &self,
        topology: &Topology,
        addr: &Arc<str>,
        items: &[Renewal],
    ) -> Verdicts {
        let mut targets: HashMap<Option<Arc<str>>, Vec<usize>> = HashMap::new();
        for (i, r) in items.iter().enumerate() {
            let node = match topology.target(key_slot(r.key.name().as_bytes())) {
                Target::Node(node) if node != *addr => Some(node),
                _ => None,
            };
            targets.entry(node).or_default().push(i);
        }
        let targets: Vec<(Option<Arc<str>>, Vec<usize>)> = targets.into_iter().collect();
        let calls: Vec<Call<'_>> = targets
            .iter()
            .map(|(node, idx)| {
                let part: Vec<Renewal> = idx.iter().map(|&i| items[i].clone()).collect();
                Box::pin(async move {
                    match node {
                        Some(node) => match self.renew_on_node(topology, node, &part).await {
                            Some(verdicts) => verdicts,
                            None => self.renew_slots(&part).await,
                        },
                        None => self.renew_slots(&part).await,
                    }
                }) as Call<'_>
            })
            .collect();
        let answers = join_all(calls).await;
        merge(
            items.len(),
            targets.iter().map(|(_, idx)| idx.as_slice()).zip(answers),
        )
    }

    /// `items` one slot per call through the cluster connection, the slots concurrently.
    async fn renew_slots(&self, items: &[Renewal]) -> Verdicts {
        let mut slots: HashMap<u16, Vec<usize>> = HashMap::new();
        for (i, r) in items.iter().enumerate() {
            slots
                .entry(key_slot(r.key.name().as_bytes()))
                .or_default()
                .push(i);
        }
        let slots: Vec<Vec<usize>> = slots.into_values().collect();
        let calls: Vec<Call<'_>> = slots
            .iter()
            .map(|idx| {
                let part: Vec<Renewal> = idx.iter().map(|&i| items[i].clone()).collect();
                Box::pin(async move { self.renew_slot(&part).await }) as Call<'_>
            })
            .collect();
        let answers = join_all(calls).await;
        merge(items.len(), slots.iter().map(Vec::as_slice).zip(answers))
    }
}

/// The verdicts of `n` locks from the answers of calls over parts of them (`idx` into the
/// whole): a failed call leaves its locks undecided. `Err` only when every call failed.
fn merge<'a>(n: usize, parts: impl Iterator<Item = (&'a [usize], Verdicts)>) -> Verdicts {
    let mut verdicts = vec![Renewed::Unknown; n];
    let mut first_error = None;
    let mut answered = false;
    for (idx, answer) in parts {
        match answer {
            Ok(part) => {
                answered = true;
                for (&i, v) in idx.iter().zip(part) {
                    verdicts[i] = v;
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, locks = idx.len(), "a renewal call failed; its locks are undecided");
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        Some(e) if !answered => Err(e),
        _ => Ok(verdicts),
    }
}

/// Whether the node answered (an error reply), rather than not at all (a timeout, a dropped
/// or refused connection).
pub(crate) fn answered(e: &redis::RedisError) -> bool {
    !(e.is_timeout() || e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal())
}

/// The answers of one `renew_node.lua` call over `n` locks: `Some(true)` renewed,
/// `Some(false)` no longer ours, `None` not served by that node; `None` for a malformed reply.
fn node_answers(reply: &Value, n: usize) -> Option<Vec<Option<bool>>> {
    match reply {
        Value::Array(v) if v.len() == n => v
            .iter()
            .map(|a| match a {
                Value::Int(1) => Some(Some(true)),
                Value::Int(0) => Some(Some(false)),
                Value::Int(-1) => Some(None),
                _ => None,
            })
            .collect(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_answers_parse() {
        let reply = Value::Array(vec![Value::Int(1), Value::Int(0), Value::Int(-1)]);
        assert_eq!(
            node_answers(&reply, 3),
            Some(vec![Some(true), Some(false), None])
        );
        assert_eq!(node_answers(&reply, 2), None);
        assert_eq!(node_answers(&Value::Array(vec![Value::Int(2)]), 1), None);
    }

    #[test]
    fn one_failed_call_leaves_only_its_locks_undecided() {
        let failed = || Err(LockError::protocol("renew", None, "x"));
        let parts = vec![
            (&[0, 2][..], Ok(vec![Renewed::Yes, Renewed::Lost])),
            (&[1][..], failed()),
        ];
        assert_eq!(
            merge(3, parts.into_iter()).ok(),
            Some(vec![Renewed::Yes, Renewed::Unknown, Renewed::Lost])
        );
        assert!(merge(1, vec![(&[0][..], failed())].into_iter()).is_err());
    }
}
