-- Shared by release.lua and leave.lua (prepended to each): hands a lock that just became free
-- to the oldest live queued waiter, or announces that it is free.
--
-- A ticket in the queue without an entry in the waiters hash is dead (taken or left: those
-- leave their list item behind rather than pay LREM) and is dropped on the way.
-- A queued waiter's entry in the waiters hash is 'expiry|generation|lease|fenced|token', then
-- '|holder' when the waiter names itself (expiry in ms of server time; generation counts the
-- waiter's attempts; lease in ms is what the handover sets; fenced '1' or '0'; token is the
-- waiter's owner token, never published; holder its identity, for the lock's stamp, see
-- release_fast.lua).
-- An entry of the bare form 'expiry' (an older client) is not handed the lock: it is told its
-- turn and takes the lock itself.
--
-- `head`, when given, is the queue's first ticket, already popped by the caller (a release
-- that looked for waiters with LPOP); otherwise the first ticket is popped here. Each ticket is
-- popped before its entry is read (one call per ticket instead of LINDEX then LPOP); one that
-- cannot take a handover is pushed back.
--
-- The message on the lock's channel is '<ticket>:<generation>:<fence>' when the lock was
-- handed to that ticket (fence 0 when not fenced), '<ticket>' when it is that ticket's turn,
-- or 'released'. It is also returned, so the releasing process can deliver it locally at once.
--
-- One function only (besides those of fence.lua): every function defined here is created on
-- each call of every script that includes this file, on the release's hot path.

local function hand_over(lock, fence_key, queue, waiters, channel, sharded, head)
  local payload = 'released'
  local now
  head = head or redis.call('LPOP', queue)
  while head do
    if not now then
      local t = redis.call('TIME')
      now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    end
    local entry = redis.call('HGET', waiters, head) or '0'
    local expiry = tonumber(string.match(entry, '^%d+') or '0')
    redis.call('HDEL', waiters, head)
    if expiry > now then
      local _, generation, lease, fenced, token, holder =
        string.match(entry, '^(%d+)|(%d+)|(%d+)|([01])|(%x+)|?(.*)$')
      -- A fenced waiter whose counter is unusable (fence.lua) takes the lock itself, and its
      -- own attempt fails: an error here would fail this release, and every other release
      -- sent in the same batch.
      local usable, fence_last = token ~= nil, 0
      if usable and fenced == '1' then
        usable, fence_last = pcall(last_fence, fence_key)
      end
      -- Stamped with the waiter's holder and now; marked (release_fast.lua) when other
      -- waiters still have entries.
      local value = token
      if usable and holder ~= '' then
        value = token .. '|' .. string.format('%d', now) .. '|' .. holder .. '|'
      end
      if usable and redis.call('EXISTS', waiters) == 1 then
        value = value .. '+'
      end
      if usable and redis.call('SET', lock, value, 'NX', 'PX', lease) then
        local fence = 0
        if fenced == '1' then
          fence = next_fence(fence_key, fence_last)
        end
        -- '%d': concatenating the number would write it as '%.14g', losing digits.
        payload = head .. ':' .. generation .. ':' .. string.format('%d', fence)
      else
        -- Cannot take a handover: it keeps its place and is told its turn came. Popping it
        -- may have deleted the queue keys: recreated, they get the queue's usual TTL back.
        redis.call('LPUSH', queue, head)
        redis.call('HSET', waiters, head, entry)
        local ttl = (expiry - now) * 2
        if redis.call('PTTL', queue) < 0 then
          redis.call('PEXPIRE', queue, ttl)
        end
        if redis.call('PTTL', waiters) < 0 then
          redis.call('PEXPIRE', waiters, ttl)
        end
        payload = head
      end
      break
    end
    head = redis.call('LPOP', queue)
  end
  -- pcall: a publish refused (a Redis user that lost its channel permission) must not fail a
  -- script whose writes are done (scripts are not rolled back). Waiters then learn on their
  -- own timers: a handed-over lock is found holding their token by their next attempt.
  if sharded == '1' then
    redis.pcall('SPUBLISH', channel, payload)
  else
    redis.pcall('PUBLISH', channel, payload)
  end
  return payload
end
