-- Release a lock if, and only if, it is still ours; then, when waiters queue for it, hand it to
-- the oldest live one or announce that it is free (hand_over, from handoff.lua).
--
-- A release that knows of no waiter tries release_fast.lua first (one key, no queue lookup);
-- this one is sent when that finds the lock marked by a waiter, or at once on a key where
-- waiters were met lately. It accepts the marked value (the token plus '+') as ours.
--
-- Every process that waits on another process's release has a ticket in the queue (the head of
-- its local queue in the default mode, each waiter in fair mode), so a release that finds the
-- queue empty has nobody to tell and publishes nothing: the common release is GET, DEL and
-- LPOP, near a bare compare-and-delete. (The releasing process tells its own waiters itself.)
--
-- This file comes first in the script, before fence.lua, handoff.lua and
-- release_handover.lua: the common release returns before any function is created (each
-- `local function` costs a closure on every call that reaches it). It takes one argument; the
-- keys are all declared, as Redis requires of a script (the hand-over branch writes the
-- fencing counter and the waiters hash); the channel, not a key, is the lock's name plus
-- ':released' (key.rs), built in the hand-over branch only.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the queue (list of waiter tickets, oldest first; usually absent)
-- KEYS[3]  the fencing counter (drawn from when the next waiter asked for a fence)
-- KEYS[4]  the waiters (hash: ticket -> entry, see handoff.lua)
-- ARGV[1]  the owner token
--
-- Returns 1 when the lock was ours and is now free (nobody queued, or 'released' was published
-- to the queue's dead tickets' waiters), {1, message}
-- when it was ours and is now handed over or announced to a waiter (message as published),
-- 0 when it was not ours (expired or taken).
local value = redis.call('GET', KEYS[1])
local owner = value and string.sub(value, 1, #ARGV[1] + 1)
if owner ~= ARGV[1] and owner ~= ARGV[1] .. '|' and owner ~= ARGV[1] .. '+' then
  return 0
end
redis.call('DEL', KEYS[1])
-- The head is popped at once: hand_over takes it from here (one call less than a look, then
-- a pop).
local head = redis.call('LPOP', KEYS[2])
if not head then
  return 1
end
