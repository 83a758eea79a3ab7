-- Release a lock that no waiter is known to queue for: one key, a compare-and-delete, the
-- release most locks get (what a bare `GET`/`DEL` script costs the server).
--
-- A lock's value is its holder's token, then (from holders that name themselves) a stamp
-- '|<since>|<holder>|': when it was taken, in ms since 1970 by the clock of whoever wrote it
-- (the acquiring client, or the server for a hand-over), and the holder's identity, for
-- inspection (inspect.lua). Every script reads the token as the value's head: the token
-- alone, or followed by '|' or '+'. Tokens all have one length, so no token is the head of
-- another's value.
--
-- A waiter that queues behind a holder marks the lock: '+' is appended to its value
-- (acquire_queued.lua, every time it leaves its caller queued; handoff.lua and
-- acquire_queued.lua when the lock they hand or take still has waiters). A marked lock is
-- left as it is here: the caller sends release.lua, which hands it over or announces it.
--
-- KEYS[1]  the lock key
-- ARGV[1]  the owner token
--
-- Returns 1 when the lock was ours and is now deleted, 2 when it is ours and marked (nothing
-- done), 0 when it was not ours (expired or taken).
local value, token = redis.call('GET', KEYS[1]), ARGV[1]
if value ~= token then
  -- Not the token alone: the token, then '|' (124) or '+' (43). A byte and a plain find at 1:
  -- no string is made (a substring or a concatenation is made, hashed and interned).
  local after = value and string.byte(value, #token + 1)
  if not ((after == 124 or after == 43) and string.find(value, token, 1, true) == 1) then
    return 0
  end
  if string.byte(value, -1) == 43 then
    return 2
  end
end
redis.call('DEL', KEYS[1])
return 1
