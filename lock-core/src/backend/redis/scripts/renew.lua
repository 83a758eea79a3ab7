-- Renew (extend) the leases of many locks at once, each only if it is still ours.
-- The watchdog sends one call per server per tick for all the locks it keeps.
-- renew_one.lua is prepended.
--
-- KEYS[i]      the i-th lock key
-- ARGV[2i-1]   the i-th owner token
-- ARGV[2i]     the i-th new lease in milliseconds
--
-- Returns an array with one entry per key: 1 when renewed, 0 when no longer ours.
local out = {}
for i, key in ipairs(KEYS) do
  out[i] = renew_one(key, redis.call('GET', key), ARGV[2 * i - 1], ARGV[2 * i])
end
return out
