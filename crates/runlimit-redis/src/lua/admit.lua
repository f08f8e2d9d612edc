-- One admission: a single check or a whole atomic batch, in one script.
--
-- KEYS: for each shard s the operation touches, its hash (entries and the fields w, n, e) and
-- its index; then for each check i, its bucket's expiry zset.
-- ARGV: shard count, check count, expired removals per check, capacity per shard; for each
-- shard its key-name base and how many checks it holds; for each check its shard (1-based
-- position), bucket, member name and the algorithm's arguments.
--
-- Read and evaluate everything first, write last: Redis never rolls a script back, so nothing
-- after the first write can fail (every value written was validated in the read phase, and
-- every key written without being read had its type checked). Writes happen only when every
-- check is allowed and every new key fits its shard, except bounded cleanup of expired
-- entries, which no decision depends on.
local S, M = num(ARGV[1]), num(ARGV[2])
local per_check, capacity = num(ARGV[3]), num(ARGV[4])
if S == nil or M == nil or per_check == nil or capacity == nil or S < 1 or M < 1 then
  fail('malformed admission header')
end
local function offset(i)
  return 4 + 2 * S + (i - 1) * (3 + ARGS)
end

-- Read: each shard's fields and its checks' states (one HMGET per shard), and the time,
-- clamped up to every watermark.
local now = server_time()
local shards = {}
for s = 1, S do
  local count = num(ARGV[4 + 2 * s])
  if count == nil then
    fail('malformed shard arguments')
  end
  shards[s] = {hash = KEYS[2 * s - 1], index = KEYS[2 * s], base = ARGV[3 + 2 * s], checks = count,
    members = {}, at = {}, new = 0, inserted = 0}
end
local checks = {}
for i = 1, M do
  local o = offset(i)
  local s, b, member = num(ARGV[o + 1]), ARGV[o + 2], ARGV[o + 3]
  local shard = s and shards[s]
  if shard == nil or num(b) == nil then
    fail('malformed check arguments')
  end
  table.insert(shard.members, member)
  checks[i] = {shard = shard, slot = #shard.members, bucket = b, member = member, zset = KEYS[2 * S + i]}
end
for s = 1, S do
  local shard = shards[s]
  local w, n, e, states = read_shard(shard.hash, shard.members)
  if w and w > now then
    now = w
  end
  shard.w, shard.n, shard.e, shard.states = w, n, e, states
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
local write = true
for i = 1, M do
  local check = checks[i]
  local shard = check.shard
  local state = shard.states[check.slot]
  if state and shard.plan.removed[check.bucket .. ':' .. check.member] then
    state = false
  end
  local allowed, following, expiry, moved = evaluate(state, now, offset(i) + 3)
  check.state, check.present, check.allowed = state or '', state and true or false, allowed
  check.following, check.expiry, check.moved = following, expiry, moved
  if allowed then
    if moved then
      expect_type(check.zset, 'zset')
    end
    if not check.present then
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

-- Write: cleanup, then (when allowed) every check's expiry and index bound, then each shard's
-- states and fields in one HSET.
for s = 1, S do
  local shard = shards[s]
  shard.fields = {}
  if #shard.plan.examined > 0 then
    local e = apply_cleanup(shard.base, shard.index, shard.plan)
    shard.e = e and tonumber(e) or nil
    shard.e_changed = true
    shard.n = shard.n - shard.plan.count
    shard.n_changed = shard.plan.count > 0
  end
end
if write then
  for i = 1, M do
    local check = checks[i]
    local shard = check.shard
    table.insert(shard.fields, check.member)
    table.insert(shard.fields, check.following)
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
      shard.n = shard.n + 1
      shard.n_changed = true
    end
  end
end
for s = 1, S do
  local shard = shards[s]
  local fields = shard.fields
  if (write or #shard.plan.examined > 0) and (shard.w == nil or now > shard.w) then
    table.insert(fields, 'w')
    table.insert(fields, str(now))
  end
  if shard.n_changed then
    table.insert(fields, 'n')
    table.insert(fields, str(shard.n))
  end
  if shard.e_changed and shard.e then
    table.insert(fields, 'e')
    table.insert(fields, str(shard.e))
  end
  if #fields > 0 then
    redis.call('HSET', shard.hash, unpack(fields))
  end
  if shard.e_changed and not shard.e then
    redis.call('HDEL', shard.hash, 'e')
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
