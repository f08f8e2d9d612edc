-- Bounded cleanup of one shard: removes at most ARGV[2] expired entries, earliest first.
-- KEYS: the shard's hash and index. ARGV: the shard's key-name base, the maximum.
-- Returns how many entries it removed.
local maximum = num(ARGV[2])
if maximum == nil then
  fail('malformed cleanup arguments')
end
local w, n, e = read_shard(KEYS[1], {})
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
  e = str(tonumber(e))
end
n = n - plan.count
if n < 0 then
  n = 0
end
local fields = {'n', str(n)}
if w == nil or now > w then
  table.insert(fields, 'w')
  table.insert(fields, str(now))
end
if e then
  table.insert(fields, 'e')
  table.insert(fields, e)
end
redis.call('HSET', KEYS[1], unpack(fields))
if not e then
  redis.call('HDEL', KEYS[1], 'e')
end
return plan.count
