-- Token bucket (src/algorithm/token_bucket.rs). A hash: l = level in units of
-- 1/unit token, t = when it was measured.
algorithms.token_bucket = function(key, p)
  local full = p.capacity * p.unit
  -- The units the bucket lacks at `now`. A clock behind the stored moment
  -- finds it lower by the refill in between: spends recorded later count.
  local deficit = 0
  local stored = redis.call('HMGET', key, 'l', 't')
  if stored[1] then
    local l, t = tonumber(stored[1]), tonumber(stored[2])
    -- Past 2^53 the product is inexact, but then the bucket is full.
    deficit = math.max(math.max(full - l, 0) + (t - now) * p.refill, 0)
  end
  local need = cost * p.unit
  -- A deficit past `full` is a level below zero: no token until it climbs
  -- back to one.
  local function branch(d)
    local remaining = idiv(math.max(full - d, 0), p.unit)
    return {
      remaining = remaining,
      reset = ceil_div(d, p.refill),
      replenish = ceil_div((remaining + 1) * p.unit + d - full, p.refill),
    }
  end
  local refuse = branch(deficit)
  local after = deficit + need
  if after <= full then
    local admit = branch(after)
    admit.write = function()
      redis.call('HSET', key, 'l', int(full - after), 't', int(now))
      expire(key, now + ceil_div(after, p.refill))
    end
    return allow(0, admit, refuse)
  end
  return deny(ceil_div(after - full, p.refill), refuse)
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

-- A reservation's units go back (algorithm/token_bucket.rs give_back): the
-- bucket refilled to now, plus the units, never past full; nothing once it
-- may have been full since the reservation (`full_at`), nor while its
-- level would stay below zero.
give_back_reserved.token_bucket = function(key, p, at, full_at)
  local stored = redis.call('HMGET', key, 'l', 't')
  if now >= full_at or not stored[1] then
    return
  end
  local full = p.capacity * p.unit
  local l, t = tonumber(stored[1]), tonumber(stored[2])
  local deficit = math.max(math.max(full - l, 0) + (t - now) * p.refill, 0)
  local after = math.max(deficit - cost * p.unit, 0)
  if after >= deficit or after > full then
    return
  end
  redis.call('HSET', key, 'l', int(full - after), 't', int(now))
  expire(key, now + ceil_div(after, p.refill))
end
