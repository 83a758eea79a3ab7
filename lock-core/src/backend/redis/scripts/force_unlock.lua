-- Remove a lock whoever holds it (Locker::force_unlock): what release.lua does, without the
-- token check, answering the state removed (as inspect.lua reads it). The fencing counter is
-- kept: the next fence is larger than every one before. The old holder learns at its next
-- renewal (its token is gone), and its release finds the lock not its own.
--
-- This file comes first in the script, before fence.lua, handoff.lua and
-- force_unlock_handover.lua; the keys are release.lua's.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the queue (list of waiter tickets, oldest first)
-- KEYS[3]  the fencing counter
-- KEYS[4]  the waiters (hash: ticket -> entry, see handoff.lua)
-- ARGV[1]  '1': remove it only if it is still the holding seen (Locker::force_unlock_seen),
--          '0' (or none): whoever holds it
-- ARGV[2]  the holding seen: its stamp's since ('' when it had none)
-- ARGV[3]  the holding seen: the fence counter's value ('' when none)
--
-- Returns 0 when nobody held it, else {pttl, since, holder, fence, message}: the lock's PTTL,
-- its stamp (see inspect.lua), the counter's value, and 'released' or the message published
-- to its waiters (handed over or announced, as release.lua's); when another holding holds it
-- than the one seen, {pttl, since, holder, fence, 'changed', 1}, nothing touched.
local value = redis.call('GET', KEYS[1])
if not value then
  return 0
end
local since, holder = string.match(value, '^%x+|(%d+)|(.*)|%+?$')
local removed = {
  redis.call('PTTL', KEYS[1]),
  since or '',
  holder or '',
  redis.call('GET', KEYS[3]) or '',
}
if ARGV[1] == '1' and (removed[2] ~= ARGV[2] or removed[4] ~= ARGV[3]) then
  table.insert(removed, 'changed')
  table.insert(removed, 1)
  return removed
end
redis.call('DEL', KEYS[1])
local head = redis.call('LPOP', KEYS[2])
if not head then
  table.insert(removed, 'released')
  return removed
end
