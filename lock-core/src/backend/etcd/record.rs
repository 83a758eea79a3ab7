//! Idempotency records on etcd: one key `N K/result` holding a result or a "started" mark,
//! bound to a lease of the record's TTL, written only while our contender key is still the one
//! we created (in the same transaction).
//!
//! Value: a kind byte (`R` result, `M` mark), the expiry in Unix milliseconds (8 bytes, big
//! endian: etcd tells a key's lease but not its remaining TTL in a read), the fingerprint's
//! length (4 bytes, big endian), the fingerprint, then the result or the mark's id.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};

use super::EtcdBackend;
use crate::LockError;
use crate::backend::record_codec::{MARK, RESULT, decode, encode};
use crate::idempotency::{IdempotencyRecord, IdempotencyState, Marked};
use crate::key::LockKey;
use crate::token::Token;

impl EtcdBackend {
    /// A lease of `ttl` (rounded up to whole seconds) for one record.
    async fn record_lease(&self, key: &LockKey, ttl: Duration) -> Result<i64, LockError> {
        if ttl.is_zero() || ttl > crate::MAX_RESULT_TTL {
            return Err(LockError::config(format!(
                "record TTL {ttl:?} is out of range: above zero and at most {:?}",
                crate::MAX_RESULT_TTL
            )));
        }
        let secs = ttl
            .as_secs()
            .saturating_add(u64::from(ttl.subsec_nanos() > 0));
        let secs = i64::try_from(secs.max(1)).unwrap_or(i64::MAX);
        let mut client = self.inner.client.lease_client();
        let granted = self
            .bounded("grant a lease", Some(key), client.grant(secs, None))
            .await?;
        if !granted.error().is_empty() {
            return Err(LockError::protocol(
                "grant a lease",
                key.user(),
                granted.error().to_owned(),
            ));
        }
        Ok(granted.id())
    }

    /// Revokes a record's lease nothing was written with (best effort: it expires anyway).
    fn revoke_later(&self, lease: i64) {
        let mut client = self.inner.client.lease_client();
        let timeout = self.inner.request_timeout;
        crate::background::spawn(async move {
            let _ = tokio::time::timeout(timeout, client.revoke(lease)).await;
        });
    }

    pub(super) async fn store_record(
        &self,
        key: &LockKey,
        token: &Token,
        fingerprint: &str,
        result: &[u8],
        ttl: Duration,
    ) -> Result<bool, LockError> {
        let (ck, rk) = (self.contender_key(key, token), self.record_key(key));
        let lease = self.record_lease(key, ttl).await?;
        let value = encode(RESULT, ttl, fingerprint, result);
        // Replaces a mark (or an older record): only the lock's holder writes here.
        let txn = Txn::new()
            .when([self.still_ours(&ck)])
            .and_then([TxnOp::put(
                rk,
                value,
                Some(PutOptions::new().with_lease(lease).with_prev_key()),
            )]);
        let mut kv = self.inner.client.kv_client();
        let answer = self.bounded("store result", Some(key), kv.txn(txn)).await;
        let written = answer
            .as_ref()
            .is_ok_and(etcd_client::TxnResponse::succeeded);
        if !written {
            self.revoke_later(lease);
        } else if let Ok(answer) = &answer {
            // The record replaced has a lease of its own, which etcd would keep (with no key)
            // until its TTL ends: one dead lease per request of a busy service.
            let replaced = answer.op_responses().into_iter().find_map(|op| match op {
                TxnOpResponse::Put(put) => put.prev_key().map(etcd_client::KeyValue::lease),
                _ => None,
            });
            if let Some(old) = replaced.filter(|old| *old != 0 && *old != lease) {
                self.revoke_later(old);
            }
        }
        answer.map(|_| written)
    }

