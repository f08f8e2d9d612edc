-- One admission: a single check or a whole atomic batch, in one script.
--
-- KEYS: for each shard s the operation touches, its meta hash and its index; then for each
-- check i, its bucket's state hash and expiry zset.
-- ARGV: shard count, check count, expired removals per check, capacity per shard; for each
-- shard its key-name base and how many checks it holds; for each check its shard (1-based
-- position), bucket, member name and the algorithm's arguments.
--
-- Read and evaluate everything first, write last: Redis never rolls a script back, so nothing
-- after the first write can fail (every value written was validated in the read phase).
-- Writes happen only when every check is allowed and every new key fits its shard, except
-- bounded cleanup of expired entries, which no decision depends on.
local S, M = num(ARGV[1]), num(ARGV[2])
local per_check, capacity = num(ARGV[3]), num(ARGV[4])
if S == nil or M == nil or per_check == nil or capacity == nil or S < 1 or M < 1 then
  fail('malformed admission header')
end

-- Read: the shards' meta fields and the time, clamped up to every watermark.
local now = server_time()
local shards = {}
for s = 1, S do
  local checks = num(ARGV[4 + 2 * s])
  if checks == nil then
    fail('malformed shard arguments')
  end
  local w, n, e = meta_fields(KEYS[2 * s - 1])
  if w and w > now then
    now = w
  end
  shards[s] = {meta = KEYS[2 * s - 1], index = KEYS[2 * s], base = ARGV[3 + 2 * s], checks = checks,
    w = w, n = n, e = e, new = 0, inserted = 0}
end

-- Read: cleanup plans, only for shards whose bound has passed.
for s = 1, S do
  local shard = shards[s]
  if shard.e == nil or shard.e <= now then
    shard.plan = plan_cleanup(shard.base, shard.index, now, per_check * shard.checks)
  else
    shard.plan = {buckets = {}, examined = {}, count = 0, removed = {}, by_bucket = {}}
  end
  shard.free = capacity - (shard.n - shard.plan.count)
end

-- Evaluate every check in input order, writing nothing.
local checks, write = {}, true
for i = 1, M do
  local o = 4 + 2 * S + (i - 1) * (3 + ARGS)
  local s, b, member = num(ARGV[o + 1]), ARGV[o + 2], ARGV[o + 3]
  local shard = s and shards[s]
  if shard == nil or num(b) == nil then
    fail('malformed check arguments')
  end
  local state = redis.call('HGET', KEYS[2 * S + 2 * i - 1], member)
  if state and shard.plan.removed[b .. ':' .. member] then
    state = false
  end
  local allowed, following, expiry, moved = evaluate(state, now, o + 3)
  local present = state and true or false
  if allowed then
    if moved then
      expect_type(KEYS[2 * S + 2 * i], 'zset')
    end
    if not present then
      if shard.new == 0 then
        expect_type(shard.index, 'zset')
      end
      shard.new = shard.new + 1
      if shard.new > shard.free then
        write = false
      end
    end
  else
    write = false
  end
  checks[i] = {state = state or '', present = present, allowed = allowed, following = following,
    expiry = expiry, moved = moved, bucket = b, member = member, hash = KEYS[2 * S + 2 * i - 1], zset = KEYS[2 * S + 2 * i],
    shard = shard}
end

-- Storage retry for shards short of room (read only; nothing is written in that case).
if not write then
  for s = 1, S do
    local shard = shards[s]
    if shard.new > shard.free then
      shard.earliest = earliest(shard.base, shard.index, shard.plan)
    end
  end
end

-- Write: cleanup, then (when allowed) every check's state, then the shards' meta fields.
for s = 1, S do
  local shard = shards[s]
  if #shard.plan.examined > 0 then
    local e = apply_cleanup(shard.base, shard.index, shard.plan)
    shard.e = e and tonumber(e) or nil
    shard.e_changed = true
  end
end
if write then
  for i = 1, M do
    local check = checks[i]
    local shard = check.shard
    redis.call('HSET', check.hash, check.member, check.following)
    if check.moved then
      redis.call('ZADD', check.zset, check.expiry, check.member)
    end
    if not check.present then
      -- A new entry may lower its bucket's and its shard's earliest expiry.
      redis.call('ZADD', shard.index, 'LT', check.expiry, check.bucket)
      if shard.e == nil or check.expiry < shard.e then
        shard.e = check.expiry
        shard.e_changed = true
      end
      shard.inserted = shard.inserted + 1
    end
  end
end
for s = 1, S do
  local shard = shards[s]
  local delta = shard.inserted - shard.plan.count
  if delta ~= 0 then
    redis.call('HINCRBY', shard.meta, 'n', delta)
    shard.n = shard.n + delta
  end
  if (write or #shard.plan.examined > 0) and (shard.w == nil or now > shard.w) then
    redis.call('HSET', shard.meta, 'w', str(now))
  end
  if shard.e_changed then
    if shard.e then
      redis.call('HSET', shard.meta, 'e', str(shard.e))
    else
      redis.call('HDEL', shard.meta, 'e')
    end
  end
end

local reply = {now, write and 1 or 0}
for i = 1, M do
  local check = checks[i]
  table.insert(reply, check.state)
  table.insert(reply, check.present and 1 or 0)
  table.insert(reply, check.allowed and 1 or 0)
  table.insert(reply, write and check.following or '')
end
for s = 1, S do
  local shard = shards[s]
  table.insert(reply, shard.n)
  table.insert(reply, shard.plan.count)
  table.insert(reply, shard.earliest or '')
end
return reply
