-- An operator's reset of one subject: removes its state, live or expired, and frees its slot.
-- KEYS: the shard's meta hash, its index, the bucket's state hash and expiry zset.
-- ARGV: the shard's key-name base, the bucket, the member name.
-- Returns the store's time and the state removed ('' when there was none). The bucket's and
-- shard's expiry bounds stay valid lower bounds: removing an entry never lowers a minimum.
local w = meta_fields(KEYS[1])
local now = server_time()
if w and w > now then
  now = w
end
local state = redis.call('HGET', KEYS[3], ARGV[3])
if not state then
  return {now, ''}
end
expect_type(KEYS[4], 'zset')
redis.call('HDEL', KEYS[3], ARGV[3])
redis.call('ZREM', KEYS[4], ARGV[3])
redis.call('HINCRBY', KEYS[1], 'n', -1)
if w == nil or now > w then
  redis.call('HSET', KEYS[1], 'w', str(now))
end
return {now, state}
