-- QuotaSet::evaluate: every quota decides; the request passes when every
-- enforced quota admits it; each quota then stores the state of the future
-- that happened (admitted, or not) and reports that future's numbers.
local steps = {}
local passes = true
local quotas = {}
for i = 1, #KEYS do
  local p = params(i)
  local check = algorithms[p.algorithm]
  if not check then
    return redis.error_reply('tollgate: unknown algorithm ' .. tostring(p.algorithm))
  end
  local step = check(KEYS[i], p)
  quotas[i] = p
  steps[i] = step
  if not step.allowed and not p.shadow then
    passes = false
  end
end

local reply = {}
for i = 1, #KEYS do
  local step = steps[i]
  local admitted = passes and step.allowed
  local view = step.refuse
  if admitted then
    view = step.admit
  end
  if commit and view.write then
    view.write()
  end
  local delay = 0
  if admitted then
    delay = step.delay
  end
  reply[#reply + 1] = step.allowed and 1 or 0
  reply[#reply + 1] = view.remaining
  reply[#reply + 1] = view.reset
  reply[#reply + 1] = step.retry_after
  reply[#reply + 1] = delay
  reply[#reply + 1] = view.replenish
end
return reply
