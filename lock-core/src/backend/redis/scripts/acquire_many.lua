-- Acquire many locks in one call (a batch of plain acquires, see batch.rs): for each key the
-- same atomic step as acquire.lua without fencing, in order. Two requests for one key are two
-- steps: the first takes a free lock, the second finds it held.
--
-- KEYS[i]      the i-th lock key
-- ARGV[2i-1]   the i-th owner token
-- ARGV[2i]     the i-th lease in milliseconds
--
-- Running it twice is safe: a retry after a dropped connection finds a lock holding its token
-- and counts it as acquired (lease reset).
-- Returns an array with one entry per key, as acquire.lua answers: {1, 0} acquired, {0, pttl}
-- held by someone else (pttl as PTTL reports it).
local out = {}
for i, key in ipairs(KEYS) do
  local token, lease = ARGV[2 * i - 1], ARGV[2 * i]
  if redis.call('SET', key, token, 'NX', 'PX', lease) then
    out[i] = {1, 0}
  elseif redis.call('GET', key) == token then
    redis.call('PEXPIRE', key, lease)
    out[i] = {1, 0}
  else
    out[i] = {0, redis.call('PTTL', key)}
  end
end
return out
