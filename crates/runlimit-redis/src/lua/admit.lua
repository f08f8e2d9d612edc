-- One admission: a single check or a whole atomic batch, in one script.
--
-- KEYS: for each shard s the operation touches, its hash (entries and the fields w, n, e) and
-- its index; then for each check i, its bucket's expiry set.
-- ARGV: for each check i, its member name and the algorithm's arguments; then the admission's
-- plan, decimal integers separated by spaces: the expired entries examined per check, the
-- capacity per shard, and for each check its shard (1-based position among the shards) and
-- its bucket. So M = (#ARGV - 1) / (1 + ARGS) and S = (#KEYS - M) / 2; a shard's key-name base
-- is its hash's name without the final 's'. (A single check, the common case, sends 3 KEYS
-- and 2 + ARGS ARGV.)
--
-- Read and evaluate everything first, write last: Redis never rolls a script back, so nothing
-- after the first write can fail (every value written was validated in the read phase, and
-- every key written without being read had its type checked). States are written only when
-- every check is allowed and every new key fits its shard; bounded cleanup of expired entries,
-- which no decision depends on, is written either way.
--
-- A check of a stored key is three commands: TIME, one HMGET of the state and the shard's
-- fields, one HSET of both (single.lua's fast path, which also computes M).
local width = 1 + ARGS
local S = (#KEYS - M) / 2
local plan = {}
for value in string.gmatch(ARGV[#ARGV] or '', '%d+') do
  plan[#plan + 1] = value
end
if M < 1 or M % 1 ~= 0 or S < 1 or S % 1 ~= 0 or #plan ~= 2 + 2 * M then
  fail('malformed admission arguments')
end
local per_check, capacity = tonumber(plan[1]), tonumber(plan[2])

-- Read: each shard's fields and its checks' states (one HMGET per shard), and the time,
-- clamped up to every watermark.
local now = server_time()
local shards, checks = {}, {}
for s = 1, S do
  local hash = KEYS[2 * s - 1]
  shards[s] = {hash = hash, index = KEYS[2 * s], base = string.sub(hash, 1, -2), checks = 0,
    members = {}, new = 0}
end
for i = 1, M do
  local o = (i - 1) * width + 1
  local shard = shards[tonumber(plan[1 + 2 * i])]
  if shard == nil then
    fail('malformed admission arguments')
  end
  local members = shard.members
  members[#members + 1] = ARGV[o]
  shard.checks = shard.checks + 1
  checks[i] = {shard = shard, slot = #members, bucket = plan[2 + 2 * i], member = ARGV[o], at = o}
end
for s = 1, S do
  local shard = shards[s]
  local w, n, e, fields = read_shard(shard.hash, shard.members)
  if w and w > now then
    now = w
  end
  shard.w, shard.n, shard.raw_e, shard.fields = w, n, e, fields
end

-- Read: cleanup plans, only for shards that may lack room for their new keys. Expired entries
-- never change a decision except by holding a slot, so a shard with room for every check of
-- the admission whose key is not stored skips cleanup (cleanup_expired reclaims the rest); a
-- shard without enough room first examines up to its budget of entries whose recorded expiry
-- has passed, freeing the expired ones, as a memory store's admission does.
for s = 1, S do
  local shard = shards[s]
  local absent = 0
  for j = 1, #shard.members do
    if not shard.fields[3 + j] then
      absent = absent + 1
    end
  end
  shard.free = capacity - shard.n
  if absent > 0 then
    -- The bound matters only when a new entry may lower it or cleanup may run.
    shard.e = bound(shard.raw_e)
  end
  if absent > shard.free and ((shard.e == nil and shard.n > 0) or (shard.e ~= nil and shard.e <= now)) then
    cleanup_functions()
    shard.plan = plan_cleanup(shard.hash, shard.base, shard.index, now, per_check * shard.checks)
    shard.free = shard.free + shard.plan.count
  end
end

-- Evaluate every check in input order, writing nothing.
local write = true
for i = 1, M do
  local check = checks[i]
  local shard = check.shard
  local state = shard.fields[3 + check.slot]
  if state and shard.plan and shard.plan.removed[check.member] then
    state = false
  end
  local allowed, following, expiry = evaluate(state, now, check.at)
  check.state, check.allowed, check.following, check.expiry = state, allowed, following, expiry
  if allowed then
    if not state then
      -- A new entry: its bucket's expiry set and the shard's index are written unread.
      expect_type(KEYS[2 * S + i], 'zset')
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

-- Write: cleanup, then (when allowed) each new entry's expiry and index bound, then each
-- shard's states and fields in one HSET; a shard short of room gets its earliest expiry.
for s = 1, S do
  local shard = shards[s]
  local fields = {}
  local plan = shard.plan
  if plan then
    local e = apply_cleanup(shard.hash, shard.base, shard.index, plan)
    shard.n = shard.n - plan.count
    if plan.count > 0 then
      fields[#fields + 1] = 'n'
      fields[#fields + 1] = str(shard.n)
    end
    if e ~= shard.e then
      shard.e, shard.e_changed = e, true
    end
  end
  if write then
    local inserted = 0
    for i = 1, M do
      local check = checks[i]
      if check.shard == shard then
        fields[#fields + 1] = check.member
        fields[#fields + 1] = check.following
        if not check.state then
          redis.call('ZADD', KEYS[2 * S + i], check.expiry, check.member)
          redis.call('ZADD', shard.index, 'LT', check.expiry, check.bucket)
          if shard.e == nil or check.expiry < shard.e then
            shard.e, shard.e_changed = check.expiry, true
          end
          inserted = inserted + 1
        end
      end
    end
    if inserted > 0 then
      shard.n = shard.n + inserted
      fields[#fields + 1] = 'n'
      fields[#fields + 1] = str(shard.n)
    end
  end
  if (write or plan) and (shard.w == nil or now > shard.w) then
    fields[#fields + 1] = 'w'
    fields[#fields + 1] = str(now)
  end
  if shard.e_changed and shard.e then
    fields[#fields + 1] = 'e'
    fields[#fields + 1] = str(shard.e)
  end
  if #fields > 0 then
    redis.call('HSET', shard.hash, unpack(fields))
  end
  if shard.e_changed and not shard.e then
    redis.call('HDEL', shard.hash, 'e')
  end
  if not write and shard.new > shard.free then
    cleanup_functions()
    shard.earliest = earliest(shard.hash, shard.base, shard.index, 256)
  end
end

-- The reply: one string of space-separated fields (states hold no space; an empty field is
-- ''), which both sides handle far more cheaply than an array of as many elements: the time,
-- whether the script wrote (1 or 0); for each check its state as read ('' when absent),
-- whether it was present, whether its rule allowed it, and the state written ('' when
-- nothing was written); for each shard its entries after the admission, the expired entries
-- its cleanup removed, and its earliest expiry when a new key did not fit ('' otherwise).
local reply = {str(now), write and '1' or '0'}
for i = 1, M do
  local check = checks[i]
  reply[#reply + 1] = check.state or ''
  reply[#reply + 1] = check.state and '1' or '0'
  reply[#reply + 1] = check.allowed and '1' or '0'
  reply[#reply + 1] = write and check.following or ''
end
for s = 1, S do
  local shard = shards[s]
  reply[#reply + 1] = str(shard.n)
  reply[#reply + 1] = str(shard.plan and shard.plan.count or 0)
  reply[#reply + 1] = shard.earliest and str(shard.earliest) or ''
end
return table.concat(reply, ' ')
