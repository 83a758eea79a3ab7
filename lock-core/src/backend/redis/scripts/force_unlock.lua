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
-- ARGV[1]  optional (Redlock): the digest of the acquisition to remove (see inspect.lua); a
--          lock whose token does not digest to it is left alone, answering 0 ('' or none:
--          whatever acquisition holds it)
-- ARGV[2]  optional (Locker::force_unlock_seen): the since of the holding seen, from its stamp
--          ('' when it had none); with it, the lock is removed only if it is still that holding
-- ARGV[3]  with ARGV[2]: the fence counter's value seen ('' when none)
--
-- Returns 0 when nobody held it (or another acquisition than ARGV[1]'s), else {pttl, since,
-- holder, fence, message}: the lock's PTTL, its stamp (see inspect.lua), the counter's value,
-- and 'released' or the message published to its waiters (handed over or announced, as
-- release.lua's); when another holding holds it than the one ARGV[2] and ARGV[3] saw, {pttl,
-- since, holder, fence, 'changed', 1}, nothing touched.
local value = redis.call('GET', KEYS[1])
if not value then
  return 0
end
if ARGV[1] and ARGV[1] ~= '' and redis.sha1hex(string.match(value, '^[^|+]*')) ~= ARGV[1] then
  return 0
end
local since, holder = string.match(value, '^%x+|(%d+)|(.*)|%+?$')
local removed = {
  redis.call('PTTL', KEYS[1]),
  since or '',
  holder or '',
  redis.call('GET', KEYS[3]) or '',
}
if ARGV[2] and (removed[2] ~= ARGV[2] or removed[4] ~= ARGV[3]) then
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
