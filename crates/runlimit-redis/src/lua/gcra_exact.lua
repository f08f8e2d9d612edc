-- The exact GCRA rule (see gcra.lua): validates the state, failing when it is malformed, and
-- holds r, b, n and Q - b as limbs.
local function evaluate(state, now, i)
  local allowed, following, expiry = plain(state, now, i)
  if allowed ~= nil then
    return allowed, following, expiry
  end
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
  expiry = t2
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
