//! Idempotency records on etcd: one key `N K/result` holding a result or a "started" mark,
//! bound to a lease of the record's TTL, written only while our contender key is still the one
//! we created (in the same transaction).
//!
//! Value: a kind byte (`R` result, `M` mark), the expiry in Unix milliseconds (8 bytes, big
//! endian: etcd tells a key's lease but not its remaining TTL in a read), the fingerprint's
//! length (4 bytes, big endian), the fingerprint, then the result or the mark's id.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};

use super::EtcdBackend;
use crate::LockError;
use crate::idempotency::{IdempotencyRecord, IdempotencyState, Marked};
use crate::key::LockKey;
use crate::token::Token;

const RESULT: u8 = b'R';
const MARK: u8 = b'M';

/// A record read back.
#[derive(Debug, PartialEq, Eq)]
struct Record {
    kind: u8,
    fingerprint: String,
    payload: Vec<u8>,
    expires_in: Duration,
}

fn encode(kind: u8, ttl: Duration, fingerprint: &str, payload: &[u8]) -> Vec<u8> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let expiry = u64::try_from((now + ttl).as_millis()).unwrap_or(u64::MAX);
    let fp_len = u32::try_from(fingerprint.len()).unwrap_or(u32::MAX);
    let mut value = Vec::with_capacity(13 + fingerprint.len() + payload.len());
    value.push(kind);
    value.extend_from_slice(&expiry.to_be_bytes());
    value.extend_from_slice(&fp_len.to_be_bytes());
    value.extend_from_slice(fingerprint.as_bytes());
    value.extend_from_slice(payload);
    value
}

/// `None` for a value this backend did not write.
fn decode(value: &[u8]) -> Option<Record> {
    let (&kind, rest) = value.split_first()?;
    if kind != RESULT && kind != MARK {
        return None;
    }
    let (expiry, rest) = rest.split_first_chunk::<8>()?;
    let (fp_len, rest) = rest.split_first_chunk::<4>()?;
    let fp_len = usize::try_from(u32::from_be_bytes(*fp_len)).ok()?;
    if rest.len() < fp_len {
        return None;
    }
    let (fingerprint, payload) = rest.split_at(fp_len);
    let expiry = Duration::from_millis(u64::from_be_bytes(*expiry));
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Some(Record {
        kind,
        fingerprint: String::from_utf8(fingerprint.to_vec()).ok()?,
        payload: payload.to_vec(),
        expires_in: expiry.saturating_sub(now),
    })
}

impl EtcdBackend {
    /// A lease of `ttl` (rounded up to whole seconds) for one record.
    async fn record_lease(&self, key: &LockKey, ttl: Duration) -> Result<i64, LockError> {
        let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
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
                Some(PutOptions::new().with_lease(lease)),
            )]);
        let mut kv = self.inner.client.kv_client();
        let answer = self.bounded("store result", Some(key), kv.txn(txn)).await;
        let written = answer
            .as_ref()
            .is_ok_and(etcd_client::TxnResponse::succeeded);
        if !written {
            self.revoke_later(lease);
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

#[cfg(test)]
mod codec_tests {
    use super::*;

    #[test]
    fn records_round_trip_and_garbage_is_refused() {
        let value = encode(RESULT, Duration::from_secs(60), "fp", &[0, 255]);
        let record = decode(&value).unwrap();
        assert_eq!(record.kind, RESULT);
        assert_eq!(record.fingerprint, "fp");
        assert_eq!(record.payload, vec![0, 255]);
        assert!(record.expires_in > Duration::from_secs(58));
        for bad in [&b""[..], b"X", b"R123", &value[..12]] {
            assert_eq!(decode(bad), None);
        }
    }
}
