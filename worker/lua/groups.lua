-- groups.lua: the group of each indexed incident (docs/contract.md, "Groups"), decided by the apply step: with
-- matches, an incident joins the group of its closest match; without, it opens one. Registers `group_merge` and the
-- read-only `group_of`.
--
-- Group state is three hashes and a sorted set under the index's hash tag, named from the prefix of {N}:meta (like the twin groups,
-- the server finds them itself; all in the index's slot):
--   {N}:group         incident -> its group's label, only for an incident whose label is not its own ID
--   {N}:groupsize     label -> members, for every group except one whose only member is the incident that opened it
--   {N}:groupmerged   label -> the label it was merged into (always a live group's own label: see group_merge)
--   {N}:groupactive   label -> the server's time (ms) of the last incident that joined it (a sorted set), for the
--                     ACTIVE_KEPT most recently joined groups only: its size stays bounded whatever the index's size
-- So an incident that opened its own group and was never joined has no entry anywhere: "no entry" reads as "its own
-- ID, one member".

--- @include "base"

-- The most recently joined groups {N}:groupactive keeps (trimmed once it holds ACTIVE_SLACK more: one trim per
-- ACTIVE_SLACK joins of groups not yet in it, not one per join).
local ACTIVE_KEPT, ACTIVE_SLACK = 1000, 100

local function group_keys(meta_key)
  local prefix = string.sub(meta_key, 1, -5)  -- '{N}:' of '{N}:meta'
  return {member = prefix .. 'group', size = prefix .. 'groupsize', merged = prefix .. 'groupmerged',
          active = prefix .. 'groupactive'}
end

-- The group keys the calls of one FCALL share (`context`: apply_batch's), with what they may also share: the labels
-- resolved (only group_merge, an FCALL of its own, changes {N}:groupmerged), the server's time when a join first
-- needed it (`now`: one score in {N}:groupactive for the FCALL's joins, a few ms apart at most) and the labels given
-- it there since (forgotten at a ZREM or a trim). A near storm's events each join one group: three of a join's
-- commands were these (benchmarks/journal/near-storms.md, section 19).
local function context_group_keys(context, meta_key)
  local gk = context.group_keys
  if gk and gk.meta == meta_key then return gk end
  gk = group_keys(meta_key)
  gk.meta, gk.resolved, gk.scored = meta_key, {}, {}
  context.group_keys = gk
  return gk
end

-- A label, or the label it was merged into (merges keep that one hop: see group_merge).
local function resolve_label(gk, label)
  local resolved = gk.resolved
  if not resolved then return redis.call('HGET', gk.merged, label) or label end
  local known = resolved[label]
  if not known then
    known = redis.call('HGET', gk.merged, label) or label
    resolved[label] = known
  end
  return known
end

-- The group of an indexed incident.
local function group_label(gk, id)
  return resolve_label(gk, redis.call('HGET', gk.member, id) or id)
end

-- The members of a live group's label (no entry: its opener, alone).
local function group_size(gk, label)
  return tonumber(redis.call('HGET', gk.size, label)) or 1
end

-- Take `id` out of its group (a delete, an expiry, an upsert before it is decided again). The group keeps its label
-- when `id` opened it; it ends when its last member leaves. Call it while `id` is still indexed or after; `fp_key`
-- tells whether the group's opener is still a member.
local function group_leave(gk, fp_key, id)
  local raw = redis.call('HGET', gk.member, id)
  if raw then redis.call('HDEL', gk.member, id) end
  local label = resolve_label(gk, raw or id)
  local size = tonumber(redis.call('HGET', gk.size, label))
  if not size then return end  -- it was alone in the group it opened: nothing was stored
  size = size - 1
  if size <= 0 or size == 1 and label ~= id and redis.call('HEXISTS', gk.member, label) == 0 and
                 redis.call('HEXISTS', fp_key, label) == 1 then
    -- (size 1: the one left is the incident that opened the group, alone again: back to costing nothing)
    redis.call('HDEL', gk.size, label)
    redis.call('ZREM', gk.active, label)
    if gk.scored then gk.scored[label] = nil end
  else
    redis.call('HSET', gk.size, label, size)
  end
end

-- `id` joins the group of `match`, its closest match. Returns the group's label and its size now.
local function group_join(gk, id, match)
  local label = group_label(gk, match)
  -- (a label equal to `id`: a group it opened earlier, which kept its label while it was away)
  if label ~= id then redis.call('HSET', gk.member, id, label) end
  local size = redis.call('HINCRBY', gk.size, label, 1)
  if size == 1 then
    -- no entry was there: the group was its opener alone
    size = 2
    redis.call('HSET', gk.size, label, 2)
  end
  local scored = gk.scored
  if not (scored and scored[label]) then
    if scored and not gk.now then gk.now = now_ms() end
    local trimmed = false
    if redis.call('ZADD', gk.active, gk.now or now_ms(), label) == 1 then
      local held = redis.call('ZCARD', gk.active)
      if held > ACTIVE_KEPT + ACTIVE_SLACK then
        redis.call('ZREMRANGEBYRANK', gk.active, 0, held - ACTIVE_KEPT - 1)
        trimmed = true
      end
    end
    -- (a trim may have taken any label scored so far, this one too: one that ties at `now`, or a clock behind the
    -- scores kept; none is known to be there after it)
    if trimmed then
      gk.scored = scored and {}
    elseif scored then
      scored[label] = true
    end
  end
  return label, size
end

-- A label's number is met in use only where incidents were named like labels (`INC-4#7`); past LABEL_TRIES such
-- numbers in one call, the label's number is padded with zeros to make it longer than any incident ID
-- (formats.MAX_INCIDENT_ID_LENGTH characters), so that incidents placed ahead under the next numbers cannot make one
-- event walk them all.
local LABEL_TRIES, MAX_ID_CHARS = 8, 256

-- `id` opens a group. Its label is its ID, unless that names a live group already (one `id` opened before and left,
-- or a label merged away): then `id`, '#' and a number from {N}:meta's `group_seq`, free of every label and ID.
local function group_open(gk, meta_key, fp_key, id)
  if redis.call('HEXISTS', gk.size, id) == 0 and redis.call('HEXISTS', gk.merged, id) == 0 then return id, 1 end
  local label
  for _ = 1, LABEL_TRIES do
    local tried = id .. '#' .. redis.call('HINCRBY', meta_key, 'group_seq', 1)
    if redis.call('HEXISTS', gk.size, tried) == 0 and redis.call('HEXISTS', gk.merged, tried) == 0 and
       redis.call('HEXISTS', fp_key, tried) == 0 then
      label = tried
      break
    end
  end
  if not label then
    -- free without looking: no ID is this long, and no earlier label ends in this number (each is given once)
    local number = tostring(redis.call('HINCRBY', meta_key, 'group_seq', 1))
    local chars = #id - select(2, string.gsub(id, '[\128-\191]', ''))  -- UTF-8 bytes that start a character
    label = id .. '#' .. string.rep('0', MAX_ID_CHARS - chars - #number) .. number
  end
  redis.call('HSET', gk.member, id, label)
  redis.call('HSET', gk.size, label, 1)
  return label, 1
end

-- Whether `label` (already resolved) names a live group: one with a stored size, or an indexed incident alone in the
-- group it opened.
local function group_live(gk, fp_key, label)
  if redis.call('HEXISTS', gk.size, label) == 1 then return true end
  return redis.call('HEXISTS', fp_key, label) == 1 and redis.call('HEXISTS', gk.member, label) == 0
end

-- `incident-worker groups merge A B`: fold group B into group A, atomically. B's members, and incidents that later
-- join any of them, resolve to A; so does any label merged into B before (rewritten to A here, so a label is never
-- more than one hop from its group).
--
-- keys[1] = {N}:meta   keys[2] = {N}:fp   args[1] = A   args[2] = B (labels or incident IDs' groups: each resolved)
-- Returns {A's label, its size now, B's label, B's size before}; an error (NOGROUP) when either names no live group.
local function group_merge(keys, args)
  local gk = group_keys(keys[1])
  local fp_key = keys[2]
  local a, b = resolve_label(gk, args[1]), resolve_label(gk, args[2])
  for _, label in ipairs({a, b}) do
    if not group_live(gk, fp_key, label) then
      return redis.error_reply('NOGROUP ' .. label .. ' names no group of ' .. keys[1] ..
        '; `incident-worker groups` lists them')
    end
  end
  local size_a, size_b = group_size(gk, a), group_size(gk, b)
  if a == b then return {a, size_a, b, size_b} end
  redis.call('HSET', gk.size, a, size_a + size_b)
  redis.call('HDEL', gk.size, b)
  local merged = redis.call('HGETALL', gk.merged)
  for i = 1, #merged, 2 do
    if merged[i + 1] == b then redis.call('HSET', gk.merged, merged[i], a) end
  end
  redis.call('HSET', gk.merged, b, a)
  local active_b = redis.call('ZSCORE', gk.active, b)
  redis.call('ZREM', gk.active, b)
  if active_b then
    local active_a = tonumber(redis.call('ZSCORE', gk.active, a) or '0')
    if tonumber(active_b) > active_a then redis.call('ZADD', gk.active, active_b, a) end
  end
  redis.call('HINCRBY', keys[1], 'group_merges', 1)
  return {a, size_a + size_b, b, size_b}
end

-- The group of each incident: keys[1] = {N}:meta   keys[2] = {N}:fp   args = incident IDs.
-- Returns per ID {label, size} or {false, 0} when it is not indexed.
local function group_of(keys, args)
  local gk = group_keys(keys[1])
  local reply = {}
  for i = 1, #args do
    if redis.call('HEXISTS', keys[2], args[i]) == 1 then
      local label = group_label(gk, args[i])
      reply[i] = {label, group_size(gk, label)}
    else
      reply[i] = {false, 0}
    end
  end
  return reply
end

register('group_merge', group_merge)
register('group_of', group_of, {'no-writes'})
