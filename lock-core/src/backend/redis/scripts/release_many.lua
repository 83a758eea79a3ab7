-- Release many locks in one call (a batch of releases, see batch.rs): for each key the same
-- step as release.lua, in order: deleted if, and only if, it still holds its token, then handed
-- to the oldest live queued waiter or announced (hand_over) when waiters queue for it.
--
-- As in release.lua, this file comes first, before fence.lua, handoff.lua and
-- release_many_handover.lua: when no key has a queue the script returns before any function is
-- created. Keys with a queue are handed over after the loop, each right after its own delete
-- as far as any other client can tell (the script is atomic).
--
-- KEYS[4i-3]  the i-th lock key
-- KEYS[4i-2]  the i-th queue
-- KEYS[4i-1]  the i-th fencing counter
-- KEYS[4i]    the i-th waiters hash
-- ARGV[i]     the i-th owner token
--
-- Returns an array with one entry per key: 1 when it was ours and is now free (nobody queued,
-- or 'released' was published), the message as published when it was ours and is now handed
-- over or announced to a waiter, 0 when it was not ours.
local out, queued = {}, nil
for i, token in ipairs(ARGV) do
  local lock = KEYS[4 * i - 3]
  local value = redis.call('GET', lock)
  local owner = value and string.sub(value, 1, #token + 1)
  if owner ~= token and owner ~= token .. '|' and owner ~= token .. '+' then
    out[i] = 0
  else
    redis.call('DEL', lock)
    out[i] = 1
    -- Popped at once: hand_over takes the head from here.
    local head = redis.call('LPOP', KEYS[4 * i - 2])
    if head then
      queued = queued or {}
      queued[#queued + 1] = {i, head}
    end
  end
end
if not queued then
  return out
end
