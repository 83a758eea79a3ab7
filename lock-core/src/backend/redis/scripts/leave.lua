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
-- Returns 1 when the ticket had an entry, 0 when it had not; as {n, message} when the lock was
-- passed on or announced (message as published, for the leaving process's own waiters).
local was_head = redis.call('LINDEX', KEYS[3], 0) == ARGV[1]
-- The entry goes; the ticket's item in the list is dropped when it reaches the head (an item
-- without an entry counts as dead: see handoff.lua). LREM would cost O(queue length) per leave.
local removed = redis.call('HDEL', KEYS[4], ARGV[1])
if was_head then
  redis.call('LPOP', KEYS[3])
end
local value = redis.call('GET', KEYS[1])
local owner = value and string.sub(value, 1, #ARGV[4] + 1)
if owner == ARGV[4] or owner == ARGV[4] .. '|' or owner == ARGV[4] .. '+' then
  redis.call('DEL', KEYS[1])
  return {removed, hand_over(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[2], ARGV[3])}
end
if was_head and redis.call('EXISTS', KEYS[1]) == 0 then
  return {removed, hand_over(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[2], ARGV[3])}
end
return removed
