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
-- (a, m <= the policy's full replenishment time); r, b, n, Q - b are limbs.
-- Returns allowed, the new state, its expiry ceil(tat' / Q) = t' + [r' > 0], and true (the
-- expiry moves with every allowed check).
local ARGS = 5

local function evaluate(state, now, i)
  local a, b, q_minus_b, m, n = num(ARGV[i + 1]), big(ARGV[i + 2]), big(ARGV[i + 3]), num(ARGV[i + 4]), big(ARGV[i + 5])
  if a == nil or b == nil or q_minus_b == nil or m == nil or n == nil then
    fail('malformed GCRA arguments')
  end
  local k, r = 0, ZERO
  if state then
    local t, rest = string.match(state, '^(%d+):(%d+)$')
    t, rest = num(t), big(rest)
    if t == nil or rest == nil or cmp(rest, add(q_minus_b, b)) >= 0 then
      fail('malformed GCRA state')
    end
    if t >= now then
      k, r = t - now, rest
    end
  end
  if not (k < m or (k == m and cmp(r, n) <= 0)) then
    return false
  end
  local t, rest
  if cmp(r, q_minus_b) >= 0 then
    t, rest = now + k + a + 1, sub(r, q_minus_b)
  else
    t, rest = now + k + a, add(r, b)
  end
  local expiry = t
  if not is_zero(rest) then
    expiry = t + 1
  end
  return true, str(t) .. ':' .. fmt(rest), expiry, true
end
