-- snapshot.lua: the snapshot read path's validation (docs/contract.md, "Snapshot reads"): the change log after a
-- copy's position, read once per FCALL, and the check of what a search of the copy found against it.

--- @include "base"
--- @include "meta"
--- @include "search"
--- @include "apply_context"
--- @include "window"
--- @include "claim_json"

-- A snapshot whose position is more changes behind than this is not validated: the full search is cheaper.
local MAX_VALIDATED_CHANGES = 4000

-- The changes after a snapshot's position, summed up per incident: `first_prev[id]`, its fingerprint before its
-- first change after the position (what the copy saw), `latest[id]`, its fingerprint now ('' when deleted), `order`,
-- the incidents in the order of their first change, and `count`, the changes. One view serves every call of a batch
-- (apply_batch): the log is read once, and each call's own change is noted in it as it is written, so a later call
-- of the batch is validated against the earlier ones too, without reading the log again. `bands` files them by byte
-- (window.lua).

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
      if context.qbands then
        view.qbands, view.registered, view.near, view.marks = context.qbands, context.registered, {}, {}
      else
        view.bands = {{}, {}, {}, {}, {}, {}, {}, {}}
      end
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
  local first_d = nil  -- the closest listed match's distance
  if n >= 2 then
    first_d = distance_number(listed[lo + 2])
  elseif n == 1 then  -- (a listing of JSON: claim_json.lua)
    local c = json_claim(listed[lo + 1])
    if c and c.n > 0 then first_d = select(2, json_entry(c, 1)) end
  end
  if count ~= 0 and not (first_d and first_d > 0) then return false end
  return not held
end

-- The incident that holds `fp` now, as the snapshot path knows it without reading the postings, when the claim
-- said who held it at the copy's position (`holder`: an incident other than `self_id`, or false for nobody):
-- `changed_holder` if an incident changed after the position holds it by its latest change (validate_snapshot),
-- else the claimed holder if it has no change after the position, either only if {N}:fp holds `fp` for it (one
-- field read: a value edited by hand into upper case is no holder for representative_of either); else false when
-- nobody held it at the position (surely_unheld's argument, which the copy's exact look-up of `fp` makes for every
-- claim, a cut one too); else nil: the caller reads the postings (representative_of).
--
-- Any holder serves: index_one adds the new incident to the group of `fp` beside it, and a fingerprint held by one
-- incident has it in its postings. In a near storm each event's claim is cut at the budget and many are exact
-- twins, so it was representative_of's SINTER of large posting sets, about half of the primary's time an event.
local function claimed_twin(context, fp_key, self_id, fp, holder, changed_holder)
  if changed_holder then
    return stored_fp(context, fp_key, changed_holder) == fp and changed_holder or nil
  end
  if not holder then return false end
  if holder ~= self_id and context.view and context.view.first_prev[holder] == nil and
      stored_fp(context, fp_key, holder) == fp then
    return holder
  end
  return nil
end

-- Append one change to {N}:changes, and note it in the view of this FCALL's calls (when they have one).
local function log_change(context, changes_key, op, id, fp, prev)
  redis.call('XADD', changes_key, '*', op, id, 'fp', fp, 'prev', prev)
  if context.view and context.key == changes_key then note_change(context.view, id, fp, prev) end
end

