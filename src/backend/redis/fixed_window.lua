-- Fixed window (src/algorithm/fixed_window.rs). A hash: s = the window's
-- first microsecond, c = its count.
-- The window holding now (a Redis clock behind the caller's, across a
-- calendar boundary, counts in the caller's), and whether the stored one,
-- if newer (the clock stepped back), still holds: its start, end and count.
local function current_window(key, p)
  local current, ends = window_of(p, now)
  if not current then
    current, ends = p.cal_start, p.cal_end
  end
  local stored = redis.call('HMGET', key, 's', 'c')
  if stored[1] and tonumber(stored[1]) >= current then
    local start = tonumber(stored[1])
    if start > current then
      local _, later = window_of(p, start)
      ends = later or ends
    end
    return start, ends, tonumber(stored[2])
  end
  return current, ends, 0
end

algorithms.fixed_window = function(key, p)
  local start, ends, count = current_window(key, p)
  local window_end = ends - now
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
        expire(key, ends)
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
    if window_of(p, since) == start then
      redis.call('HSET', key, 'c', int(math.max(tonumber(stored[2]) - units, 0)))
    end
  end
end

-- A reservation's units go back (algorithm/fixed_window.rs give_back) to
-- the window they were counted in, while it holds.
give_back_reserved.fixed_window = function(key, p, at, full_at)
  local start, ends = window_of(p, at)
  if not start or ends <= now then
    return
  end
  local stored = redis.call('HMGET', key, 's', 'c')
  if stored[1] and tonumber(stored[1]) == start and tonumber(stored[2]) > 0 then
    redis.call('HSET', key, 'c', int(math.max(tonumber(stored[2]) - cost, 0)))
  end
end
