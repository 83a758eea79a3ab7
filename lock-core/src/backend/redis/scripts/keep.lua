-- At the bound of a local hand-off's turns: keep the lock when no waiter of another process
-- queues for it (the holder's process goes on passing it between its own tasks), else release
-- it to the oldest live queued waiter (hand_over, from handoff.lua), as release.lua does.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the fencing counter key (drawn from when the next waiter asked for a fence)
-- KEYS[3]  the queue (list of waiter tickets, oldest first)
-- KEYS[4]  the waiters (hash: ticket -> entry, see handoff.lua)
-- ARGV[1]  the owner token
-- ARGV[2]  the release channel (same hash slot as KEYS[1])
-- ARGV[3]  '1' to publish with SPUBLISH (sharded pub/sub, Redis 7+), '0' for PUBLISH
--
-- Dead tickets at the queue's head (not refreshed in time, or without an entry) are dropped.
-- Returns 2 when the lock is ours and kept (nobody queues), 1 or {1, message} when it was ours
-- and is now released (message as published), 0 when it was not ours.
local value = redis.call('GET', KEYS[1])
local owner = value and string.sub(value, 1, #ARGV[1] + 1)
if owner ~= ARGV[1] and owner ~= ARGV[1] .. '|' and owner ~= ARGV[1] .. '+' then
  return 0
end
local head = redis.call('LINDEX', KEYS[3], 0)
if not head then
  return 2
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
while head do
  local entry = redis.call('HGET', KEYS[4], head) or '0'
  if tonumber(string.match(entry, '^%d+') or '0') > now then
    break
  end
  redis.call('LPOP', KEYS[3])
  redis.call('HDEL', KEYS[4], head)
  head = redis.call('LINDEX', KEYS[3], 0)
end
if not head then
  return 2
end
redis.call('DEL', KEYS[1])
local message = hand_over(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[2], ARGV[3])
if message == 'released' then
  return 1
end
return {1, message}
