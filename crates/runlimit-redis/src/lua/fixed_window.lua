-- The anchored fixed-window rule (runlimit_core::backend::fixed_window) for one check.
--
-- State: '<deadline ms>:<units used>'. Arguments (ARGV[i + 1 ..]): the window W in ms, the
-- room L - c (the most units the window may have used for the check to fit) and the cost c,
-- all computed exactly by the client. Live iff deadline > now; allowed iff live and
-- used <= L - c (then used + c <= L < 2^63, exact in limbs), or not live (a new window
-- anchored at now, ending at now + W < 2^53). Returns allowed, the new state, its expiry and
-- whether the expiry moved (an increment inside a live window keeps its deadline).
local ARGS = 3

local function evaluate(state, now, i)
  local window, room, cost = num(ARGV[i + 1]), big(ARGV[i + 2]), big(ARGV[i + 3])
  if window == nil or room == nil or cost == nil then
    fail('malformed fixed-window arguments')
  end
  if state then
    local digits, used = string.match(state, '^(%d+):(%d+)$')
    local deadline = num(digits)
    used = big(used)
    if deadline == nil or used == nil or is_zero(used) then
      fail('malformed fixed-window state')
    end
    if deadline > now then
      if cmp(used, room) <= 0 then
        return true, digits .. ':' .. fmt(add(used, cost)), deadline, false
      end
      return false
    end
  end
  local deadline = now + window
  return true, str(deadline) .. ':' .. fmt(cost), deadline, true
end
