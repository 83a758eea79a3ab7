-- Acquire a lock in FIFO order across processes (fair mode), or take a place in its queue.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the fencing counter key
-- KEYS[3]  the queue (list of waiter tickets, oldest first)
-- KEYS[4]  the waiters (hash: ticket -> expiry in ms, server time)
-- ARGV[1]  the owner token
-- ARGV[2]  the lease in milliseconds
-- ARGV[3]  '1' to draw a fencing token, '0' not to
-- ARGV[4]  this waiter's ticket (random, not secret)
-- ARGV[5]  how long the ticket lives without a refresh, in ms; '0' = one attempt, never queue
--
-- Running it twice with one token is safe (a retry after a dropped connection finds the lock
-- holding its token). Dead tickets (not refreshed in time) at the head are dropped first. The lock is taken only
-- when it is free and nobody live queues before this ticket.
-- Returns {1, fence} when acquired (fence 0 when not fenced),
--         {0, pttl}  otherwise (-2 when the lock is free but it is another waiter's turn).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if ARGV[3] == '1' then
    return {1, redis.call('INCR', KEYS[2])}
  end
  return {1, 0}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local head
while true do
  head = redis.call('LINDEX', KEYS[3], 0)
  if not head or head == ARGV[4] then
    break
  end
  if tonumber(redis.call('HGET', KEYS[4], head) or '0') > now then
    break
  end
  redis.call('LPOP', KEYS[3])
  redis.call('HDEL', KEYS[4], head)
end
if (not head or head == ARGV[4]) and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if head then
    redis.call('LPOP', KEYS[3])
    redis.call('HDEL', KEYS[4], ARGV[4])
  end
  if ARGV[3] == '1' then
    return {1, redis.call('INCR', KEYS[2])}
  end
  return {1, 0}
end
local ttl = tonumber(ARGV[5])
if ttl > 0 then
  if redis.call('HSET', KEYS[4], ARGV[4], now + ttl) == 1 then
    redis.call('RPUSH', KEYS[3], ARGV[4])
  end
  -- Abandoned queues disappear on their own.
  redis.call('PEXPIRE', KEYS[3], ttl * 2)
  redis.call('PEXPIRE', KEYS[4], ttl * 2)
end
return {0, redis.call('PTTL', KEYS[1])}
