-- Shared by the scripts that work on a shard: its hash, type checks and bounded cleanup.

-- A shard's hash holds its entries (member -> state) and three fields: w, the latest time (ms)
-- an operation on the shard used; n, the entries it holds; e, a lower bound of the earliest
-- expiry in the shard (absent: unknown). Member names are 24 bytes, so they never collide with
-- these one-letter fields. Reads w, n, e and the states of `members` in one HMGET and parses w
-- and n (failing when malformed). Returns w (or nil), n, the raw e (parse it with bound) and
-- the reply, where member j's state (false when absent) is at index 3 + j.
local function read_shard(hash, members)
  local fields = redis.call('HMGET', hash, 'w', 'n', 'e', unpack(members))
  local w, n = fields[1], fields[2]
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
  return w, n, fields[3], fields
end

-- The shard's expiry bound from its raw field (nil when absent); fails when malformed.
local function bound(e)
  if not e then
    return nil
  end
  e = num(e)
  if e == nil then
    fail('malformed shard expiry bound')
  end
  return e
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

-- Expiry bounds. A bucket's expiry set scores each member by a lower bound of its state's
-- expiry: exact when the member was added, and still a lower bound afterwards, because an
-- entry's expiry never decreases (time only moves forward), so admissions of stored keys never
-- rewrite it. The shard's index scores each non-empty bucket by a lower bound of its members'
-- scores (a new member lowers it with ZADD LT), and the field e bounds the whole shard, so an
-- admission skips cleanup without reading the index while e > now. Cleanup reads the state
-- behind every score that has passed: an expired entry is removed, a live one re-scored at its
-- real expiry (as the memory stores' lazy expiry heap does).
local plan_cleanup, apply_cleanup, earliest
local function cleanup_functions()
  if plan_cleanup then
    return
  end
  -- Read phase: examines entries whose recorded expiry has passed, in buckets whose bound has
  -- passed, earliest bound first, until `budget` expired entries are found or `budget` live
  -- ones were re-scored (the memory stores' removal and refresh allowances). Returns
  -- {buckets = {{b, remove, drop, refresh}...}, examined = {b...}, count (entries to remove),
  -- removed = set of member}. Writes nothing.
  plan_cleanup = function(hash, base, index, now, budget)
    local plan = {buckets = {}, examined = {}, count = 0, removed = {}}
    if budget <= 0 then
      return plan
    end
    local refreshes = 0
    local due = redis.call('ZRANGEBYSCORE', index, '-inf', now)
    for _, b in ipairs(due) do
      if plan.count >= budget or refreshes >= budget then
        break
      end
      table.insert(plan.examined, b)
      local wanted = 2 * budget - plan.count - refreshes
      local members = redis.call('ZRANGEBYSCORE', base .. 'x' .. b, '-inf', now, 'LIMIT', 0, wanted)
      if #members > 0 then
        local states = redis.call('HMGET', hash, unpack(members))
        local entry = {b, {}, {}, {}}
        for j, member in ipairs(members) do
          local state = states[j]
          if not state then
            table.insert(entry[3], member)
          else
            local expiry = expiry_of(state)
            if expiry <= now then
              if plan.count < budget then
                table.insert(entry[2], member)
                plan.removed[member] = true
                plan.count = plan.count + 1
              end
            elseif refreshes < budget then
              table.insert(entry[4], expiry)
              table.insert(entry[4], member)
              refreshes = refreshes + 1
            end
          end
        end
        table.insert(plan.buckets, entry)
      end
    end
    return plan
  end

  -- Write phase: removes the expired entries and stray members the plan found, re-scores the
  -- live ones, re-bounds every examined bucket in the index, and returns the shard's new bound
  -- e (the index's lowest score, or nil when the shard is empty). (HSET duplicates are fine:
  -- the caller may set a field twice in one HSET; the last value wins.)
  apply_cleanup = function(hash, base, index, plan)
    for _, entry in ipairs(plan.buckets) do
      local set = base .. 'x' .. entry[1]
      if #entry[2] > 0 then
        redis.call('HDEL', hash, unpack(entry[2]))
        redis.call('ZREM', set, unpack(entry[2]))
      end
      if #entry[3] > 0 then
        redis.call('ZREM', set, unpack(entry[3]))
      end
      if #entry[4] > 0 then
        redis.call('ZADD', set, unpack(entry[4]))
      end
    end
    for _, b in ipairs(plan.examined) do
      local first = redis.call('ZRANGE', base .. 'x' .. b, 0, 0, 'WITHSCORES')
      if first[1] then
        redis.call('ZADD', index, first[2], b)
      else
        redis.call('ZREM', index, b)
      end
    end
    local first = redis.call('ZRANGE', index, 0, 0, 'WITHSCORES')
    return first[2] and tonumber(first[2]) or nil
  end

  -- The exact earliest expiry in a shard (after cleanup), or nil when it is empty or more than
  -- `cap` entries would have to be read to be sure. Scores are lower bounds: visit buckets in
  -- bound order and each bucket's members in score order, reading their states, until a bound
  -- or score is no lower than the earliest expiry found.
  earliest = function(hash, base, index, cap)
    local best, read = nil, 0
    local bounds = redis.call('ZRANGE', index, 0, -1, 'WITHSCORES')
    for j = 1, #bounds, 2 do
      if best ~= nil and tonumber(bounds[j + 1]) >= best then
        return best
      end
      local set = base .. 'x' .. bounds[j]
      local scored = redis.call('ZRANGE', set, 0, -1, 'WITHSCORES')
      for k = 1, #scored, 2 do
        if best ~= nil and tonumber(scored[k + 1]) >= best then
          break
        end
        read = read + 1
        if read > cap then
          return nil
        end
        local state = redis.call('HGET', hash, scored[k])
        if state then
          local expiry = expiry_of(state)
          if best == nil or expiry < best then
            best = expiry
          end
        end
      end
    end
    return best
  end
end
