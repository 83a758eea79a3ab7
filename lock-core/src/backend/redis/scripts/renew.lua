-- Renew (extend) the leases of many locks at once, each only if it is still ours.
-- The watchdog sends one call per server per tick for all the locks it keeps.
-- renew_one.lua is prepended.
--
-- KEYS[i]      the i-th lock key
-- ARGV[2i-1]   the i-th owner token
-- ARGV[2i]     the i-th new lease in milliseconds
-- ARGV[2n+1]   optional (n = #KEYS): 'at-least' (Redlock's servers) to lengthen a lease only,
--              never shorten it: a call that lands after a later one (its per-server call was
--              resent after NOSCRIPT or a reconnect) cannot cut short what the later one set
--
-- Returns an array with one entry per key: 1 when renewed (or already held at least that
-- long, with 'at-least'), 0 when no longer ours.
local at_least = ARGV[2 * #KEYS + 1] == 'at-least'
local out = {}
for i, key in ipairs(KEYS) do
  out[i] = renew_one(key, redis.call('GET', key), ARGV[2 * i - 1], ARGV[2 * i], at_least)
end
return out
