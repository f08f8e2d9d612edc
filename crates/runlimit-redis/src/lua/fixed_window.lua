-- The anchored fixed-window rule (runlimit_core::backend::fixed_window) for one check.
--
-- State: '<deadline ms>:<units used>'. Arguments (ARGV[i + 1 ..]): the window W in ms, the
-- room L - c (the most units the window may have used for the check to fit) and the cost c,
-- all computed exactly by the client. Live iff deadline > now; allowed iff live and
-- used <= L - c (then used + c <= L < 2^63), or not live (a new window anchored at now,
-- ending at now + W < 2^53). Counts of at most 15 digits are plain exact doubles; longer ones
-- take the limbs. Returns allowed, the new state and its expiry (the deadline).
local ARGS = 3

local function evaluate(state, now, i)
  local room, cost = ARGV[i + 2], ARGV[i + 3]
  if state then
    local digits, used = string.match(state, '^(%d+):(%d+)$')
    local deadline = num(digits)
    if deadline == nil or used == nil or #used > 20 then
      fail('malformed fixed-window state')
    end
    if deadline > now then
      if #used <= 15 and #room <= 15 and #cost <= 15 then
        local units = tonumber(used)
        if units == 0 then
          fail('malformed fixed-window state')
        end
        if units <= tonumber(room) then
          return true, digits .. ':' .. str(units + tonumber(cost)), deadline
        end
        return false
      end
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
  local deadline = now + tonumber(ARGV[i + 1])
  return true, str(deadline) .. ':' .. cost, deadline
end

expiry_of = function(state)
  local deadline = num(string.match(state, '^(%d+):%d+$'))
  if deadline == nil then
    fail('malformed fixed-window state')
  end
  return deadline
end
