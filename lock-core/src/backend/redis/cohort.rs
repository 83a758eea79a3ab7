//! The Redis side of local hand-off (lock cohorting): at the bound of local turns, one script
//! call keeps the lock when no waiter of another process queues for it, or releases it to the
//! oldest live one.

use std::sync::LazyLock;

use redis::{Script, Value};

use super::RedisBackend;
use crate::LockError;
use crate::backend::Kept;
use crate::key::LockKey;
use crate::token::Token;

static KEEP: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("scripts/fence.lua"),
        include_str!("scripts/handoff.lua"),
        include_str!("scripts/keep.lua")
    ))
});

impl RedisBackend {
    pub(crate) async fn keep_if_alone(
        &self,
        key: &LockKey,
        token: &Token,
    ) -> Result<Kept, LockError> {
        let channel = key.channel();
        let mut call = KEEP.prepare_invoke();
        call.key(key.name())
            .key(key.fence())
            .key(key.queue())
            .key(key.waiters())
            .arg(token.as_str())
            .arg(&channel)
            .arg(if self.inner.sharded { "1" } else { "0" });
        let reply = self.invoke(&call, "release", Some(key.user())).await?;
        match &reply {
            Value::Int(2) => Ok(Kept::Alone),
            Value::Int(1) => {
                self.inner.subscriber.deliver(&channel, b"released");
                Ok(Kept::Released)
            }
            Value::Int(0) => Ok(Kept::NotOurs),
            Value::Array(items) => match items.as_slice() {
                [Value::Int(1), Value::BulkString(message)] => {
                    // As after a release: this process's waiters learn at once, and the key's
                    // next releases go straight to the hand-over (release.rs).
                    self.inner.contention.note(key);
                    self.inner.subscriber.deliver(&channel, message);
                    Ok(Kept::Released)
                }
                _ => Err(protocol(key, &reply)),
            },
            _ => Err(protocol(key, &reply)),
        }
    }
}

fn protocol(key: &LockKey, reply: &Value) -> LockError {
    LockError::protocol(
        "release",
        key.user(),
        format!("keep-if-alone script answered {reply:?}"),
    )
}
