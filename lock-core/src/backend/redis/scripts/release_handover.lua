-- The end of release.lua, after fence.lua and handoff.lua: the lock was ours, is deleted, and
-- waiters queue for it. The fencing counter, the waiters hash and the channel are the lock's
-- name plus a suffix (key.rs). The script's last line, added in Rust, calls
-- `release_handover('1')` (SPUBLISH) or `release_handover('0')` (PUBLISH): one script per
-- kind of pub/sub rather than one more argument on every release.
local function release_handover(sharded)
  local lock = KEYS[1]
  local message = hand_over(lock, lock .. ':fence', KEYS[2], lock .. ':waiters',
    lock .. ':released', sharded)
  if message == 'released' then
    return 1
  end
  return {1, message}
end
