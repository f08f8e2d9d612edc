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

-- A shard's hash holds its entries (member -> state) and three fields: w, the latest time (ms)
-- an operation on the shard used; n, the entries it holds; e, a lower bound of the earliest
-- expiry in the shard (absent: unknown). Member names are 24 bytes, so they never collide with
-- these one-letter fields. Reads w, n, e and the states of `members` in one HMGET; fails when a
-- field is malformed. Returns w (or nil), n, e (or nil) and the states (false when absent).
local function read_shard(hash, members)
  local fields = redis.call('HMGET', hash, 'w', 'n', 'e', unpack(members))
  local w, n, e = fields[1], fields[2], fields[3]
  if w then
    w = num(w)
    if w == nil then
      fail('malformed shard watermark')
    end
  else
    w = nil
  end
  if n then
    n = num(n)
    if n == nil then
      fail('malformed shard entry count')
    end
  else
    n = 0
  end
  if e then
    e = num(e)
    if e == nil then
      fail('malformed shard expiry bound')
    end
  else
    e = nil
  end
  local states = {}
  for j = 1, #members do
    states[j] = fields[3 + j]
  end
  return w, n, e, states
end

-- Fails unless `key` holds a value of `kind` or nothing. Redis checks a key's type only when a
-- command touches it, and a script is never rolled back, so every key the write phase writes
-- without having read it is checked here, in the read phase: a key of another type (written by
-- something else) then fails the script before its first write.
local function expect_type(key, kind)
  local found = redis.call('TYPE', key).ok
  if found ~= kind and found ~= 'none' then
    fail(key .. ' holds a ' .. found .. ', not a ' .. kind)
  end
end

-- The server's TIME in whole milliseconds (truncated).
local function server_time()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The index of a shard (zset: bucket -> score) holds, for each non-empty bucket, a lower bound
-- of the bucket's earliest expiry: exact when the bucket was last re-indexed, and kept valid
-- without re-indexing because an entry's expiry never decreases (time only moves forward) and
-- only a new entry can lower a bucket's minimum (it lowers the bound with ZADD LT). The meta
-- field e bounds the whole shard the same way, so an admission skips cleanup without reading
-- the index while e > now.

-- Read phase of bounded cleanup: examines at most `budget` buckets whose bound has passed,
-- earliest bound first, and plans the removal of at most `budget` expired entries from them.
-- Returns {buckets = {{b, members}...}, examined = {b...}, count, removed = set of
-- bucket .. ':' .. member, by_bucket = b -> count}. Writes nothing.
local function plan_cleanup(base, index, now, budget)
  local plan = {buckets = {}, examined = {}, count = 0, removed = {}, by_bucket = {}}
  if budget <= 0 then
    return plan
  end
  local due = redis.call('ZRANGEBYSCORE', index, '-inf', now, 'LIMIT', 0, budget)
  for _, b in ipairs(due) do
    table.insert(plan.examined, b)
    local left = budget - plan.count
    if left > 0 then
      local members = redis.call('ZRANGEBYSCORE', base .. 'x' .. b, '-inf', now, 'LIMIT', 0, left)
      if #members > 0 then
        table.insert(plan.buckets, {b, members})
        plan.by_bucket[b] = #members
        plan.count = plan.count + #members
        for _, member in ipairs(members) do
          plan.removed[b .. ':' .. member] = true
        end
      end
    end
  end
  return plan
end

-- Sets bucket b's bound in the index to its exact earliest expiry (removes it when empty).
local function reindex(base, index, b)
  local first = redis.call('ZRANGE', base .. 'x' .. b, 0, 0, 'WITHSCORES')
  if first[1] then
    redis.call('ZADD', index, first[2], b)
  else
    redis.call('ZREM', index, b)
  end
end

-- Write phase of bounded cleanup: removes what plan_cleanup found from the shard's hash and
-- expiry sets, re-indexes every bucket it examined, and returns the shard's new bound e (the
-- index's lowest score, or nil if empty).
local function apply_cleanup(base, index, plan)
  for _, entry in ipairs(plan.buckets) do
    local b, members = entry[1], entry[2]
    redis.call('HDEL', base .. 's', unpack(members))
    redis.call('ZREM', base .. 'x' .. b, unpack(members))
  end
  for _, b in ipairs(plan.examined) do
    reindex(base, index, b)
  end
  local first = redis.call('ZRANGE', index, 0, 0, 'WITHSCORES')
  return first[2]
end

-- The exact earliest expiry left in a shard once plan's entries are gone, or nil when it is
-- empty. Bounds are lower bounds: visit buckets in bound order, reading each one's earliest
-- remaining expiry (past the entries the plan removes, the lowest-ranked of its bucket), until
-- a bound is no lower than the best found.
local function earliest(base, index, plan)
  local bounds = redis.call('ZRANGE', index, 0, -1, 'WITHSCORES')
  local best = nil
  for j = 1, #bounds, 2 do
    local b, bound = bounds[j], tonumber(bounds[j + 1])
    if best ~= nil and bound >= best then
      break
    end
    local skip = plan.by_bucket[b] or 0
    local rest = redis.call('ZRANGE', base .. 'x' .. b, skip, skip, 'WITHSCORES')
    if rest[2] then
      local at = tonumber(rest[2])
      if best == nil or at < best then
        best = at
      end
    end
  end
  return best
end