    pub(super) async fn write_mark(
        &self,
        key: &LockKey,
        token: &Token,
        mark: &Token,
        fingerprint: &str,
        ttl: Duration,
    ) -> Result<Marked, LockError> {
        let (ck, rk) = (self.contender_key(key, token), self.record_key(key));
        let lease = self.record_lease(key, ttl).await?;
        let value = encode(MARK, ttl, fingerprint, mark.as_str().as_bytes());
        let ours = self.still_ours(&ck);
        let txn = Txn::new()
            .when([
                ours.clone(),
                Compare::create_revision(rk.as_str(), CompareOp::Equal, 0),
            ])
            .and_then([TxnOp::put(
                rk.as_str(),
                value,
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::txn(
                Txn::new()
                    .when([ours])
                    .and_then([TxnOp::get(rk.as_str(), None)]),
            )]);
        let mut kv = self.inner.client.kv_client();
        let answer = self.bounded("mark started", Some(key), kv.txn(txn)).await;
        let answer = match answer {
            Ok(answer) if answer.succeeded() => return Ok(Marked::Written),
            Ok(answer) => answer,
            Err(e) => {
                self.revoke_later(lease);
                return Err(e);
            }
        };
        self.revoke_later(lease);
        let Some(TxnOpResponse::Txn(inner)) = answer.op_responses().into_iter().next() else {
            return Err(unreadable(key, "mark started"));
        };
        if !inner.succeeded() {
            return Ok(Marked::NotOurs);
        }
        let Some(TxnOpResponse::Get(range)) = inner.op_responses().into_iter().next() else {
            return Err(unreadable(key, "mark started"));
        };
        let Some(found) = range.kvs().first() else {
            // The record went between the compare and the read: impossible in one transaction.
            return Err(unreadable(key, "mark started"));
        };
        let record = decode(found.value()).ok_or_else(|| unreadable(key, "mark started"))?;
        Ok(match record.kind {
            RESULT => Marked::Completed,
            _ if record.payload == mark.as_str().as_bytes() => Marked::Written,
            _ => Marked::Started {
                fingerprint: record.fingerprint,
                expires_in: record.expires_in,
            },
        })
    }

    pub(super) async fn clear_mark(
        &self,
        key: &LockKey,
        token: &Token,
        mark: &Token,
    ) -> Result<bool, LockError> {
        let (ck, rk) = (self.contender_key(key, token), self.record_key(key));
        let ours = self.still_ours(&ck);
        // Deletes the record only if it is our mark: a read, then a delete that checks the
        // record did not change since (its mod revision).
        let txn = Txn::new()
            .when([ours.clone()])
            .and_then([TxnOp::get(rk.as_str(), None)]);
        let mut kv = self.inner.client.kv_client();
        let answer = self
            .bounded("clear started", Some(key), kv.txn(txn))
            .await?;
        if !answer.succeeded() {
            return Ok(false);
        }
        let found = match answer.op_responses().into_iter().next() {
            Some(TxnOpResponse::Get(range)) => range.kvs().first().cloned(),
            _ => return Err(unreadable(key, "clear started")),
        };
        let Some(found) = found else {
            return Ok(true);
        };
        let ours_mark = decode(found.value())
            .is_some_and(|r| r.kind == MARK && r.payload == mark.as_str().as_bytes());
        if !ours_mark {
            return Ok(true);
        }
        let txn = Txn::new()
            .when([
                ours,
                Compare::mod_revision(rk.as_str(), CompareOp::Equal, found.mod_revision()),
            ])
            .and_then([TxnOp::delete(rk.as_str(), None)]);
        let answer = self
            .bounded("clear started", Some(key), kv.txn(txn))
            .await?;
        if answer.succeeded() && found.lease() != 0 {
            self.revoke_later(found.lease());
        }
        Ok(answer.succeeded())
    }

    /// One read-only transaction: the record, and whether any contender exists.
    pub(super) async fn read_state(&self, key: &LockKey) -> Result<IdempotencyState, LockError> {
        let rk = self.record_key(key);
        let prefix = self.queue_prefix(key);
        let txn = Txn::new().and_then([
            TxnOp::get(rk.as_str(), None),
            TxnOp::get(
                prefix.as_str(),
                Some(GetOptions::new().with_prefix().with_count_only()),
            ),
        ]);
        let mut kv = self.inner.client.kv_client();
        let answer = self
            .bounded("idempotency state", Some(key), kv.txn(txn))
            .await?;
        let ops = answer.op_responses();
        let (Some(TxnOpResponse::Get(record)), Some(TxnOpResponse::Get(contenders))) =
            (ops.first(), ops.get(1))
        else {
            return Err(unreadable(key, "idempotency state"));
        };
        let record = match record.kvs().first() {
            Some(kv) => {
                Some(decode(kv.value()).ok_or_else(|| unreadable(key, "idempotency state"))?)
            }
            None => None,
        };
        Ok(match record {
            Some(r) if r.kind == RESULT => IdempotencyState::Completed(IdempotencyRecord {
                fingerprint: r.fingerprint,
                result: r.payload,
                expires_in: r.expires_in,
            }),
            _ if contenders.count() > 0 => IdempotencyState::InFlight,
            Some(mark) => IdempotencyState::Started {
                fingerprint: mark.fingerprint,
                expires_in: mark.expires_in,
            },
            None => IdempotencyState::Absent,
        })
    }
}

fn unreadable(key: &LockKey, operation: &'static str) -> LockError {
    LockError::protocol(
        operation,
        key.user(),
        "etcd answered with a record or transaction this backend did not write",
    )
}
