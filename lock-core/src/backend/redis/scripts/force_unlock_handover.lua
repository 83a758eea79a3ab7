-- The end of force_unlock.lua, after fence.lua and handoff.lua: the lock is deleted and
-- waiters queue for it; they get it handed over or are told, as by release_handover.lua.
local function force_handover(sharded)
  local lock = KEYS[1]
  table.insert(removed, hand_over(lock, KEYS[3], KEYS[2], KEYS[4], lock .. ':released', sharded, head))
  return removed
end
