-- Read an idempotency key's state in one atomic step: its stored record if there is one,
-- else whether its lock is held (the first request is still running), else its "started"
-- mark (a request started and recorded no outcome). Writes nothing.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the record key (a hash beside the lock, same hash slot)
--
-- Returns {1, fingerprint, result, pttl} when a record is stored (pttl: its remaining TTL in
-- milliseconds, -1 when it has none), {2} when no record is stored and the lock is held,
-- {3, fingerprint, pttl} when only a mark is stored and the lock is free, {0} when none.
local fingerprint = redis.call('HGET', KEYS[2], 'fingerprint')
if fingerprint then
  local result = redis.call('HGET', KEYS[2], 'result')
  if result then
    return {1, fingerprint, result, redis.call('PTTL', KEYS[2])}
  end
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {2}
end
if fingerprint then
  return {3, fingerprint, redis.call('PTTL', KEYS[2])}
end
return {0}
