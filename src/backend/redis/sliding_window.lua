-- Sliding window counter (src/algorithm/sliding_window.rs). A hash: s = the
-- current window's first microsecond, p = the previous window's count,
-- c = the current one's.
algorithms.sliding_window = function(key, p)
  local period = p.period
  -- The one float computation, in the same operations and order as weigh()
  -- in Rust, so both round alike.
  local function weigh(prev, still_in)
    return math.floor(prev * still_in / period)
  end
  -- The first offset e in [from, period) at which `prev`, weighted, is at
  -- most `room`; nil if none. weigh() only falls as e grows, so the answer
  -- is unique: the estimate only decides how far the two walks go.
  local function first_fit(prev, room, from)
    if prev == 0 or weigh(prev, period - from) <= room then
      return from
    end
    local max_still_in = math.min(math.ceil((room + 1) * period / prev) - 1, period)
    local e = math.max(period - max_still_in, 0)
    while e < period and weigh(prev, period - e) > room do
      e = e + 1
    end
    while e > from and weigh(prev, period - (e - 1)) <= room do
      e = e - 1
    end
    if e < period then
      return math.max(e, from)
    end
    return nil
  end

  -- fits_at() of the Rust version: the first offset from `start` (at least
  -- `from`) at which the estimate of (prev, curr) is at most `room`.
  local function fits_at(prev, curr, room, from)
    local e
    if curr <= room then
      e = first_fit(prev, room - curr, from)
    end
    if e then
      return e
    end
    return period + (first_fit(curr, room, 0) or period)
  end

  local current = now - math.fmod(now, period)
  local start, prev, curr = current, 0, 0
  local stored = redis.call('HMGET', key, 's', 'p', 'c')
  if stored[1] then
    local s = tonumber(stored[1])
    if s >= current then
      start, prev, curr = s, tonumber(stored[2]), tonumber(stored[3])
    elseif s + period == current then
      prev = tonumber(stored[3])
    end
  end
  local elapsed = math.max(now - start, 0)
  local used = weigh(prev, period - elapsed) + curr
  local function reset(c)
    if c > 0 then
      return start + 2 * period - now
    elseif prev > 0 then
      return start + period - now
    end
    return 0
  end
  -- Time until the estimate falls below `u` (or the capacity, when over it).
  local function replenish(c, u)
    local at = period
    local room = math.min(u, p.capacity) - 1
    if room >= 0 then
      at = fits_at(prev, c, room, elapsed)
    end
    return math.max(start + at - now, 0)
  end
  local refuse = {
    remaining = math.max(p.capacity - used, 0),
    reset = reset(curr),
    replenish = replenish(curr, used),
  }
  if used + cost <= p.capacity then
    local admit = {
      remaining = p.capacity - used - cost,
      reset = reset(curr + cost),
      replenish = replenish(curr + cost, used + cost),
      write = function()
        redis.call('HSET', key, 's', int(start), 'p', int(prev), 'c', int(curr + cost))
        expire(key, start + 2 * period)
      end,
    }
    local step = allow(0, admit, refuse)
    -- Units leased in this window count in this window only: later they
    -- would weigh less than they do here.
    step.lease_ends = start + period - now
    return step
  end
  return deny(start + fits_at(prev, curr, p.capacity - cost, elapsed) - now, refuse)
end

-- Units leased in the current window, or in the previous one, are as if
-- never counted there; older ones no longer count anyway.
give_back.sliding_window = function(key, p, units, since)
  local stored = redis.call('HMGET', key, 's', 'p', 'c')
  if stored[1] then
    local start = tonumber(stored[1])
    if since >= start and since < start + p.period then
      redis.call('HSET', key, 'c', int(math.max(tonumber(stored[3]) - units, 0)))
    elseif since >= start - p.period and since < start then
      redis.call('HSET', key, 'p', int(math.max(tonumber(stored[2]) - units, 0)))
    end
  end
end

-- A reservation's units go back (algorithm/sliding_window.rs give_back) to
-- the stored window they were counted in: the current one, or the previous
-- one, where they still weigh.
give_back_reserved.sliding_window = function(key, p, at, full_at)
  local stored = redis.call('HMGET', key, 's', 'p', 'c')
  if not stored[1] then
    return
  end
  local start = at - math.fmod(at, p.period)
  local s = tonumber(stored[1])
  if s == start and tonumber(stored[3]) > 0 then
    redis.call('HSET', key, 'c', int(math.max(tonumber(stored[3]) - cost, 0)))
  elseif s == start + p.period and tonumber(stored[2]) > 0 then
    redis.call('HSET', key, 'p', int(math.max(tonumber(stored[2]) - cost, 0)))
  end
end
