-- Fixed window (src/algorithm/fixed_window.rs). A hash: s = the window's
-- first microsecond, c = its count.
algorithms.fixed_window = function(key, p)
  local current = now - math.fmod(now, p.period)
  local start, count = current, 0
  local stored = redis.call('HMGET', key, 's', 'c')
  -- A window newer than the clock (it stepped back) still holds.
  if stored[1] and tonumber(stored[1]) >= current then
    start, count = tonumber(stored[1]), tonumber(stored[2])
  end
  local window_end = start + p.period - now
  local refuse = {
    remaining = math.max(p.capacity - count, 0),
    reset = window_end,
    replenish = window_end,
  }
  if count == 0 then
    refuse.reset = 0
  end
  if count + cost <= p.capacity then
    local admit = {
      remaining = p.capacity - (count + cost),
      reset = window_end,
      replenish = window_end,
      write = function()
        redis.call('HSET', key, 's', int(start), 'c', int(count + cost))
        expire(key, start + p.period)
      end,
    }
    local step = allow(0, admit, refuse)
    -- Units leased in this window count in this window only.
    step.lease_ends = window_end
    return step
  end
  return deny(window_end, refuse)
end

-- Units leased in the window still current are as if never counted; those
-- of an earlier window lapse with it.
give_back.fixed_window = function(key, p, units, since)
  local stored = redis.call('HMGET', key, 's', 'c')
  if stored[1] then
    local start = tonumber(stored[1])
    if since >= start and since < start + p.period then
      redis.call('HSET', key, 'c', int(math.max(tonumber(stored[2]) - units, 0)))
    end
  end
end

-- A reservation's units go back (algorithm/fixed_window.rs give_back) to
-- the window they were counted in, while it holds.
give_back_reserved.fixed_window = function(key, p, at, full_at)
  local start = at - math.fmod(at, p.period)
  if start + p.period <= now then
    return
  end
  local stored = redis.call('HMGET', key, 's', 'c')
  if stored[1] and tonumber(stored[1]) == start and tonumber(stored[2]) > 0 then
    redis.call('HSET', key, 'c', int(math.max(tonumber(stored[2]) - cost, 0)))
  end
end
