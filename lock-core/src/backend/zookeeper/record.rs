//! Idempotency records on ZooKeeper: one TTL node `R/K/result` holding a result or a "started"
//! mark (the value of `record_codec`), written in a multi-op whose first operation checks that
//! our contender node still exists. TTL nodes need the servers' `zookeeper.extendedTypesEnabled`
//! (a Java system property); without it a write is refused with a clear `InvalidConfig`.

use std::time::Duration;

use zookeeper_client as zk;

use super::ZooKeeperBackend;
use super::session::Session;
use super::{backend_error, timed_out};
use crate::LockError;
use crate::backend::record_codec::{MARK, RESULT, decode, encode};
use crate::idempotency::{IdempotencyRecord, IdempotencyState, Marked};
use crate::key::LockKey;
use crate::token::Token;

/// How a multi-op that checks our node first ended.
enum Written {
    Done,
    /// Our node is gone (or was never ours).
    NotOurs,
    /// The check held; an operation after it failed with this error.
    Failed(zk::Error),
}

impl ZooKeeperBackend {
    /// `R/K/result`.
    fn record_path(&self, key: &LockKey) -> String {
        format!("{}/result", self.lock_path(key))
    }

    /// Our node for `token` on the live session: the session and the node's path.
    fn ours(&self, key: &LockKey, token: &Token) -> Option<(std::sync::Arc<Session>, String)> {
        let session = self.inner.sessions.live()?;
        let path = self
            .inner
            .contenders
            .lock()
            .get(&Self::contender_id(key, token))
            .filter(|c| c.session == session.id)
            .map(|c| c.path.clone())?;
        Some((session, path))
    }

    /// Refuses a record whose request the servers would not read.
    fn fits(&self, value: &[u8]) -> Result<(), LockError> {
        let most = self
            .inner
            .max_request
            .saturating_sub(super::REQUEST_OVERHEAD);
        if value.len() > most {
            return Err(LockError::config(format!(
                "an idempotency record of {} bytes does not fit in one ZooKeeper request: the servers read at most {} bytes (jute.maxbuffer); raise -Djute.maxbuffer on the servers and ZooKeeperBackendBuilder::max_request",
                value.len(),
                self.inner.max_request
            )));
        }
        Ok(())
    }

