-- Release a lock that no waiter is known to queue for: one key, a compare-and-delete, the
-- release most locks get (what a bare `GET`/`DEL` script costs the server).
--
-- A waiter that queues behind a holder marks the lock: its value becomes the holder's token
-- plus '+' (acquire_queued.lua, every time it leaves its caller queued; handoff.lua and
-- acquire_queued.lua when the lock they hand or take still has waiters). A marked lock is
-- left as it is here: the caller sends release.lua, which hands it over or announces it.
--
-- KEYS[1]  the lock key
-- ARGV[1]  the owner token
--
-- Returns 1 when the lock was ours and is now deleted, 2 when it is ours and marked (nothing
-- done), 0 when it was not ours (expired or taken).
local value = redis.call('GET', KEYS[1])
if value == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
if value == ARGV[1] .. '+' then
  return 2
end
return 0
