-- The exact fixed-window rule (see fixed_window.lua): validates the state, failing when it is
-- malformed, and holds counts of more than 15 digits as limbs.
local function evaluate(state, now, i)
  local allowed, following, deadline = plain(state, now, i)
  if allowed ~= nil then
    return allowed, following, deadline
  end
  local room, cost = ARGV[i + 2], ARGV[i + 3]
  if state then
    local digits, used = string.match(state, '^(%d+):(%d+)$')
    deadline = num(digits)
    if deadline == nil or used == nil or #used > 20 then
      fail('malformed fixed-window state')
    end
    if deadline > now then
      limbs()
      local units = big(used)
      if is_zero(units) then
        fail('malformed fixed-window state')
      end
      if cmp(units, big(room)) <= 0 then
        return true, digits .. ':' .. fmt(add(units, big(cost))), deadline
      end
      return false
    end
  end
  deadline = now + tonumber(ARGV[i + 1])
  return true, str(deadline) .. ':' .. cost, deadline
end

expiry_of = function(state)
  local deadline = num(string.match(state, '^(%d+):%d+$'))
  if deadline == nil then
    fail('malformed fixed-window state')
  end
  return deadline
end
