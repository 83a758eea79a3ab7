-- Renew (extend) the leases of many locks at once, each only if it is still ours.
-- The watchdog sends one call per server per tick for all the locks it keeps.
--
-- KEYS[i]      the i-th lock key
-- ARGV[2i-1]   the i-th owner token
-- ARGV[2i]     the i-th new lease in milliseconds
--
-- Returns an array with one entry per key: 1 when renewed, 0 when no longer ours.
local out = {}
for i, key in ipairs(KEYS) do
  local value, token = redis.call('GET', key), ARGV[2 * i - 1]
  if value == token or value == token .. '+' then
    redis.call('PEXPIRE', key, ARGV[2 * i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
