-- Usage beyond a reservation, charged whatever is left
-- (src/algorithm/charge.rs): the quota goes into debt and refuses until it
-- has returned. Each function spends `cost` on its quota's state.
local charge = {}

-- The furthest a debt reaches, in microseconds (2^40, some 12 days): an
-- arrival time past it would leave the exact range of a double.
local DEBT_HORIZON = 1099511627776

local function charge_arrival(key, p)
  local start = now
  local stored = redis.call('GET', key)
  if stored then
    start = math.max(tonumber(stored), now)
  end
  local next = math.min(start + cost * p.interval, now + DEBT_HORIZON)
  redis.call('SET', key, int(next))
  expire(key, next)
end
charge.gcra = charge_arrival
charge.leaky_bucket = charge_arrival

-- A level below zero is stored as it is: the check reads it as a deficit
-- past full.
charge.token_bucket = function(key, p)
  local full = p.capacity * p.unit
  local deficit = 0
  local stored = redis.call('HMGET', key, 'l', 't')
  if stored[1] then
    local l, t = tonumber(stored[1]), tonumber(stored[2])
    deficit = math.max(math.max(full - l, 0) + (t - now) * p.refill, 0)
  end
  local after = math.min(deficit + cost * p.unit, DEBT_HORIZON * p.refill)
  redis.call('HSET', key, 'l', int(full - after), 't', int(now))
  expire(key, now + ceil_div(after, p.refill))
end

charge.fixed_window = function(key, p)
  local start, ends, count = current_window(key, p)
  redis.call('HSET', key, 's', int(start), 'c', int(count + cost))
  expire(key, ends)
end

charge.sliding_window = function(key, p)
  local period = p.period
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
  redis.call('HSET', key, 's', int(start), 'p', int(prev), 'c', int(curr + cost))
  expire(key, start + 2 * period)
end

-- Each unit an entry; a full log refuses until its entries expire, so no
-- more than the capacity is logged.
charge.sliding_log = function(key, p)
  log_append(key, p, math.min(cost, p.capacity))
end
