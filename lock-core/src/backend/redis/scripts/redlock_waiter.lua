-- Redlock: a waiter announces itself in a lock's queue (or leaves it) so that a release there
-- publishes on the lock's channel, without ever being handed the lock: its entry has the bare
-- form 'expiry' (see handoff.lua), so a release tells it its turn instead (each server of a
-- Redlock would hand the lock to whichever waiter heads its own queue: split votes, and a
-- handover on a minority is no lock). keep.lua sees it too: local hand-off gives way to it.
--
-- KEYS[1]  the queue (list of waiter tickets, oldest first)
-- KEYS[2]  the waiters (hash: ticket -> entry)
-- ARGV[1]  the ticket
-- ARGV[2]  how long the entry lives without a refresh, in ms
-- ARGV[3]  '1' to announce (or refresh), '0' to leave
--
-- Returns 1.
if ARGV[3] == '0' then
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('LREM', KEYS[1], 0, ARGV[1])
  return 1
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
if redis.call('HSET', KEYS[2], ARGV[1], string.format('%d', now + ttl)) == 1 then
  redis.call('RPUSH', KEYS[1], ARGV[1])
end
redis.call('PEXPIRE', KEYS[1], ttl * 2)
redis.call('PEXPIRE', KEYS[2], ttl * 2)
return 1
