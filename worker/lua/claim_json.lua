-- claim_json.lua: a snapshot claim's listing sent as its alert's JSON (snapshot.lua's validate_snapshot). A worker
-- whose compiled loop wrote the listing (worker/copywritten.py), every ID needing no escape, sends it as one argument
--   '<n>/<m>:<offsets>[<entries>'
-- n the matches listed; offsets, n + 1 of them, 5 hex digits each: where each entry starts in <entries> (0-based),
-- the last where a next one would (its length + 1); entries '{"incident_id":"<id>","distance":<d>}' joined by ',',
-- except that the one after the m-th (the alert's last as the worker's cap has it, 1 <= m <= n, or 0 when n is) is
-- ']': '[' to it is the alert's JSON as it stands when no change of the window comes among the matches it lists (a
-- storm's usual claim), taken whole (each string made here costs Redis's Lua its allocation and the collector's work
-- on it: about 12 us for a storm alert's 4.5 KB, measured).
-- A near storm's claim lists 116 matches: as 232 arguments, then a check of each and a JSON of the alert's 100 made
-- from them, they were most of its event's time on the primary (benchmarks/journal/near-storms.md, section 17).
-- Here the alert's JSON is cut from the claim's own (its head, with the window's additions spliced in), and the
-- entries are read only where a merge or the reply needs them. Anything else (a listed match a change touched, the
-- alert's byte cap reached) reads every entry into the usual list (json_listed) and validates it the usual way.

--- @include "base"
--- @include "listing"
--- @include "alert_json"

local JSON_HEAD = '{"incident_id":"'

-- The value of each lowercase hex digit, by its byte (an offset's digits are read as bytes: no string made).
local HEX = {}
for i = 0, 9 do HEX[48 + i] = i end
for i = 0, 5 do HEX[97 + i] = 10 + i end

-- The claim of `arg`: {arg, n, m, at (where the offsets start), base (where the entries start, after the '[')};
-- nil when malformed.
-- Its offsets are checked as they are read (entry_start), and an entry its offset does not find where it is read
-- (json_entry, entry_distance): a storm's claim has 117, of which a merge reads a few dozen.
local function json_claim(arg)
  local colon = string.find(arg, ':', 1, true)
  local slash = colon and string.find(arg, '/', 1, true)
  if not slash or slash > colon then return nil end
  local n, m = tonumber(string.sub(arg, 1, slash - 1)), tonumber(string.sub(arg, slash + 1, colon - 1))
  if not (n and m) or n < 0 or n % 1 ~= 0 or m % 1 ~= 0 or m > n or m < (n > 0 and 1 or 0) then return nil end
  local open = colon + 5 * n + 6
  if string.byte(arg, open) ~= 91 then return nil end  -- ('[' after the offsets)
  return {arg = arg, n = n, m = m, at = colon, base = open + 1}
end

-- Where entry k (1 .. n + 1) starts in the argument; nil when its offset is not 5 lowercase hex digits.
local function entry_start(c, k)
  local p = c.at + 5 * k - 4
  local h1, h2, h3, h4, h5 = string.byte(c.arg, p, p + 4)
  h1, h2, h3, h4, h5 = HEX[h1], HEX[h2], HEX[h3], HEX[h4], HEX[h5]
  if not (h1 and h2 and h3 and h4 and h5) then return nil end
  return c.base + (((h1 * 16 + h2) * 16 + h3) * 16 + h4) * 16 + h5
end

-- Entry k's distance, read from its last bytes (no string made), and where it ends (its '}'); nil when malformed.
local function entry_distance(c, k)
  local e = entry_start(c, k + 1)
  if not e then return nil end
  e = e - 2
  local d1, d0, close = string.byte(c.arg, e - 2, e)
  if close ~= 125 or d0 < 48 or d0 > 57 then return nil end  -- ('}' after a digit)
  if d1 == 58 then return d0 - 48, e end  -- (':' and one digit)
  if d1 < 48 or d1 > 57 then return nil end
  return (d1 - 48) * 10 + d0 - 48, e
end

local JSON_MIDDLE = '","distance":'

-- Entry k's ID and distance (a number), cut at the places its offsets and its last bytes give (its head and the text
-- between ID and distance checked; no pattern matched); nil when malformed.
local function json_entry(c, k)
  local d, e = entry_distance(c, k)
  local at = d and entry_start(c, k)
  if not at then return nil end
  local middle = e - 13 - (d < 10 and 1 or 2)  -- where '","distance":' starts
  local arg = c.arg
  -- (found in place rather than cut out and compared: no string made for either)
  if middle < at + 16 or string.find(arg, JSON_HEAD, at, true) ~= at or string.find(arg, JSON_MIDDLE, middle, true) ~= middle
  then
    return nil
  end
  return string.sub(arg, at + 16, middle - 1), d
end

-- Every entry as the usual listing: a flat list id, d, ... (distances as numbers); nil when malformed.
local function json_listed(c)
  local flat = {}
  for k = 1, c.n do
    local id, d = json_entry(c, k)
    if not id then return nil end
    flat[2 * k - 1], flat[2 * k] = id, d
  end
  return flat
end

-- Whether a change to `id` (an incident the copy held: it may be listed) touches the listing.
local function json_lists(c, id)
  if string.find(id, '[%z\1-\31\127"\\]') then return false end  -- (the claim's IDs need no escape)
  return string.find(c.arg, JSON_HEAD .. id .. '","distance":', c.base, true) ~= nil
end

-- The entries i .. j (1 <= i <= j <= n) as they are, joined; nil when an offset is malformed.
local function json_run(c, i, j)
  local first, after = entry_start(c, i), entry_start(c, j + 1)
  if not (first and after) then return nil end
  return string.sub(c.arg, first, after - 2)
end

-- merge_claim (snapshot.lua) for a claim of JSON whose listed matches no change touched: its count, the first
-- `replied` pairs of what the alert lists (all of them without `replied`) as a flat id, d, ..., that list's JSON (nil
-- when it passes the alert's byte cap: the caller makes it the usual way), and `held`; or nil when the claim cannot
-- be validated. `additions` (each {d, id}) are the window's changes within the distance.
local function json_merge(c, count, additions, n_additions, less, cap, complete, cut, held, replied)
  local n = c.n
  local bound_id, bound_d
  if not cut and not complete then
    if n == 0 then return nil end
    bound_id, bound_d = json_entry(c, n)  -- (the last listed match: see claim_takes)
    if not bound_id then return nil end
  end
  local adds, n_adds, want
  adds, n_adds, want, count = claim_takes(additions, n_additions, not cut and not complete, bound_d, bound_id, less,
                                          count, n, cap, cut)
  if not adds then return nil end
  if cut then held = true end
  -- the ']' the worker wrote after the m-th: a run of listed matches that goes past it is cut in two there
  local m = c.m
  local after = m > 0 and entry_start(c, m + 1) or c.base + 1  -- (where the entry after it would start)
  if not after or string.byte(c.arg, after - 1) ~= 93 then return nil end
  -- each addition's place: before the first listed match it comes before (n + 1: after them all)
  local places, from, floor = {}, 1, math.floor
  for a = 1, n_adds do
    local pair = adds[a]
    local low, high = from, n + 1
    while low < high do
      local mid = floor((low + high) / 2)
      -- pair_before, the entry's ID read only at its own distance (most entries of a search differ in distance)
      local d, e = entry_distance(c, mid)
      if not d then return nil end
      local before = pair[1] < d
      if pair[1] == d then
        -- (entry_distance read entry mid + 1's offset; entry mid's own is read here: checked too)
        local at = entry_start(c, mid)
        if not at then return nil end
        before = less(pair[2], string.sub(c.arg, at + 16, e - 14 - (d < 10 and 1 or 2)))
      end
      if before then high = mid else low = mid + 1 end
    end
    places[a], from = low, low
  end
  local flat, n_flat = {}, 0
  -- (at least the first, when there is one: the incident joins its closest match's group)
  local shown = replied and (replied < want and replied or want) or want
  if shown == 0 and want > 0 then shown = 1 end
  if n_adds == 0 and want == m then
    -- the alert lists the claim's own head, which the worker closed: its JSON as it stands
    for k = 1, shown do
      local id, d = json_entry(c, k)
      if not id then return nil end
      flat[2 * k - 1], flat[2 * k] = id, d
    end
    local json = string.sub(c.arg, c.base - 1, after - 1)
    if want > 0 and #json + 1 - 2 * want > MAX_MATCHES_BYTES then json = nil end  -- (alert_json's rule)
    return count, flat, json, held
  end
  -- the alert's list: the listed runs between the additions, cut at `want`
  local pieces, n_pieces, taken, next_listed = {}, 0, 0, 1
  local a = 1
  while taken < want do
    local place = a <= n_adds and places[a] or n + 1
    if next_listed < place then
      local last = place - 1
      if last - next_listed + 1 > want - taken then last = next_listed + want - taken - 1 end
      local first = next_listed
      if first <= m and last > m then  -- (across the ']': two pieces)
        n_pieces = n_pieces + 1
        pieces[n_pieces] = json_run(c, first, m)
        if not pieces[n_pieces] then return nil end
        first = m + 1
      end
      n_pieces = n_pieces + 1
      pieces[n_pieces] = json_run(c, first, last)
      if not pieces[n_pieces] then return nil end
      for k = next_listed, last do
        if n_flat >= 2 * shown then break end
        local id, d = json_entry(c, k)
        if not id then return nil end
        flat[n_flat + 1], flat[n_flat + 2] = id, d
        n_flat = n_flat + 2
      end
      taken = taken + last - next_listed + 1
      next_listed = last + 1
    else
      local pair = adds[a]
      n_pieces = n_pieces + 1
      pieces[n_pieces] = '{"incident_id":' .. json_string(pair[2]) .. ',"distance":' .. pair[1] .. '}'
      if n_flat < 2 * shown then
        flat[n_flat + 1], flat[n_flat + 2] = pair[2], pair[1]
        n_flat = n_flat + 2
      end
      taken = taken + 1
      a = a + 1
    end
  end
  -- (one run, the usual storm's alert: one string made for it, not a join of one and then its brackets)
  local json = n_pieces == 1 and '[' .. pieces[1] .. ']' or '[' .. table.concat(pieces, ',') .. ']'
  if want > 0 and #json + 1 - 2 * want > MAX_MATCHES_BYTES then json = nil end  -- (alert_json's rule)
  return count, flat, json, held
end
