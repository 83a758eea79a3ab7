-- Renew (extend) the leases of many locks at once, each only if it is still ours.
-- The watchdog sends one call per server per tick for all the locks it keeps.
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
  local value, token = redis.call('GET', key), ARGV[2 * i - 1]
  if value == token or value == token .. '+' then
    local ms = tonumber(ARGV[2 * i])
    if not at_least or redis.call('PTTL', key) < ms then
      redis.call('PEXPIRE', key, ms)
    end
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
