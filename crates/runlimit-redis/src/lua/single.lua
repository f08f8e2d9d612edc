-- The common case first, before any other function or table of the general path is created:
-- an admission of keys all stored in one shard (a single check, or a batch within one shard;
-- KEYS: the shard's hash and index, then each check's expiry set; ARGV as admit.lua reads
-- them) whose numbers the rule's plain function decides. Three commands: TIME, one HMGET of
-- the states and the shard's fields w and n, and, when every check is allowed, one HSET of
-- them all. No key is new, so no slot is taken and no cleanup is due (admit.lua cleans up only
-- a shard lacking room for new keys). It answers as admit.lua does (one string).
--
-- It validates what it reads as the general path does, but never fails: any other admission
-- (several shards, a key not stored yet, a number of more than 15 digits) or a stored value it
-- cannot vouch for goes on, having written nothing, to the general path (admit.lua), which
-- reads again and fails on a malformed value before any write.
local M = (#ARGV - 1) / (1 + ARGS)
if #KEYS == 2 + M then
  local time = redis.call('TIME')
  local fields
  if M == 1 then
    fields = redis.call('HMGET', KEYS[1], 'w', 'n', ARGV[1])
  else
    local members = {}
    for i = 1, M do
      members[i] = ARGV[(i - 1) * (1 + ARGS) + 1]
    end
    fields = redis.call('HMGET', KEYS[1], 'w', 'n', unpack(members))
  end
  local w, n = fields[1], fields[2]
  if (not w or (#w <= 15 and string.find(w, '^%d+$')))
      and (not n or (#n <= 15 and string.find(n, '^%d+$'))) then
    -- The time as server_time (core.lua) computes it, clamped up to the watermark.
    local micros = time[2] + 0
    local now = time[1] * 1000 + (micros - micros % 1000) / 1000
    if w then
      w = w + 0
      if w > now then
        now = w
      end
    end
    n = n or '0'
    if M == 1 then
      local state = fields[3]
      local allowed, following
      if state then
        allowed, following = plain(state, now, 1)
      end
      if allowed ~= nil then
        local at = string.format('%d', now)
        if not allowed then
          return at .. ' 0 ' .. state .. ' 1 0  ' .. n .. ' 0 '
        end
        if w == now then
          redis.call('HSET', KEYS[1], ARGV[1], following)
        else
          redis.call('HSET', KEYS[1], ARGV[1], following, 'w', at)
        end
        return at .. ' 1 ' .. state .. ' 1 1 ' .. following .. ' ' .. n .. ' 0 '
      end
    else
      -- Every check evaluated first; all written only when all are allowed.
      local followings, write = {}, true
      for i = 1, M do
        local state, allowed, following = fields[2 + i], nil, nil
        if state then
          allowed, following = plain(state, now, (i - 1) * (1 + ARGS) + 1)
        end
        if allowed == nil then
          write = nil
          break
        end
        followings[i] = allowed and following
        if not allowed then
          write = false
        end
      end
      if write ~= nil then
        local at = string.format('%d', now)
        local reply = {at, write and '1' or '0'}
        if write then
          local args = {KEYS[1]}
          for i = 1, M do
            args[2 * i] = ARGV[(i - 1) * (1 + ARGS) + 1]
            args[2 * i + 1] = followings[i]
          end
          if w ~= now then
            args[2 * M + 2] = 'w'
            args[2 * M + 3] = at
          end
          redis.call('HSET', unpack(args))
        end
        for i = 1, M do
          reply[#reply + 1] = fields[2 + i]
          reply[#reply + 1] = '1'
          reply[#reply + 1] = followings[i] and '1' or '0'
          reply[#reply + 1] = write and followings[i] or ''
        end
        reply[#reply + 1] = n
        reply[#reply + 1] = '0'
        reply[#reply + 1] = ''
        return table.concat(reply, ' ')
      end
    end
  end
end
