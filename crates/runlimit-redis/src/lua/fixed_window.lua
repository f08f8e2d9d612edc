-- The anchored fixed-window rule (runlimit_core::backend::fixed_window) for one check.
--
-- State: '<deadline ms>:<units used>'. Arguments (ARGV[i + 1 ..]): the window W in ms, the
-- room L - c (the most units the window may have used for the check to fit) and the cost c,
-- all computed exactly by the client. Live iff deadline > now; allowed iff live and
-- used <= L - c (then used + c <= L < 2^63), or not live (a new window anchored at now,
-- ending at now + W < 2^53).
--
-- This file holds the rule on plain numbers, the only function an admission's fast path
-- creates (see single.lua): it decides when the state's numbers, the room and the cost have
-- at most 15 digits (exact doubles), as for every policy of at most 15-digit limits, and
-- returns nil otherwise or for a state it cannot vouch for. The caller then takes the exact
-- rule, `evaluate` (fixed_window_exact.lua), which fails on a malformed state and holds longer
-- counts as limbs. Returns allowed, the new state and its expiry (the deadline), or nil.
-- (A digit string becomes a number by arithmetic, `s + 0`, which parses it once, where
-- tonumber parses it twice; every string so converted was matched as digits first.)
local ARGS = 3

local function plain(state, now, i)
  local cost = ARGV[i + 3]
  if state then
    local deadline, used = string.match(state, '^(%d+):(%d+)$')
    if deadline == nil or #deadline > 15 or #used > 15 then
      return nil
    end
    local at = deadline + 0
    if at > now then
      local room = ARGV[i + 2]
      local units = used + 0
      if #room > 15 or #cost > 15 or units == 0 then
        return nil
      end
      if units <= room + 0 then
        return true, string.format('%s:%d', deadline, units + cost), at
      end
      return false
    end
  end
  local at = now + ARGV[i + 1]
  return true, string.format('%d:%s', at, cost), at
end
