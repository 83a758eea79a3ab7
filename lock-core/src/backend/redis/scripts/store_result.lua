-- Store an idempotency record if, and only if, the lock is still ours: a holder that lost its
-- lease (expired, deleted, taken by another owner) writes nothing. A record already there is
-- replaced (only the lock's holder can have written it), a "started" mark too.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the record key (a hash beside the lock, same hash slot)
-- ARGV[1]  the owner token
-- ARGV[2]  the request's fingerprint
-- ARGV[3]  the result (any bytes, possibly empty)
-- ARGV[4]  the record's TTL in milliseconds (at least 1)
--
-- Returns 1 when the record was written, 0 when the lock was not ours (nothing written).
local value = redis.call('GET', KEYS[1])
local owner = value and string.sub(value, 1, #ARGV[1] + 1)
if owner ~= ARGV[1] and owner ~= ARGV[1] .. '|' and owner ~= ARGV[1] .. '+' then
  return 0
end
redis.call('HSET', KEYS[2], 'fingerprint', ARGV[2], 'result', ARGV[3])
redis.call('HDEL', KEYS[2], 'started')
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return 1
