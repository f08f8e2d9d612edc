-- An operator's reset of one subject: removes its state, live or expired, and frees its slot.
-- KEYS: the shard's hash, the bucket's expiry zset. ARGV: the member name.
-- Returns the store's time and the state removed ('' when there was none). The bucket's and
-- shard's expiry bounds stay valid lower bounds: removing an entry never lowers a minimum.
local w, n, _, fields = read_shard(KEYS[1], {ARGV[1]})
local now = server_time()
if w and w > now then
  now = w
end
local state = fields[4]
if not state then
  return {now, ''}
end
expect_type(KEYS[2], 'zset')
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if n > 0 then
  n = n - 1
end
if w == nil or now > w then
  redis.call('HSET', KEYS[1], 'w', str(now), 'n', str(n))
else
  redis.call('HSET', KEYS[1], 'n', str(n))
end
return {now, state}
