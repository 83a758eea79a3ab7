-- The end of release.lua, after fence.lua and handoff.lua: the lock was ours, is deleted, and
-- waiters queue for it. The channel is the lock's name plus ':released' (key.rs). The script's last line, added in Rust, calls
-- `release_handover('1')` (SPUBLISH) or `release_handover('0')` (PUBLISH): one script per
-- kind of pub/sub rather than one more argument on every release.
local function release_handover(sharded)
  local lock = KEYS[1]
  local message = hand_over(lock, KEYS[3], KEYS[2], KEYS[4], lock .. ':released', sharded, head)
  if message == 'released' then
    return 1
  end
  return {1, message}
end
