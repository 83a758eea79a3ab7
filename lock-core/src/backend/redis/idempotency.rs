//! The idempotency result store on Redis: a hash `P{T}S:result` (fields `fingerprint` and
//! `result`, with a TTL; or `fingerprint` and `started`, the writer's token, for a "started"
//! mark) beside the lock `P{T}S`, in its hash slot. Written by `mark_started.lua`,
//! `store_result.lua` and `clear_started.lua` only while the lock holds the writer's token;
//! read with the lock's state by `result_state.lua`, one call each.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Script, Value};

use super::{RedisBackend, millis};
use crate::LockError;
use crate::idempotency::{IdempotencyRecord, IdempotencyState, Marked};
use crate::key::LockKey;
use crate::token::Token;

static STORE_RESULT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/store_result.lua")));
static RESULT_STATE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/result_state.lua")));
static MARK_STARTED: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/mark_started.lua")));
static CLEAR_STARTED: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/clear_started.lua")));

impl RedisBackend {
    pub(crate) async fn store_result(
        &self,
        key: &LockKey,
        token: &Token,
        fingerprint: &str,
        result: &[u8],
        ttl: Duration,
    ) -> Result<bool, LockError> {
        let mut call = STORE_RESULT.prepare_invoke();
        call.key(key.name())
            .key(key.result())
            .arg(token.as_str())
            .arg(fingerprint)
            .arg(result)
            .arg(millis(ttl));
        // Safe to run twice (the retry after a dropped connection): the same record again,
        // and only while the lock is still ours.
        match self.invoke(&call, "store result", Some(key.user())).await? {
            Value::Int(1) => Ok(true),
            Value::Int(0) => Ok(false),
            other => Err(LockError::protocol(
                "store result",
                key.user(),
                format!("store script answered {other:?}"),
            )),
        }
    }

    pub(crate) async fn mark_started(
        &self,
        key: &LockKey,
        token: &Token,
        mark: &Token,
        fingerprint: &str,
        ttl: Duration,
    ) -> Result<Marked, LockError> {
        let mut call = MARK_STARTED.prepare_invoke();
        call.key(key.name())
            .key(key.result())
            .arg(token.as_str())
            .arg(fingerprint)
            .arg(millis(ttl))
            .arg(mark.as_str());
        // Safe to run twice: a mark of this id found again answers "written".
        let reply = self.invoke(&call, "mark started", Some(key.user())).await?;
        parse_marked(&reply).ok_or_else(|| {
            LockError::protocol(
                "mark started",
                key.user(),
                format!("mark script answered {}", shown(&reply)),
            )
        })
    }

    pub(crate) async fn clear_started(
        &self,
        key: &LockKey,
        token: &Token,
        mark: &Token,
    ) -> Result<bool, LockError> {
        let mut call = CLEAR_STARTED.prepare_invoke();
        call.key(key.name())
            .key(key.result())
            .arg(token.as_str())
            .arg(mark.as_str());
        match self
            .invoke(&call, "clear started", Some(key.user()))
            .await?
        {
            Value::Int(1) => Ok(true),
            Value::Int(0) => Ok(false),
            other => Err(LockError::protocol(
                "clear started",
                key.user(),
                format!("clear script answered {other:?}"),
            )),
        }
    }

    pub(crate) async fn idempotency_state(
        &self,
        key: &LockKey,
    ) -> Result<IdempotencyState, LockError> {
        // Once per key prefix, as before a first acquire (a success is remembered).
        self.check_permissions_of(key)
            .await
            .map_err(|e| super::permissions::for_operation(e, "nothing was locked"))?;
        let mut call = RESULT_STATE.prepare_invoke();
        call.key(key.name()).key(key.result());
        let reply = self
            .invoke(&call, "idempotency state", Some(key.user()))
            .await?;
        parse_state(&reply).ok_or_else(|| {
            LockError::protocol(
                "idempotency state",
                key.user(),
                format!("state script answered {}", shown(&reply)),
            )
        })
    }
}

fn parse_state(reply: &Value) -> Option<IdempotencyState> {
    let Value::Array(items) = reply else {
        return None;
    };
    match items.as_slice() {
        [Value::Int(0)] => Some(IdempotencyState::Absent),
        [Value::Int(2)] => Some(IdempotencyState::InFlight),
        [
            Value::Int(1),
            Value::BulkString(fingerprint),
            Value::BulkString(result),
            Value::Int(pttl),
        ] => Some(IdempotencyState::Completed(IdempotencyRecord {
            fingerprint: String::from_utf8(fingerprint.clone()).ok()?,
            result: result.clone(),
            expires_in: expires_in(*pttl),
        })),
        [
            Value::Int(3),
            Value::BulkString(fingerprint),
            Value::Int(pttl),
        ] => Some(IdempotencyState::Started {
            fingerprint: String::from_utf8(fingerprint.clone()).ok()?,
            expires_in: expires_in(*pttl),
        }),
        _ => None,
    }
}

