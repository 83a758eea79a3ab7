//! For the Redlock backend (`backend::redlock`): a waiter's announcement in a lock's queue on
//! one server, without a token (see `scripts/redlock_waiter.lua`): releases there then publish
//! on the lock's channel, and never hand the lock over.

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

use super::{RedisBackend, millis};
use crate::LockError;
use crate::key::LockKey;

static WAITER: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/redlock_waiter.lua")));

impl RedisBackend {
    /// Announces `ticket` as a waiter of `key` for `ttl` (refreshing it), or takes it out
    /// (`announce` false).
    pub(crate) async fn redlock_waiter(
        &self,
        key: &LockKey,
        ticket: &str,
        ttl: Duration,
        announce: bool,
    ) -> Result<(), LockError> {
        let mut call = WAITER.prepare_invoke();
        call.key(key.queue())
            .key(key.waiters())
            .arg(ticket)
            .arg(millis(ttl))
            .arg(if announce { "1" } else { "0" });
        self.invoke(&call, "wait", Some(key.user())).await?;
        Ok(())
    }
}

static TAKE_BACK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "local v = redis.call('GET', KEYS[1]) local o = v and string.sub(v, 1, #ARGV[1] + 1) \
         if o == ARGV[1] or o == ARGV[1] .. '|' or o == ARGV[1] .. '+' then \
         return redis.call('DEL', KEYS[1]) end return 0",
    )
});

impl RedisBackend {
    /// Deletes the lock of `key` if it holds `token`, announcing nothing: what a Redlock attempt
    /// that did not get a majority took on this server. A delete, not an expiry: the key would
    /// answer busy to every contender for the rest of its lease.
    pub(crate) async fn redlock_take_back(
        &self,
        key: &LockKey,
        token: &crate::token::Token,
    ) -> Result<bool, LockError> {
        let mut call = TAKE_BACK.prepare_invoke();
        call.key(key.name()).arg(token.as_str());
        let reply = self.invoke(&call, "release", Some(key.user())).await?;
        Ok(reply == redis::Value::Int(1))
    }
}
