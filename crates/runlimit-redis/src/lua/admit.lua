-- One admission: a single check or a whole atomic batch, in one script.
--
-- KEYS: for each shard s the operation touches, its meta hash (watermark w, entry count n)
-- and its index zset (bucket -> earliest expiry); then for each check i, its bucket's state
-- hash and expiry zset.
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

local metas, shards = {}, {}
for s = 1, S do
  local checks = num(ARGV[4 + 2 * s])
  if checks == nil then
    fail('malformed shard arguments')
  end
  metas[s] = KEYS[2 * s - 1]
  shards[s] = {meta = KEYS[2 * s - 1], index = KEYS[2 * s], base = ARGV[3 + 2 * s], checks = checks, new = 0}
end

-- Read: time, counts, cleanup plans.
local now = clock(metas)
for s = 1, S do
  local shard = shards[s]
  shard.n = entries(shard.meta)
  shard.plan = plan_cleanup(shard.base, shard.index, now, per_check * shard.checks)
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
  local allowed, following, expiry = evaluate(state, now, o + 3)
  local present = state and true or false
  if allowed then
    if not present then
      shard.new = shard.new + 1
      if shard.new > shard.free then
        write = false
      end
    end
  else
    write = false
  end
  checks[i] = {state = state or '', present = present, allowed = allowed, following = following, expiry = expiry,
    bucket = b, member = member, hash = KEYS[2 * S + 2 * i - 1], zset = KEYS[2 * S + 2 * i], shard = shard}
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

-- Write: cleanup, then (when allowed) every check's state, then indexes, counts, watermarks.
local cleaned = false
for s = 1, S do
  local shard = shards[s]
  shard.touched = {}
  if shard.plan.count > 0 then
    apply_cleanup(shard.base, shard.plan, shard.touched)
    shard.n = shard.n - shard.plan.count
    cleaned = true
  end
end
if write then
  for i = 1, M do
    local check = checks[i]
    redis.call('HSET', check.hash, check.member, check.following)
    redis.call('ZADD', check.zset, str(check.expiry), check.member)
    check.shard.touched[check.bucket] = true
    if not check.present then
      check.shard.n = check.shard.n + 1
    end
  end
end
if write or cleaned then
  for s = 1, S do
    local shard = shards[s]
    for b in pairs(shard.touched) do
      reindex(shard.base, shard.index, b)
    end
    redis.call('HSET', shard.meta, 'w', str(now), 'n', str(shard.n))
  end
end

local reply = {str(now), write and 1 or 0}
for i = 1, M do
  local check = checks[i]
  table.insert(reply, check.state)
  table.insert(reply, check.present and 1 or 0)
  table.insert(reply, check.allowed and 1 or 0)
  table.insert(reply, write and check.following or '')
end
for s = 1, S do
  local shard = shards[s]
  table.insert(reply, str(shard.n))
  table.insert(reply, shard.plan.count)
  table.insert(reply, shard.earliest and str(shard.earliest) or '')
end
return reply
