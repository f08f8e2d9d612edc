-- A subject's stored state and the store's time, read only.
-- KEYS: the shard's meta hash, the bucket's state hash. ARGV: the member name.
local w = meta_fields(KEYS[1])
local now = server_time()
if w and w > now then
  now = w
end
local state = redis.call('HGET', KEYS[2], ARGV[1])
return {now, state or ''}
