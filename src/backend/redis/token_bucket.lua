-- Token bucket (src/algorithm/token_bucket.rs). A hash: l = level in units of
-- 1/unit token, t = when it was measured.
algorithms.token_bucket = function(key, p)
  local full = p.capacity * p.unit
  local level, at = full, now
  local stored = redis.call('HMGET', key, 'l', 't')
  if stored[1] then
    local l, t = tonumber(stored[1]), tonumber(stored[2])
    local elapsed = math.max(now - t, 0)
    -- Past 2^53 the sum is inexact, but then it is past `full` too.
    level = math.min(full, l + elapsed * p.refill)
    at = math.max(t, now)
  end
  local need = cost * p.unit
  local function time_to_fill(lv)
    return ceil_div(full - lv, p.refill) + (at - now)
  end
  local function replenish(lv)
    return ceil_div((idiv(lv, p.unit) + 1) * p.unit - lv, p.refill) + (at - now)
  end
  local refuse = {
    remaining = idiv(level, p.unit),
    reset = time_to_fill(level),
    replenish = replenish(level),
  }
  if level >= need then
    local left = level - need
    local admit = {
      remaining = idiv(left, p.unit),
      reset = time_to_fill(left),
      replenish = replenish(left),
      write = function()
        redis.call('HSET', key, 'l', int(left), 't', int(at))
        expire(key, at + ceil_div(full - left, p.refill))
      end,
    }
    return allow(0, admit, refuse)
  end
  return deny(ceil_div(need - level, p.refill) + (at - now), refuse)
end

-- A leased unit goes back only as far as the refill since the lease could
-- not have replaced it: a bucket full meanwhile lost that refill, and
-- giving the whole unit back would admit more than the bucket allows.
give_back.token_bucket = function(key, p, units, since)
  local stored = redis.call('HMGET', key, 'l', 't')
  local back = units * p.unit - math.max(now - since, 0) * p.refill
  if stored[1] and back > 0 then
    local full = p.capacity * p.unit
    local level, at = math.min(full, tonumber(stored[1]) + back), tonumber(stored[2])
    redis.call('HSET', key, 'l', int(level), 't', int(at))
    expire(key, at + ceil_div(full - level, p.refill))
  end
end
