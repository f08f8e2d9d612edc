-- Shared by every Runlimit script: exact integer arithmetic and the time.
--
-- Lua numbers are doubles: an integer is exact only below 2^53, and tostring keeps 14
-- significant digits. So this file never formats a number with tostring (str below formats an
-- integral double through a 64-bit integer, exact below 2^53), reads stored numbers only after checking they are digits (at most 15 for a
-- plain number, so below 2^53), and keeps a 64-bit quantity above that (a count up to
-- 2^63 - 1, a GCRA remainder) as two exact limbs in base 10^9, compared, added and subtracted
-- limb by limb. Counts of at most 15 digits, by far the common case, take the plain path.
--
-- A script runs its whole chunk, creating every local function, on each call: functions only
-- slow paths need (limbs, the shard functions of shard.lua, cleanup) are created on first use,
-- and an admission script runs its fast path (single.lua) before this file, with only the
-- rule's plain function created.

-- Fails the script with the error reply `RUNLIMIT <what>`. Only ever called before the first
-- write, so a failed script has changed nothing.
local function fail(what)
  error({err = 'RUNLIMIT ' .. what})
end

-- A decimal integer below 10^15 (< 2^53, so exact), or nil when s is not one. (Arithmetic,
-- `s + 0`, parses the checked digits once; tonumber would parse them twice.)
local function num(s)
  if type(s) ~= 'string' or #s == 0 or #s > 15 or string.find(s, '^%d+$') == nil then
    return nil
  end
  return s + 0
end

-- An exact integer below 2^53 as its decimal digits. ('%d' converts the double to a 64-bit
-- integer first, exactly for every integer below 2^53, and is much cheaper than '%.0f'.)
local function str(x)
  return string.format('%d', x)
end

-- Limbs: a decimal integer of at most 20 digits as {hi, lo}, value = hi * 10^9 + lo.
local big, cmp, add, sub, is_zero, fmt
local function limbs()
  if big then
    return
  end
  local BASE = 1000000000
  big = function(s)
    if type(s) ~= 'string' or #s == 0 or #s > 20 or string.find(s, '^%d+$') == nil then
      return nil
    end
    local n = #s
    if n <= 9 then
      return {0, tonumber(s)}
    end
    return {tonumber(string.sub(s, 1, n - 9)), tonumber(string.sub(s, n - 8))}
  end
  -- -1, 0 or 1 as a < b, a == b, a > b.
  cmp = function(a, b)
    if a[1] ~= b[1] then
      return a[1] < b[1] and -1 or 1
    end
    if a[2] ~= b[2] then
      return a[2] < b[2] and -1 or 1
    end
    return 0
  end
  add = function(a, b)
    local hi, lo = a[1] + b[1], a[2] + b[2]
    if lo >= BASE then
      hi, lo = hi + 1, lo - BASE
    end
    return {hi, lo}
  end
  -- a - b for a >= b.
  sub = function(a, b)
    local hi, lo = a[1] - b[1], a[2] - b[2]
    if lo < 0 then
      hi, lo = hi - 1, lo + BASE
    end
    return {hi, lo}
  end
  is_zero = function(a)
    return a[1] == 0 and a[2] == 0
  end
  -- The decimal digits of limbs, without leading zeros.
  fmt = function(a)
    if a[1] == 0 then
      return str(a[2])
    end
    return str(a[1]) .. string.format('%09d', a[2])
  end
end

-- The server's TIME in whole milliseconds (truncated). (single.lua computes it the same way.)
local function server_time()
  local t = redis.call('TIME')
  local micros = t[2] + 0
  return t[1] * 1000 + (micros - micros % 1000) / 1000
end

-- The expiry (ms) of a stored state: the algorithm's file sets it.
local expiry_of

