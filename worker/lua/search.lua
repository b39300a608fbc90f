-- search.lua: the core of the index: the distance of two fingerprints, the search through the posting sets
-- (find_matches, listing its closest by listing.lua's order), and how an incident enters and leaves its postings and
-- twin group. Registers `matches`, the read-only search.

--- @include "base"
--- @include "meta"
--- @include "listing"

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

-- find_matches's rows: DIGIT_DISTANCE's, where an upper-case digit (A-F: a fingerprint edited by hand; the worker
-- writes lower case) adds UPPER_MARK to its bits. A sum is then whole exactly when the stored fingerprint is lower
-- case, whose twin group's key is the prefix and the value as read: a match needs no string.lower (a string made)
-- unless its sum has a fraction. 16 marks add at most 1/4, so a sum is within a limit exactly when it is below the
-- limit + 1/2, and its whole part is the distance.
local UPPER_MARK = 1 / 64
local SEARCH_DISTANCE = {}
for q = 0, 15 do
  local row = {}
  for c = 0, 255 do row[c] = DIGIT_DISTANCE[q][c] end
  for c = 65, 70 do row[c] = row[c] + UPPER_MARK end
  SEARCH_DISTANCE[q] = row
end

local function search_rows(query)
  local q = {string.byte(query, 1, 16)}
  local rows = {}
  for i = 1, 16 do rows[i] = SEARCH_DISTANCE[NIBBLE[q[i]]] end
  return unpack(rows)
end

-- The candidates of a search bounded by `budget`, or nil when the posting sets `probe_keys` hold no more members
-- than that in all (the caller then reads their union as usual). Their sizes are read first (SCARD, O(1) each),
-- so that a flood of incidents crafted to share one band value costs this search `budget` members, never the set
-- (SMEMBERS or SUNION of a set of 200,000 would cost the primary's thread far more than the budget alone).
--
-- A set no larger than the budget is read whole, a larger one sampled (SRANDMEMBER: what is left of the budget in
-- distinct members, O(what it returns)), and the reading stops at the budget's distinct IDs. So a search is cut
-- exactly when its sets hold more than the budget of distinct incidents (a set larger than the budget is such a
-- case), and the members read are at most one per band for each ID kept (an incident near the query sits in up to
-- one probe set per band). Returns at most `budget` distinct IDs and whether the search was cut.
local function bounded_candidates(probe_keys, budget)
  local sizes, total = {}, 0
  for i = 1, #probe_keys do
    local size = redis.call('SCARD', probe_keys[i])
    sizes[i] = size
    total = total + size
  end
  if total <= budget then return nil, false end
  local seen, list, n, cut = {}, {}, 0, false
  for i = 1, #probe_keys do
    local size = sizes[i]
    local members
    if size > budget then
      -- more distinct incidents than the budget in this set alone: the search is cut, whatever the others hold
      cut = true
      if n < budget then members = redis.call('SRANDMEMBER', probe_keys[i], budget - n) end
    elseif size > 0 then
      members = redis.call('SMEMBERS', probe_keys[i])
    end
    if members then
      for j = 1, #members do
        local id = members[j]
        if not seen[id] then
          if n == budget then
            cut = true
            break
          end
          seen[id] = true
          n = n + 1
          list[n] = id
        end
      end
    end
    if cut and n == budget then break end
  end
  return list, cut
end

-- Every indexed incident within `limit` of `query`, found through the posting sets `probe_keys` (a list of key
-- names). Postings hold one representative per distinct fingerprint; the other incidents with that exact
-- fingerprint (its twins) sit with it in a group, the sorted set `twin_prefix .. <fingerprint>` (all scores 0, so
-- ZRANGE lists it in byte order), which exists only while two or more incidents share the fingerprint. Only
-- representatives are verified: a storm of twins costs one candidate, one ZCARD and one ZRANGE of at most `cap`.
--
-- `budget` (> 0) bounds the representatives verified (docs/contract.md, "The per-event budget"): past it the search
-- is cut (bounded_candidates), and what it returns is then a part of the answer, flagged.
--
-- Returns the number of candidates verified, the number of matches (every twin counted), the matches sorted by
-- (distance, ID), at most `cap` of them when cap > 0, as a flat list id, d, id, d..., the representative of
-- `query` itself (the candidate at distance 0) or nil when the fingerprint is not indexed, and whether the search
-- was cut. A cut search's matches are real matches, its count a lower bound, and its representative may be nil
-- though the fingerprint is indexed (the caller asks representative_of).
local function find_matches(fp_key, twin_prefix, probe_keys, query, limit, cap, budget, bound)
  local candidates, cut = nil, false
  -- (`bound`, {N}:meta's posting_bound when the index has one: sets that cannot hold more than the budget in all
  -- need not be measured, see meta.lua)
  if budget and budget > 0 and not (bound and bound * #probe_keys <= budget) then
    candidates, cut = bounded_candidates(probe_keys, budget)
  end
  if candidates then
    -- (already read)
  elseif #probe_keys == 1 then
    candidates = redis.call('SMEMBERS', probe_keys[1])
  else
    candidates = redis.call('SUNION', unpack(probe_keys))
  end
  local n = #candidates
  if n == 0 then return 0, 0, {}, nil, cut end

  local byte, lower = string.byte, string.lower
  local T1, T2, T3, T4, T5, T6, T7, T8, T9, T10, T11, T12, T13, T14, T15, T16 = search_rows(query)
  local within = limit + 0.5  -- a sum below it is within the limit (see SEARCH_DISTANCE)

  -- the representatives at distance d: ids_at[d + 1][i], with groups_at[d + 1][i] the key of its twin group or
  -- false (none), n_at[d + 1] of them (lists side by side: no table made a match)
  local ids_at, groups_at, n_at = {}, {}, {}
  for d = 0, limit do ids_at[d + 1], groups_at[d + 1], n_at[d + 1] = {}, {}, 0 end
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
        if d < within then
          local c9, c10, c11, c12, c13, c14, c15, c16 = byte(h, 9, 16)
          d = d + T9[c9] + T10[c10] + T11[c11] + T12[c12] + T13[c13] + T14[c14] + T15[c15] + T16[c16]
          if d < within then
            local id = candidates[first + k - 1]
            local group
            if d % 1 == 0 then
              group = twin_prefix .. h
            else
              d = d - d % 1
              group = twin_prefix .. lower(h)
            end
            if d == 0 and not twin then twin = id end
            local size = redis.call('ZCARD', group)
            local slot = d + 1
            local i = n_at[slot] + 1
            n_at[slot] = i
            ids_at[slot][i] = id
            if size > 1 then
              groups_at[slot][i] = group
              matched = matched + size
            else
              groups_at[slot][i] = false
              matched = matched + 1
            end
          end
        end
      end
    end
  end

  local flat = {}
  if matched == 0 then return verified, 0, flat, twin, cut end
  local order = id_order()
  local less = order or plain_less
  local want = matched
  if cap > 0 and cap < want then want = cap end
  local taken = 0
  for d = 0, limit do
    if taken == want then break end
    local count = n_at[d + 1]
    if count > 0 then
      local need = want - taken
      local ids, groups = ids_at[d + 1], groups_at[d + 1]
      if count == 1 and groups[1] then
        ids = redis.call('ZRANGE', groups[1], 0, need - 1)  -- already in byte order
      else
        ids = first_of_distance(ids, groups, count, need, less, order)
      end
      for i = 1, #ids do
        if taken == want then break end
        taken = taken + 1
        flat[2 * taken - 1] = ids[i]
        flat[2 * taken] = d
      end
    end
  end
  return verified, matched, flat, twin, cut
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

-- A match count as a reply gives it: the number, or '<n>+' when the search that made it was cut (n matches found,
-- more may exist); library.parse_count reads both.
local function budget_count(matched, cut)
  if cut then return matched .. '+' end
  return matched
end

-- Every indexed incident within a distance of a fingerprint, without indexing anything.
--
-- keys[1] = {N}:meta   keys[2] = {N}:fp   keys[3] = {N}:twins:<the fingerprint>   keys[4 .. #keys] = the probe keys
-- args[1] = fingerprint (hex)   args[2] = max distance   args[3] = layout tag
-- args[4] = most matches to list (0 or absent = all)   args[5] = most candidates to verify (0 or absent = all)
--
-- Returns {match_count, candidates_verified, id1, d1, id2, d2, ...}, sorted, capped as asked; match_count is
-- '<n>+' when the search was cut at the budget (n, a lower bound; see budget_count).
local function matches(keys, args)
  local refused = check_layout(keys[1], args[3])
  if refused then return refused end
  local budget = tonumber(args[5]) or 0
  local bound = budget > 0 and tonumber(redis.call('HGET', keys[1], 'posting_bound')) or nil
  local verified, matched, flat, _, cut = find_matches(keys[2], string.sub(keys[3], 1, -17), slice(keys, 4, #keys),
                                                       args[1], tonumber(args[2]), tonumber(args[4]) or 0, budget,
                                                       bound)
  local reply = {budget_count(matched, cut), verified}
  for i = 1, #flat do reply[2 + i] = flat[i] end
  return reply
end

register('matches', matches, {'no-writes'})
