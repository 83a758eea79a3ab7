-- Prepended to renew.lua and renew_node.lua: renews one lock when it is still ours.
--
-- key     the lock key
-- value   its current value (GET), false when it does not exist
-- token   the owner token ('token+' marks a lock with queued waiters: also ours)
-- lease     the new lease in milliseconds
-- at_least  true to lengthen the lease only, never shorten it (Redlock's servers: see renew.lua)
--
-- Returns 1 when renewed (or already held at least that long, with at_least), 0 when no
-- longer ours.
local function renew_one(key, value, token, lease, at_least)
  -- The token is the value's head (see release_fast.lua for the value's forms).
  local owner = value and string.sub(value, 1, #token + 1)
  if owner == token or owner == token .. '|' or owner == token .. '+' then
    if not at_least or redis.call('PTTL', key) < tonumber(lease) then
      redis.call('PEXPIRE', key, lease)
    end
    return 1
  end
  return 0
end
