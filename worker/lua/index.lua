#!lua name=incident_index_v2
--
-- The server side of one incident fingerprint index (docs/contract.md: bands, keys, what each entry does), as a Redis Functions library.
-- Loaded once per server by worker/library.py (FUNCTION LOAD REPLACE); the version is part of every name, so
-- workers of two versions can share a server during a rolling upgrade.
--
-- Each call is one atomic step: it reads everything it needs, decides, and only then writes, so a call that
-- refuses (stale, duplicate, not pending) changes nothing. Every key a call touches arrives in `keys`, except the
-- twin groups of the fingerprints it finds, whose names only the server can know: those are built from the prefix
-- of a group key that does arrive in `keys`. All of them carry the index's hash tag, so a call is safe on Redis
-- Cluster.
--
-- Storms (twin groups in docs/contract.md#what-lives-in-redis): the posting sets hold one incident per distinct
-- fingerprint, its representative. When more incidents share that exact fingerprint, all of them, the
-- representative included, are the members of the sorted set {N}:twins:<fingerprint> (all scores 0: ZRANGE lists
-- them in byte order). A query verifies representatives only, so an event costs the same whether its fingerprint
-- is indexed under one ID or 100,000.
--
-- Fingerprints travel and are stored as 16 lowercase hex digits: Lua numbers cannot hold 64 bits exactly.
-- The distance of two of them is summed from per-digit tables built here at load time, with plain arithmetic
-- (only `redis` is visible while a library loads) and without the `bit` library, which real Redis has and
-- fakeredis lacks: the same code runs on both.

-- ASCII code of a hex digit -> its value.
local NIBBLE = {}
for c = 48, 57 do NIBBLE[c] = c - 48 end
for c = 97, 102 do NIBBLE[c] = c - 87 end

local function xor4(a, b)
  local result, place = 0, 1
  for _ = 1, 4 do
    local x, y = a % 2, b % 2
    if x ~= y then result = result + place end
    a, b, place = (a - x) / 2, (b - y) / 2, place * 2
  end
  return result
end

local POPCOUNT4 = {[0] = 0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4}

-- DIGIT_DISTANCE[q][c]: the bits in which the digit of value q and the digit with ASCII code c differ; any byte
-- that is not a hex digit counts 64, so a fingerprint mangled by hand is simply never within the distance.
-- A query picks one row per position once; each candidate then costs at most 16 table reads and additions.
-- (Measured on Redis 7.0: this beats the `bit` library, whose tonumber(string.sub(...)) creates strings; and
-- it is the same code on fakeredis, which has no `bit`.)
local DIGIT_DISTANCE = {}
for q = 0, 15 do
  local row = {}
  for c = 0, 255 do row[c] = 64 end
  for c = 48, 57 do row[c] = POPCOUNT4[xor4(q, c - 48)] end
  for c = 97, 102 do row[c] = POPCOUNT4[xor4(q, c - 87)] end
  for c = 65, 70 do row[c] = POPCOUNT4[xor4(q, c - 55)] end
  DIGIT_DISTANCE[q] = row
end

-- The DIGIT_DISTANCE row of each of the 16 digits of `query`, as 16 values (kept in locals by the callers: a
-- candidate then costs table reads and additions only).
local function digit_rows(query)
  local q = {string.byte(query, 1, 16)}
  local rows = {}
  for i = 1, 16 do rows[i] = DIGIT_DISTANCE[NIBBLE[q[i]]] end
  return unpack(rows)
end

-- Lua 5.1's `unpack` stops near 8,000 values: candidate IDs are read in chunks.
local CHUNK = 4000

local JSON_ESCAPES = {['"'] = '\\"', ['\\'] = '\\\\', ['\b'] = '\\b', ['\f'] = '\\f',
                      ['\n'] = '\\n', ['\r'] = '\\r', ['\t'] = '\\t'}

local function json_string(s)
  if string.find(s, '[%z\1-\31\127"\\]') then
    s = string.gsub(s, '[%z\1-\31\127"\\]', function(c)
      return JSON_ESCAPES[c] or string.format('\\u%04x', string.byte(c))
    end)
  end
  return '"' .. s .. '"'
end

-- Matches are sorted by distance, then ID in byte order, as Python sorts str. Lua compares strings with
-- strcoll, which is byte order only under the C locale; under any other, compare bytes by hand.
local function bytes_less(a, b)
  local la, lb = #a, #b
  local n = la < lb and la or lb
  local byte = string.byte
  for i = 1, n do
    local x, y = byte(a, i), byte(b, i)
    if x ~= y then return x < y end
  end
  return la < lb
end

local function id_order()
  if 'B' < 'a' and '\195\169' > 'z' and 'a' < 'aa' then return nil end
  return bytes_less
end

local function plain_less(a, b) return a < b end

-- The ID order of this FCALL (see id_order), a function in any case, found once for the calls of a batch.
local function id_less_of(context)
  local less = context.id_less
  if not less then
    less = id_order() or plain_less
    context.id_less = less
  end
  return less
end

-- Whether the match (ad, aid) comes before (bd, bid): by distance, then by ID in `less`'s order.
local function pair_before(less, ad, aid, bd, bid)
  if ad ~= bd then return ad < bd end
  return less(aid, bid)
end

-- Sort the first n of `list`, each {distance, ID}, by pair_before. Already in order (the claim's list, which the
-- worker sorted the same way, with nothing added) they are left as they are, after n - 1 comparisons: two pairs
-- neither of which comes first are the same pair, so any sort would give this order too.
local function sort_pairs(list, n, less)
  for i = 2, n do
    local a, b = list[i - 1], list[i]
    if pair_before(less, b[1], b[2], a[1], a[2]) then
      table.sort(list, function(x, y) return pair_before(less, x[1], x[2], y[1], y[2]) end)
      return
    end
  end
end

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
local META_FIELDS = {'layout', 'building', 'retention_ms', 'changes_trimmed_to', 'tokenizer'}

local function meta_of(context, meta_key)
  if context.meta_key == meta_key then return context.meta end
  local v = redis.call('HMGET', meta_key, unpack(META_FIELDS))
  local meta = {layout = v[1], building = v[2], retention_ms = v[3], changes_trimmed_to = v[4], tokenizer = v[5]}
  context.meta_key, context.meta = meta_key, meta
  return meta
end

-- Every indexed incident within `limit` of `query`, found through the posting sets `probe_keys` (a list of key
-- names). Postings hold one representative per distinct fingerprint; the other incidents with that exact
-- fingerprint (its twins) sit with it in a group, the sorted set `twin_prefix .. <fingerprint>` (all scores 0, so
-- ZRANGE lists it in byte order), which exists only while two or more incidents share the fingerprint. Only
-- representatives are verified: a storm of twins costs one candidate, one ZCARD and one ZRANGE of at most `cap`.
--
-- Returns the number of candidates verified, the number of matches (every twin counted), the matches sorted by
-- (distance, ID), at most `cap` of them when cap > 0, as a flat list id, d, id, d..., and the representative of
-- `query` itself (the candidate at distance 0) or nil when the fingerprint is not indexed.
local function find_matches(fp_key, twin_prefix, probe_keys, query, limit, cap)
  local candidates
  if #probe_keys == 1 then
    candidates = redis.call('SMEMBERS', probe_keys[1])
  else
    candidates = redis.call('SUNION', unpack(probe_keys))
  end
  local n = #candidates
  if n == 0 then return 0, 0, {}, nil end

  local byte, lower = string.byte, string.lower
  local T1, T2, T3, T4, T5, T6, T7, T8, T9, T10, T11, T12, T13, T14, T15, T16 = digit_rows(query)

  -- by_distance[d + 1] lists the representatives at distance d, each as {id, group key or false}
  local by_distance = {}
  for d = 0, limit do by_distance[d + 1] = {} end
  local matched, verified, twin = 0, 0, nil
  for first = 1, n, CHUNK do
    local last = first + CHUNK - 1
    if last > n then last = n end
    local stored = redis.call('HMGET', fp_key, unpack(candidates, first, last))
    for k = 1, last - first + 1 do
      local h = stored[k]
      -- a posting without a (well-formed) fingerprint, say from a half-made manual edit, is not an incident
      if h and #h == 16 then
        verified = verified + 1
        -- the first 8 digits (32 bits) already rule out nearly every candidate; only survivors read the rest
        local c1, c2, c3, c4, c5, c6, c7, c8 = byte(h, 1, 8)
        local d = T1[c1] + T2[c2] + T3[c3] + T4[c4] + T5[c5] + T6[c6] + T7[c7] + T8[c8]
        if d <= limit then
          local c9, c10, c11, c12, c13, c14, c15, c16 = byte(h, 9, 16)
          d = d + T9[c9] + T10[c10] + T11[c11] + T12[c12] + T13[c13] + T14[c14] + T15[c15] + T16[c16]
        end
        if d <= limit then
          local id = candidates[first + k - 1]
          if d == 0 and not twin then twin = id end
          local group = twin_prefix .. lower(h)
          local size = redis.call('ZCARD', group)
          local bucket = by_distance[d + 1]
          if size > 1 then
            bucket[#bucket + 1] = {id, group}
            matched = matched + size
          else
            bucket[#bucket + 1] = {id, false}
            matched = matched + 1
          end
        end
      end
    end
  end

  local flat = {}
  if matched == 0 then return verified, 0, flat, twin end
  local order = id_order()
  local want = matched
  if cap > 0 and cap < want then want = cap end
  local taken = 0
  for d = 0, limit do
    if taken == want then break end
    local bucket = by_distance[d + 1]
    if #bucket > 0 then
      local need = want - taken
      local ids
      if #bucket == 1 and bucket[1][2] then
        ids = redis.call('ZRANGE', bucket[1][2], 0, need - 1)  -- already in byte order
      else
        -- several representatives at one distance: the first `need` of each group, merged
        ids = {}
        for i = 1, #bucket do
          local entry = bucket[i]
          if entry[2] then
            local members = redis.call('ZRANGE', entry[2], 0, need - 1)
            for j = 1, #members do ids[#ids + 1] = members[j] end
          else
            ids[#ids + 1] = entry[1]
          end
        end
        table.sort(ids, order)
      end
      for i = 1, #ids do
        if taken == want then break end
        taken = taken + 1
        flat[2 * taken - 1] = ids[i]
        flat[2 * taken] = d
      end
    end
  end
  return verified, matched, flat, twin
end

-- Take `id`, whose fingerprint is indexed under the posting keys `postings` with the group key `group`, out of
-- the postings and the group. A representative that leaves a group hands its postings to the group's first
-- member in byte order; a group left with one member is dropped (a lone incident needs no group).
local function unindex(id, group, postings)
  local size = redis.call('ZCARD', group)
  if size == 0 then
    for i = 1, #postings do redis.call('SREM', postings[i], id) end
    return
  end
  local removed = redis.call('ZREM', group, id)
  if #postings > 0 and redis.call('SISMEMBER', postings[1], id) == 1 then
    local heir = redis.call('ZRANGE', group, 0, 0)[1]
    for i = 1, #postings do
      redis.call('SREM', postings[i], id)
      if heir then redis.call('SADD', postings[i], heir) end
    end
  end
  -- (only a group `id` was in is left with one member: an ID stored with its fingerprint mangled by hand, in
  -- upper case, is no member of the group of its value, which keeps its two)
  if removed == 1 and size <= 2 then redis.call('DEL', group) end
end

-- Index `id` under its fingerprint: a fingerprint not indexed yet gets `id` as its representative in the
-- postings; otherwise `id` joins the group of `twin`, the representative (the group is made when needed).
local function index_one(id, twin, group, postings)
  if twin then
    redis.call('ZADD', group, 0, twin, 0, id)
  else
    for i = 1, #postings do redis.call('SADD', postings[i], id) end
  end
end

-- The representative of fingerprint `fp` (the incident in its postings), or nil when it is not indexed: any member
-- of its group when it has twins, else the incident in every one of its posting sets (SINTER starts from the
-- smallest) whose fingerprint is `fp`. The snapshot path needs it without searching.
local function representative_of(fp_key, group, fp, postings)
  local member = redis.call('ZRANGE', group, 0, 0)[1]
  if member then return member end
  if #postings == 0 then return nil end
  local found = #postings == 1 and redis.call('SMEMBERS', postings[1]) or redis.call('SINTER', unpack(postings))
  for i = 1, #found do
    if redis.call('HGET', fp_key, found[i]) == fp then return found[i] end
  end
  return nil
end

-- Entry IDs compare as (milliseconds, sequence); their strings do not (10-0 < 9-0 as text).
local function parse_id(id)
  local dash = string.find(id, '-', 1, true)
  return tonumber(string.sub(id, 1, dash - 1)), tonumber(string.sub(id, dash + 1))
end

local function parsed_less(am, as, bm, bs)
  if am ~= bm then return am < bm end
  return as < bs
end

local function id_less(a, b)
  local am, as = parse_id(a)
  local bm, bs = parse_id(b)
  return parsed_less(am, as, bm, bs)
end

-- Whether `id` is a stream entry ID (ms-seq). {N}:meta's changes_trimmed_to can be edited by hand: a value that is
-- not one must not make the functions fail (in every worker at once), and proves nothing about the log.
local function is_entry_id(id)
  return type(id) == 'string' and string.find(id, '^%d+%-%d+$') ~= nil
end

-- A snapshot whose position is more changes behind than this is not validated: the full search is cheaper.
local MAX_VALIDATED_CHANGES = 4000

-- The changes after a snapshot's position, summed up per incident: `first_prev[id]`, its fingerprint before its
-- first change after the position (what the copy saw), `latest[id]`, its fingerprint now ('' when deleted), `order`,
-- the incidents in the order of their first change, and `count`, the changes. One view serves every call of a batch
-- (apply_batch): the log is read once, and each call's own change is noted in it as it is written, so a later call
-- of the batch is validated against the earlier ones too, without reading the log again.
local function note_change(view, id, fp, prev)
  view.count = view.count + 1
  if view.first_prev[id] == nil then
    view.first_prev[id] = prev
    view.order[#view.order + 1] = id
  end
  view.latest[id] = fp
end

-- `context` is what the calls of one FCALL share: the view of the changes after `context.position` in
-- `context.key`, or false when those cannot be had (trimmed past the position, too many, or of an older format
-- without fingerprints, or the log no longer holds the position's own entry). Read from the log the first time a
-- call asks for that position.
--
-- The position's own entry is read too, as the proof that this log is the one the copy followed: a copy's position
-- is an entry it applied (or '0-0', or the trim floor when the log was trimmed empty), and trimming keeps every
-- entry at or above the floor. A log without it was reset (the namespace deleted, FLUSHALL) or went back in time (a
-- restart from an older save, a failover to a replica that lagged), and the copy may hold incidents the index no
-- longer has: its claim is not validated, and its worker loads the copy again (readpath.py does the same check).
local function changes_after(context, meta_key, changes_key, position)
  if context.key == changes_key and context.position == position then return context.view end
  local view = false
  local floor = meta_of(context, meta_key).changes_trimmed_to
  -- (a floor that is no entry ID, a hand edit, validates nothing: the full search runs instead)
  if not (floor and (not is_entry_id(floor) or id_less(position, floor))) then
    local changes = redis.call('XRANGE', changes_key, position, '+', 'COUNT', MAX_VALIDATED_CHANGES + 2)
    local first = 1
    if changes[1] and changes[1][1] == position then
      first = 2
    elseif position ~= '0-0' and position ~= floor then
      first = nil
    end
    if first and #changes - first + 1 <= MAX_VALIDATED_CHANGES then
      view = {count = 0, first_prev = {}, latest = {}, order = {}}
      for i = first, #changes do
        local f = changes[i][2]
        -- <op> <id> fp <new hex or ''> prev <old hex or ''>
        if f[3] ~= 'fp' or f[5] ~= 'prev' then
          view = false
          break
        end
        note_change(view, f[2], f[4], f[6])
      end
    end
  end
  context.key, context.position, context.view = changes_key, position, view
  return view
end

-- Whether no incident holds the fingerprint `fp` now, judged without reading the postings, from what the snapshot
-- path has at hand: the claim of a copy of the index at a position of {N}:changes (its match count `count` and its
-- closest matches `listed`, flat id, d, ... closest first) and every change after that position (changes_after;
-- this FCALL's earlier calls included), read by validate_snapshot: `held`, see below. True only when that is
-- certain; false means "read the postings" (representative_of), never "someone holds it".
--
-- Why true is certain. Take any incident x other than `self_id`, the caller's own (which does not hold `fp` at this
-- point: an add of a new ID holds nothing, an upsert took its old fingerprint out, and one already holding `fp`
-- answered `repeat`).
-- * x has no change after the position: its value in {N}:fp is the one it had at the position (every write of
--   {N}:fp logs a change, but for verify's repair of a mis-spelt value into its lowercase form, which keeps its
--   number), and the copy, exact at the position, holds that number for x. Had it been `fp`, the copy's search,
--   which leaves out only `self_id` and finds every incident within the distance, would have counted x at distance
--   0 and listed it first, matches being listed closest first. So when it counted none, or listed a closest match
--   further than 0, x does not hold `fp`.
-- * x changed after the position: its value now is its latest change's, view.latest[x], compared with `fp` by
--   validate_snapshot as it reads the changes for the distances: `held` is whether any such x holds `fp`.
-- So no incident holds `fp`: none of its posting sets holds an incident of it, and it has no twin group (a group
-- exists only while two or more incidents share its fingerprint), which is what representative_of would find.
--
-- `listed` is read in place: args[lo + 1 .. lo + n] of the call.
local function surely_unheld(held, count, listed, lo, n)
  if count ~= 0 and not (n >= 2 and tonumber(listed[lo + 2]) > 0) then return false end
  return not held
end

-- Append one change to {N}:changes, and note it in the view of this FCALL's calls (when they have one).
local function log_change(context, changes_key, op, id, fp, prev)
  redis.call('XADD', changes_key, '*', op, id, 'fp', fp, 'prev', prev)
  if context.view and context.key == changes_key then note_change(context.view, id, fp, prev) end
end

-- Snapshot reads (docs/contract.md, "Snapshot reads"). A worker searched its own copy of the index as it stood at
-- `position` in {N}:changes and counted `count` matches other than `self_id`, the closest listed in `listed`
-- (flat id, d, ... sorted by distance then ID; all of them when `complete`), here args[lo + 1 .. lo + n_listed] of
-- the call's arguments (read in place, not copied). Every change after that position is re-checked against the new
-- fingerprint: an incident the copy counted (its fingerprint before its first later change was within `limit`) and
-- one that counts now (its latest fingerprint is) adjust the count and the list.
--
-- Returns changes_checked, matched, flat (at most `cap` pairs when cap > 0), and `held`: whether an incident other
-- than `self_id` holds `query` by its latest change after the position (see surely_unheld); or nil when the copy
-- cannot be validated (its changes were trimmed, are too many, or lack fingerprints, or what it listed no longer
-- covers the cap): the caller then answers `unvalidated` and the worker sends the full search.
--
-- Each change costs table reads and additions only: the distance is summed from the per-digit rows of `query`
-- (find_matches's), and only within the limit after the first 8 digits are the other 8 read (the sum only grows,
-- so one past the limit there is past it in the end; its exact value is never used).
local function validate_snapshot(context, meta_key, changes_key, query, limit, self_id, cap, position, count, listed,
                                 lo, n_listed, complete)
  local view = changes_after(context, meta_key, changes_key, position)
  if not view or view.count > MAX_VALIDATED_CHANGES then return nil end
  local first_prev, latest, order = view.first_prev, view.latest, view.order

  local byte = string.byte
  local T1, T2, T3, T4, T5, T6, T7, T8, T9, T10, T11, T12, T13, T14, T15, T16 = digit_rows(query)
  -- (a query that is not 16 hex digits has rows missing: then every digit is read, and the sum fails as it always did)
  local halves = T9 and T10 and T11 and T12 and T13 and T14 and T15 and T16 and true

  local held = false
  local additions, n_additions = nil, 0
  for j = 1, #order do
    local id = order[j]
    if id ~= self_id then
      local was, now = first_prev[id], latest[id]
      -- the distances of `was` and `now` ('' for none: 64), one sum written once (no function call a change)
      local d_was, d = 64, 64
      for k = 1, 2 do
        local h = k == 1 and was or now
        if #h == 16 then
          local c1, c2, c3, c4, c5, c6, c7, c8 = byte(h, 1, 8)
          local e = T1[c1] + T2[c2] + T3[c3] + T4[c4] + T5[c5] + T6[c6] + T7[c7] + T8[c8]
          if e <= limit or not halves then
            local c9, c10, c11, c12, c13, c14, c15, c16 = byte(h, 9, 16)
            e = e + T9[c9] + T10[c10] + T11[c11] + T12[c12] + T13[c13] + T14[c14] + T15[c15] + T16[c16]
          end
          if k == 1 then d_was = e else d = e end
        end
      end
      if d_was <= limit then count = count - 1 end
      if now == query then held = true end
      if d <= limit then
        count = count + 1
        n_additions = n_additions + 1
        if n_additions == 1 then additions = {} end
        additions[n_additions] = {d, id}
      end
    end
  end

  local kept, n_kept = {}, 0
  for i = 1, n_listed, 2 do
    local id = listed[lo + i]
    if first_prev[id] == nil then
      n_kept = n_kept + 1
      kept[n_kept] = {tonumber(i < n_listed and listed[lo + i + 1] or nil), id}
    end
  end

  -- the copy listed every match, or only those up to its last listed one: past that, nothing is known
  local less = id_less_of(context)
  local bound_d, bound_id = nil, nil
  if not complete then
    if n_listed == 0 then return nil end
    bound_d, bound_id = tonumber(listed[lo + n_listed]), n_listed >= 2 and listed[lo + n_listed - 1] or nil
  end
  for i = 1, n_additions do
    local pair = additions[i]
    if complete or not pair_before(less, bound_d, bound_id, pair[1], pair[2]) then
      n_kept = n_kept + 1
      kept[n_kept] = pair
    end
  end
  if n_kept > 1 then sort_pairs(kept, n_kept, less) end
  local want = count
  if cap > 0 and cap < want then want = cap end
  if n_kept < want then return nil end
  local flat = {}
  for i = 1, want do
    flat[2 * i - 1] = kept[i][2]
    flat[2 * i] = kept[i][1]
  end
  return view.count, count, flat, held
end

-- The server's clock in milliseconds: the same clock as the stream entry IDs.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Which run of the server this is: the server's time (in us) when this library first ran a call in this process.
-- A SCAN or HSCAN cursor stored in a key (a migration's pass, the retention backfill) is only good in the process
-- that gave it: Redis seeds its hash function at random when it starts, so after a restart (a crash and its AOF, a
-- failover to a replica) the same cursor walks another order and skips keys. A pass whose stored run is not this one
-- starts again from 0 (each step of these passes may be repeated). A library loaded again (FUNCTION LOAD REPLACE)
-- counts as a new run too: only work is lost.
local RUN = {}
local function server_run()
  if RUN.id == nil then
    local t = redis.call('TIME')
    -- a server whose Lua tables were read-only could not keep it: then '' every time (a stored cursor is trusted,
    -- as before) rather than a new run at every call, which would never finish a pass
    if not pcall(function() RUN.id = t[1] .. '.' .. t[2] end) then return '' end
  end
  return RUN.id
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

-- The alert's `matches`: [{"incident_id":"<id>","distance":<d>},...], in pieces joined once (no string per match).
local function matches_json(flat)
  local parts, n = {'['}, 1
  for i = 1, #flat, 2 do
    parts[n + 1] = i == 1 and '{"incident_id":' or ',{"incident_id":'
    parts[n + 2] = json_string(flat[i])
    parts[n + 3] = ',"distance":'
    parts[n + 4] = flat[i + 1]
    parts[n + 5] = '}'
    n = n + 5
  end
  parts[n + 1] = ']'
  return table.concat(parts)
end

-- Bytes an alert's `matches` may take: the closest matches that fit are listed (match_count still counts them all).
-- 100 matches of everyday IDs take about 4 KB; 100 of 256 four-byte characters took 100 KB, a hundred times the
-- event that made them, so that one producer could fill the alerts stream faster than the upkeep measures it.
local MAX_MATCHES_BYTES = 8192

-- matches_json of the longest head of `flat` (id, d, ...) whose JSON fits in MAX_MATCHES_BYTES, at least one match.
local function matches_json_within(flat)
  local size, n = 2, 0
  for i = 1, #flat, 2 do
    size = size + #json_string(flat[i]) + #tostring(flat[i + 1]) + 27  -- {"incident_id":,"distance":} and a comma
    if size > MAX_MATCHES_BYTES and n > 0 then break end
    n = n + 2
  end
  if n == #flat then return matches_json(flat) end
  local head = {}
  for i = 1, n do head[i] = flat[i] end
  return matches_json(head)
end

local function is_pending(events_key, group, entry_id)
  local pending = redis.call('XPENDING', events_key, group, entry_id, entry_id, 1)
  return #pending > 0
end

-- What the calls of one apply_batch each read first, read for all of them at once (see prefetch below) and kept in
-- their `context`: `pending[entry ID]` true for an entry known to be pending in `pending_stream`'s `pending_group`,
-- and `stored[ID]` the value {N}:fp (`stored_key`) holds for an incident (false: none). Only the batch's own calls
-- change either while it runs (an entry leaves the pending list only when acknowledged, {N}:fp changes only by
-- HSET and HDEL, and no other command runs meanwhile), and each notes its change as it makes it. A call that finds
-- nothing here reads for itself, as a call of its own does.
local function entry_pending(context, events_key, group, entry_id)
  if context.acks and context.acked[entry_id] and context.pending_stream == events_key and
     context.pending_group == group then
    return false
  end
  if context.pending and context.pending[entry_id] and context.pending_stream == events_key and
     context.pending_group == group then
    return true
  end
  return is_pending(events_key, group, entry_id)
end

-- Acknowledge an entry. In an apply_batch whose calls share a stream and group (prefetch), the entries are
-- acknowledged together, with one XACK after the last call (nothing outside the FCALL sees the difference), and
-- meanwhile count as not pending to the later calls of the batch.
local function ack_entry(context, events_key, group, entry_id)
  if context.acks and context.pending_stream == events_key and context.pending_group == group then
    if not context.acked[entry_id] then
      context.acks[#context.acks + 1] = entry_id
      context.acked[entry_id] = true
    end
  else
    redis.call('XACK', events_key, group, entry_id)
  end
  if context.pending then context.pending[entry_id] = nil end
end

local function flush_acks(context)
  local acks = context.acks
  if not acks or #acks == 0 then return end
  for first = 1, #acks, CHUNK do
    local last = first + CHUNK - 1
    if last > #acks then last = #acks end
    redis.call('XACK', context.pending_stream, context.pending_group, unpack(acks, first, last))
  end
end

local function stored_fp(context, fp_key, id)
  if context.stored_key == fp_key then
    local value = context.stored[id]
    if value ~= nil then return value end
  end
  return redis.call('HGET', fp_key, id)
end

local function stored_now(context, fp_key, id, value)
  if context.stored_key == fp_key then context.stored[id] = value end
end

local function slice(list, first, last)
  local out = {}
  for i = first, last do out[#out + 1] = list[i] end
  return out
end

-- Append to `out` the keys of a call numbered first .. last that it has (1 .. nk), keys[ko + i] for its key i: the
-- keys of a call of apply_batch are read in place, in the FCALL's keys (ko = the keys of the calls before it), not
-- copied to a table of their own first; what slice gives from a table of the call's keys alone.
local function call_keys(out, keys, ko, nk, first, last)
  for i = first, last do
    if i >= 1 and i <= nk then
      local key = keys[ko + i]
      if key ~= nil then out[#out + 1] = key end
    end
  end
  return out
end

-- Add, upsert or delete one incident; in stream mode also publish its alert and acknowledge its entry.
--
-- keys[1] = {N}:meta       keys[2] = {N}:fp         keys[3] = {N}:changes (a stream: one entry <op> <ID> a change)
-- keys[4] = events stream  keys[5] = alerts stream
-- keys[6] = {N}:twins:<new fingerprint> (delete: of the expected one)
-- keys[7] = {N}:twins:<the fingerprint the client expects to replace> (add, or none expected: same as keys[6])
-- keys[8] = {N}:expiry (retention bookkeeping: scored with the server's time on add and upsert while retention is
--           on, see retention_on; the incident leaves it on delete)
-- keys[9 .. 8+n_new]             = the new fingerprint's posting keys, band 0 first
-- keys[9+n_new .. 8+n_new+n_old] = the posting keys of the fingerprint the client expects to replace, band 0 first
-- keys[9+n_new+n_old .. #keys-t] = the other probe keys of the new fingerprint
-- keys[#keys-t+1 .. #keys]       = while a migration builds another layout (args[19]): the new fingerprint's posting
--                                  keys in it (n_target of them when n_new > 0), then those of the fingerprint the
--                                  client expects to replace (n_target when n_old > 0); t counts both (0 otherwise)
-- The groups of the matches found are read under the prefix of keys[6] (all in the index's hash tag): their names
-- depend on fingerprints that only the server knows.
--
-- args[1] = op: add | upsert | delete       args[2] = incident ID
-- args[3] = new fingerprint (hex; '' for delete)
-- args[4] = the fingerprint the client expects stored now: hex, '-' for none, '*' for "any" (add)
-- args[5] = layout tag, must equal {N}:meta's `layout`
-- args[6] = max distance   args[7] = n_new   args[8] = n_old
-- args[9] = consumer group ('' = library mode: no acknowledgement, no alert)   args[10] = stream entry ID
-- args[11] = approximate MAXLEN of the alerts stream (0 = no trimming)
-- args[12] = most matches to list (0 = all)
-- args[13] = how many of the new posting keys (band 0 first) are probed too; the rest are only written
-- args[14] = text to publish in the alert's `text` field ('' = none)
-- args[15] = tokenizer version of a text incident ('' for a bag): refused (error TOKENIZER) when it differs from
--            {N}:meta's `tokenizer`; recorded there by the first call that indexes a text incident
-- args[16] = snapshot position in {N}:changes ('' or absent: search the postings here; see validate_snapshot)
-- args[17] = the snapshot's match count   args[18] = '1' when it listed every match ('' .. '' without a snapshot)
-- args[19] = the layout tag a migration is building, which this call writes too ('' = none): must equal {N}:meta's
--            `building` (refused with MIGRATION otherwise)   args[20] = n_target, posting keys per fingerprint in it
-- args[21 ..] = the snapshot's listed matches: id, d, ...
--
-- Returns {status, match_count, candidates_verified, alert_entry_id_or_'', id1, d1, id2, d2, ...} where status is
-- indexed | repeat | duplicate | stale | deleted | absent | not_pending | unvalidated. Only indexed, repeat,
-- deleted and absent acknowledge the entry; duplicate, stale, not_pending and unvalidated change nothing.
-- candidates_verified counts the representatives read, never their twins (on the snapshot path: the changes
-- validated).
--
-- apply_at runs the call whose keys are keys[ko + 1 .. ko + nk] and arguments args[ao + 1 .. ao + na] (apply_batch's
-- calls, in place); apply, a call of its own, is apply_at with all of them.
local function apply_at(keys, ko, nk, args, ao, na, context)
  local meta_key, fp_key, changes_key = keys[ko + 1], keys[ko + 2], keys[ko + 3]
  local events_key, alerts_key = keys[ko + 4], keys[ko + 5]
  local new_group, old_group, expiry_key = keys[ko + 6], keys[ko + 7], keys[ko + 8]
  local op, id, fp, expected = args[ao + 1], args[ao + 2], args[ao + 3], args[ao + 4]
  local limit, n_new, n_old = tonumber(args[ao + 6]), tonumber(args[ao + 7]), tonumber(args[ao + 8])
  local group, entry_id = args[ao + 9], args[ao + 10]
  local alerts_maxlen, cap = tonumber(args[ao + 11]), tonumber(args[ao + 12])
  local streaming = group ~= ''
  local FIRST = 9

  local meta = meta_of(context, meta_key)
  local refused = layout_refusal(meta_key, meta.layout, args[ao + 5])
  if refused then return refused end
  -- a migration's target layout, written beside the current one (see check_building)
  refused = building_refusal(meta_key, meta.building, args[ao + 19] or '')
  if refused then return refused end
  local n_target = tonumber(args[ao + 20]) or 0
  local t_new = n_new > 0 and n_target or 0
  local t_old = n_old > 0 and n_target or 0
  local LAST_PROBE = nk - t_new - t_old
  local tokenizer = args[ao + 15] or ''
  if tokenizer ~= '' and meta.tokenizer and meta.tokenizer ~= tokenizer then
    return redis.error_reply('TOKENIZER the text incidents of ' .. meta_key .. ' were made by tokenizer version ' ..
      meta.tokenizer .. ', not ' .. tokenizer .. '; run workers of that version, or use a new namespace')
  end
  if streaming and not entry_pending(context, events_key, group, entry_id) then
    return {'not_pending', 0, 0, ''}
  end

  local old = stored_fp(context, fp_key, id)
  if expected ~= '*' and (old or '-') ~= expected then
    return {'stale', 0, 0, ''}
  end

  if op == 'delete' then
    if not old then
      if streaming then ack_entry(context, events_key, group, entry_id) end
      return {'absent', 0, 0, ''}
    end
    unindex(id, old_group, call_keys(call_keys({}, keys, ko, nk, FIRST + n_new, FIRST - 1 + n_new + n_old),
                                     keys, ko, nk, LAST_PROBE + t_new + 1, nk))
    redis.call('HDEL', fp_key, id)
    stored_now(context, fp_key, id, false)
    redis.call('ZREM', expiry_key, id)
    log_change(context, changes_key, op, id, '', old)
    if streaming then ack_entry(context, events_key, group, entry_id) end
    return {'deleted', 0, 0, ''}
  end

  -- an add or upsert, a repeat of the stored fingerprint included, starts the incident's retention window again
  if old == fp then
    if retention_window(meta.retention_ms) then redis.call('ZADD', expiry_key, now_ms(), id) end
    if streaming then ack_entry(context, events_key, group, entry_id) end
    return {'repeat', 0, 0, ''}
  end
  if old and op == 'add' then
    return {'duplicate', 0, 0, old}
  end

  -- A snapshot's claim is validated before anything is written: `unvalidated` must change nothing.
  local position = args[ao + 16] or ''
  local verified, matched, flat, twin, held
  local n_listed = na > 20 and na - 20 or 0
  if position ~= '' then
    verified, matched, flat, held = validate_snapshot(context, meta_key, changes_key, fp, limit, id, cap, position,
                                                      tonumber(args[ao + 17]), args, ao + 20, n_listed,
                                                      args[ao + 18] == '1')
    if not verified then return {'unvalidated', 0, 0, ''} end
  end

  -- Nothing refuses from here on. An upsert takes its old self out first: it never matches itself, and a
  -- representative leaving hands its postings to a twin, which then matches like any other incident.
  if old then
    unindex(id, old_group, call_keys(call_keys({}, keys, ko, nk, FIRST + n_new, FIRST - 1 + n_new + n_old),
                                     keys, ko, nk, LAST_PROBE + t_new + 1, nk))
  end

  if position == '' then
    local probes = call_keys({}, keys, ko, nk, FIRST, FIRST - 1 + (tonumber(args[ao + 13]) or n_new))
    call_keys(probes, keys, ko, nk, FIRST + n_new + n_old, LAST_PROBE)
    local twin_prefix = string.sub(new_group, 1, -17)
    verified, matched, flat, twin = find_matches(fp_key, twin_prefix, probes, fp, limit, cap)
  elseif not surely_unheld(held, tonumber(args[ao + 17]), args, ao + 20, n_listed) then
    -- (the common case, a fingerprint nobody holds, needs no read: see surely_unheld)
    twin = representative_of(fp_key, new_group, fp, call_keys({}, keys, ko, nk, FIRST, FIRST - 1 + n_new))
  end

  -- the first text incident indexed records its tokenizer (a text event that indexes nothing records nothing: an
  -- index of bags stays open to workers of any tokenizer version)
  if tokenizer ~= '' and not meta.tokenizer then
    redis.call('HSET', meta_key, 'tokenizer', tokenizer)
    meta.tokenizer = tokenizer
  end
  index_one(id, twin, new_group, call_keys(call_keys({}, keys, ko, nk, FIRST, FIRST - 1 + n_new),
                                           keys, ko, nk, LAST_PROBE + 1, LAST_PROBE + t_new))
  redis.call('HSET', fp_key, id, fp)
  stored_now(context, fp_key, id, fp)
  if retention_window(meta.retention_ms) then redis.call('ZADD', expiry_key, now_ms(), id) end
  log_change(context, changes_key, op, id, fp, old or '')

  local alert_id = ''
  if streaming then
    if matched > 0 then
      local fields = {'incident_id', id, 'fingerprint', fp, 'matches', matches_json_within(flat),
                      'match_count', matched, 'max_distance', limit, 'source_entry', entry_id, 'op', op}
      local text = args[ao + 14] or ''
      if text ~= '' then
        fields[#fields + 1] = 'text'
        fields[#fields + 1] = text
      end
      if alerts_maxlen > 0 then
        alert_id = redis.call('XADD', alerts_key, 'MAXLEN', '~', alerts_maxlen, '*', unpack(fields))
      else
        alert_id = redis.call('XADD', alerts_key, '*', unpack(fields))
      end
    end
    ack_entry(context, events_key, group, entry_id)
  end
  local reply = {'indexed', matched, verified, alert_id}
  for i = 1, #flat do reply[4 + i] = flat[i] end
  return reply
end

local function apply(keys, args)
  return apply_at(keys, 0, #keys, args, 0, #args, {})
end

-- Several apply calls in one FCALL, run in order, each exactly as the apply function runs it; for the snapshot path,
-- whose calls of one send share their position in {N}:changes: the changes after it are read from the log once, and
-- each call's own change is added to what the later calls validate (see changes_after).
--
-- keys = the keys of every call, one call's after the other's
-- args[1] = n, the number of calls   args[2 .. 2n+1] = each call's number of keys and of arguments, in turn
-- args[2n+2 ..] = the arguments of every call, one call's after the other's
--
-- Returns one reply per call, in order: what apply returns, or the error it met (as an error reply in the array;
-- the calls after it still run, as separate calls would).
-- Fill `context` with what the calls of a batch read first (see entry_pending): whether their entries are pending,
-- from one XPENDING of the range of entry IDs they span (an entry not among its rows, not pending or past the rows
-- asked for when other consumers' entries share the range, is asked about again by its call), and their incidents'
-- stored fingerprints, with one HMGET.
-- Only when every call names the same {N}:fp, events stream and group; on any error it leaves `context` as it was
-- (each call then meets that error itself, as separate calls would).
local function prefetch(context, keys, args, n)
  local fp_key, events_key, group = nil, nil, nil
  local ids, entries = {}, {}
  local k, a = 0, 1 + 2 * n
  for i = 1, n do
    local nk, na = tonumber(args[2 * i]), tonumber(args[2 * i + 1])
    if nk < 8 or na < 10 then return end
    local f, e, g = keys[k + 2], keys[k + 4], args[a + 9]
    if i == 1 then fp_key, events_key, group = f, e, g end
    if f ~= fp_key or e ~= events_key or g ~= group then return end
    ids[i], entries[i] = args[a + 2], args[a + 10]
    k, a = k + nk, a + na
  end
  local ok, stored = pcall(redis.call, 'HMGET', fp_key, unpack(ids))
  if not ok or type(stored) ~= 'table' then return end
  local known = {}
  for i = 1, n do known[ids[i]] = stored[i] end
  context.stored_key, context.stored = fp_key, known
  if group == '' then return end
  -- (as id_less compares them, each ID parsed once)
  local low, high = entries[1], entries[1]
  local ranged = pcall(function()
    local low_ms, low_seq = parse_id(low)
    local high_ms, high_seq = low_ms, low_seq
    for i = 2, n do
      local ms, seq = parse_id(entries[i])
      if parsed_less(ms, seq, low_ms, low_seq) then low, low_ms, low_seq = entries[i], ms, seq end
      if parsed_less(high_ms, high_seq, ms, seq) then high, high_ms, high_seq = entries[i], ms, seq end
    end
  end)
  if not ranged then return end
  local asked = 4 * n + 16
  local rows
  ok, rows = pcall(redis.call, 'XPENDING', events_key, group, low, high, asked)
  if not ok or type(rows) ~= 'table' then return end
  local pending = {}
  for i = 1, #rows do pending[rows[i][1]] = true end
  context.pending_stream, context.pending_group, context.pending = events_key, group, pending
  context.acks, context.acked = {}, {}
end

local function apply_batch(keys, args)
  local n = tonumber(args[1])
  local context = {}
  local replies = {}
  if n > 1 then prefetch(context, keys, args, n) end
  local n_keys, n_args = #keys, #args
  local k, a = 0, 1 + 2 * n
  for i = 1, n do
    local nk, na = tonumber(args[2 * i]), tonumber(args[2 * i + 1])
    local ok, reply
    if nk >= 8 and na >= 20 and nk % 1 == 0 and na % 1 == 0 and k + nk <= n_keys and a + na <= n_args then
      -- the call's keys and arguments read in place (every one it reads is its own: see apply_at, call_keys)
      ok, reply = pcall(apply_at, keys, k, nk, args, a, na, context)
    else
      local call_keys_of, call_args_of = slice(keys, k + 1, k + nk), slice(args, a + 1, a + na)
      ok, reply = pcall(apply_at, call_keys_of, 0, #call_keys_of, call_args_of, 0, #call_args_of, context)
    end
    if not ok then
      if type(reply) == 'table' and reply.err then
        reply = {err = reply.err}
      else
        reply = {err = 'ERR ' .. tostring(reply)}
      end
    end
    replies[i] = reply
    k, a = k + nk, a + na
  end
  flush_acks(context)
  return replies
end

-- Every indexed incident within a distance of a fingerprint, without indexing anything.
--
-- keys[1] = {N}:meta   keys[2] = {N}:fp   keys[3] = {N}:twins:<the fingerprint>   keys[4 .. #keys] = the probe keys
-- args[1] = fingerprint (hex)   args[2] = max distance   args[3] = layout tag
-- args[4] = most matches to list (0 or absent = all)
--
-- Returns {match_count, candidates_verified, id1, d1, id2, d2, ...}, sorted, capped as asked.
local function matches(keys, args)
  local refused = check_layout(keys[1], args[3])
  if refused then return refused end
  local verified, matched, flat = find_matches(keys[2], string.sub(keys[3], 1, -17), slice(keys, 4, #keys), args[1],
                                               tonumber(args[2]), tonumber(args[4]) or 0)
  local reply = {matched, verified}
  for i = 1, #flat do reply[2 + i] = flat[i] end
  return reply
end

-- Dead-letter a stream entry and acknowledge it, unless it is no longer pending (another consumer finished it).
--
-- keys[1] = events stream   keys[2] = dead-letter stream
-- args[1] = consumer group   args[2] = entry ID   args[3] = approximate MAXLEN of the dead stream (0 = none)
-- args[4 ..] = the dead letter's field, value pairs
--
-- Returns the dead letter's entry ID, or '' when the entry was not pending.
local function dead_letter(keys, args)
  local group, entry_id, maxlen = args[1], args[2], tonumber(args[3])
  if not is_pending(keys[1], group, entry_id) then return '' end
  local fields = slice(args, 4, #args)
  local dead_id
  if maxlen > 0 then
    dead_id = redis.call('XADD', keys[2], 'MAXLEN', '~', maxlen, '*', unpack(fields))
  else
    dead_id = redis.call('XADD', keys[2], '*', unpack(fields))
  end
  redis.call('XACK', keys[1], group, entry_id)
  return dead_id
end

-- Remove a consumer from the group, but only if it has nothing pending (checked and done in one step, so a
-- consumer that just read entries is never dropped with them).
--
-- keys[1] = events stream   args[1] = consumer group   args[2] = consumer
--
-- Returns 1 when it removed the consumer, 0 when the consumer had entries pending.
local function forget_consumer(keys, args)
  if #redis.call('XPENDING', keys[1], args[1], '-', '+', 1, args[2]) > 0 then return 0 end
  redis.call('XGROUP', 'DELCONSUMER', keys[1], args[1], args[2])
  return 1
end

-- What the calling user may not do among the commands the apply, apply_batch and dead_letter functions send, and
-- which of the keys they write hold another type: checked once, when a worker starts. A function stops at the first
-- command refused and keeps what it wrote before it (Redis rolls nothing back), so a call refused its XADD to the
-- change log or the alerts, or its XACK, after indexing left an entry indexed without its change or its alert, and
-- its retry found the incident indexed already: a repeat, acknowledged without an alert.
--
-- keys[1] = {N}:meta   keys[2] = {N}:fp   keys[3] = {N}:changes   keys[4] = events stream   keys[5] = alerts stream
-- keys[6] = dead-letter stream   keys[7] = a posting set key   keys[8] = a twin group key   keys[9] = {N}:expiry
-- args[1] = consumer group
--
-- Returns a flat list: 'denied', command, key (or ''), ... and 'type', key, the type it must be, ...
local function preflight(keys, args)
  local out = {}
  if redis.acl_check_cmd then  -- (Redis 7; fakeredis has no ACL)
    local g = args[1]
    local checks = {
      {'HGET', keys[1], 'f'}, {'HSET', keys[1], 'f', 'v'}, {'HGETALL', keys[1]}, {'EXISTS', keys[1]},
      {'HGET', keys[2], 'i'}, {'HMGET', keys[2], 'i'}, {'HSET', keys[2], 'i', 'v'}, {'HDEL', keys[2], 'i'},
      {'XADD', keys[3], '*', 'f', 'v'}, {'XRANGE', keys[3], '-', '+'},
      {'XACK', keys[4], g, '0-1'}, {'XPENDING', keys[4], g, '-', '+', '1'},
      {'XADD', keys[5], 'MAXLEN', '~', '1', '*', 'f', 'v'}, {'XADD', keys[6], 'MAXLEN', '~', '1', '*', 'f', 'v'},
      {'SADD', keys[7], 'i'}, {'SREM', keys[7], 'i'}, {'SMEMBERS', keys[7]}, {'SUNION', keys[7], keys[7]},
      {'SINTER', keys[7], keys[7]},
      {'ZADD', keys[8], '0', 'i'}, {'ZREM', keys[8], 'i'}, {'ZRANGE', keys[8], '0', '0'}, {'ZCARD', keys[8]},
      {'DEL', keys[8]},
      {'ZADD', keys[9], '0', 'i'}, {'ZREM', keys[9], 'i'}, {'ZSCORE', keys[9], 'i'},
      {'TIME'},
    }
    for i = 1, #checks do
      local check = checks[i]
      if not redis.acl_check_cmd(unpack(check)) then
        out[#out + 1] = 'denied'
        out[#out + 1] = check[1]
        out[#out + 1] = check[2] or ''
      end
    end
  end
  -- The keys written after a call's first write (probed with commands a worker's user has: TYPE is not among them),
  -- and {N}:fp: read before anything is written, so a call fails whole, but every call does, and each entry of the
  -- stream would end as poison.
  local probes = {{'XLEN', keys[3], 'stream'}, {'XLEN', keys[5], 'stream'}, {'XLEN', keys[6], 'stream'},
                  {'ZCARD', keys[9], 'sorted set'}, {'HLEN', keys[2], 'hash'}}
  for i = 1, #probes do
    local reply = redis.pcall(probes[i][1], probes[i][2])
    if type(reply) == 'table' and reply.err and string.find(tostring(reply.err), 'WRONGTYPE', 1, true) then
      out[#out + 1] = 'type'
      out[#out + 1] = probes[i][2]
      out[#out + 1] = probes[i][3]
    end
  end
  return out
end

-- Write the index's meta on first use; report what is there.
--
-- keys[1] = {N}:meta   args[1] = layout tag   args[2 ..] = the other meta field, value pairs
--
-- Returns the stored layout tag (the new one when this call wrote it), or '' when the key holds a hash
-- without a layout (not an index of ours).
local function ensure_meta(keys, args)
  local current = redis.call('HGET', keys[1], 'layout')
  if current then return current end
  -- a meta holding only `changes_trimmed_to` is ours: an earlier version's trim wrote it into a namespace a restart
  -- without persistence had emptied
  local fields = redis.call('HLEN', keys[1])  -- (HLEN and HGET: commands the worker's user has; HKEYS is not)
  if fields > 1 or (fields == 1 and not redis.call('HGET', keys[1], 'changes_trimmed_to')) then return '' end
  redis.call('HSET', keys[1], 'layout', args[1], unpack(slice(args, 2, #args)))
  return args[1]
end

-- Reading entries with their size known first (read_new, read_pending, claim below). A stream entry leaves the
-- server whole only when its field names and values total at most `limit` bytes; a larger one travels as a bounded
-- summary (prefixes and sizes), so that no entry, however large, reaches a worker whole. Server side, the entry is
-- in Lua's memory only for the duration of the call.
--
-- Each entry in a reply is a list {id, deliveries, kind, ...}:
--   kind 'f' (full):    name1, value1, name2, value2, ... every field in order, repeated names kept
--   kind 'o' (oversized): total bytes, field count, then for each of the first SUMMARY_FIELDS fields:
--                       name prefix, name bytes, value prefix, value bytes (prefixes of `prefix` bytes)
--   kind 'm' (missing): the entry is no longer in the stream (deleted or trimmed while pending)
local SUMMARY_FIELDS = 1000

-- The reply of one entry and the bytes it carries.
local function entry_reply(id, deliveries, fields, limit, prefix)
  if not fields or #fields == 0 then return {id, deliveries, 'm'}, 0 end
  local total = 0
  for i = 1, #fields do total = total + #fields[i] end
  if total <= limit then
    local out = {id, deliveries, 'f'}
    for i = 1, #fields do out[3 + i] = fields[i] end
    return out, total
  end
  local count = #fields / 2
  local out = {id, deliveries, 'o', total, count}
  local kept, size = count, 0
  if kept > SUMMARY_FIELDS then kept = SUMMARY_FIELDS end
  local sub = string.sub
  for i = 1, kept do
    local name, value = fields[2 * i - 1], fields[2 * i]
    local n = #out
    out[n + 1], out[n + 2] = sub(name, 1, prefix), #name
    out[n + 3], out[n + 4] = sub(value, 1, prefix), #value
    size = size + #out[n + 1] + #out[n + 3]
  end
  return out, size
end

-- The entries of an XREADGROUP reply of one stream (none: {}). Redis answers {{stream, {entry, ...}}} or nil;
-- fakeredis answers {stream, {entry, ...}} or {}.
local function stream_entries(reply)
  if not reply or not reply[1] then return {} end
  if type(reply[1]) == 'table' then return reply[1][2] end
  return reply[2]
end

-- Deliver the group's next new entries to a consumer until `count` entries or until the reply carries `budget`
-- bytes (at least one entry when there is one). An entry adds at most `most` bytes to a reply: `limit` when sent
-- whole, the prefixes of at most SUMMARY_FIELDS fields otherwise. So each XREADGROUP takes as many entries as would
-- fit the bytes left even if every one of them were that large (at least one): they are the very entries that one
-- XREADGROUP COUNT 1 an entry would take (before each of them, the budget is not spent yet), and the reply stays
-- within the budget plus one entry as before; but small entries, the common case, come several to a call (an
-- XREADGROUP from Lua costs ~10 us beside its entries). With the defaults (8 MiB budget, 1 MiB entries, 1 KiB
-- prefixes: `most` is 2,000 KiB) a call takes 4 at first, so Lua holds at most 4 entries, however large, at once.
--
-- keys[1] = events stream
-- args[1] = consumer group  args[2] = consumer  args[3] = most entries  args[4] = byte budget of the reply
-- args[5] = largest entry sent whole (bytes)  args[6] = bytes kept of each field of a larger entry
--
-- Returns {'', entry, entry, ...}.
local function read_new(keys, args)
  local group, consumer = args[1], args[2]
  local count, budget = tonumber(args[3]), tonumber(args[4])
  local limit, prefix = tonumber(args[5]), tonumber(args[6])
  local most = 2 * prefix * SUMMARY_FIELDS
  if limit > most then most = limit end
  local out = {''}
  while #out <= count and budget > 0 do
    local take = math.floor(budget / most)
    if take < 1 then take = 1 end
    if take > count + 1 - #out then take = count + 1 - #out end
    local reply = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', take, 'STREAMS', keys[1], '>')
    local entries = stream_entries(reply)
    for i = 1, #entries do
      local item, size = entry_reply(entries[i][1], 1, entries[i][2], limit, prefix)
      out[#out + 1] = item
      budget = budget - size
    end
    if #entries < take then break end
  end
  return out
end

-- A consumer's own pending entries from `start` on, with their delivery counts, without delivering them again:
-- XPENDING and XRANGE leave the counts alone (an XREADGROUP of the history would add one to each, so a worker
-- that reconnects often would turn good entries into poison). With args[7] = '1' each one still in the stream is
-- counted as delivered once more (XCLAIM RETRYCOUNT): for the entries a crashed predecessor left.
--
-- keys[1] = events stream
-- args[1] = consumer group  args[2] = consumer  args[3] = first entry ID  args[4] = most entries
-- args[5] = byte budget  args[6] = largest entry sent whole  args[7] = prefix bytes  args[8] = '1' to count
--
-- Returns {'', entry, ...} in ID order.
local function read_pending(keys, args)
  local group, consumer = args[1], args[2]
  local budget, limit, prefix = tonumber(args[5]), tonumber(args[6]), tonumber(args[7])
  local rows = redis.call('XPENDING', keys[1], group, args[3], '+', tonumber(args[4]), consumer)
  local out = {''}
  for i = 1, #rows do
    if budget <= 0 then break end
    local id, deliveries = rows[i][1], rows[i][4]
    local found = redis.call('XRANGE', keys[1], id, id)
    local fields = found[1] and found[1][2]
    if fields and args[8] == '1' then
      deliveries = deliveries + 1
      redis.call('XCLAIM', keys[1], group, consumer, 0, id, 'RETRYCOUNT', deliveries, 'JUSTID')
    end
    local item, size = entry_reply(id, deliveries, fields, limit, prefix)
    out[#out + 1] = item
    budget = budget - size
  end
  return out
end

-- Take over entries pending longer than `min_idle` ms with any consumer (XAUTOCLAIM, which counts a delivery:
-- an entry whose holder went silent may be what silenced it), one at a time until `count` or the byte budget.
--
-- keys[1] = events stream
-- args[1] = consumer group  args[2] = consumer  args[3] = min idle ms  args[4] = cursor  args[5] = most entries
-- args[6] = byte budget  args[7] = largest entry sent whole  args[8] = prefix bytes
--
-- Returns {next cursor ('0-0' when the scan is complete), entry, ...}.
local function claim(keys, args)
  local group, consumer, min_idle = args[1], args[2], args[3]
  local cursor, count, budget = args[4], tonumber(args[5]), tonumber(args[6])
  local limit, prefix = tonumber(args[7]), tonumber(args[8])
  local out = {cursor}
  local scans = 0
  while #out <= count and budget > 0 and scans < 10 * count do
    scans = scans + 1
    local reply = redis.call('XAUTOCLAIM', keys[1], group, consumer, min_idle, cursor, 'COUNT', 1)
    cursor = reply[1]
    local entry = reply[2][1]
    if entry then
      local row = redis.call('XPENDING', keys[1], group, entry[1], entry[1], 1)
      local deliveries = row[1] and row[1][4] or 1
      local item, size = entry_reply(entry[1], deliveries, entry[2], limit, prefix)
      out[#out + 1] = item
      budget = budget - size
    end
    if cursor == '0-0' then break end
  end
  out[1] = cursor
  return out
end

-- Exact arithmetic on entry IDs for trimming: each part may be any number up to 2^64 - 1 (a producer may give its own
-- IDs), past the 53 bits a Lua number holds, where parse_id rounds (up, too: a bound past an undelivered entry).
-- The parts are compared as decimal text, shorter first (Redis writes them without leading zeros).
local LAST_PART = '18446744073709551615'

local function split_id(id)
  local dash = string.find(id, '-', 1, true)
  return string.sub(id, 1, dash - 1), string.sub(id, dash + 1)
end

local function decimal_less(a, b)
  if #a ~= #b then return #a < #b end
  return bytes_less(a, b)
end

local function exact_id_less(a, b)
  local am, as = split_id(a)
  local bm, bs = split_id(b)
  if am ~= bm then return decimal_less(am, bm) end
  return decimal_less(as, bs)
end

local function decimal_next(n)
  local i = #n
  while i > 0 and string.sub(n, i, i) == '9' do i = i - 1 end
  if i == 0 then return '1' .. string.rep('0', #n) end
  return string.sub(n, 1, i - 1) .. string.char(string.byte(n, i) + 1) .. string.rep('0', #n - i)
end

-- The first entry ID after `id` (`id` itself for the last possible one: nothing can follow it).
local function id_after(id)
  local ms, seq = split_id(id)
  if seq ~= LAST_PART then return ms .. '-' .. decimal_next(seq) end
  if ms == LAST_PART then return id end
  return decimal_next(ms) .. '-0'
end

-- Trim the events stream below the oldest entry any consumer group still needs, never above it.
--
-- A group needs every entry it has not acknowledged (its smallest pending ID, from XPENDING) and every entry not
-- yet delivered to it (those after its last-delivered-id, from XINFO GROUPS). Read and trimmed in one atomic step,
-- so no group can be created, rewound or handed an entry between the reading and the trimming.
--
-- keys[1] = events stream
-- args[1] = the workers' own group: never ignored
-- args[2] = ms: another group whose oldest needed entry is older than this no longer holds the stream (0 = never)
-- args[3] = most entries removed by this call; trimming is approximate (whole stream nodes), so up to one node's
--           worth of entries below the bound can stay until a later call
--
-- Returns {removed, bound ('' = none: no group), then per group: name, position, age_ms, ignored (0/1), lag or -1}
-- where position is the first entry ID the group still needs and age_ms the age of the oldest such entry (0: none).
local function trim_events(keys, args)
  local stream, own, max_age, limit = keys[1], args[1], tonumber(args[2]), tonumber(args[3])
  if redis.call('EXISTS', stream) == 0 then return {0, ''} end
  local now = now_ms()
  local bound
  local reply = {0, ''}
  for _, row in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
    local info = {}
    for i = 1, #row, 2 do info[row[i]] = row[i + 1] end
    local name = info['name']
    local position = id_after(info['last-delivered-id'])
    if tonumber(info['pending']) > 0 then
      local oldest_pending = redis.call('XPENDING', stream, name)[2]
      if oldest_pending and exact_id_less(oldest_pending, position) then position = oldest_pending end
    end
    local age = 0
    local first = redis.call('XRANGE', stream, position, '+', 'COUNT', 1)[1]
    if first then
      age = now - parse_id(first[1])
      if age < 0 then age = 0 end
    end
    local ignored = name ~= own and max_age > 0 and age > max_age
    if not ignored and (bound == nil or exact_id_less(position, bound)) then bound = position end
    local lag = info['lag']
    reply[#reply + 1] = name
    reply[#reply + 1] = position
    reply[#reply + 1] = age
    reply[#reply + 1] = ignored and 1 or 0
    reply[#reply + 1] = lag and tonumber(lag) or -1
  end
  if bound then
    reply[1] = redis.call('XTRIM', stream, 'MINID', '~', bound, 'LIMIT', limit)
    reply[2] = bound
  end
  return reply
end

-- Take or keep a lease: a key holding its holder's name, with a TTL, so that a holder that dies loses it.
--
-- keys[1] = the lease key   args[1] = holder   args[2] = TTL in ms ('0': give the lease up, if held)
--
-- Returns 1 when args[1] holds the lease after this call, else 0.
local function lease(keys, args)
  local holder = redis.call('GET', keys[1])
  if holder and holder ~= args[1] then return 0 end
  if args[2] == '0' then
    if holder then redis.call('DEL', keys[1]) end
    return 0
  end
  redis.call('SET', keys[1], args[1], 'PX', args[2])
  return 1
end

-- Trim the change log below an entry ID, and record that bound first in {N}:meta's `changes_trimmed_to`, so that a
-- snapshot older than it is never validated against a log with a hole (see validate_snapshot).
--
-- keys[1] = {N}:meta   keys[2] = {N}:changes   args[1] = bound (entry ID)   args[2] = most entries removed
--
-- Returns the number of entries removed (approximately: whole stream nodes).
local function trim_changes(keys, args)
  -- No index (Redis restarted without persistence under a running worker): nothing to trim, and the meta is not
  -- created here: a meta without a layout would stop every worker's start as "not the meta of an incident index".
  if not redis.call('HGET', keys[1], 'layout') then return 0 end
  local floor = redis.call('HGET', keys[1], 'changes_trimmed_to')
  if floor and not is_entry_id(floor) then
    return redis.error_reply('ERR ' .. keys[1] .. ' field changes_trimmed_to holds ' .. string.format('%q', floor) ..
      ', not a stream entry ID: set it to the first entry ID of ' .. keys[2] .. ' (HSET, as an administrator)')
  end
  if not floor or id_less(floor, args[1]) then redis.call('HSET', keys[1], 'changes_trimmed_to', args[1]) end
  return redis.call('XTRIM', keys[2], 'MINID', '~', args[1], 'LIMIT', args[2])
end

-- Retention (docs/contract.md, "Retention"). The window lives in {N}:meta's `retention_ms`, so every worker's apply
-- step agrees on whether to keep {N}:expiry, whatever each worker's own setting.

-- Record the retention window. Turning it on starts the backfill: {N}:expiry gets every incident already indexed,
-- scored with the time it was turned on (`retention_since`), in bounded steps (expiry_backfill) from the HSCAN
-- cursor in `retention_backfill`. Turning it off drops {N}:expiry (UNLINK: freed in the background).
--
-- keys[1] = {N}:meta   keys[2] = {N}:expiry   args[1] = layout tag   args[2] = window in ms (0 = off)
--
-- Returns the window recorded before this call (0 = off).
local function set_retention(keys, args)
  local meta_key, expiry_key = keys[1], keys[2]
  local refused = check_layout(meta_key, args[1])
  if refused then return refused end
  local window = tonumber(args[2])
  local was_on, was = retention_on(meta_key)
  if window > 0 then
    redis.call('HSET', meta_key, 'retention_ms', string.format('%.0f', window))
    if not was_on then
      redis.call('UNLINK', expiry_key)
      redis.call('HSET', meta_key, 'retention_since', now_ms(), 'retention_backfill', '0', 'retention_backfill_run',
                 server_run())
    end
  else
    redis.call('HDEL', meta_key, 'retention_ms', 'retention_since', 'retention_backfill', 'retention_backfill_run')
    redis.call('UNLINK', expiry_key)
  end
  return was
end

-- One bounded step of the backfill that set_retention starts: the next HSCAN page of {N}:fp joins {N}:expiry with the
-- score `retention_since`, unless it is there already (ZADD NX: an add or upsert since then is newer).
--
-- keys[1] = {N}:meta   keys[2] = {N}:fp   keys[3] = {N}:expiry   args[1] = HSCAN COUNT
--
-- Returns {cursor ('' once the backfill is done or when none runs), incidents added}.
local function expiry_backfill(keys, args)
  local meta_key, fp_key, expiry_key = keys[1], keys[2], keys[3]
  local cursor = redis.call('HGET', meta_key, 'retention_backfill')
  local since = redis.call('HGET', meta_key, 'retention_since')
  if not cursor or not since or not retention_on(meta_key) then return {'', 0} end
  -- a cursor of another run of the server (see server_run) would skip incidents: start the pass again (ZADD NX)
  if redis.call('HGET', meta_key, 'retention_backfill_run') ~= server_run() then cursor = '0' end
  local reply = redis.call('HSCAN', fp_key, cursor, 'COUNT', tonumber(args[1]))
  local rows = reply[2]
  local added = 0
  local batch = {}
  local function flush()
    if #batch > 0 then
      added = added + redis.call('ZADD', expiry_key, 'NX', unpack(batch))
      batch = {}
    end
  end
  for i = 1, #rows, 2 do
    batch[#batch + 1] = since
    batch[#batch + 1] = rows[i]
    if #batch >= CHUNK then flush() end
  end
  flush()
  local next_cursor = tostring(reply[1])
  if next_cursor == '0' then
    redis.call('HDEL', meta_key, 'retention_backfill', 'retention_backfill_run')
    return {'', added}
  end
  redis.call('HSET', meta_key, 'retention_backfill', next_cursor, 'retention_backfill_run', server_run())
  return {next_cursor, added}
end

-- Expire incidents whose last add or upsert is older than the window: each one, atomically, leaves the postings
-- (a representative hands them to its heir, as in a delete), its twin group, {N}:fp and {N}:expiry, and the change
-- log records `expire <ID> fp '' prev <old>`. Each is conditional: it goes only if {N}:expiry still dates it before
-- now - retention_ms (an add or upsert since it was picked moved it on) and {N}:fp still holds the fingerprint the
-- caller read (whose posting keys it sent).
--
-- keys[1] = {N}:meta   keys[2] = {N}:fp   keys[3] = {N}:changes   keys[4] = {N}:expiry
-- then per incident: {N}:twins:<its fingerprint>, then its n posting keys (band 0 first)
-- args[1] = layout tag   then per incident: ID, the fingerprint read (hex, or '-' for none), n
--
-- Returns {expired, kept (changed since picked, or not due), dropped (in {N}:expiry without a fingerprint)}.
local function expire(keys, args)
  local meta_key, fp_key, changes_key, expiry_key = keys[1], keys[2], keys[3], keys[4]
  local refused = check_layout(meta_key, args[1])
  if refused then return refused end
  local on, window = retention_on(meta_key)
  -- nothing expires while a move to another layout builds its postings (the `building` field of {N}:meta): the
  -- postings of the layout being built would be left behind
  if not on or redis.call('HEXISTS', meta_key, 'building') == 1 then return {0, (#args - 1) / 3, 0} end
  local cutoff = now_ms() - window
  local expired, kept, dropped = 0, 0, 0
  local k = 5
  for i = 2, #args, 3 do
    local id, expected, n = args[i], args[i + 1], tonumber(args[i + 2])
    local group, first = keys[k], k + 1
    k = k + 1 + n
    local score = tonumber(redis.call('ZSCORE', expiry_key, id) or '')
    local old = redis.call('HGET', fp_key, id)
    if not score or score > cutoff then
      kept = kept + 1
    elseif not old then
      redis.call('ZREM', expiry_key, id)
      dropped = dropped + 1
    elseif old ~= expected then
      kept = kept + 1
    else
      unindex(id, group, slice(keys, first, first + n - 1))
      redis.call('HDEL', fp_key, id)
      redis.call('ZREM', expiry_key, id)
      redis.call('XADD', changes_key, '*', 'expire', id, 'fp', '', 'prev', old)
      expired = expired + 1
    end
  end
  return {expired, kept, dropped}
end


-- Integrity check and repair (`incident-worker verify`, docs/contract.md "Verifying and repairing the index").
--
-- The verifier walks the index in bounded batches and sends what it wants checked here, where each subject is read
-- and judged in one atomic step: what a running worker changed between the walk's read and this call is seen as it
-- is now, so a state a concurrent change explains is never reported, and a repair never undoes a worker's change.
-- The same code checks (verify_check, no writes) and repairs (verify_repair: a fix is made only where the check
-- finds a problem at that moment; {N}:fp, the source of truth, is only written for a fingerprint that is not 16
-- lowercase hex digits).

local HEX16 = '^[0-9a-f]+$'

local function is_fingerprint(value)
  return value ~= nil and #value == 16 and string.find(value, HEX16) ~= nil
end

-- The smallest ID of a list in byte order (nil for none).
local function first_id(ids)
  local best = nil
  for i = 1, #ids do
    if best == nil or bytes_less(ids[i], best) then best = ids[i] end
  end
  return best
end

-- One fingerprint's postings and twin group, judged from what can be read without a scan: the incidents in all of its
-- posting sets, the `candidates` given (those the walk met), and its group's members when it has at most two.
-- Incidents of the fingerprint outside all of these are judged when the walk meets them. Appends each finding to
-- `out` as kind, subject, fingerprint; with `repair`, fixes it in the same step.
--
-- The target, as the apply step keeps it: one representative in every posting set (the one already in all of them,
-- else the one in most, else the first in byte order), no other incident of the fingerprint in any of them, and a
-- group (score 0) of all incidents of the fingerprint when two or more share it, none when one does.
local function reconcile(fp_key, group, postings, fp, candidates, repair, out)
  local m = #postings
  local seen, holders, holding = {}, {}, {}
  local group_size = redis.call('ZCARD', group)
  local strays = 0
  local function consider(id, from_group)
    if seen[id] then return end
    seen[id] = true
    if redis.call('HGET', fp_key, id) == fp then
      holders[#holders + 1] = id
      holding[id] = true
    elseif from_group then
      -- a member of the group with another fingerprint, or none
      strays = strays + 1
      out[#out + 1] = 'twin_stray'
      out[#out + 1] = id
      out[#out + 1] = fp
      if repair then redis.call('ZREM', group, id) end
    end
  end
  for i = 1, #candidates do consider(candidates[i], false) end
  if group_size > 0 and group_size <= 2 then
    local members = redis.call('ZRANGE', group, 0, -1)
    for i = 1, #members do consider(members[i], true) end
  end
  local full = m == 1 and redis.call('SMEMBERS', postings[1]) or redis.call('SINTER', unpack(postings))
  local any_full = false
  for i = 1, #full do
    consider(full[i], false)
    if holding[full[i]] then any_full = true end
  end
  if not any_full and m > 1 then
    -- no incident of the fingerprint in all of its posting sets: one in some of them (a representative that lost
    -- a posting) is the one to complete, not a twin that the walk happened to meet first
    local some = redis.call('SUNION', unpack(postings))
    for i = 1, #some do consider(some[i], false) end
  end
  if #holders == 0 then return end
  group_size = group_size - strays

  local count, grouped = {}, {}
  local best_full, best_partial, best_count = {}, nil, 0
  for _, id in ipairs(holders) do
    local c = 0
    for i = 1, m do c = c + redis.call('SISMEMBER', postings[i], id) end
    count[id] = c
    grouped[id] = redis.call('ZSCORE', group, id) ~= false
    if c == m then
      best_full[#best_full + 1] = id
    elseif c > best_count or (c == best_count and c > 0 and bytes_less(id, best_partial)) then
      best_partial, best_count = id, c
    end
  end
  local rep = first_id(best_full) or best_partial or first_id(holders)

  local outside = 0
  for _, id in ipairs(holders) do
    if not grouped[id] then outside = outside + 1 end
  end
  local total = group_size + outside

  if count[rep] < m then
    out[#out + 1] = (count[rep] == 0 and total >= 2) and 'group_without_representative' or 'missing_postings'
    out[#out + 1] = rep
    out[#out + 1] = fp
    if repair then
      for i = 1, m do redis.call('SADD', postings[i], rep) end
    end
  end
  for _, id in ipairs(holders) do
    if id ~= rep and count[id] > 0 then
      out[#out + 1] = count[id] == m and 'two_representatives' or 'extra_posting'
      out[#out + 1] = id
      out[#out + 1] = fp
      if repair then
        for i = 1, m do redis.call('SREM', postings[i], id) end
      end
    end
  end
  if total >= 2 then
    for _, id in ipairs(holders) do
      if not grouped[id] then
        out[#out + 1] = 'twin_not_grouped'
        out[#out + 1] = id
        out[#out + 1] = fp
        if repair then redis.call('ZADD', group, 0, id) end
      end
    end
  elseif group_size == 1 then
    out[#out + 1] = 'small_group'
    out[#out + 1] = group
    out[#out + 1] = fp
    if repair then redis.call('DEL', group) end
  end
end

-- The subjects of one verify call. Each is five arguments: code, how many keys it takes (from keys[6] on, in order),
-- and three fields ('' when unused):
--   i  incident      id, its fingerprint as the walk read it            keys: its group, its posting keys
--   b  bad value     id, the value read (not 16 lowercase hex digits)   keys: the group and posting keys of its
--                                                                       lowercase form when that is a fingerprint
--   p  posting       posting key member, the fingerprint read ('' = none): the walk found it does not belong there
--                                                                       keys: the posting key
--   g  group member  member, the group's fingerprint, its score          keys: the group, the fingerprint's postings
--   s  group         the group's fingerprint                             keys: the group, the fingerprint's postings
--   x  bad group key (its name is not a fingerprint)                     keys: the key
--   e  expiry entry  id: an entry of {N}:expiry the walk found without an incident
--
-- keys[1] = {N}:meta   keys[2] = {N}:fp   keys[3] = {N}:migration   keys[4] = {N}:expiry   keys[5] = {N}:changes
-- args[1] = layout tag (must equal {N}:meta's `layout`; '' for a check of an index whose meta is missing)
-- args[2] = '1' when the walk checks that every incident is in {N}:expiry; judged again here against {N}:meta, as
--           everything else is: only while retention is on now and no backfill runs (a worker may have turned it off,
--           or off and on again, since the walk began)
-- args[3 ..] = the subjects
--
-- Returns the findings as a flat list: the subject's number (1 = the first), kind, subject, detail, ... (with
-- repair: each of them fixed in this call).
local function verify(keys, args, repair)
  local meta_key, fp_key, migration_key, expiry_key, changes_key = keys[1], keys[2], keys[3], keys[4], keys[5]
  if args[1] ~= '' then
    local refused = check_layout(meta_key, args[1])
    if refused then return refused end
  end
  if redis.call('EXISTS', migration_key) == 1 then
    return redis.error_reply('MIGRATING ' .. migration_key .. ' says the index is moving to another layout; ' ..
      'run verify after the move has finished or been aborted')
  end
  local expiry_on = args[2] == '1' and retention_on(meta_key)
                    and redis.call('HEXISTS', meta_key, 'retention_backfill') == 0
  local reply = {}
  local k = 6
  for a = 3, #args, 5 do
    local out = {}
    local code, n, f1, f2, f3 = args[a], tonumber(args[a + 1]), args[a + 2], args[a + 3], args[a + 4]
    local sk = slice(keys, k, k + n - 1)
    k = k + n
    if code == 'i' then
      if redis.call('HGET', fp_key, f1) == f2 then
        reconcile(fp_key, sk[1], slice(sk, 2, #sk), f2, {f1}, repair, out)
        if expiry_on and redis.call('ZSCORE', expiry_key, f1) == false then
          out[#out + 1] = 'expiry_missing'
          out[#out + 1] = f1
          out[#out + 1] = f2
          if repair then redis.call('ZADD', expiry_key, now_ms(), f1) end
        end
      end
    elseif code == 'b' then
      local value = redis.call('HGET', fp_key, f1)
      if value == f2 and not is_fingerprint(value) then
        local lower = string.lower(value)
        out[#out + 1] = 'bad_fingerprint'
        out[#out + 1] = f1
        out[#out + 1] = value
        if repair and is_fingerprint(lower) then
          -- the same number in the contract's spelling; then its postings as for any incident
          redis.call('HSET', fp_key, f1, lower)
          reconcile(fp_key, sk[1], slice(sk, 2, #sk), lower, {f1}, repair, out)
        elseif repair then
          -- no number to rebuild from: the incident is taken out, as a delete would (its value is in the report)
          redis.call('HDEL', fp_key, f1)
          redis.call('ZREM', expiry_key, f1)
          redis.call('XADD', changes_key, '*', 'delete', f1, 'fp', '', 'prev', '')
        end
      end
    elseif code == 'p' then
      local stored = redis.call('HGET', fp_key, f2) or ''
      if stored == f3 and redis.call('SISMEMBER', sk[1], f2) == 1 then
        out[#out + 1] = f3 == '' and 'orphan_posting' or 'wrong_posting'
        out[#out + 1] = f2
        out[#out + 1] = sk[1]
        if repair then redis.call('SREM', sk[1], f2) end
      end
    elseif code == 'g' then
      local score = redis.call('ZSCORE', sk[1], f1)
      if score then
        if redis.call('HGET', fp_key, f1) ~= f2 then
          out[#out + 1] = 'twin_stray'
          out[#out + 1] = f1
          out[#out + 1] = f2
          if repair then
            redis.call('ZREM', sk[1], f1)
            reconcile(fp_key, sk[1], slice(sk, 2, #sk), f2, {}, repair, {})
          end
        elseif tonumber(score) ~= 0 then
          out[#out + 1] = 'twin_score'
          out[#out + 1] = f1
          out[#out + 1] = f2
          if repair then redis.call('ZADD', sk[1], 0, f1) end
        end
      end
    elseif code == 's' then
      local first = redis.call('ZRANGE', sk[1], 0, 0)[1]
      if first then reconcile(fp_key, sk[1], slice(sk, 2, #sk), f1, {first}, repair, out) end
    elseif code == 'x' then
      if redis.call('EXISTS', sk[1]) == 1 then
        out[#out + 1] = 'bad_twin_key'
        out[#out + 1] = sk[1]
        out[#out + 1] = ''
        if repair then redis.call('DEL', sk[1]) end
      end
    elseif code == 'e' then
      if redis.call('ZSCORE', expiry_key, f1) and redis.call('HEXISTS', fp_key, f1) == 0 then
        out[#out + 1] = 'expiry_orphan'
        out[#out + 1] = f1
        out[#out + 1] = ''
        if repair then redis.call('ZREM', expiry_key, f1) end
      end
    end
    for j = 1, #out, 3 do
      reply[#reply + 1] = (a - 3) / 5 + 1
      reply[#reply + 1] = out[j]
      reply[#reply + 1] = out[j + 1]
      reply[#reply + 1] = out[j + 2]
    end
  end
  return reply
end

-- The members of a page of posting sets that do not belong there, judged in one read-only step (the walk of
-- `incident-worker verify`; the verdicts are leads, confirmed subject by subject by verify_check).
--
-- keys[1] = {N}:fp   keys[2 ..] = posting keys
-- args[1] = most members of a set read here (a larger set is left to the caller's SSCAN)
-- args[1 + i] = for keys[1 + i]: 'a:<first>:<last>', the hex digits of the fingerprint that spell this band's value
--               when the layout's bands are whole hex digits; 'f' for a key the layout does not have (every member
--               is returned); 'l' for a band the caller compares itself (every member is returned with its value)
--
-- Returns a flat list: key number (1 = keys[2]), member, its stored value ('' = none), ...; a key number with
-- member '' and value '-1' for a set larger than args[1].
local function verify_postings(keys, args)
  local fp_key, most = keys[1], tonumber(args[1])
  local reply = {}
  for i = 2, #keys do
    local spec = args[i]
    local size = redis.call('SCARD', keys[i])
    if size > most then
      reply[#reply + 1] = i - 1
      reply[#reply + 1] = ''
      reply[#reply + 1] = '-1'
    elseif size > 0 then
      local members = redis.call('SMEMBERS', keys[i])
      local stored = redis.call('HMGET', fp_key, unpack(members))
      local first, last, value = nil, nil, nil
      if string.sub(spec, 1, 1) == 'a' then
        local _, _, a, b = string.find(spec, '^a:(%d+):(%d+)$')
        first, last = tonumber(a), tonumber(b)
        value = string.match(keys[i], ':([^:]*)$')
      end
      for j = 1, #members do
        local h = stored[j]
        local keep = true
        if first and h and #h == 16 and string.lower(string.sub(h, first, last)) == value then keep = false end
        if keep then
          reply[#reply + 1] = i - 1
          reply[#reply + 1] = members[j]
          reply[#reply + 1] = h or ''
        end
      end
    end
  end
  return reply
end

local function verify_check(keys, args) return verify(keys, args, false) end
local function verify_repair(keys, args) return verify(keys, args, true) end
-- Moving a live index to another layout (docs/contract.md, "Moving to another layout"; worker/migrate.py drives it).
-- {N}:migration holds the move's state: building (the target's postings are built from {N}:fp in bounded batches
-- while every apply call writes both layouts), built (the pass over {N}:fp is done), cleaning (switched: the source's
-- postings are being removed) or aborting (the target's are). Each step below is atomic and checks the state and the
-- cursor its caller started from, so a migrator that crashed resumes from the stored cursor, and a second migrator
-- running at the same time is refused instead of racing the first.

local function migration_refused(migration_key, why)
  return redis.error_reply('MIGRATION ' .. migration_key .. ': ' .. why)
end

-- Start a move, or report the one under way.
--
-- keys[1] = {N}:meta   keys[2] = {N}:migration   keys[3] = {N}:fp
-- args[1] = the source layout tag (must be {N}:meta's `layout`)   args[2] = the target layout tag
-- args[3 ..] = the migration's other field, value pairs (generation, prefixes, the target's meta fields, ...)
--
-- Returns the migration hash as field, value pairs: the one already under way, if any (the caller resumes it only
-- when its target is the same).
local function migrate_start(keys, args)
  local existing = redis.call('HGETALL', keys[2])
  if #existing > 0 then return existing end
  local refused = check_layout(keys[1], args[1])
  if refused then return refused end
  if redis.call('HEXISTS', keys[1], 'building') == 1 then
    return migration_refused(keys[2], 'missing while ' .. keys[1] .. ' says a layout is being built; run migrate --abort')
  end
  redis.call('HSET', keys[2], 'state', 'building', 'source', args[1], 'target', args[2], 'cursor', '0',
             'run', server_run(), 'visited', 0, 'written', 0, 'removed', 0, 'total', redis.call('HLEN', keys[3]),
             'started_at', now_ms(), unpack(slice(args, 3, #args)))
  -- from here on every apply call writes the target too (check_building)
  redis.call('HSET', keys[1], 'building', args[2])
  return redis.call('HGETALL', keys[2])
end

-- One batch of the build: each incident whose fingerprint is still the one the caller read, and which is its
-- fingerprint's representative in the source layout (in its band-0 posting set), is added to its target postings.
-- An incident changed since the caller read it was written to both layouts by that change.
--
-- keys[1] = {N}:meta   keys[2] = {N}:migration   keys[3] = {N}:fp
-- keys[4 ..] = per incident, 1 + n keys: its source band-0 posting key, then its n target posting keys
-- args[1] = target layout tag   args[2] = n   args[3] = the cursor this batch starts from (must be the stored one)
-- args[4] = the cursor after it ('0': the pass over {N}:fp is complete)   args[5 ..] = per incident: ID, fingerprint
--
-- Returns {written, visited}.
local function migrate_build(keys, args)
  local m = redis.call('HMGET', keys[2], 'state', 'target', 'cursor')
  if m[1] ~= 'building' or m[2] ~= args[1] then
    return migration_refused(keys[2], 'not building "' .. args[1] .. '" (state ' .. tostring(m[1]) .. ')')
  end
  if m[3] ~= args[3] then
    return migration_refused(keys[2], 'its cursor moved on to ' .. m[3] .. ': another migrator is running')
  end
  local n = tonumber(args[2])
  local written, visited, k = 0, 0, 4
  for i = 5, #args, 2 do
    local id, hex = args[i], args[i + 1]
    visited = visited + 1
    if redis.call('HGET', keys[3], id) == hex and redis.call('SISMEMBER', keys[k], id) == 1 then
      for j = 1, n do redis.call('SADD', keys[k + j], id) end
      written = written + 1
    end
    k = k + 1 + n
  end
  -- (HMGET and HSET, not HINCRBY: the worker's least-privilege user may run this too, deploy/redis/users.acl)
  local counts = redis.call('HMGET', keys[2], 'visited', 'written', 'run')
  -- the pass is only complete when one run of the server gave all of its cursors (see server_run); otherwise it starts
  -- again from 0 (what this batch wrote stays right: each incident was checked above)
  local next_cursor = counts[3] == server_run() and args[4] or '0'
  redis.call('HSET', keys[2], 'cursor', next_cursor, 'run', server_run(),
             'visited', (tonumber(counts[1]) or 0) + visited, 'written', (tonumber(counts[2]) or 0) + written)
  if next_cursor == '0' and counts[3] == server_run() then
    redis.call('HSET', keys[2], 'state', 'built', 'built_at', now_ms())
  end
  return {written, visited}
end

-- The switch: {N}:meta takes the target layout in one step; from then on every call of the source layout is refused
-- (LAYOUT) and its worker takes the new layout from the meta. The source's postings are left for migrate_remove.
--
-- keys[1] = {N}:meta   keys[2] = {N}:migration
-- args[1] = target layout tag   args[2 ..] = {N}:meta field, value pairs of the target (bands, generation, ...)
--
-- Returns 'switched', or 'already' when an earlier call switched.
local function migrate_switch(keys, args)
  local m = redis.call('HMGET', keys[2], 'state', 'target', 'source', 'source_prefix')
  if m[2] ~= args[1] then return migration_refused(keys[2], 'not moving to "' .. args[1] .. '"') end
  if m[1] == 'cleaning' then return 'already' end
  if m[1] ~= 'built' then
    return migration_refused(keys[2], 'the target is not built yet (state ' .. tostring(m[1]) .. ')')
  end
  local refused = check_layout(keys[1], m[3])
  if refused then return refused end
  -- {N}:meta deleted mid-move (and re-created by a worker) or edited: calls made since wrote the source layout only,
  -- and their incidents are missing from the target. Refused: the move must be made again.
  if redis.call('HGET', keys[1], 'building') ~= args[1] then
    return migration_refused(keys[2], keys[1] .. ' no longer names this move\'s target in `building` (deleted or ' ..
      'edited during the move): incidents indexed since are missing from the target. Run `incident-worker ' ..
      'migrate --abort`, then start the move again')
  end
  local previous = redis.call('HGET', keys[1], 'previous_layouts')
  redis.call('HSET', keys[1], 'layout', args[1], 'previous_layouts', m[3] .. (previous and (' ' .. previous) or ''),
             unpack(slice(args, 2, #args)))
  redis.call('HDEL', keys[1], 'building')
  redis.call('HSET', keys[2], 'state', 'cleaning', 'cursor', '0', 'run', server_run(), 'removing', m[4],
             'switched_at', now_ms())
  return 'switched'
end

-- Abort a move before its switch: {N}:meta stops naming the target (so no call writes it any more), and the target's
-- postings are left for migrate_remove.
--
-- keys[1] = {N}:meta   keys[2] = {N}:migration
--
-- Returns the state after the call: 'aborting', or '' when no move is under way.
local function migrate_abort(keys, args)
  local m = redis.call('HMGET', keys[2], 'state', 'target_prefix')
  if not m[1] then return '' end
  if m[1] == 'cleaning' then
    return migration_refused(keys[2], 'the index already switched to the new layout; it can no longer be aborted ' ..
      '(run migrate again to finish removing the old postings)')
  end
  if m[1] ~= 'aborting' then
    redis.call('HDEL', keys[1], 'building')
    redis.call('HSET', keys[2], 'state', 'aborting', 'cursor', '0', 'run', server_run(), 'removing', m[2],
               'aborted_at', now_ms())
  end
  return 'aborting'
end

-- One batch of removing the postings of the layout that is no longer used (the source after the switch, the target
-- after an abort). Only keys that start with the migration's `removing` prefix followed by a band number are
-- removed; any other key passed is left alone. The batch that ends the pass removes {N}:migration and records the
-- move in {N}:meta's `last_migration`.
--
-- keys[1] = {N}:meta   keys[2] = {N}:migration   keys[3 ..] = posting keys to remove
-- args[1] = state (cleaning | aborting)   args[2] = the cursor this batch starts from (must be the stored one)
-- args[3] = the cursor after it ('0': the pass is complete)
--
-- Returns {removed, done (0/1)}.
local function migrate_remove(keys, args)
  local m = redis.call('HMGET', keys[2], 'state', 'cursor', 'removing', 'source', 'target')
  if m[1] ~= args[1] then
    return migration_refused(keys[2], 'not ' .. args[1] .. ' (state ' .. tostring(m[1]) .. ')')
  end
  if m[2] ~= args[2] then
    return migration_refused(keys[2], 'its cursor moved on to ' .. m[2] .. ': another migrator is running')
  end
  local prefix, removed = m[3], 0
  for i = 3, #keys do
    local key = keys[i]
    if string.sub(key, 1, #prefix) == prefix and string.find(key, '^%d', #prefix + 1) then
      removed = removed + redis.call('UNLINK', key)
    end
  end
  -- a pass of SCAN cursors from another run of the server skipped keys (see server_run): it starts again from 0
  local same_run = redis.call('HGET', keys[2], 'run') == server_run()
  if args[3] ~= '0' or not same_run then
    local before = tonumber(redis.call('HGET', keys[2], 'removed')) or 0
    redis.call('HSET', keys[2], 'cursor', same_run and args[3] or '0', 'run', server_run(), 'removed', before + removed)
    return {removed, 0}
  end
  local done = m[1] == 'cleaning' and 'moved from ' or 'aborted, stayed at '
  redis.call('HSET', keys[1], 'last_migration', done .. m[4] .. (m[1] == 'cleaning' and ' to ' or ' instead of ') ..
             m[5] .. ' at ' .. now_ms())
  redis.call('DEL', keys[2])
  return {removed, 1}
end

redis.register_function('incident_index_v2_apply', apply)
redis.register_function('incident_index_v2_apply_batch', apply_batch)
-- allow-oom: the upkeep frees memory (trimming, expiry; the lease and the meta it takes first are a few bytes), and
-- it must run while Redis is full (maxmemory with noeviction), or a full Redis stays full until someone steps in
redis.register_function{function_name = 'incident_index_v2_trim_events', callback = trim_events, flags = {'allow-oom'}}
redis.register_function{function_name = 'incident_index_v2_trim_changes', callback = trim_changes,
                        flags = {'allow-oom'}}
redis.register_function{function_name = 'incident_index_v2_lease', callback = lease, flags = {'allow-oom'}}
redis.register_function('incident_index_v2_set_retention', set_retention)
redis.register_function('incident_index_v2_expiry_backfill', expiry_backfill)
redis.register_function{function_name = 'incident_index_v2_expire', callback = expire, flags = {'allow-oom'}}
redis.register_function{function_name = 'incident_index_v2_matches', callback = matches, flags = {'no-writes'}}
redis.register_function('incident_index_v2_dead_letter', dead_letter)
-- (allow-oom: it writes a few fields, once; a worker restarted while Redis is full must get to its upkeep)
redis.register_function{function_name = 'incident_index_v2_ensure_meta', callback = ensure_meta,
                        flags = {'allow-oom'}}
redis.register_function{function_name = 'incident_index_v2_preflight', callback = preflight, flags = {'no-writes'}}
-- (allow-oom: removing a consumer frees memory; refused while Redis is full, it stopped the worker before its upkeep)
redis.register_function{function_name = 'incident_index_v2_forget_consumer', callback = forget_consumer,
                        flags = {'allow-oom'}}
-- allow-oom: reading and claiming allocate next to nothing, and a worker must keep reading while Redis is full
-- (it then holds what it read until writes work again)
redis.register_function{function_name = 'incident_index_v2_read_new', callback = read_new, flags = {'allow-oom'}}
redis.register_function{function_name = 'incident_index_v2_read_pending', callback = read_pending,
                        flags = {'allow-oom'}}
redis.register_function{function_name = 'incident_index_v2_claim', callback = claim, flags = {'allow-oom'}}
-- verify: checks read only; repairs write, and must run while Redis is short of memory no more than any write
redis.register_function{function_name = 'incident_index_v2_verify_check', callback = verify_check,
                        flags = {'no-writes'}}
redis.register_function('incident_index_v2_verify_repair', verify_repair)
redis.register_function{function_name = 'incident_index_v2_verify_postings', callback = verify_postings,
                        flags = {'no-writes'}}
-- Which run of the server this is (server_run): verify compares it before and after its walk, whose SCAN cursors
-- are only good in one server process. keys[1] = {N}:meta (unused: it routes the call to the index's node)
redis.register_function{function_name = 'incident_index_v2_server_run', callback = function() return server_run() end,
                        flags = {'no-writes'}}
redis.register_function('incident_index_v2_migrate_start', migrate_start)
redis.register_function('incident_index_v2_migrate_build', migrate_build)
redis.register_function('incident_index_v2_migrate_switch', migrate_switch)
redis.register_function('incident_index_v2_migrate_abort', migrate_abort)
redis.register_function('incident_index_v2_migrate_remove', migrate_remove)
