-- GCRA and the leaky bucket (src/algorithm/gcra.rs, leaky_bucket.rs). A
-- string: the theoretical arrival time.
local function schedule(key, p)
  local tolerance = p.capacity * p.interval
  local start = now
  local stored = redis.call('GET', key)
  if stored then
    start = math.max(tonumber(stored), now)
  end
  local next = start + cost * p.interval
  local function replenish(reset, remaining)
    return math.max(reset + (remaining + 1) * p.interval - tolerance, 0)
  end
  local refuse = {
    remaining = idiv(math.max(tolerance - (start - now), 0), p.interval),
    reset = start - now,
  }
  refuse.replenish = replenish(refuse.reset, refuse.remaining)
  if next - now <= tolerance then
    local admit = {
      remaining = idiv(tolerance - (next - now), p.interval),
      reset = next - now,
      replenish = replenish(next - now, idiv(tolerance - (next - now), p.interval)),
      write = function()
        redis.call('SET', key, int(next))
        expire(key, next)
      end,
    }
    return start, allow(0, admit, refuse)
  end
  return start, deny(next - tolerance - now, refuse)
end

algorithms.gcra = function(key, p)
  local _, step = schedule(key, p)
  return step
end

-- As for the token bucket: a leased unit goes back only as far as the time
-- since the lease has not already made up for it.
give_back.gcra = function(key, p, units, since)
  local stored = redis.call('GET', key)
  local back = units * p.interval - math.max(now - since, 0)
  if stored and back > 0 then
    local tat = tonumber(stored) - back
    if tat <= now then
      redis.call('DEL', key)
    else
      redis.call('SET', key, int(tat))
      expire(key, tat)
    end
  end
end

-- A reservation's units go back (algorithm/gcra.rs give_back): the time
-- moves back by their intervals, never before now; nothing once the quota
-- may have been full since the reservation (`full_at`).
give_back_reserved.gcra = function(key, p, at, full_at)
  local stored = redis.call('GET', key)
  if now >= full_at or not stored then
    return
  end
  local tat = tonumber(stored)
  local back = math.max(tat - cost * p.interval, now)
  if back < tat then
    redis.call('SET', key, int(back))
    expire(key, back)
  end
end
give_back_reserved.leaky_bucket = give_back_reserved.gcra

algorithms.leaky_bucket = function(key, p)
  local start, step = schedule(key, p)
  if step.allowed then
    step.delay = start - now
  end
  return step
end
