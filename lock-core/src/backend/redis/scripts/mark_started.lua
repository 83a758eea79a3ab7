-- Write the "started" mark of an idempotency key if, and only if, the lock is still ours and
-- the key has neither a mark of another holder nor a result: a request about to run its work
-- says so durably first, so that a retry that finds the mark never runs the work again.
-- Nothing is written otherwise. The mark keeps its own id (one per acquisition, not the
-- lock's token: a lock handed over locally keeps its token, and a later request must not take
-- an earlier one's mark for its own), so a write sent again (the retry after a dropped
-- connection) finds its own mark and answers as written.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the record key (a hash beside the lock, same hash slot)
-- ARGV[1]  the owner token
-- ARGV[2]  the request's fingerprint
-- ARGV[3]  the mark's TTL in milliseconds (at least 1): the record's TTL
-- ARGV[4]  the mark's id (random, one per acquisition)
--
-- Returns {1} when the mark is written (now, or before with this id), {0} when the lock was
-- not ours, {2, fingerprint, pttl} when another mark is there (another holder's, or one
-- an earlier guard of this lock left behind) (pttl: its remaining
-- TTL in milliseconds, -1 when it has none), {3} when a result is stored already.
local value = redis.call('GET', KEYS[1])
local owner = value and string.sub(value, 1, #ARGV[1] + 1)
if owner ~= ARGV[1] and owner ~= ARGV[1] .. '|' and owner ~= ARGV[1] .. '+' then
  return {0}
end
local fingerprint = redis.call('HGET', KEYS[2], 'fingerprint')
if fingerprint then
  if redis.call('HGET', KEYS[2], 'result') then
    return {3}
  end
  if redis.call('HGET', KEYS[2], 'started') == ARGV[4] then
    return {1}
  end
  return {2, fingerprint, redis.call('PTTL', KEYS[2])}
end
redis.call('HSET', KEYS[2], 'fingerprint', ARGV[2], 'started', ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return {1}
