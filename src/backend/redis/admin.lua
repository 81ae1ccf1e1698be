-- The shared store of overrides, blocks and resets (rules/runtime.rs):
-- KEYS[1] the entries (a hash: field "o|b <rule>\n<key>", value the
-- entry), KEYS[2] the version, bumped by every change, KEYS[3] the recent
-- resets ("<version>\n<rule>\n<key>", newest first, the last 256).
-- One hash tag, so one slot, so one atomic script on a cluster too.
local op = ARGV[1]
if op == 'read' then
  return {redis.call('GET', KEYS[2]) or '0', redis.call('HGETALL', KEYS[1]),
          redis.call('LRANGE', KEYS[3], 0, 255)}
elseif op == 'set' then
  redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
elseif op == 'del' then
  redis.call('HDEL', KEYS[1], ARGV[2])
elseif op ~= 'reset' then
  return redis.error_reply('tollgate: unknown store operation ' .. tostring(op))
end
local v = redis.call('INCR', KEYS[2])
if op == 'reset' then
  redis.call('LPUSH', KEYS[3], v .. '\n' .. ARGV[2])
  redis.call('LTRIM', KEYS[3], 0, 255)
end
return v
