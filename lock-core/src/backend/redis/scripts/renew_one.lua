-- Prepended to renew.lua and renew_node.lua: renews one lock when it is still ours.
--
-- key     the lock key
-- value   its current value (GET), false when it does not exist
-- token   the owner token ('token+' marks a lock with queued waiters: also ours)
-- lease   the new lease in milliseconds
--
-- Returns 1 when renewed, 0 when no longer ours.
local function renew_one(key, value, token, lease)
  if value == token or value == token .. '+' then
    redis.call('PEXPIRE', key, lease)
    return 1
  end
  return 0
end
