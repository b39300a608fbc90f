-- verify_groups.lua: `incident-worker verify` of group state (docs/contract.md, "Groups" and "Verifying and
-- repairing the index"): each subject the walk sends is judged, and repaired if asked, in one atomic step.
-- Registers `verify_groups_check` (no writes) and `verify_groups_repair`.

--- @include "base"
--- @include "meta"
--- @include "groups"

-- The most hops a chain of merged labels is followed (a longer one is cut there; the rest is judged when the walk
-- meets its labels).
local MAX_HOPS = 1000

-- What every change of group state moves: the last entry of {N}:changes (every add, upsert, delete and expiry
-- writes one in the same step as its group change) and {N}:meta's `group_merges` (every merge counts up).
local function group_marker(meta_key, changes_key)
  local last = redis.call('XREVRANGE', changes_key, '+', '-', 'COUNT', 1)[1]
  return (last and last[1] or '') .. ' ' .. (redis.call('HGET', meta_key, 'group_merges') or '0')
end

-- The labels met following {N}:groupmerged from `label` (itself first), and the label met twice when the chain
-- closes into a loop (nil when it ends at a label not merged).
local function merge_path(gk, label)
  local path, seen = {label}, {[label] = true}
  while #path <= MAX_HOPS do
    local into = redis.call('HGET', gk.merged, path[#path])
    if not into then return path, nil end
    if seen[into] then return path, into end
    seen[into] = true
    path[#path + 1] = into
  end
  return path, nil
end

-- A merged label: its entry must name a label that is not merged itself (group_merge keeps one hop).
--   a chain (A -> B -> C): every label of it pointed at its end, the group the merges meant;
--   a loop (A -> B -> A, or A -> A): no label of it reads as a group today (one hop from each lands on another);
--   its smallest label in byte order becomes the group (its entry removed), the others, and the labels leading in,
--   point at it.
-- The sizes and {N}:groupactive entries this leaves wrong are judged by the walk's later steps.
local function judge_merged(gk, label, repair, out)
  local path, again = merge_path(gk, label)
  if #path == 1 and not again then return end  -- no entry any more
  local target
  if again then
    local from = 1
    while path[from] ~= again do from = from + 1 end
    target = again
    for i = from, #path do
      if bytes_less(path[i], target) then target = path[i] end
    end
    -- a repair reports every label on the way (it fixes them all: none is left for a later subject); a check only
    -- this subject's, as each label of the loop is a subject of its own. The way is shown to its first 20 labels,
    -- so that a long loop costs its check a reply linear in its length, not cubic.
    local shown = #path <= 20 and table.concat(path, ' -> ') or
      (table.concat(slice(path, 1, 20), ' -> ') .. ' -> ... (' .. #path .. ' labels)')
    local detail = shown .. ' -> ' .. again
    for i = 1, repair and #path or 1 do
      out[#out + 1] = 'group_merge_loop'
      out[#out + 1] = path[i]
      out[#out + 1] = detail
    end
  elseif #path > 2 then
    target = path[#path]
    out[#out + 1] = 'group_merge_chain'
    out[#out + 1] = label
    out[#out + 1] = table.concat(path, ' -> ')
  else
    return
  end
  if repair then
    for i = 1, #path do
      if path[i] ~= target then
        redis.call('HSET', gk.merged, path[i], target)
      elseif again then
        redis.call('HDEL', gk.merged, target)
      end
      -- (a chain's end keeps its entry: it has none, or, where MAX_HOPS cut the chain, it names the rest of it)
    end
  end
end

-- The subjects of one call, three arguments each: a code and two fields.
--   e  entry of {N}:group     id, the label the walk read: wrong when id is not indexed (group_entry_orphan) or
--                             when the label is id itself (group_entry_self: no entry means the same)
--   m  entry of {N}:groupmerged  label: judged by judge_merged
--   z  entry of {N}:groupsize  label, the size the walk counted ('' = no entry: the group has no member, or only the
--                             incident that opened it under its own ID); judged only while group_marker is still
--                             args[3], so that no change since the count began can explain the difference
--   a  entry of {N}:groupactive  label: wrong when it names no group of more than one (no size, or merged away)
--
-- keys[1] = {N}:meta   keys[2] = {N}:fp   keys[3] = {N}:changes
-- args[1] = layout tag (must equal {N}:meta's `layout`; '' for an index whose meta is missing)
-- args[2] = '1' to repair   args[3] = the marker the count
-- began with ('' when no z subject)   args[4 ..] = the subjects
--
-- Returns {group_marker now, then per finding: the subject's number (1 = the first), kind, subject, detail}.
local function verify_groups(keys, args)
  local meta_key, fp_key, changes_key = keys[1], keys[2], keys[3]
  if args[1] ~= '' then
    local refused = check_layout(meta_key, args[1])
    if refused then return refused end
  end
  local repair = args[2] == '1'
  local gk = group_keys(meta_key)
  local settled = args[3] ~= '' and group_marker(meta_key, changes_key) == args[3]
  local reply = {group_marker(meta_key, changes_key)}
  for a = 4, #args, 3 do
    local code, f1, f2 = args[a], args[a + 1], args[a + 2]
    local out = {}
    if code == 'e' then
      if redis.call('HGET', gk.member, f1) == f2 then
        local kind = nil
        if redis.call('HEXISTS', fp_key, f1) == 0 then
          kind = 'group_entry_orphan'
        elseif f2 == f1 then
          kind = 'group_entry_self'
        end
        if kind then
          out = {kind, f1, f2}
          if repair then redis.call('HDEL', gk.member, f1) end
        end
      end
    elseif code == 'm' then
      judge_merged(gk, f1, repair, out)
    elseif code == 'z' and settled then
      local stored = redis.call('HGET', gk.size, f1) or ''
      if stored ~= f2 then
        out = {'group_size', f1, 'stored ' .. (stored == '' and 'none' or stored) .. ', counted ' ..
               (f2 == '' and 'none' or f2)}
        if repair and f2 == '' then
          redis.call('HDEL', gk.size, f1)
          redis.call('ZREM', gk.active, f1)
        elseif repair then
          redis.call('HSET', gk.size, f1, f2)
        end
      end
    elseif code == 'a' then
      if redis.call('ZSCORE', gk.active, f1) and
         (redis.call('HEXISTS', gk.size, f1) == 0 or redis.call('HEXISTS', gk.merged, f1) == 1) then
        out = {'group_active_stale', f1, ''}
        if repair then redis.call('ZREM', gk.active, f1) end
      end
    end
    add_findings(reply, (a - 4) / 3 + 1, out)
  end
  return reply
end

local function verify_groups_check(keys, args)
  args[2] = '0'
  return verify_groups(keys, args)
end

register('verify_groups_check', verify_groups_check, {'no-writes'})
register('verify_groups_repair', verify_groups)
