-- release_fast.lua for a batch of releases (batch.rs): for each key in order, deleted if it
-- holds its token unmarked, left as it is when marked (a waiter queues: the caller sends the
-- full release), nothing when it is not ours.
--
-- KEYS[i]  the i-th lock key
-- ARGV[i]  the i-th owner token
--
-- Returns an array with one entry per key: 1 deleted, 2 ours and marked, 0 not ours.
local out = {}
for i, key in ipairs(KEYS) do
  local value, token = redis.call('GET', key), ARGV[i]
  local after = value and string.byte(value, #token + 1)
  if not (value == token or ((after == 124 or after == 43) and string.find(value, token, 1, true) == 1)) then
    out[i] = 0
  elseif string.byte(value, -1) == 43 then
    out[i] = 2
  else
    redis.call('DEL', key)
    out[i] = 1
  end
end
return out
