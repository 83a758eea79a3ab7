-- Release a lock if, and only if, it is still ours; notify waiters when it was.
--
-- KEYS[1]  the lock key
-- ARGV[1]  the owner token
-- ARGV[2]  the release channel (same hash slot as KEYS[1])
-- ARGV[3]  '1' to publish with SPUBLISH (sharded pub/sub, Redis 7+), '0' for PUBLISH
--
-- Returns 1 when the lock was ours and is deleted, 0 when it was not ours (expired or taken).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if ARGV[3] == '1' then
    redis.call('SPUBLISH', ARGV[2], 'released')
  else
    redis.call('PUBLISH', ARGV[2], 'released')
  end
  return 1
end
return 0
