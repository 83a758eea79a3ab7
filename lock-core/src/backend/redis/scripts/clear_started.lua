-- Remove the "started" mark of an idempotency key if, and only if, the lock is still ours and
-- the mark is ours (written with this mark id): work that ended in an error that is not stored
-- may run again. Never a stored result, never another mark (a request that started and
-- recorded nothing: removed, the next request would run the work a second time). A key
-- without a mark of ours is left as it is.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the record key (a hash beside the lock, same hash slot)
-- ARGV[1]  the owner token
-- ARGV[2]  the mark's id (see mark_started.lua)
--
-- Returns 1 when the lock was ours (its mark, if any, is removed), 0 when it was not
-- (nothing removed).
local value = redis.call('GET', KEYS[1])
local owner = value and string.sub(value, 1, #ARGV[1] + 1)
if owner ~= ARGV[1] and owner ~= ARGV[1] .. '|' and owner ~= ARGV[1] .. '+' then
  return 0
end
if redis.call('HGET', KEYS[2], 'started') == ARGV[2] and not redis.call('HGET', KEYS[2], 'result') then
  redis.call('DEL', KEYS[2])
end
return 1
