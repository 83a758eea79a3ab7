-- The end of release_many.lua, after fence.lua and handoff.lua: the keys in `queued` were ours,
-- are deleted, and waiters queue for them. The script's last line, added in Rust, calls
-- `release_many_handover('1')` (SPUBLISH) or `release_many_handover('0')` (PUBLISH).
local function release_many_handover(sharded)
  for _, popped in ipairs(queued) do
    local i, head = popped[1], popped[2]
    local lock = KEYS[4 * i - 3]
    local message = hand_over(lock, KEYS[4 * i - 1], KEYS[4 * i - 2], KEYS[4 * i],
      lock .. ':released', sharded, head)
    if message ~= 'released' then
      out[i] = message
    end
  end
  return out
end
