-- tollgate: one rate-limit decision for every quota of a set, in one call.
--
-- This script is assembled from several files (prelude.lua, one file per
-- algorithm, decide.lua) and mirrors src/algorithm/*.rs and
-- QuotaSet::evaluate exactly. Lua numbers are doubles: every value here is an
-- integer below 2^53, so + - * and comparisons are exact; integer division
-- goes through math.fmod, which is exact, instead of math.floor(a / b), whose
-- quotient can round up to the next integer.
--
-- KEYS[i]: the state of quota i (all under one hash tag).
-- ARGV[1]: the time in microseconds, or '' to read Redis's TIME.
-- ARGV[2]: the cost.  ARGV[3]: '1' to commit, '0' to peek, '2' to give
-- back a reservation of the cost made at ARGV[7] (Redis time), on the
-- quotas whose ARGV[7 + 13 * #KEYS + i] is the moment the reservation left
-- them full again ('' for the quotas it did not spend), '3' to charge the
-- cost whatever is left (usage beyond a reservation).
-- ARGV[4]: milliseconds added to every expiry (0 unless a test clock is used).
-- ARGV[5]: the units wanted (a lease when more than the cost).
-- ARGV[6], ARGV[7]: units of an earlier lease given back, and when (Redis
-- time) they were taken.
-- ARGV[8 + 13 * (i - 1) ...]: quota i's parameters (see params below); the
-- 13th is '' for a quota counting the cost, else the requests it spends in
-- this call (Counts::Requests in Rust: 1 for a request, 0 for usage
-- settled after it).
--
-- Returns, per quota: allowed (1/0), remaining, reset, retry-after, delay,
-- the wait until one more unit frees when this admission left the quota
-- empty (0 otherwise), replenish (time until more quota is available); then
-- the units spent (the cost, or a whole lease; 0 if refused), the time, and
-- how long a lease may last (0: no bound).

local function idiv(a, b)
  return (a - math.fmod(a, b)) / b
end

local function ceil_div(a, b)
  local q = idiv(a, b)
  if q * b < a then
    q = q + 1
  end
  return q
end

-- Decimal text of an integer: tostring() keeps only 14 digits.
local function int(x)
  return string.format('%d', x)
end

local now
if ARGV[1] == '' then
  -- Redis before 5 refuses writes after TIME unless the script's effects,
  -- not the script, are replicated; since 7 this does nothing.
  if redis.replicate_commands then
    redis.replicate_commands()
  end
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end
-- Not constant: a lease re-runs the algorithms with the lease's size.
local cost = tonumber(ARGV[2])
local commit = ARGV[3] == '1'
local giving_back = ARGV[3] == '2'
local charging = ARGV[3] == '3'
local slack_ms = tonumber(ARGV[4])
local want = tonumber(ARGV[5])
local given_back = tonumber(ARGV[6])
local given_back_since = tonumber(ARGV[7])

local function params(i)
  local base = 7 + 13 * (i - 1)
  return {
    algorithm = ARGV[base + 1],
    period = tonumber(ARGV[base + 2]),
    capacity = tonumber(ARGV[base + 3]),
    interval = tonumber(ARGV[base + 4]),
    unit = tonumber(ARGV[base + 5]),
    refill = tonumber(ARGV[base + 6]),
    count_rejected = ARGV[base + 7] == '1',
    shadow = ARGV[base + 8] == '1',
    -- Elastic mode without room: units the request must leave unspent.
    margin = tonumber(ARGV[base + 9]),
    -- A calendar quota's windows, worked out in Rust for the caller's
    -- clock: the period holding it, and the next one's end (0: none).
    cal_start = tonumber(ARGV[base + 10]),
    cal_end = tonumber(ARGV[base + 11]),
    cal_next = tonumber(ARGV[base + 12]),
    -- nil for a quota counting the cost.
    requests = tonumber(ARGV[base + 13]),
  }
end

-- f() with `cost` made quota p's units for this call: the requests for a
-- quota counting requests, else the cost (QuotaSet::evaluate in Rust).
local function spending(p, f)
  if not p.requests then
    return f()
  end
  local asked = cost
  cost = p.requests
  local result = f()
  cost = asked
  return result
end

-- The fixed window holding `t`: its first microsecond and its end. A
-- calendar quota's come from Rust: the period holding the caller's clock,
-- or the next one if Redis's clock has already crossed into it; nil for a
-- moment before them (an earlier period, not known here).
local function window_of(p, t)
  if p.cal_end > 0 then
    if t >= p.cal_end then
      return p.cal_end, p.cal_next
    end
    if t >= p.cal_start then
      return p.cal_start, p.cal_end
    end
    return nil
  end
  local start = t - math.fmod(t, p.period)
  return start, start + p.period
end

-- Keeps `key` until `expires_at` (the moment its state means the same as no
-- state, State::expires_at in Rust), rounded up to Redis's millisecond and
-- one more for the millisecond Redis truncates its own clock to.
local function expire(key, expires_at)
  if expires_at <= now then
    redis.call('DEL', key)
  else
    redis.call('PEXPIRE', key, int(ceil_div(expires_at - now, 1000) + 1 + slack_ms))
  end
end

local function allow(delay, admit, refuse)
  return { allowed = true, retry_after = 0, delay = delay, admit = admit, refuse = refuse }
end

local function deny(retry_after, refuse)
  if retry_after < 1 then
    retry_after = 1
  end
  return { allowed = false, retry_after = retry_after, delay = 0, admit = refuse, refuse = refuse }
end

local algorithms = {}
-- give_back[name](key, p, units, since): puts back units leased at `since`
-- and not spent, as far as the algorithm allows without ever admitting more
-- than it would have.
local give_back = {}
-- give_back_reserved[name](key, p, at, full_at): puts back the `cost` units
-- a reservation made at `at` spent (QuotaSet::give_back in Rust).
local give_back_reserved = {}