-- validate_snapshot's answer when the listed matches no change touched are in order (their places in `listed`:
-- kept[1 .. n_kept]): the same as sorting them with the additions (each {d, id}), but only the additions are sorted
-- (the changes near the query, a few), then merged with the listed ones read in place, up to the cap. A storm's claim
-- lists its cap of matches, and a table and a sort of them all cost each of its events about what the rest of the
-- validation did. Returns count, flat, held (see validate_snapshot), or nil when the claim cannot be validated.
local function merge_claim(count, listed, lo, n_listed, kept, n_kept, additions, n_additions, less, cap,
                           complete, cut, held)
  local bound_d, bound_id
  if not cut and not complete then
    if n_listed == 0 then return nil end
    bound_d, bound_id = distance_number(listed[lo + n_listed]), listed[lo + n_listed - 1]
  end
  local adds, n_adds, want
  adds, n_adds, want, count = claim_takes(additions, n_additions, not cut and not complete, bound_d, bound_id, less,
                                          count, n_kept, cap, cut)
  if not adds then return nil end
  if cut then held = true end
  if n_adds == 0 and 2 * n_kept == n_listed and want <= 2000 then
    -- nothing added, nothing dropped: the claim's own head, copied as it came in one step (distances as the digits
    -- sent; the alert's JSON and the reply read them as numbers; unpack's stack holds a few thousand values).
    return count, {unpack(listed, lo + 1, lo + 2 * want)}, held
  end
  if 2 * n_kept == n_listed and want <= 2000 then
    -- nothing dropped, a few added (near half of a near storm's claims: the window's changes are storm events too,
    -- some among the closest): the claim's head copied in one step, each addition found its place by a binary
    -- search of the listed ones (the k-th listed is at 2k - 1) and put there by table.insert, which moves what
    -- follows in C, then what passed the cap cut off. A comparison and a call for each match listed had cost such
    -- a claim about what its alert's JSON did (benchmarks/journal/near-storms.md, section 15).
    local flat = {unpack(listed, lo + 1, lo + 2 * (n_kept < want and n_kept or want))}
    local from, floor = 1, math.floor
    for a = 1, n_adds do
      local pair = adds[a]
      local low, high = from, n_kept + 1  -- the first listed one it comes before (n_kept + 1: none)
      while low < high do
        local mid = floor((low + high) / 2)
        if pair_before(less, pair[1], pair[2], distance_number(listed[lo + 2 * mid]), listed[lo + 2 * mid - 1]) then
          high = mid
        else
          low = mid + 1
        end
      end
      if low + a - 2 >= want then break end  -- (past the cap, as every later one is)
      local at = 2 * (low + a - 2) + 1
      table.insert(flat, at, pair[2])
      table.insert(flat, at + 1, pair[1])
      from = low
    end
    for i = #flat, 2 * want + 1, -1 do flat[i] = nil end
    return count, flat, held
  end
  local flat = {}
  local a, k = 1, 1
  for out = 1, want do
    local pair = adds[a]
    local i = kept[k]
    if pair and (not i or pair_before(less, pair[1], pair[2], distance_number(listed[lo + i + 1]), listed[lo + i])) then
      flat[2 * out - 1], flat[2 * out] = pair[2], pair[1]
      a = a + 1
    else
      flat[2 * out - 1], flat[2 * out] = listed[lo + i], distance_number(listed[lo + i + 1])
      k = k + 1
    end
  end
  return count, flat, held
end

