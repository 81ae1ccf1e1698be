-- tollgate: the concurrency slots of one key, in one call.
--
-- KEYS[1]: a sorted set of the key's held slot ids, each scored by the time
-- (ms, Redis's clock) it expires unless refreshed, so slots of a server that
-- died come free by themselves.
-- ARGV[1]: 'acquire', 'refresh' or 'release'.  ARGV[2]: the slot id.
-- ARGV[3]: the limit (acquire).  ARGV[4]: the slot's lifetime in ms.
--
-- Returns {1 if acquired / still held / released, else 0; slots in use}.

local key, op, id = KEYS[1], ARGV[1], ARGV[2]
if op == 'release' then
  redis.call('ZREM', key, id)
  return {1, redis.call('ZCARD', key)}
end
-- Redis before 5 refuses writes after TIME unless effects are replicated.
if redis.replicate_commands then
  redis.replicate_commands()
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
local held = 0
if op == 'refresh' then
  held = redis.call('ZADD', key, 'XX', 'CH', now + ttl, id)
elseif redis.call('ZCARD', key) < tonumber(ARGV[3]) then
  redis.call('ZADD', key, now + ttl, id)
  held = 1
end
local n = redis.call('ZCARD', key)
if n > 0 then
  -- Every member expires by now + ttl, so the set may too.
  redis.call('PEXPIRE', key, ttl)
end
return {held, n}
