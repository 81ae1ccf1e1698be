-- QuotaSet::evaluate: every quota decides; the request passes when every
-- enforced quota admits it; each quota then stores the state of the future
-- that happened (admitted, or not) and reports that future's numbers.
local quotas = {}
for i = 1, #KEYS do
  local p = params(i)
  if not algorithms[p.algorithm] then
    return redis.error_reply('tollgate: unknown algorithm ' .. tostring(p.algorithm))
  end
  quotas[i] = p
end

-- A reservation given back: each quota it spent, by its twin of the Rust
-- give_back; then what is left, as a peek at cost 0 (QuotaSet::give_back).
if giving_back then
  for i = 1, #KEYS do
    local full_at = ARGV[7 + 13 * #KEYS + i]
    if full_at and full_at ~= '' then
      local p = quotas[i]
      spending(p, function()
        give_back_reserved[p.algorithm](KEYS[i], p, given_back_since, tonumber(full_at))
      end)
    end
  end
  cost = 0
end

-- What is left after a give-back or a charge is a peek at cost 0, which
-- spends no request either.
if giving_back or charging then
  for i = 1, #KEYS do
    if quotas[i].requests then
      quotas[i].requests = 0
    end
  end
end

-- Usage beyond a reservation, charged on every quota whatever is left;
-- then what is left, as a peek at cost 0 (QuotaSet::charge_in).
if charging then
  for i = 1, #KEYS do
    -- A quota counting requests counted the request already.
    if not quotas[i].requests then
      charge[quotas[i].algorithm](KEYS[i], quotas[i])
    end
  end
  cost = 0
end

-- Units an earlier lease left unspent go back before this request, which
-- may need them.
if commit and given_back > 0 then
  for i = 1, #KEYS do
    local back = give_back[quotas[i].algorithm]
    if back then
      back(KEYS[i], quotas[i], given_back, given_back_since)
    end
  end
end

-- Every quota's step for `cost`; whether the set passes; whether every
-- quota, shadow ones included, admits.
-- Quota::check: an elastic quota without room admits only if its ceiling
-- would admit the cost plus the margin (the state stays the ceiling's).
local function step_of_units(i)
  local p = quotas[i]
  local step = algorithms[p.algorithm](KEYS[i], p)
  if p.margin == 0 or not step.allowed then
    return step
  end
  -- The algorithms never see a cost over the capacity: such a request fits
  -- only with room.
  if cost + p.margin > p.capacity then
    return deny(p.period, step.refuse)
  end
  local asked = cost
  cost = asked + p.margin
  local strict = algorithms[p.algorithm](KEYS[i], p)
  cost = asked
  if strict.allowed then
    return step
  end
  return deny(strict.retry_after, step.refuse)
end

-- Each quota steps for its own units: the cost, or the requests.
local function step_of(i)
  return spending(quotas[i], function()
    return step_of_units(i)
  end)
end

local function evaluate()
  local steps, passes, every = {}, true, true
  for i = 1, #KEYS do
    local p = quotas[i]
    local step = step_of(i)
    steps[i] = step
    if not step.allowed then
      every = false
      if not p.shadow then
        passes = false
      end
    end
  end
  return steps, passes, every
end

local steps, passes, every = evaluate()

-- A lease: when every quota admits the request and more is wanted, take as
-- many units as every quota can give now (all or nothing for the set, as
-- for one request). With nothing more to give, this is the request alone.
if commit and every and want > cost then
  local n = want
  for i = 1, #KEYS do
    n = math.min(n, steps[i].refuse.remaining)
  end
  if n > cost then
    local asked = cost
    cost = n
    local leased, leased_passes = evaluate()
    if leased_passes then
      steps = leased
    else
      cost = asked
    end
  end
end

local reply = {}
local lease_ends = 0
for i = 1, #KEYS do
  local step = steps[i]
  local admitted = passes and step.allowed
  local view = step.refuse
  if admitted then
    view = step.admit
    if step.lease_ends and (lease_ends == 0 or step.lease_ends < lease_ends) then
      lease_ends = step.lease_ends
    end
  end
  if commit and view.write then
    -- The writes read `cost` when called: the quota's own units then.
    spending(quotas[i], view.write)
  end
end

-- The denial cache's other half: when this admission left an enforced quota
-- empty, how long until it admits one more unit (checked on the state just
-- written, with the same algorithm).
local spent = cost
local next_free = {}
for i = 1, #KEYS do
  local step = steps[i]
  next_free[i] = 0
  if commit and passes and step.allowed and not quotas[i].shadow and step.admit.remaining == 0 then
    cost = 1
    next_free[i] = algorithms[quotas[i].algorithm](KEYS[i], quotas[i]).retry_after
  end
end

for i = 1, #KEYS do
  local step = steps[i]
  local admitted = passes and step.allowed
  local view = step.refuse
  local delay = 0
  if admitted then
    view = step.admit
    delay = step.delay
  end
  reply[#reply + 1] = step.allowed and 1 or 0
  reply[#reply + 1] = view.remaining
  reply[#reply + 1] = view.reset
  reply[#reply + 1] = step.retry_after
  reply[#reply + 1] = delay
  reply[#reply + 1] = next_free[i]
  reply[#reply + 1] = view.replenish
end
if not (commit and passes) then
  spent = 0
end
reply[#reply + 1] = spent
reply[#reply + 1] = now
reply[#reply + 1] = lease_ends
return reply
