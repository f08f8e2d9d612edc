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
local ARGS = 5

local function evaluate(state, now, i)
  local a, b, q_minus_b, m, n = tonumber(ARGV[i + 1]), ARGV[i + 2], ARGV[i + 3], tonumber(ARGV[i + 4]), ARGV[i + 5]
  local k, t, r = 0, nil, '0'
  if state then
    local digits, rest = string.match(state, '^(%d+):(%d+)$')
    t = num(digits)
    if t == nil or rest == nil or #rest > 20 then
      fail('malformed GCRA state')
    end
    r = rest
  end
  if #b <= 15 and #q_minus_b <= 15 and #n <= 15 and #r <= 15 then
    local bb, qb, rr = tonumber(b), tonumber(q_minus_b), tonumber(r)
    if rr >= bb + qb then
      fail('malformed GCRA state')
    end
    if t == nil or t < now then
      k, rr = 0, 0
    else
      k = t - now
    end
    if not (k < m or (k == m and rr <= tonumber(n))) then
      return false
    end
    local t2, r2 = now + k + a, rr + bb
    if rr >= qb then
      t2, r2 = t2 + 1, rr - qb
    end
    local expiry = t2
    if r2 > 0 then
      expiry = t2 + 1
    end
    return true, str(t2) .. ':' .. str(r2), expiry
  end
  limbs()
  local bb, qb, nn, rr = big(b), big(q_minus_b), big(n), big(r)
  if cmp(rr, add(qb, bb)) >= 0 then
    fail('malformed GCRA state')
  end
  if t == nil or t < now then
    k, rr = 0, {0, 0}
  else
    k = t - now
  end
  if not (k < m or (k == m and cmp(rr, nn) <= 0)) then
    return false
  end
  local t2, r2 = now + k + a, nil
  if cmp(rr, qb) >= 0 then
    t2, r2 = t2 + 1, sub(rr, qb)
  else
    r2 = add(rr, bb)
  end
  local expiry = t2
  if not is_zero(r2) then
    expiry = t2 + 1
  end
  return true, str(t2) .. ':' .. fmt(r2), expiry
end

expiry_of = function(state)
  local digits, rest = string.match(state, '^(%d+):(%d+)$')
  local t = num(digits)
  if t == nil then
    fail('malformed GCRA state')
  end
  if rest ~= '0' then
    return t + 1
  end
  return t
end
