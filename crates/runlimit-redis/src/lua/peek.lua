-- A subject's stored state and the store's time, read only.
-- KEYS: the shard's meta hash, the bucket's state hash. ARGV: the member name.
local now = clock({KEYS[1]})
local state = redis.call('HGET', KEYS[2], ARGV[1])
return {str(now), state or ''}
