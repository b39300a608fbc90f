-- window.lua: the snapshot validation's window filed by byte bands: each change after a copy's position noted by
-- the 8 bytes of its fingerprints, so that a claim is checked against the few changes that could be within 7 bits
-- of its query, not against every change (snapshot.lua).

--- @include "base"

-- `bands` indexes every fingerprint noted (each `prev` that became a first_prev, each `fp`) by its 8 bytes: bands[k]
-- maps digits 2k - 1 and 2k (lower-cased, as two bytes: c * 256 + c') to the incident, or to a list of them. Two
-- fingerprints within 7 bits agree exactly on one of 8 disjoint 8-bit bands (otherwise each band differs in a bit at
-- least: 8 bits), so the incidents a query can be within 7 of, or equal to, are among those its own 8 bands name
-- (near_ids): validate_snapshot reads those instead of every change (about 1 in 32 of them, whatever the window).
-- An apply_batch files the changes by its calls' own queries instead (note_near, below), the same argument read the
-- other way round: a change is kept for each query it shares a band with.
local function band_add(band, key, id)
  local v = band[key]
  if v == nil then
    band[key] = id
  elseif v ~= id then
    if type(v) == 'table' then v[#v + 1] = id else band[key] = {v, id} end
  end
end

local function note_bands(bands, id, h)
  if #h ~= 16 then return end  -- '' (deleted, or none): within no distance, equal to no query
  local c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15, c16 = string.byte(string.lower(h), 1, 16)
  local b1, b2, b3, b4, b5, b6, b7, b8 = bands[1], bands[2], bands[3], bands[4], bands[5], bands[6], bands[7], bands[8]
  local k
  k = c1 * 256 + c2; if b1[k] == nil then b1[k] = id else band_add(b1, k, id) end
  k = c3 * 256 + c4; if b2[k] == nil then b2[k] = id else band_add(b2, k, id) end
  k = c5 * 256 + c6; if b3[k] == nil then b3[k] = id else band_add(b3, k, id) end
  k = c7 * 256 + c8; if b4[k] == nil then b4[k] = id else band_add(b4, k, id) end
  k = c9 * 256 + c10; if b5[k] == nil then b5[k] = id else band_add(b5, k, id) end
  k = c11 * 256 + c12; if b6[k] == nil then b6[k] = id else band_add(b6, k, id) end
  k = c13 * 256 + c14; if b7[k] == nil then b7[k] = id else band_add(b7, k, id) end
  k = c15 * 256 + c16; if b8[k] == nil then b8[k] = id else band_add(b8, k, id) end
end

-- The send's own queries instead (apply_batch registers them first: register_queries): `qbands[k]` maps each of
-- their band values to the list of queries that have it, and each change is looked up there instead of being filed:
-- `near[query]` lists the incidents that share a band with `query` (an incident once, or again when a change of
-- another came between two of its own: near_of then lists each once). A change looked up in 8 small tables costs
-- about half of one filed in 8 growing ones (benchmarks/journal/pipeline.md, "The fleet by part"), and a send's
-- window is read once a send: the part of the primary's cost an event that grows with the workers.
local function register_queries(context, queries)
  local qbands, registered = {{}, {}, {}, {}, {}, {}, {}, {}}, {}
  for i = 1, #queries do
    local q = queries[i]
    if type(q) == 'string' and #q == 16 and not string.find(q, '[^0-9a-f]') and not registered[q] then
      registered[q] = true
      local c = {string.byte(q, 1, 16)}
      for k = 1, 8 do
        local band, key = qbands[k], c[2 * k - 1] * 256 + c[2 * k]
        local v = band[key]
        if v == nil then band[key] = {q} else v[#v + 1] = q end
      end
    end
  end
  context.qbands, context.registered = qbands, registered
end

-- Each query sharing a band with the change of incident `id` (v: the queries of a band value) gets `id` once,
-- however many of its bands it shares: `marks[query]` is the last incident noted for it. In a near storm the send's
-- queries and its window's changes share most of their bands, and an incident noted once a shared band had made
-- each query's list eight times as long, and near_of's reading of it as slow.
local function near_hit(near, marks, v, id)
  for i = 1, #v do
    local q = v[i]
    if marks[q] ~= id then
      marks[q] = id
      local list = near[q]
      if list == nil then near[q] = {id} else list[#list + 1] = id end
    end
  end
end

local function note_near(view, id, h)
  if #h ~= 16 then return end
  local c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15, c16 = string.byte(string.lower(h), 1, 16)
  local qb, near, marks = view.qbands, view.near, view.marks
  local v
  v = qb[1][c1 * 256 + c2]; if v ~= nil then near_hit(near, marks, v, id) end
  v = qb[2][c3 * 256 + c4]; if v ~= nil then near_hit(near, marks, v, id) end
  v = qb[3][c5 * 256 + c6]; if v ~= nil then near_hit(near, marks, v, id) end
  v = qb[4][c7 * 256 + c8]; if v ~= nil then near_hit(near, marks, v, id) end
  v = qb[5][c9 * 256 + c10]; if v ~= nil then near_hit(near, marks, v, id) end
  v = qb[6][c11 * 256 + c12]; if v ~= nil then near_hit(near, marks, v, id) end
  v = qb[7][c13 * 256 + c14]; if v ~= nil then near_hit(near, marks, v, id) end
  v = qb[8][c15 * 256 + c16]; if v ~= nil then near_hit(near, marks, v, id) end
end

local function note_change(view, id, fp, prev)
  view.count = view.count + 1
  local near = view.qbands ~= nil
  if view.first_prev[id] == nil then
    view.first_prev[id] = prev
    view.order[#view.order + 1] = id
    if prev ~= '' then  -- (an incident the copy held: its claims may list it; claim_json.lua's json_lists)
      local known = view.known or {}
      known[#known + 1] = id
      view.known = known
    end
    if near then note_near(view, id, prev) else note_bands(view.bands, id, prev) end
  else
    view.again = true  -- (an incident noted again, after others maybe: near_of's lists may hold it twice)
  end
  view.latest[id] = fp
  if near then note_near(view, id, fp) else note_bands(view.bands, id, fp) end
end

-- The incidents of near[query] (see note_near), each once: a list and its length.
local function near_of(view, query)
  local list = view.near[query]
  if list == nil then return nil, 0 end
  if not view.again then return list, #list end  -- (each incident noted once: in a list once, see near_hit)
  local ids, n, seen = {}, 0, {}
  for i = 1, #list do
    local id = list[i]
    if not seen[id] then
      seen[id] = true
      n = n + 1
      ids[n] = id
    end
  end
  return ids, n
end

-- The incidents of `bands` (see note_bands) that share one of its 8 bands with `query` (16 lowercase hex digits),
-- each once: a list and its length.
local function near_ids(bands, query)
  local q = {string.byte(query, 1, 16)}
  local ids, n, seen = nil, 0, nil
  for k = 1, 8 do
    local v = bands[k][q[2 * k - 1] * 256 + q[2 * k]]
    if v ~= nil then
      if not seen then ids, seen = {}, {} end
      if type(v) == 'table' then
        for i = 1, #v do
          local id = v[i]
          if not seen[id] then
            seen[id] = true
            n = n + 1
            ids[n] = id
          end
        end
      elseif not seen[v] then
        seen[v] = true
        n = n + 1
        ids[n] = v
      end
    end
  end
  return ids, n
end