fn parse_marked(reply: &Value) -> Option<Marked> {
    let Value::Array(items) = reply else {
        return None;
    };
    match items.as_slice() {
        [Value::Int(1)] => Some(Marked::Written),
        [Value::Int(0)] => Some(Marked::NotOurs),
        [Value::Int(3)] => Some(Marked::Completed),
        [
            Value::Int(2),
            Value::BulkString(fingerprint),
            Value::Int(pttl),
        ] => Some(Marked::Started {
            fingerprint: String::from_utf8(fingerprint.clone()).ok()?,
            expires_in: expires_in(*pttl),
        }),
        _ => None,
    }
}

/// A PTTL as a duration: `Duration::MAX` for a key without expiry (-1).
fn expires_in(pttl: i64) -> Duration {
    u64::try_from(pttl).map_or(Duration::MAX, Duration::from_millis)
}

/// A reply for an error message: its shape, never the stored bytes (a result may be large or
/// hold data that does not belong in logs).
fn shown(reply: &Value) -> String {
    match reply {
        Value::Array(items) => format!(
            "an array of {} ({})",
            items.len(),
            items
                .iter()
                .map(|v| match v {
                    Value::Int(i) => i.to_string(),
                    Value::BulkString(b) => format!("{} bytes", b.len()),
                    other => format!("{:?}", std::mem::discriminant(other)),
                })
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Value::Int(i) => i.to_string(),
        _ => "an unexpected value".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_parse() {
        let arr = |v: Vec<Value>| Value::Array(v);
        assert_eq!(
            parse_state(&arr(vec![Value::Int(0)])),
            Some(IdempotencyState::Absent)
        );
        assert_eq!(
            parse_state(&arr(vec![Value::Int(2)])),
            Some(IdempotencyState::InFlight)
        );
        let done = parse_state(&arr(vec![
            Value::Int(1),
            Value::BulkString(b"fp".to_vec()),
            Value::BulkString(vec![0, 255]),
            Value::Int(1500),
        ]));
        assert_eq!(
            done,
            Some(IdempotencyState::Completed(IdempotencyRecord {
                fingerprint: "fp".into(),
                result: vec![0, 255],
                expires_in: Duration::from_millis(1500),
            }))
        );
        let no_ttl = parse_state(&arr(vec![
            Value::Int(1),
            Value::BulkString(b"fp".to_vec()),
            Value::BulkString(Vec::new()),
            Value::Int(-1),
        ]));
        assert!(
            matches!(no_ttl, Some(IdempotencyState::Completed(r)) if r.expires_in == Duration::MAX)
        );
        // Garbage is None (a protocol error), never a panic; a fingerprint that is not UTF-8 too.
        for bad in [
            Value::Int(1),
            arr(vec![]),
            arr(vec![Value::Int(7)]),
            arr(vec![
                Value::Int(1),
                Value::BulkString(vec![0xff]),
                Value::BulkString(vec![]),
                Value::Int(1),
            ]),
        ] {
            assert_eq!(parse_state(&bad), None);
        }
        assert!(!shown(&arr(vec![Value::BulkString(b"secret".to_vec())])).contains("secret"));
        assert_eq!(
            parse_state(&arr(vec![
                Value::Int(3),
                Value::BulkString(b"fp".to_vec()),
                Value::Int(-1),
            ])),
            Some(IdempotencyState::Started {
                fingerprint: "fp".into(),
                expires_in: Duration::MAX,
            })
        );
    }

    #[test]
    fn mark_answers_parse() {
        let arr = |v: Vec<Value>| Value::Array(v);
        assert_eq!(
            parse_marked(&arr(vec![Value::Int(1)])),
            Some(Marked::Written)
        );
        assert_eq!(
            parse_marked(&arr(vec![Value::Int(0)])),
            Some(Marked::NotOurs)
        );
        assert_eq!(
            parse_marked(&arr(vec![Value::Int(3)])),
            Some(Marked::Completed)
        );
        assert_eq!(
            parse_marked(&arr(vec![
                Value::Int(2),
                Value::BulkString(b"fp".to_vec()),
                Value::Int(900),
            ])),
            Some(Marked::Started {
                fingerprint: "fp".into(),
                expires_in: Duration::from_millis(900),
            })
        );
        for bad in [
            Value::Int(1),
            arr(vec![Value::Int(2)]),
            arr(vec![
                Value::Int(2),
                Value::BulkString(vec![0xff]),
                Value::Int(1),
            ]),
        ] {
            assert_eq!(parse_marked(&bad), None);
        }
    }
}
