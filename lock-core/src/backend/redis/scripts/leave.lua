-- Take a waiter's ticket out of the queue (it timed out or was cancelled).
--
-- KEYS[1]  the lock key
-- KEYS[2]  the fencing counter key
-- KEYS[3]  the queue (list of tickets)
-- KEYS[4]  the waiters (hash: ticket -> entry)
-- ARGV[1]  the ticket
-- ARGV[2]  the release channel
-- ARGV[3]  '1' for SPUBLISH, '0' for PUBLISH
-- ARGV[4]  the waiter's owner token
--
-- A release may have handed the lock to this waiter as it gave up: then the lock is passed on
-- as a release would. When the ticket was at the head and the lock is free, the next waiter
-- gets it (hand_over, from handoff.lua).
-- Returns 2 when the lock had been handed to this waiter (and is passed on), 1 when the
-- ticket was queued, 0 when it was not.
local was_head = redis.call('LINDEX', KEYS[3], 0) == ARGV[1]
local removed = redis.call('LREM', KEYS[3], 0, ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
if redis.call('GET', KEYS[1]) == ARGV[4] then
  redis.call('DEL', KEYS[1])
  hand_over(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[2], ARGV[3])
  return 2
end
if was_head and redis.call('EXISTS', KEYS[1]) == 0 then
  hand_over(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[2], ARGV[3])
end
if removed > 0 then
  return 1
end
return 0
