-- A lock's state, read in one atomic step without taking it (Locker::inspect): never the
-- token. The holder and the time it took the lock come from the value's stamp
-- ('<token>|<since>|<holder>|', '+' appended when marked; see release_fast.lua).
--
-- KEYS[1]  the lock key
-- KEYS[2]  the fencing counter
-- KEYS[3]  the waiters (hash: ticket -> 'expiry|...', see handoff.lua)
-- ARGV[1]  optional: '1' (Redlock) to add the holder's digest
--
-- Returns {pttl, since, holder, fence, waiters, now}: the lock's PTTL (-2 when nobody holds
-- it); when the holder took it, in ms since 1970 ('' when the value has no stamp); its holder
-- ('' likewise); the counter's value ('' when none); how many waiters' entries are live; the
-- server's time in ms since 1970. Numbers that may pass 2^53 are strings.
-- With ARGV[1] '1', a seventh item: the SHA-1 (hex) of the value's token (all of the value
-- before its first '|' or '+'; '' when nobody holds it), so that a Redlock client can tell
-- whether a majority of servers hold the same acquisition without the token leaving the
-- server (force_unlock.lua takes it back to remove only that acquisition).
local value = redis.call('GET', KEYS[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local since, holder = '', ''
if value then
  since, holder = string.match(value, '^%x+|(%d+)|(.*)|%+?$')
  since, holder = since or '', holder or ''
end
local waiters = 0
for _, entry in ipairs(redis.call('HVALS', KEYS[3])) do
  if tonumber(string.match(entry, '^%d+') or '0') > now then
    waiters = waiters + 1
  end
end
local pttl = -2
if value then
  pttl = redis.call('PTTL', KEYS[1])
end
local state = {pttl, since, holder, redis.call('GET', KEYS[2]) or '', waiters, string.format('%d', now)}
if ARGV[1] == '1' then
  table.insert(state, value and redis.sha1hex(string.match(value, '^[^|+]*')) or '')
end
return state
