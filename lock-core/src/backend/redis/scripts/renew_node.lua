-- Renew, in one call, the leases of the locks one Redis Cluster node serves, whatever their
-- hash slots (Redis 7+). The backend prepends the line `#!lua flags=allow-cross-slot-keys,allow-oom`
-- (the script may touch keys of several slots on the node that serves them all; a renewal
-- allocates nothing and goes on when the node is full), then renew_one.lua. The watchdog sends
-- one call per primary per tick. The lock keys come in ARGV, not KEYS: declared keys must share
-- one slot. A key whose slot this node does not serve (moved away, or being moved) is reported
-- and left alone: the caller renews it where it lives.
--
-- KEYS         none
-- ARGV[3i-2]   the i-th lock key
-- ARGV[3i-1]   the i-th owner token
-- ARGV[3i]     the i-th new lease in milliseconds
--
-- Returns an array with one entry per lock: 1 when renewed, 0 when no longer ours, -1 when
-- this node does not serve the key's slot (undecided here).
local out = {}
for i = 1, #ARGV / 3 do
  local key = ARGV[3 * i - 2]
  local value = redis.pcall('GET', key)
  if type(value) == 'table' and value.err then
    out[i] = -1
  else
    out[i] = renew_one(key, value, ARGV[3 * i - 1], ARGV[3 * i])
  end
end
return out
