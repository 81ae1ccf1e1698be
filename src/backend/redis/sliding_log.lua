-- Sliding window log (src/algorithm/sliding_log.rs). A sorted set: one
-- member per logged unit, scored by its time. Members are
-- '<time>:<sequence>', the sequence counting up within one microsecond
-- (zero-padded, so members of one time sort in the order they were logged),
-- so two units logged in the same microsecond are two entries. At most
-- `capacity` members are kept.

-- The score of the member at `rank`, or nil.
local function score_at(key, rank)
  local found = redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')
  if found[1] then
    return tonumber(found[2])
  end
  return nil
end

-- Logs `count` units at `at` (the newest time seen: a clock that stepped
-- back must not unsort the log), keeping the newest `capacity`; the
-- append() of the Rust version.
local function log_append(key, p, count)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now - p.period))
  local len = redis.call('ZCARD', key)
  local at, seq, back = now, 0, nil
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if newest[1] then
    back = tonumber(newest[2])
    if back >= at then
      at = back
      seq = tonumber(string.match(newest[1], ':(%d+)$')) + 1
    end
  end
  local n = math.min(count, p.capacity)
  local overflow = len + n - p.capacity
  if overflow > 0 then
    redis.call('ZREMRANGEBYRANK', key, 0, overflow - 1)
  end
  local score = int(at)
  local batch = {}
  for i = 0, n - 1 do
    batch[#batch + 1] = score
    batch[#batch + 1] = string.format('%s:%010d', score, seq + i)
    -- Bounded batches: unpack() has a small stack.
    if #batch >= 1000 or i == n - 1 then
      -- Lua 5.1 (Redis, Valkey) has unpack; Lua 5.4 (Dragonfly) table.unpack.
      redis.call('ZADD', key, (unpack or table.unpack)(batch))
      batch = {}
    end
  end
  if n > 0 then
    back = at
  end
  if back then
    expire(key, back + p.period)
  end
end

algorithms.sliding_log = function(key, p)
  local period = p.period
  local len = redis.call('ZCARD', key)
  local live = redis.call('ZCOUNT', key, '(' .. int(now - period), '+inf')
  local newest = score_at(key, -1)
  local function reset(t)
    if t then
      return math.max(t + period - now, 0)
    end
    return 0
  end
  -- Time until the entry at `rank` (the oldest live one) expires, or
  -- `otherwise` when there is none.
  local function replenish(rank, otherwise)
    if rank < len then
      local t = score_at(key, rank)
      if t then
        return math.max(t + period - now, 0)
      end
    end
    return otherwise
  end
  local append = function()
    log_append(key, p, cost)
  end
  if live + cost <= p.capacity then
    local logged_at = math.max(now, newest or 0)
    local admit = {
      remaining = p.capacity - live - cost,
      reset = reset(logged_at),
      replenish = replenish(len - live, logged_at + period - now),
      write = append,
    }
    local refuse = {
      remaining = p.capacity - live,
      reset = reset(newest),
      replenish = replenish(len - live, period),
    }
    return allow(0, admit, refuse)
  end
  -- The request passes once enough of the oldest entries have expired for
  -- the newest `capacity - cost` to be all that is left.
  local keep = p.capacity - cost
  local refuse, wait
  if p.count_rejected then
    -- The log as it would be with this attempt logged, without dropping
    -- expired entries first (as the Rust version computes it).
    local n = math.min(cost, p.capacity)
    local overflow = math.max(len + n - p.capacity, 0)
    local expired = len - live
    local live_after = live - math.max(overflow - expired, 0) + n
    local at = math.max(now, newest or 0)
    refuse = {
      remaining = math.max(p.capacity - live_after, 0),
      reset = reset(at),
      replenish = replenish(math.max(len - live, overflow), at + period - now),
      write = append,
    }
    local index = (len - overflow + n) - keep - 1
    if index < len - overflow then
      wait = score_at(key, overflow + index)
    else
      wait = at
    end
  else
    refuse = {
      remaining = p.capacity - math.min(live, p.capacity),
      reset = reset(newest),
      replenish = replenish(len - live, period),
    }
    wait = score_at(key, math.max(len - keep - 1, 0)) or 0
  end
  return deny(math.max(wait + period - now, 0), refuse)
end

-- A reservation's units go back (algorithm/sliding_log.rs give_back): up to
-- `cost` members logged at its moment, while they still count.
give_back_reserved.sliding_log = function(key, p, at, full_at)
  if at + p.period <= now then
    return
  end
  local found = redis.call('ZRANGEBYSCORE', key, int(at), int(at))
  local n = math.min(#found, cost)
  if n == 0 then
    return
  end
  for i = #found - n + 1, #found do
    redis.call('ZREM', key, found[i])
  end
  local newest = score_at(key, -1)
  if newest then
    expire(key, newest + p.period)
  end
end
