-- Take a fair waiter's ticket out of the queue (it timed out or was cancelled).
--
-- KEYS[1]  the lock key
-- KEYS[2]  the queue (list of tickets)
-- KEYS[3]  the waiters (hash: ticket -> expiry)
-- ARGV[1]  the ticket
-- ARGV[2]  the release channel
-- ARGV[3]  '1' for SPUBLISH, '0' for PUBLISH
--
-- When the ticket was at the head and the lock is free, the next ticket is told its turn came.
-- Returns 1 when the ticket was queued, 0 when it was not.
local was_head = redis.call('LINDEX', KEYS[2], 0) == ARGV[1]
local removed = redis.call('LREM', KEYS[2], 0, ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
if was_head and redis.call('EXISTS', KEYS[1]) == 0 then
  local next = redis.call('LINDEX', KEYS[2], 0)
  if next then
    if ARGV[3] == '1' then
      redis.call('SPUBLISH', ARGV[2], next)
    else
      redis.call('PUBLISH', ARGV[2], next)
    end
  end
end
if removed > 0 then
  return 1
end
return 0
