-- meta.lua: what {N}:meta says to every call: the layout it was built with (a call of another one is refused),
-- the layout a migration is building (written beside it), and the retention window.

--- @include "base"

-- Moving to another layout (docs/contract.md, "Moving to another layout"): while {N}:meta's `building` names the
-- layout being built, every change is written to that layout's postings too. A call made without knowing of it (or
-- still writing one that was switched to or aborted) is refused, changing nothing; its worker reads the meta again.
local function building_refusal(meta_key, current, building)
  current = current or ''
  if current == building then return end
  if current == '' then
    return redis.error_reply('MIGRATION the index ' .. meta_key .. ' is not building "' .. building ..
      '" (any more); read the meta again')
  end
  return redis.error_reply('MIGRATION the index ' .. meta_key .. ' is building "' .. current ..
    '" too; read the meta again and write both layouts')
end

local function layout_refusal(meta_key, current, layout)
  if current == layout then return end
  if not current then
    return redis.error_reply('NOMETA the index meta ' .. meta_key .. ' is missing; reopen the index to write it')
  end
  return redis.error_reply('LAYOUT the index ' .. meta_key .. ' was built as "' .. current ..
    '", not "' .. layout .. '"; use its layout or a new namespace')
end

local function check_building(meta_key, building)
  return building_refusal(meta_key, redis.call('HGET', meta_key, 'building'), building)
end

local function check_layout(meta_key, layout)
  return layout_refusal(meta_key, redis.call('HGET', meta_key, 'layout'), layout)
end

-- The {N}:meta fields an apply call reads, read once per FCALL with one HMGET and shared by the calls of an
-- apply_batch through their `context`. None of them can change under the calls of one FCALL except `tokenizer`,
-- which apply records on first use and notes here as it writes it: the layout, `building`, `retention_ms` and
-- `changes_trimmed_to` are written only by other functions (the migration's, set_retention, trim_changes), and no
-- other command runs while a function does.
local META_FIELDS = {'layout', 'building', 'retention_ms', 'changes_trimmed_to', 'tokenizer', 'posting_bound'}

local function meta_of(context, meta_key)
  if context.meta_key == meta_key then return context.meta end
  local v = redis.call('HMGET', meta_key, unpack(META_FIELDS))
  local meta = {layout = v[1], building = v[2], retention_ms = v[3], changes_trimmed_to = v[4], tokenizer = v[5],
                posting_bound = tonumber(v[6])}
  context.meta_key, context.meta = meta_key, meta
  return meta
end

-- {N}:meta's `posting_bound`: when present, no posting set of the index (of either layout during a move) holds more
-- members than it. A search on the primary whose probes could not hold more than its budget in all (probes x bound
-- <= budget) then skips reading the size of each (search.lua, bounded_candidates): 68 SCARDs an event with the
-- default layout, about a fifth of the primary's time an event. A new index starts it at 0 (ensure_meta); every
-- write that adds to a posting set raises it to the sizes it made (raise_bound), or takes it away (drop_bound), and
-- an index without it reads the sizes, as every index did before. A bound left too low (a hand edit, an SADD by
-- hand) costs a search its cut, never an answer: the search then reads every set, which is exact.

-- Raise the bound to the sizes of the posting sets `keys` just added to (SCARD, O(1) each), when the index has one.
-- `meta` is meta_of's table (kept current), or nil: read here.
local function raise_bound(meta_key, keys, meta)
  local bound = meta and meta.posting_bound or not meta and tonumber(redis.call('HGET', meta_key, 'posting_bound'))
  if not bound then return end
  local largest = bound
  for i = 1, #keys do
    local size = redis.call('SCARD', keys[i])
    if size > largest then largest = size end
  end
  if largest > bound then
    redis.call('HSET', meta_key, 'posting_bound', largest)
    if meta then meta.posting_bound = largest end
  end
end

-- Take the bound away (the index then reads every search's set sizes): for writes that add to posting sets without
-- measuring them (the snapshot path's adds, whose searches the copy made: see apply.lua).
local function drop_bound(meta_key, meta)
  if meta.posting_bound then
    redis.call('HDEL', meta_key, 'posting_bound')
    meta.posting_bound = nil
  end
end

-- Retention (docs/contract.md, "Retention"): while {N}:meta's `retention_ms` is above 0, {N}:expiry scores every
-- indexed incident with the time of its last add or upsert (ms of the server's clock); otherwise it does not exist.
local function retention_window(value)
  local window = tonumber(value or '0') or 0
  return window > 0, window
end

local function retention_on(meta_key)
  return retention_window(redis.call('HGET', meta_key, 'retention_ms'))
end
