-- The common case first: a single check (KEYS: its shard's hash and index and its expiry set)
-- of a key already stored in its shard. It creates none of the functions and tables the
-- general path below needs and answers {now, written, state, next, entries}; any other
-- admission (a batch, a key not stored yet) goes on to the general path, which reads again.
if #KEYS == 3 then
  local now = server_time()
  local member = ARGV[9]
  local fields = redis.call('HMGET', KEYS[1], 'w', 'n', member)
  local state = fields[3]
  if state then
    local w, n = fields[1], fields[2]
    if w then
      w = num(w)
      if w == nil then
        fail('malformed shard watermark')
      end
      if w > now then
        now = w
      end
    end
    if n then
      n = num(n)
      if n == nil then
        fail('malformed shard entry count')
      end
    else
      n = 0
    end
    local allowed, following = evaluate(state, now, 9)
    if not allowed then
      return {now, 0, state, '', n}
    end
    if w == nil or now > w then
      redis.call('HSET', KEYS[1], member, following, 'w', str(now))
    else
      redis.call('HSET', KEYS[1], member, following)
    end
    return {now, 1, state, following, n}
  end
end