-- Snapshot reads (docs/contract.md, "Snapshot reads"). A worker searched its own copy of the index as it stood at
-- `position` in {N}:changes and counted `count` matches other than `self_id`, the closest listed in `listed`
-- (flat id, d, ... sorted by distance then ID; all of them when `complete`), here args[lo + 1 .. lo + n_listed] of
-- the call's arguments (read in place, not copied). Every change after that position is re-checked against the new
-- fingerprint: an incident the copy counted (its fingerprint before its first later change was within `limit`) and
-- one that counts now (its latest fingerprint is) adjust the count and the list.
--
-- `cut`: the copy's search stopped at the per-event budget (docs/contract.md, "The per-event budget"), so what it
-- counted and listed are some of its matches, not the closest: the listed ones no change touched and every change
-- now within `limit` are listed (real matches), the count stays a lower bound (never below what is listed), and
-- `held` is true ("maybe": the copy may have missed an incident holding `query`, so the caller reads the postings).
--
-- Returns changes_checked, matched, flat (at most `cap` pairs when cap > 0), and `held`: whether an incident other
-- than `self_id` holds `query` by its latest change after the position (see surely_unheld), the incident that holds
-- it by such a change, and for a listing of JSON (one argument, claim_json.lua) the alert's matches as JSON, flat
-- then holding only the first `replied` pairs of them (all without `replied`); or nil when the copy
-- cannot be validated (its changes were trimmed, are too many, or lack fingerprints, or what it listed no longer
-- covers the cap): the caller then answers `unvalidated` and the worker sends the full search.
--
-- Within a limit of 7 (the default), only the changes that share one of its 8 byte bands with `query` are read
-- (near_ids, or near_of for a query its apply_batch registered: about 1 in 32 of a window of random changes); every
-- other one can neither count, nor be listed, nor hold `query`, so leaving it out changes no answer. A change is
-- indexed once per FCALL as it is noted (note_bands, or note_near), not compared once per call: a window's cost no
-- longer grows with the calls that read it. Each change
-- read costs table reads and additions only: the distance is summed from the per-digit rows of `query`
-- (find_matches's), and only within the limit after the first 8 digits are the other 8 read (the sum only grows,
-- so one past the limit there is past it in the end; its exact value is never used).
local function validate_snapshot(context, meta_key, changes_key, query, limit, self_id, cap, position, count, listed,
                                 lo, n_listed, complete, cut, replied)
  local view = changes_after(context, meta_key, changes_key, position)
  if not view or view.count > MAX_VALIDATED_CHANGES then return nil end
  local first_prev, latest, order = view.first_prev, view.latest, view.order

  local byte = string.byte
  local T1, T2, T3, T4, T5, T6, T7, T8, T9, T10, T11, T12, T13, T14, T15, T16 = digit_rows(query)
  -- (a query that is not 16 hex digits has rows missing: then every digit is read, and the sum fails as it always did)
  local halves = T9 and T10 and T11 and T12 and T13 and T14 and T15 and T16 and true

  -- Within 7 bits, every incident that can count, be listed or hold `query` shares a band with it (note_change):
  -- only those are read. Past 7 (a layout of a wider distance), or a query with a digit that is not lowercase hex,
  -- every change is, as the sums below always did.
  local ids, n_ids = order, #order
  if limit <= 7 and T1 and T2 and T3 and T4 and T5 and T6 and T7 and T8 and halves then
    if not view.qbands then
      ids, n_ids = near_ids(view.bands, query)
    elseif view.registered[query] then  -- (a query the send did not register reads every change)
      ids, n_ids = near_of(view, query)
    end
  end

  -- a listing not of every match (nor cut) is bounded by its last listed match: a change past that one's distance is
  -- counted and no path below keeps it (claim_takes), so it is not made an addition (a near storm's claim met 12.7
  -- changes within the distance and kept 0.5 of them: benchmarks/journal/near-storms.md, section 19)
  local beyond, c = 64, nil
  if not cut and not complete then
    if n_listed == 1 then
      c = json_claim(listed[lo + 1])
      beyond = c and c.n > 0 and entry_distance(c, c.n) or 64
    elseif n_listed > 0 and n_listed % 2 == 0 then
      local last = listed[lo + n_listed]
      beyond = DISTANCES[last] or tonumber(last) or 64
    end
  end

  local held, changed_holder = false, nil
  local additions, n_additions = nil, 0
  for j = 1, n_ids do
    local id = ids[j]
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
      if now == query then held, changed_holder = true, id end
      if d <= limit then
        count = count + 1
        if d <= beyond then
          n_additions = n_additions + 1
          if n_additions == 1 then additions = {} end
          additions[n_additions] = {d, id}
        end
      end
    end
  end

  -- the copy listed every match, or only those up to its last listed one: past that, nothing is known
  local less = id_less_of(context)
  if n_listed == 1 then
    -- a listing of JSON (claim_json.lua): its alert's JSON cut from it, unless a change touched a listed match or
    -- the alert's byte cap is reached; then it is read into the usual list and validated below
    c = c or json_claim(listed[lo + 1])
    if not c then return nil end
    local touched, known = false, view.known
    if known then
      for j = 1, #known do
        if json_lists(c, known[j]) then
          touched = true
          break
        end
      end
    end
    if not touched then
      local matched, flat, json, maybe = json_merge(c, count, additions, n_additions, less, cap, complete, cut, held,
                                                    replied)
      if not matched then return nil end
      if json then return view.count, matched, flat, maybe, changed_holder, json end
    end
    listed, lo = json_listed(c), 0
    if not listed then return nil end
    n_listed = #listed
  end
  if n_listed % 2 == 0 then
    -- the listed matches no change touched, as their places in `listed` (no table a match), and whether they are
    -- in order (the worker sorts them as pair_before does; a list out of order is sorted below, as it always was)
    local kept, n_kept, in_order = {}, 0, true
    local last_d, last_id = nil, nil
    local plain = less == plain_less  -- (then compared here: no call a match)
    for i = 1, n_listed, 2 do
      local id = listed[lo + i]
      if first_prev[id] == nil then
        local d = listed[lo + i + 1]
        d = DISTANCES[d] or tonumber(d)  -- (distance_number, without a call a match)
        if not d or (last_d and not (last_d < d or last_d == d and
            (plain and last_id < id or not plain and less(last_id, id)))) then
          in_order = false
          break
        end
        n_kept = n_kept + 1
        kept[n_kept] = i
        last_d, last_id = d, id
      end
    end
    if in_order then
      local matched, flat, maybe = merge_claim(count, listed, lo, n_listed, kept, n_kept, additions, n_additions,
                                               less, cap, complete, cut, held)
      if not matched then return nil end
      return view.count, matched, flat, maybe, changed_holder
    end
  end
  local kept, n_kept = {}, 0
  for i = 1, n_listed, 2 do
    local id = listed[lo + i]
    if first_prev[id] == nil then
      n_kept = n_kept + 1
      kept[n_kept] = {distance_number(i < n_listed and listed[lo + i + 1] or nil), id}
    end
  end

  if cut then
    for i = 1, n_additions do kept[n_kept + i] = additions[i] end
    n_kept = n_kept + n_additions
    if n_kept > 1 then sort_pairs(kept, n_kept, less) end
    if count < n_kept then count = n_kept end
    local want = n_kept
    if cap > 0 and cap < want then want = cap end
    local flat = {}
    for i = 1, want do
      flat[2 * i - 1] = kept[i][2]
      flat[2 * i] = kept[i][1]
    end
    return view.count, count, flat, true, changed_holder
  end
  local bound_d, bound_id = nil, nil
  if not complete then
    if n_listed == 0 then return nil end
    bound_d, bound_id = distance_number(listed[lo + n_listed]), n_listed >= 2 and listed[lo + n_listed - 1] or nil
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
  return view.count, count, flat, held, changed_holder
end
