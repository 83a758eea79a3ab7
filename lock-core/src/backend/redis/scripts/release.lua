-- Release a lock if, and only if, it is still ours; then hand it to the oldest live queued
-- waiter or announce that it is free (hand_over, from handoff.lua).
--
-- KEYS[1]  the lock key
-- KEYS[2]  the fencing counter key (drawn from when the next waiter asked for a fence)
-- KEYS[3]  the queue (list of waiter tickets, oldest first; usually absent)
-- KEYS[4]  the waiters (hash: ticket -> entry, see handoff.lua)
-- ARGV[1]  the owner token
-- ARGV[2]  the release channel (same hash slot as KEYS[1])
-- ARGV[3]  '1' to publish with SPUBLISH (sharded pub/sub, Redis 7+), '0' for PUBLISH
--
-- Returns 1 when the lock was ours and is now free ('released' was published), {1, message}
-- when it was ours and is now handed over or announced to a waiter (message as published),
-- 0 when it was not ours (expired or taken).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
local message = hand_over(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[2], ARGV[3])
if message == 'released' then
  return 1
end
return {1, message}
