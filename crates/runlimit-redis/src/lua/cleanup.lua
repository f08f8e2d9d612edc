-- Bounded cleanup of one shard: examines at most ARGV[2] entries whose expiry bound has
-- passed, earliest first, removing the expired ones. KEYS: the shard's hash and index. ARGV:
-- the shard's key-name base, the maximum. Returns how many entries it removed.
local maximum = tonumber(ARGV[2])
if maximum == nil then
  fail('malformed cleanup arguments')
end
local w, n, raw_e = read_shard(KEYS[1], {})
local e = bound(raw_e)
local now = server_time()
if w and w > now then
  now = w
end
if (e == nil and n == 0) or (e ~= nil and e > now) then
  return 0
end
cleanup_functions()
local plan = plan_cleanup(KEYS[1], ARGV[1], KEYS[2], now, maximum)
local bound = apply_cleanup(KEYS[1], ARGV[1], KEYS[2], plan)
n = n - plan.count
if n < 0 then
  n = 0
end
local fields = {'n', str(n)}
if w == nil or now > w then
  fields[#fields + 1] = 'w'
  fields[#fields + 1] = str(now)
end
if bound then
  fields[#fields + 1] = 'e'
  fields[#fields + 1] = str(bound)
end
redis.call('HSET', KEYS[1], unpack(fields))
if not bound then
  redis.call('HDEL', KEYS[1], 'e')
end
return plan.count
