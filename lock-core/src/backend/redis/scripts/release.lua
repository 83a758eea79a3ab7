-- Release a lock if, and only if, it is still ours; notify waiters when it was.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the fair-mode queue (list of waiter tickets; usually absent)
-- KEYS[3]  the fair-mode waiters (hash: ticket -> expiry in ms, server time)
-- ARGV[1]  the owner token
-- ARGV[2]  the release channel (same hash slot as KEYS[1])
-- ARGV[3]  '1' to publish with SPUBLISH (sharded pub/sub, Redis 7+), '0' for PUBLISH
--
-- The message is the ticket of the next live fair waiter (dead tickets at the head are dropped),
-- so only that waiter needs to wake, or 'released' when nobody queues fairly.
--
-- Returns 1 when the lock was ours and is deleted, 0 when it was not ours (expired or taken).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
local payload = 'released'
if redis.call('EXISTS', KEYS[2]) == 1 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  while true do
    local head = redis.call('LINDEX', KEYS[2], 0)
    if not head then
      break
    end
    if tonumber(redis.call('HGET', KEYS[3], head) or '0') > now then
      payload = head
      break
    end
    redis.call('LPOP', KEYS[2])
    redis.call('HDEL', KEYS[3], head)
  end
end
if ARGV[3] == '1' then
  redis.call('SPUBLISH', ARGV[2], payload)
else
  redis.call('PUBLISH', ARGV[2], payload)
end
return 1
