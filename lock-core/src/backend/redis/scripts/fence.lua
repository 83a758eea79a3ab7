-- Prepended to every script that may draw a fencing token (acquire, acquire_queued, and through
-- handoff.lua release and leave).
--
-- A token is strictly above the last one drawn for the lock (kept in the counter key) and never
-- below the server's clock in microseconds. So tokens keep rising when the counter is lost with
-- the server's data (a restart without persistence, FLUSHALL, a failover to a replica that had
-- not seen the last draw) or when it expires: the counter needs no life of its own and carries
-- the lease it was drawn for as its TTL. This holds as long as the server's clock does not go
-- backwards, and as long as no key draws more than one token per microsecond (each draw is a
-- whole script call, so the counter can only ever be a few microseconds ahead of the clock).
-- Microseconds since 1970 stay below 2^53, exact in Lua's doubles, until the year 2255.
--
-- Returns the token, as a number.
local function next_fence(counter, ttl_ms)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local fence = tonumber(redis.call('GET', counter) or '0') + 1
  if fence < now then
    fence = now
  end
  -- '%d': a plain number argument would be sent as '%.14g', losing digits.
  redis.call('SET', counter, string.format('%d', fence), 'PX', ttl_ms)
  return fence
end
