-- Shared by every Runlimit script: exact integer arithmetic and the shard layout.
--
-- Lua numbers are doubles: an integer is exact only below 2^53, and tostring keeps 14
-- significant digits. So this file never formats a number with tostring (str below is exact
-- below 2^53), reads small numbers only after checking they have at most 15 digits, and keeps
-- every 64-bit quantity (counts up to 2^63 - 1, GCRA remainders) as two exact limbs in base
-- 10^9, compared, added and subtracted limb by limb.

local BASE = 1000000000

-- Fails the script with the error reply `RUNLIMIT <what>`. Only ever called before the first
-- write, so a failed script has changed nothing.
local function fail(what)
  error({err = 'RUNLIMIT ' .. what})
end

-- A decimal integer below 10^15 (< 2^53, so exact), or nil when s is not one.
local function num(s)
  if type(s) ~= 'string' or #s == 0 or #s > 15 or string.find(s, '^%d+$') == nil then
    return nil
  end
  return tonumber(s)
end

-- An exact integer below 2^53 as its decimal digits.
local function str(x)
  return string.format('%.0f', x)
end

-- A decimal integer of at most 20 digits as limbs {hi, lo} (value = hi * 10^9 + lo), or nil.
local function big(s)
  if type(s) ~= 'string' or #s == 0 or #s > 20 or string.find(s, '^%d+$') == nil then
    return nil
  end
  local n = #s
  if n <= 9 then
    return {0, tonumber(s)}
  end
  return {tonumber(string.sub(s, 1, n - 9)), tonumber(string.sub(s, n - 8))}
end

local ZERO = {0, 0}

-- -1, 0 or 1 as a < b, a == b, a > b.
local function cmp(a, b)
  if a[1] ~= b[1] then
    return a[1] < b[1] and -1 or 1
  end
  if a[2] ~= b[2] then
    return a[2] < b[2] and -1 or 1
  end
  return 0
end

local function add(a, b)
  local hi, lo = a[1] + b[1], a[2] + b[2]
  if lo >= BASE then
    hi, lo = hi + 1, lo - BASE
  end
  return {hi, lo}
end

-- a - b for a >= b.
local function sub(a, b)
  local hi, lo = a[1] - b[1], a[2] - b[2]
  if lo < 0 then
    hi, lo = hi - 1, lo + BASE
  end
  return {hi, lo}
end

local function is_zero(a)
  return a[1] == 0 and a[2] == 0
end

-- The decimal digits of limbs, without leading zeros.
local function fmt(a)
  if a[1] == 0 then
    return str(a[2])
  end
  return str(a[1]) .. string.format('%09.0f', a[2])
end

-- The store's time in whole milliseconds: the server's TIME, truncated, clamped up to the
-- watermarks of the shards the operation touches (metas: meta hash names), so a clock that
-- steps back (or a failover to a server whose clock is behind) never replenishes early.
-- Fails on a malformed watermark.
local function clock(metas)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  for _, meta in ipairs(metas) do
    local w = redis.call('HGET', meta, 'w')
    if w then
      w = num(w)
      if w == nil then
        fail('malformed shard watermark')
      end
      if w > now then
        now = w
      end
    end
  end
  return now
end

-- The entries a shard counts (field n of its meta hash); fails when malformed.
local function entries(meta)
  local n = redis.call('HGET', meta, 'n')
  if not n then
    return 0
  end
  n = num(n)
  if n == nil then
    fail('malformed shard entry count')
  end
  return n
end

-- Re-positions bucket b of a shard in the shard's index (its earliest expiry, or gone when
-- the bucket is empty). base: the shard's key-name base; index: its index zset.
local function reindex(base, index, b)
  local first = redis.call('ZRANGE', base .. 'b' .. b .. ':x', 0, 0, 'WITHSCORES')
  if first[1] then
    redis.call('ZADD', index, first[2], b)
  else
    redis.call('ZREM', index, b)
  end
end

-- Read phase of bounded cleanup: up to `budget` expired entries of a shard, earliest expiry
-- first, found through the shard's index. Returns {buckets = {{b, members}...}, count,
-- removed = set of bucket .. ':' .. member}. Writes nothing.
local function plan_cleanup(base, index, now, budget)
  local plan = {buckets = {}, count = 0, removed = {}, by_bucket = {}}
  if budget <= 0 then
    return plan
  end
  local due = redis.call('ZRANGEBYSCORE', index, '-inf', str(now), 'LIMIT', 0, budget)
  for _, b in ipairs(due) do
    local left = budget - plan.count
    if left <= 0 then
      break
    end
    local members = redis.call('ZRANGEBYSCORE', base .. 'b' .. b .. ':x', '-inf', str(now), 'LIMIT', 0, left)
    if #members > 0 then
      table.insert(plan.buckets, {b, members})
      plan.by_bucket[b] = #members
      plan.count = plan.count + #members
      for _, member in ipairs(members) do
        plan.removed[b .. ':' .. member] = true
      end
    end
  end
  return plan
end

-- Write phase of bounded cleanup: removes what plan_cleanup found. Returns the buckets it
-- touched (a set) so the caller re-indexes them once.
local function apply_cleanup(base, plan, touched)
  for _, entry in ipairs(plan.buckets) do
    local b, members = entry[1], entry[2]
    redis.call('HDEL', base .. 'b' .. b .. ':s', unpack(members))
    redis.call('ZREM', base .. 'b' .. b .. ':x', unpack(members))
    touched[b] = true
  end
end

-- The earliest expiry left in a shard once plan's entries are gone, or nil when it is empty.
-- The plan removed the lowest-ranked entries of each bucket it names, so a bucket's next
-- expiry is at the rank equal to its removal count; among the index's lowest |plan| + 1
-- buckets at least one was not cleaned, and every bucket ranked after it starts later.
local function earliest(base, index, plan)
  local first = redis.call('ZRANGE', index, 0, #plan.buckets, 'WITHSCORES')
  local best = nil
  for j = 1, #first, 2 do
    local b, score = first[j], tonumber(first[j + 1])
    local removed = plan.by_bucket[b]
    if removed then
      local rest = redis.call('ZRANGE', base .. 'b' .. b .. ':x', removed, removed, 'WITHSCORES')
      score = rest[2] and tonumber(rest[2]) or nil
    end
    if score and (best == nil or score < best) then
      best = score
    end
  end
  return best
end
