-- Names what a Redis user lacks for the operators' reads (Locker::inspect, list: inspect.lua
-- and SCAN), run after Redis refused one of them without naming the command ("the user
-- executing the script can't run this command"). Writes nothing. On Redis 7+ it asks
-- redis.acl_check_cmd; before, it runs the reads themselves.
--
-- KEYS[1]  <prefix>{__lock_probe__}            stands for a lock
-- KEYS[2]  <prefix>{__lock_probe__}:fence      its fence counter
-- KEYS[3]  <prefix>{__lock_probe__}:waiters    its waiter entries
-- ARGV[1]  '1' to check SCAN too (a listing), '0' for an inspection
--
-- Returns an array with one entry per refused permission, empty when all are granted, as
-- probe.lua's: 'key <COMMAND> <key name>' or 'command <COMMAND> -'.

-- Every command inspect.lua runs (a unit test keeps this list complete), on the key it reads.
local key_commands = {{'GET', 1}, {'PTTL', 1}, {'GET', 2}, {'HVALS', 3}}
local refused = {}

if redis.acl_check_cmd then
  local function allowed(...)
    local ok, answer = pcall(redis.acl_check_cmd, ...)
    return ok and answer
  end
  for _, c in ipairs(key_commands) do
    if not allowed(c[1], KEYS[c[2]]) then
      table.insert(refused, 'key ' .. c[1] .. ' ' .. KEYS[c[2]])
    end
  end
  if not allowed('TIME') then
    table.insert(refused, 'command TIME -')
  end
  if ARGV[1] == '1' and not allowed('SCAN', '0') then
    table.insert(refused, 'command SCAN -')
  end
  return refused
end

-- Before Redis 7: an error that is a permission refusal (Redis 6 ACL).
local function is_refusal(answer)
  return type(answer) == 'table' and answer.err ~= nil
    and (string.find(answer.err, 'NOPERM', 1, true) ~= nil
      or string.find(answer.err, "can't", 1, true) ~= nil)
end
for _, c in ipairs(key_commands) do
  if is_refusal(redis.pcall(c[1], KEYS[c[2]])) then
    table.insert(refused, 'key ' .. c[1] .. ' ' .. KEYS[c[2]])
  end
end
if is_refusal(redis.pcall('TIME')) then
  table.insert(refused, 'command TIME -')
end
if ARGV[1] == '1' and is_refusal(redis.pcall('SCAN', '0', 'COUNT', '1')) then
  table.insert(refused, 'command SCAN -')
end
return refused
