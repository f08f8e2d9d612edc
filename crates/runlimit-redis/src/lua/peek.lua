-- A subject's stored state and the store's time, read only.
-- KEYS: the shard's hash. ARGV: the member name.
local w, _, _, fields = read_shard(KEYS[1], {ARGV[1]})
local now = server_time()
if w and w > now then
  now = w
end
return {now, fields[4] or ''}
