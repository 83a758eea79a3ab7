-- Prepended to every script that may draw a fencing token (acquire, acquire_queued, and through
-- handoff.lua release and leave).
--
-- A token is strictly above the last one drawn for the lock (kept in the counter key) and never
-- below the server's clock in microseconds. The counter has no TTL (DESIGN: tokens must never go
-- backwards): while it lives, a token is last + 1 at least, whatever the clock does. When it is
-- lost with the server's data (a restart without persistence, FLUSHALL, eviction, a failover to
-- a replica that had not seen the last draw), the clock keeps tokens rising, as long as it has
-- not gone backwards, and as long as no key draws more than one token per microsecond (each
-- draw is a whole script call, so the counter can only ever be a few microseconds ahead of the
-- clock). It costs one small key per fenced lock name.
-- Microseconds since 1970 stay below 2^53, exact in Lua's doubles, until the year 2255.
--
-- A counter that is not a whole number below 2^53 - 1 (written by something else, or corrupt)
-- is refused: past 2^53 a double cannot count on by one, and a token would repeat, or the
-- counter be written back lower. `last_fence` checks it before the script writes anything:
-- an acquire fails with an error and takes nothing; a hand-over leaves that waiter to take the
-- lock itself (its own attempt then fails), and the release goes on.

-- The last token drawn for the lock (0 when none); raises an error for an unusable counter.
local function last_fence(counter)
  local last = redis.call('GET', counter) or '0'
  if not string.match(last, '^%d+$') or tonumber(last) >= 9007199254740991 then
    error('fence counter ' .. counter .. ' holds no whole number below 2^53 - 1')
  end
  return tonumber(last)
end

-- Draws the next token after `last` (from `last_fence`, in the same script); returns it, as a
-- number.
local function next_fence(counter, last)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local fence = last + 1
  if fence < now then
    fence = now
  end
  -- '%d': a plain number argument would be sent as '%.14g', losing digits.
  redis.call('SET', counter, string.format('%d', fence))
  return fence
end
