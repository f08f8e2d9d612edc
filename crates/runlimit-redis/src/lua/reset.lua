-- An operator's reset of one subject: removes its state, live or expired, and frees its slot.
-- KEYS: the shard's meta hash, its index, the bucket's state hash and expiry zset.
-- ARGV: the shard's key-name base, the bucket, the member name.
-- Returns the store's time and the state removed ('' when there was none).
local now = clock({KEYS[1]})
local n = entries(KEYS[1])
local state = redis.call('HGET', KEYS[3], ARGV[3])
if not state then
  return {str(now), ''}
end
redis.call('HDEL', KEYS[3], ARGV[3])
redis.call('ZREM', KEYS[4], ARGV[3])
reindex(ARGV[1], KEYS[2], ARGV[2])
if n > 0 then
  n = n - 1
end
redis.call('HSET', KEYS[1], 'w', str(now), 'n', str(n))
return {str(now), state}
