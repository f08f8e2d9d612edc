-- The GCRA rule (runlimit_core::backend::gcra) for one check, exact for every valid policy.
--
-- State: '<t>:<r>', the theoretical arrival time tat = t * Q + r scaled units (ms * Q), with
-- 0 <= r < Q. Relative to now (scaled now * Q), the state is d = (t - now) * Q + r when
-- t >= now, else 0 (tat < now * Q). A check of cost c is allowed iff
-- d + c*P <= B*P. The client splits the policy's products by Q exactly (in 128 bits):
--   c*P = a*Q + b,  (B - c)*P = m*Q + n,  0 <= b, n < Q,  and sends Q - b,
-- so with k = t - now (or 0), the test d <= m*Q + n is k < m, or k = m and r <= n, and the
-- new state tat + c*P is (now + k + a + carry) * Q + r', with carry = [r + b >= Q] and
-- r' = r + b - carry*Q. Every plain number here is a millisecond count below 2^53
-- (a, m <= the policy's full replenishment time); r, b, n and Q - b are plain exact doubles
-- when they have at most 15 digits (then r + b < 2Q < 2^53), limbs otherwise.
-- Returns allowed, the new state and its expiry ceil(tat' / Q) = t' + [r' > 0].
--
-- This file holds the rule on plain numbers, the only function an admission's fast path
-- creates (see single.lua): it decides when r, b, n and Q - b have at most 15 digits, and
-- returns nil otherwise or for a state it cannot vouch for. The caller then takes the exact
-- rule, `evaluate` (gcra_exact.lua), which fails on a malformed state and uses limbs.
-- (A digit string becomes a number by arithmetic, `s + 0`, which parses it once, where
-- tonumber parses it twice; every string so converted was matched as digits or sent by the
-- client.)
local ARGS = 5

local function plain(state, now, i)
  local b, q_minus_b, n = ARGV[i + 2], ARGV[i + 3], ARGV[i + 5]
  if #b > 15 or #q_minus_b > 15 or #n > 15 then
    return nil
  end
  b, q_minus_b = b + 0, q_minus_b + 0
  local k, r = 0, 0
  if state then
    local t, rest = string.match(state, '^(%d+):(%d+)$')
    if t == nil or #t > 15 or #rest > 15 then
      return nil
    end
    r = rest + 0
    if r >= b + q_minus_b then
      return nil
    end
    t = t + 0
    if t < now then
      r = 0
    else
      k = t - now
    end
  end
  local m = ARGV[i + 4] + 0
  if not (k < m or (k == m and r <= n + 0)) then
    return false
  end
  local t2, r2 = now + k + ARGV[i + 1], r + b
  if r >= q_minus_b then
    t2, r2 = t2 + 1, r - q_minus_b
  end
  if r2 > 0 then
    return true, string.format('%d:%d', t2, r2), t2 + 1
  end
  return true, string.format('%d:0', t2), t2
end
