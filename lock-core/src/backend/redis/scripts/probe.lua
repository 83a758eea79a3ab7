-- Checks that the Redis user may run every command the lock runs on the keys and channel of
-- one key prefix, before any lock of that prefix is taken: scripts are not rolled back, so a
-- permission refused half-way through a release would leave it half done. Writes nothing.
-- On Redis 7+ it asks redis.acl_check_cmd; before, it tries what it can without writing
-- (reads, writes refused for a bad argument after the permission check) and publishes one
-- probe message on the channel (nobody waits on it; a listener would read a plain release).
--
-- KEYS[1]  <prefix>{__lock_probe__}            stands for a lock
-- KEYS[2]  <prefix>{__lock_probe__}:fence      its fence counter
-- KEYS[3]  <prefix>{__lock_probe__}:queue      its waiter queue
-- KEYS[4]  <prefix>{__lock_probe__}:waiters    its waiter entries
-- KEYS[5]  <prefix>{__lock_probe__}:result     its idempotency record
-- ARGV[1]  <prefix>{__lock_probe__}:released   its release channel
-- ARGV[2]  '1' for sharded pub/sub (SPUBLISH, SSUBSCRIBE: Redis 7+), '0' for plain pub/sub
--
-- Returns an array with one entry per refused permission, empty when all are granted:
--   'key <COMMAND> <key name>', 'channel <COMMAND> <channel name>' or 'command <COMMAND> -'.

-- Every command the lock's scripts run on its keys (a unit test keeps this list complete),
-- with arguments that name the key where the command expects it.
local key_commands = {
  {'GET'}, {'SET', 'v'}, {'APPEND', 'v'}, {'DEL'}, {'EXISTS'}, {'PTTL'}, {'PEXPIRE', '1'},
  {'INCR'}, {'LINDEX', '0'}, {'LPOP'}, {'LPUSH', 'v'}, {'RPUSH', 'v'}, {'LREM', '0', 'v'},
  {'HGET', 'f'}, {'HSET', 'f', 'v'}, {'HDEL', 'f'},
}
-- The idempotency record is read and written with commands of the list above (HGET, HSET,
-- PEXPIRE, PTTL on the record; GET, EXISTS on the lock).
local channel_commands
if ARGV[2] == '1' then
  channel_commands = {{'SPUBLISH', 'm'}, {'SSUBSCRIBE'}, {'SUNSUBSCRIBE'}}
else
  channel_commands = {{'PUBLISH', 'm'}, {'SUBSCRIBE'}, {'UNSUBSCRIBE'}}
end
-- TIME: the scripts read the server clock; PING: the subscriber's health check;
-- SCRIPT LOAD: how a script is loaded after NOSCRIPT (EVALSHA itself runs this one).
local other_commands = {{'TIME'}, {'PING'}, {'SCRIPT', 'LOAD', 'return 1'}}

local refused = {}

if redis.acl_check_cmd then
  local function allowed(...)
    local ok, answer = pcall(redis.acl_check_cmd, ...)
    return ok and answer
  end
  for _, key in ipairs(KEYS) do
    for _, c in ipairs(key_commands) do
      if not allowed(c[1], key, unpack(c, 2)) then
        table.insert(refused, 'key ' .. c[1] .. ' ' .. key)
      end
    end
  end
  for _, c in ipairs(channel_commands) do
    if not allowed(c[1], ARGV[1], unpack(c, 2)) then
      table.insert(refused, 'channel ' .. c[1] .. ' ' .. ARGV[1])
    end
  end
  for _, c in ipairs(other_commands) do
    if not allowed(unpack(c)) then
      table.insert(refused, 'command ' .. c[1] .. ' -')
    end
  end
  return refused
end

-- Before Redis 7: an error that is a permission refusal (Redis 6 ACL).
local function is_refusal(answer)
  return type(answer) == 'table' and answer.err ~= nil
    and (string.find(answer.err, 'NOPERM', 1, true) ~= nil
      or string.find(answer.err, "can't", 1, true) ~= nil)
end
local tries = {
  {'key', 'GET', KEYS[1]},
  {'key', 'PTTL', KEYS[1]},
  -- Refused for its zero expiry after the permission check: writes nothing.
  {'key', 'SET', KEYS[1], 'v', 'PX', '0'},
  -- Refused for its expiry that is not a number after the permission check.
  {'key', 'PEXPIRE', KEYS[1], 'x'},
  {'key', 'LINDEX', KEYS[3], '0'},
  {'key', 'HGET', KEYS[4], 'f'},
  {'key', 'HGET', KEYS[5], 'f'},
  {'command', 'TIME'},
  {'channel', 'PUBLISH', ARGV[1], 'probe'},
}
for _, t in ipairs(tries) do
  if is_refusal(redis.pcall(unpack(t, 2))) then
    table.insert(refused, t[1] .. ' ' .. t[2] .. ' ' .. (t[3] or '-'))
  end
end
return refused
