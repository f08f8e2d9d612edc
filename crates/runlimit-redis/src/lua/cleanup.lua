-- Bounded cleanup of one shard: removes at most ARGV[2] expired entries, earliest first.
-- KEYS: the shard's meta hash and index. ARGV: the shard's key-name base, the maximum.
-- Returns how many entries it removed.
local maximum = num(ARGV[2])
if maximum == nil then
  fail('malformed cleanup arguments')
end
local w, _, e = meta_fields(KEYS[1])
local now = server_time()
if w and w > now then
  now = w
end
if e and e > now then
  return 0
end
local plan = plan_cleanup(ARGV[1], KEYS[2], now, maximum)
if #plan.examined == 0 then
  return 0
end
e = apply_cleanup(ARGV[1], KEYS[2], plan)
if e then
  redis.call('HSET', KEYS[1], 'e', e)
else
  redis.call('HDEL', KEYS[1], 'e')
end
if plan.count > 0 then
  redis.call('HINCRBY', KEYS[1], 'n', -plan.count)
end
if w == nil or now > w then
  redis.call('HSET', KEYS[1], 'w', str(now))
end
return plan.count
