-- claim_json.lua: a snapshot claim's listing sent as its alert's JSON (snapshot.lua's validate_snapshot). A worker
-- whose compiled loop wrote the listing (worker/copywritten.py), every ID needing no escape, sends it as one argument
--   '<n>:<offsets><entries>'
-- n the matches listed; offsets, n + 1 of them, 5 hex digits each: where each entry starts in <entries> (0-based),
-- the last where a next one would (its length + 1); entries '{"incident_id":"<id>","distance":<d>}' joined by ','.
-- A near storm's claim lists 116 matches: as 232 arguments, then a check of each and a JSON of the alert's 100 made
-- from them, they were most of its event's time on the primary (benchmarks/journal/near-storms.md, section 17).
-- Here the alert's JSON is cut from the claim's own (its head, with the window's additions spliced in), and the
-- entries are read only where a merge or the reply needs them. Anything else (a listed match a change touched, the
-- alert's byte cap reached) reads every entry into the usual list (json_listed) and validates it the usual way.

--- @include "base"
--- @include "listing"
--- @include "alert_json"

local JSON_HEAD = '{"incident_id":"'

-- The claim of `arg`: {arg, n, at (where the offsets start), base (where the entries start)}; nil when malformed
-- (an entry its offset does not find is found malformed where it is read: json_entry).
local function json_claim(arg)
  local colon = string.find(arg, ':', 1, true)
  local n = colon and tonumber(string.sub(arg, 1, colon - 1))
  if not n or n < 0 or n % 1 ~= 0 or #arg < colon + 5 * (n + 1) then return nil end
  if string.find(string.sub(arg, colon + 1, colon + 5 * (n + 1)), '[^0-9a-f]') then return nil end
  return {arg = arg, n = n, at = colon, base = colon + 5 * (n + 1) + 1}
end

-- Where entry k (1 .. n + 1) starts in the argument.
local function entry_start(c, k)
  local p = c.at + 5 * k - 4
  return c.base + tonumber(string.sub(c.arg, p, p + 4), 16)
end

-- Entry k's ID and distance (a number).
local function json_entry(c, k)
  local id, d = string.match(c.arg, '^{"incident_id":"(.-)","distance":(%d+)}', entry_start(c, k))
  return id, tonumber(d)
end

-- Entry k's distance, read from its last bytes (no string made), and where it ends (its '}'); nil when malformed.
local function entry_distance(c, k)
  local e = entry_start(c, k + 1) - 2
  local d1, d0 = string.byte(c.arg, e - 2, e - 1)
  if not d0 or d0 < 48 or d0 > 57 then return nil end
  if d1 == 58 then return d0 - 48, e end  -- (':' and one digit)
  if d1 < 48 or d1 > 57 then return nil end
  return (d1 - 48) * 10 + d0 - 48, e
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

-- The entries i .. j (1 <= i <= j <= n) as they are, joined.
local function json_run(c, i, j)
  return string.sub(c.arg, entry_start(c, i), entry_start(c, j + 1) - 2)
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
        before = less(pair[2], string.sub(c.arg, entry_start(c, mid) + 16, e - 14 - (d < 10 and 1 or 2)))
      end
      if before then high = mid else low = mid + 1 end
    end
    places[a], from = low, low
  end
  -- the alert's list: the listed runs between the additions, cut at `want`
  local pieces, n_pieces, taken, next_listed = {}, 0, 0, 1
  local flat, n_flat = {}, 0
  -- (at least the first, when there is one: the incident joins its closest match's group)
  local shown = replied and (replied < want and replied or want) or want
  if shown == 0 and want > 0 then shown = 1 end
  local a = 1
  while taken < want do
    local place = a <= n_adds and places[a] or n + 1
    if next_listed < place then
      local last = place - 1
      if last - next_listed + 1 > want - taken then last = next_listed + want - taken - 1 end
      n_pieces = n_pieces + 1
      pieces[n_pieces] = json_run(c, next_listed, last)
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
  local json = '[' .. table.concat(pieces, ',') .. ']'
  if want > 0 and #json + 1 - 2 * want > MAX_MATCHES_BYTES then json = nil end  -- (alert_json's rule)
  return count, flat, json, held
end
