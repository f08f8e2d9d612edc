-- Bounded cleanup of one shard: removes at most ARGV[2] expired entries, earliest first.
-- KEYS: the shard's meta hash and index. ARGV: the shard's key-name base, the maximum.
-- Returns how many entries it removed.
local maximum = num(ARGV[2])
if maximum == nil then
  fail('malformed cleanup arguments')
end
local now = clock({KEYS[1]})
local n = entries(KEYS[1])
local plan = plan_cleanup(ARGV[1], KEYS[2], now, maximum)
if plan.count == 0 then
  return 0
end
local touched = {}
apply_cleanup(ARGV[1], plan, touched)
for b in pairs(touched) do
  reindex(ARGV[1], KEYS[2], b)
end
n = n - plan.count
if n < 0 then
  n = 0
end
redis.call('HSET', KEYS[1], 'w', str(now), 'n', str(n))
return plan.count
