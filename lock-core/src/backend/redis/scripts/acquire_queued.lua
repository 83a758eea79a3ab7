-- Acquire a lock, or take (or refresh) a place in its queue of waiters, where a release can
-- hand the lock straight to this waiter (handoff.lua).
--
-- KEYS[1]  the lock key
-- KEYS[2]  the fencing counter key (see fence.lua, prepended to this script)
-- KEYS[3]  the queue (list of waiter tickets, oldest first)
-- KEYS[4]  the waiters (hash: ticket -> 'expiry|generation|lease|fenced|token|holder')
-- ARGV[1]  the owner token
-- ARGV[2]  the lease in milliseconds
-- ARGV[3]  '1' to draw a fencing token, '0' not to
-- ARGV[4]  this waiter's ticket (random, not secret)
-- ARGV[5]  how long the ticket lives without a refresh, in ms; '0' = one attempt, never queue
-- ARGV[6]  this attempt's generation (a handover names it)
-- ARGV[7]  the lease a handover sets, in milliseconds
-- ARGV[8]  '1' fair: take a free lock only at the queue's head; '0': whatever the place
-- ARGV[9]  the release channel (same hash slot as KEYS[1])
-- ARGV[10] '1' to publish with SPUBLISH (sharded pub/sub, Redis 7+), '0' for PUBLISH
-- ARGV[11] the stamp after the token: '|<since>|<holder>|', or '' (see release_fast.lua); a
--          hand-over to this waiter stamps the lock with its holder and the server's time
--
-- A fair waiter that joins the queue says so on the lock's channel ('fair:<ticket>'): a
-- process passing the lock between its own tasks (local hand-off) gives it back to the queue
-- at its next release instead.
--
-- The lock's value is its holder's token and stamp, plus '+' once a waiter queues behind it (the
-- mark, see release_fast.lua): this script marks the lock every time it leaves its caller queued
-- behind a holder, and marks the lock it takes when other waiters still have entries. So
-- whenever a live waiter waits on a held lock, the lock is marked, and a one-key release
-- (release_fast.lua) never deletes it without the hand-over.
--
-- Running it twice with one token is safe (a retry after a dropped connection, or a handover
-- whose message has not arrived yet, finds the lock holding the token: acquired, lease reset).
-- In fair mode, dead tickets (not refreshed in time, or without an entry: taken or gone) at the
-- head are dropped first.
-- Returns {1, fence} when acquired (fence 0 when not fenced),
--         {0, pttl}  otherwise (-2 when the lock is free but it is another waiter's turn).
-- Checked before anything is written: an unusable counter fails the attempt, which takes nothing.
local fence_last = ARGV[3] == '1' and last_fence(KEYS[2])
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function mark()
  local value = redis.call('GET', KEYS[1])
  if value and string.sub(value, -1) ~= '+' then
    redis.call('APPEND', KEYS[1], '+')
  end
end
local function taken()
  -- The ticket's entry goes; its item in the list is dropped when it reaches the head (an item
  -- without an entry counts as dead there). No LREM: it would cost O(queue length) per taker,
  -- O(N^2) for N fair waiters.
  if redis.call('HDEL', KEYS[4], ARGV[4]) == 1 and redis.call('LINDEX', KEYS[3], 0) == ARGV[4] then
    redis.call('LPOP', KEYS[3])
  end
  -- Other waiters have entries: the lock taken is marked for them.
  if redis.call('EXISTS', KEYS[4]) == 1 then
    mark()
  end
  if ARGV[3] == '1' then
    return {1, next_fence(KEYS[2], fence_last)}
  end
  return {1, 0}
end
local function ours()
  local value = redis.call('GET', KEYS[1])
  local owner = value and string.sub(value, 1, #ARGV[1] + 1)
  if owner == ARGV[1] or owner == ARGV[1] .. '|' or owner == ARGV[1] .. '+' then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return true
  end
  return false
end
local now
if ARGV[8] ~= '1' then
  -- Not fair: a free lock is taken whatever the queue holds.
  if redis.call('SET', KEYS[1], ARGV[1] .. ARGV[11], 'NX', 'PX', ARGV[2]) or ours() then
    return taken()
  end
else
  if ours() then
    return taken()
  end
  local head
  while true do
    head = redis.call('LINDEX', KEYS[3], 0)
    if not head or head == ARGV[4] then
      break
    end
    now = now or now_ms()
    local entry = redis.call('HGET', KEYS[4], head) or '0'
    if tonumber(string.match(entry, '^%d+') or '0') > now then
      break
    end
    redis.call('LPOP', KEYS[3])
    redis.call('HDEL', KEYS[4], head)
  end
  if (not head or head == ARGV[4]) and redis.call('SET', KEYS[1], ARGV[1] .. ARGV[11], 'NX', 'PX', ARGV[2]) then
    return taken()
  end
end
local ttl = tonumber(ARGV[5])
if ttl > 0 then
  now = now or now_ms()
  local entry = (now + ttl) .. '|' .. ARGV[6] .. '|' .. ARGV[7] .. '|' .. ARGV[3] .. '|' .. ARGV[1]
  local holder = string.match(ARGV[11], '^|%d+|(.*)|$')
  if holder then
    entry = entry .. '|' .. holder
  end
  if redis.call('HSET', KEYS[4], ARGV[4], entry) == 1 then
    redis.call('RPUSH', KEYS[3], ARGV[4])
    if ARGV[8] == '1' then
      -- pcall: a refused publish must not fail a script whose writes are done.
      if ARGV[10] == '1' then
        redis.pcall('SPUBLISH', ARGV[9], 'fair:' .. ARGV[4])
      else
        redis.pcall('PUBLISH', ARGV[9], 'fair:' .. ARGV[4])
      end
    end
  end
  -- Abandoned queues disappear on their own.
  redis.call('PEXPIRE', KEYS[3], ttl * 2)
  redis.call('PEXPIRE', KEYS[4], ttl * 2)
  -- Queued behind a holder: its release must hand over (or announce), not just delete.
  mark()
end
return {0, redis.call('PTTL', KEYS[1])}