    fn record_options(&self, ttl: Duration) -> Result<zk::CreateOptions<'static>, LockError> {
        if ttl.is_zero() || ttl > crate::MAX_RESULT_TTL {
            return Err(LockError::config(format!(
                "record TTL {ttl:?} is out of range: above zero and at most {:?}",
                crate::MAX_RESULT_TTL
            )));
        }
        // ZooKeeper counts TTLs in milliseconds, at least one.
        let ttl = ttl.max(Duration::from_millis(1));
        Ok(zk::CreateMode::Persistent
            .with_acls(self.inner.acls())
            .with_ttl(ttl))
    }

    /// Runs `ops` after a check that our node `ours` exists, in one multi-op.
    async fn checked(
        &self,
        session: &Session,
        key: &LockKey,
        ours: &str,
        operation: &'static str,
        ops: impl FnOnce(&mut zk::CheckWriter<'_>) -> Result<(), zk::Error>,
    ) -> Result<Written, LockError> {
        let user = Some(key.user());
        let mut writer = session
            .client
            .new_check_writer(ours, None)
            .map_err(|e| backend_error(operation, user, e))?;
        ops(&mut writer).map_err(|e| backend_error(operation, user, e))?;
        match self.within(writer.commit()).await {
            Some(Ok(_)) => Ok(Written::Done),
            Some(Err(zk::CheckWriteError::CheckFailed { .. })) => Ok(Written::NotOurs),
            Some(Err(zk::CheckWriteError::OperationFailed { source, .. })) => {
                Ok(Written::Failed(source))
            }
            Some(Err(zk::CheckWriteError::RequestFailed { source })) => {
                Err(record_error(operation, key, source))
            }
            None => Err(timed_out(operation, user)),
        }
    }

    pub(super) async fn store_record(
        &self,
        key: &LockKey,
        token: &Token,
        fingerprint: &str,
        result: &[u8],
        ttl: Duration,
    ) -> Result<bool, LockError> {
        let options = self.record_options(ttl)?;
        let Some((session, ours)) = self.ours(key, token) else {
            return Ok(false);
        };
        let rk = self.record_path(key);
        let value = encode(RESULT, ttl, fingerprint, result);
        self.fits(&value)?;
        // Replaces a mark (or an older record): only the lock's holder writes here. The TTL of
        // a node is set when it is made, so the old one goes and a new one comes.
        for _ in 0..3 {
            let existing = self
                .bounded("store result", Some(key), session.client.check_stat(&rk))
                .await?;
            let written = self
                .checked(&session, key, &ours, "store result", |w| {
                    if let Some(old) = existing {
                        w.add_delete(&rk, Some(old.version))?;
                    }
                    w.add_create(&rk, &value, &options)
                })
                .await?;
            match written {
                Written::Done => return Ok(true),
                Written::NotOurs => return Ok(false),
                // The record changed between the read and the write: read again.
                Written::Failed(
                    zk::Error::NoNode | zk::Error::NodeExists | zk::Error::BadVersion,
                ) => {}
                Written::Failed(e) => return Err(record_error("store result", key, e)),
            }
        }
        Err(LockError::protocol(
            "store result",
            key.user(),
            "the idempotency record kept changing under the lock's holder",
        ))
    }

    pub(super) async fn write_mark(
        &self,
        key: &LockKey,
        token: &Token,
        mark: &Token,
        fingerprint: &str,
        ttl: Duration,
    ) -> Result<Marked, LockError> {
        let options = self.record_options(ttl)?;
        let Some((session, ours)) = self.ours(key, token) else {
            return Ok(Marked::NotOurs);
        };
        let rk = self.record_path(key);
        let value = encode(MARK, ttl, fingerprint, mark.as_str().as_bytes());
        self.fits(&value)?;
        let written = self
            .checked(&session, key, &ours, "mark started", |w| {
                w.add_create(&rk, &value, &options)
            })
            .await?;
        match written {
            Written::Done => return Ok(Marked::Written),
            Written::NotOurs => return Ok(Marked::NotOurs),
            Written::Failed(zk::Error::NodeExists) => {}
            Written::Failed(e) => return Err(record_error("mark started", key, e)),
        }
        // A record is there: what is it?
        let found = self
            .within(session.client.get_data(&rk))
            .await
            .ok_or_else(|| timed_out("mark started", Some(key.user())))?;
        let (value, _) = match found {
            Ok(found) => found,
            // Gone meanwhile (its TTL ended): the caller asks again.
            Err(zk::Error::NoNode) => {
                return Err(LockError::protocol(
                    "mark started",
                    key.user(),
                    "the idempotency record went as it was read",
                ));
            }
            Err(e) => return Err(record_error("mark started", key, e)),
        };
        let record = decode(&value).ok_or_else(|| unreadable(key, "mark started"))?;
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
        let Some((session, ours)) = self.ours(key, token) else {
            return Ok(false);
        };
        let rk = self.record_path(key);
        let found = self
            .within(session.client.get_data(&rk))
            .await
            .ok_or_else(|| timed_out("clear started", Some(key.user())))?;
        let (value, stat) = match found {
            Ok(found) => found,
            Err(zk::Error::NoNode) => return Ok(true),
            Err(e) => return Err(record_error("clear started", key, e)),
        };
        let ours_mark =
            decode(&value).is_some_and(|r| r.kind == MARK && r.payload == mark.as_str().as_bytes());
        if !ours_mark {
            return Ok(true);
        }
        let written = self
            .checked(&session, key, &ours, "clear started", |w| {
                w.add_delete(&rk, Some(stat.version))
            })
            .await?;
        Ok(matches!(written, Written::Done))
    }

    pub(super) async fn read_state(&self, key: &LockKey) -> Result<IdempotencyState, LockError> {
        let session = self.inner.sessions.current().await?;
        let (rk, dir) = (self.record_path(key), self.lock_path(key));
        let mut reader = session.client.new_multi_reader();
        reader
            .add_get_data(&rk)
            .and_then(|()| reader.add_get_children(&dir))
            .map_err(|e| backend_error("idempotency state", Some(key.user()), e))?;
        let answer = self
            .bounded("idempotency state", Some(key), reader.commit())
            .await?;
        let mut answer = answer.into_iter();
        let record = match answer.next() {
            Some(zk::MultiReadResult::Data { data, .. }) => {
                Some(decode(&data).ok_or_else(|| unreadable(key, "idempotency state"))?)
            }
            Some(zk::MultiReadResult::Error {
                err: zk::Error::NoNode,
            }) => None,
            Some(zk::MultiReadResult::Error { err }) => {
                return Err(record_error("idempotency state", key, err));
            }
            _ => return Err(unreadable(key, "idempotency state")),
        };
        let contenders = match answer.next() {
            Some(zk::MultiReadResult::Children { children }) => children
                .iter()
                .filter(|c| super::lock::is_contender(c))
                .count(),
            Some(zk::MultiReadResult::Error {
                err: zk::Error::NoNode,
            }) => 0,
            Some(zk::MultiReadResult::Error { err }) => {
                return Err(record_error("idempotency state", key, err));
            }
            _ => return Err(unreadable(key, "idempotency state")),
        };
        Ok(match record {
            Some(r) if r.kind == RESULT => IdempotencyState::Completed(IdempotencyRecord {
                fingerprint: r.fingerprint,
                result: r.payload,
                expires_in: r.expires_in,
            }),
            _ if contenders > 0 => IdempotencyState::InFlight,
            Some(mark) => IdempotencyState::Started {
                fingerprint: mark.fingerprint,
                expires_in: mark.expires_in,
            },
            None => IdempotencyState::Absent,
        })
    }
}

/// A record write refused: TTL nodes turned off on the servers is a configuration matter.
fn record_error(operation: &'static str, key: &LockKey, e: zk::Error) -> LockError {
    if matches!(e, zk::Error::Unimplemented | zk::Error::BadArguments(_)) {
        return LockError::config(format!(
            "ZooKeeper refused to {operation}: {e} (idempotency records are TTL nodes: start the servers with -Dzookeeper.extendedTypesEnabled=true)"
        ));
    }
    backend_error(operation, Some(key.user()), e)
}

fn unreadable(key: &LockKey, operation: &'static str) -> LockError {
    LockError::protocol(
        operation,
        key.user(),
        "ZooKeeper answered with a record this backend did not write",
    )
}
