-- tollgate: one outbound schedule step, mirroring src/outbound/schedule.rs.
-- Every value is an integer below 2^53 (microseconds) except the two rate
-- factors, so + - * and comparisons are exact; the adapted rate is computed
-- in doubles, as in Rust.
--
-- KEYS[1]: the key's hash: tat, ci (interval of the last cut), ca (when),
-- pu (the end of the last pause).
-- ARGV[1]: 'a' acquire, 'g' give back, 'o' obey the provider.
-- ARGV[2..8]: the plan: interval, burst, max interval, min interval,
-- decrease, increase, forget.
-- 'a': ARGV[9] cost, ARGV[10] max wait. Returns {1, delay, now, interval,
--      paused} or {0, would wait, now, 0, paused}, paused being the time
--      left of the last pause (0: none).
-- 'g': ARGV[9] cost, ARGV[10] interval, ARGV[11] slot.
-- 'o': ARGV[9] pause (from now, 0: none), ARGV[10] '1' to cut,
--      ARGV[11] when the refused request was scheduled, ARGV[12] announced
--      interval (0: none).
-- 'g' and 'o' return {1, 0, now, 0, 0}.

-- Redis before 5 refuses writes after TIME unless effects are replicated.
if redis.replicate_commands then
  redis.replicate_commands()
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local interval0 = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local max_interval = tonumber(ARGV[4])
local min_interval = tonumber(ARGV[5])
local decrease = tonumber(ARGV[6])
local increase = tonumber(ARGV[7])
local forget = tonumber(ARGV[8])

local key = KEYS[1]
local stored = redis.call('HMGET', key, 'tat', 'ci', 'ca', 'pu')
local tat = tonumber(stored[1]) or 0
local ci = tonumber(stored[2]) or 0
local ca = tonumber(stored[3]) or 0
local pu = tonumber(stored[4]) or 0

local function clamp(x)
  if x < min_interval then return min_interval end
  if x > max_interval then return max_interval end
  return x
end

local function interval_at()
  if ci == 0 or now - ca >= forget then
    return interval0
  end
  local interval = ci
  if increase > 0 then
    local rate = 1e6 / ci + increase * ((now - ca) / 1e6)
    interval = math.ceil(1e6 / rate)
  end
  return clamp(interval)
end

local function store()
  local life = tat - now
  if ci ~= 0 and ca + forget - now > life then
    life = ca + forget - now
  end
  if life <= 0 then
    redis.call('DEL', key)
    return
  end
  redis.call('HSET', key, 'tat', string.format('%.0f', tat), 'ci', string.format('%.0f', ci),
    'ca', string.format('%.0f', ca), 'pu', string.format('%.0f', pu))
  redis.call('PEXPIRE', key, math.ceil(life / 1000) + 1000)
end

local mode = ARGV[1]
if mode == 'a' then
  local cost = tonumber(ARGV[9])
  local max_wait = tonumber(ARGV[10])
  local interval = interval_at()
  local tolerance = burst * interval
  local start = tat
  if now > start then start = now end
  local next = start + cost * interval
  local delay = next - now - tolerance
  if delay < 0 then delay = 0 end
  local paused = pu - now
  if paused < 0 then paused = 0 end
  if delay > max_wait then
    return {0, delay, now, 0, paused}
  end
  tat = next
  store()
  return {1, delay, now, interval, paused}
elseif mode == 'g' then
  local cost = tonumber(ARGV[9])
  local interval = tonumber(ARGV[10])
  local slot = tonumber(ARGV[11])
  if now < slot and tat > 0 then
    local back = tat - cost * interval
    if back < now then back = now end
    tat = back
    store()
  end
  return {1, 0, now, 0, 0}
elseif mode == 'o' then
  local pause = tonumber(ARGV[9])
  local cut = ARGV[10] == '1'
  local scheduled_at = tonumber(ARGV[11])
  local announced = tonumber(ARGV[12])
  if announced > 0 then
    ci = clamp(announced)
    ca = now
  end
  if cut and decrease < 1 and (ci == 0 or scheduled_at >= ca) then
    ci = clamp(math.ceil(interval_at() / decrease))
    ca = now
  end
  if pause > 0 then
    if now + pause > pu then pu = now + pause end
    local until_ = now + pause + burst * interval_at()
    if until_ > tat then tat = until_ end
  end
  store()
  return {1, 0, now, 0, 0}
end
return redis.error_reply('tollgate pace: unknown mode')
