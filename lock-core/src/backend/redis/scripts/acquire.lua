-- Acquire a lock in one atomic step, optionally drawing a fencing token.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the fencing counter key (same hash slot; touched only when ARGV[3] == '1'; see
--          fence.lua, prepended to this script)
-- ARGV[1]  the owner token (128 random bits, hex)
-- ARGV[2]  the lease in milliseconds
-- ARGV[3]  '1' to increment and return the fencing counter, '0' not to
-- ARGV[4]  the stamp after the token: '|<since>|<holder>|', or '' (see release_fast.lua)
--
-- A lock this acquires is not marked (release_fast.lua): waiters that queued while it was free
-- mark it at their next attempt, which their own timer sends when it was free.
--
-- Running it twice with one token is safe: a retry after a dropped connection finds the lock
-- already holding its token and counts it as acquired.
--
-- Returns {1, fence} when acquired (fence is 0 when not fenced),
--         {0, pttl}  when held by someone else (pttl as PTTL reports it: -1 = no expiry).
-- Checked before anything is written: an unusable counter fails the attempt, which takes nothing.
local fence_last = ARGV[3] == '1' and last_fence(KEYS[2])
local ours = redis.call('SET', KEYS[1], ARGV[1] .. ARGV[4], 'NX', 'PX', ARGV[2])
if not ours then
  -- Ours already (a retry), possibly marked since by a waiter ('+' appended, see
  -- release_fast.lua): its stamp stays, with the time it was first taken.
  local value = redis.call('GET', KEYS[1])
  local owner = value and string.sub(value, 1, #ARGV[1] + 1)
  if owner == ARGV[1] or owner == ARGV[1] .. '|' or owner == ARGV[1] .. '+' then
    ours = redis.call('PEXPIRE', KEYS[1], ARGV[2]) == 1
  end
end
if ours then
  if ARGV[3] == '1' then
    return {1, next_fence(KEYS[2], fence_last)}
  end
  return {1, 0}
end
return {0, redis.call('PTTL', KEYS[1])}
