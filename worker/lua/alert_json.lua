-- alert_json.lua: an alert's `matches` field as JSON, within its byte cap: the closest matches that fit, each
-- written once (apply.lua).

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

-- Bytes an alert's `matches` may take: the closest matches that fit are listed (match_count still counts them all).
-- 100 matches of everyday IDs take about 4 KB; 100 of 256 four-byte characters took 100 KB, a hundred times the
-- event that made them, so that one producer could fill the alerts stream faster than the upkeep measures it.
local MAX_MATCHES_BYTES = 8192

-- Each distance's JSON between two IDs, and after the last one (a distance is a whole number of bits, 0 to 64):
-- written once, not made from the number for each match (tostring and table.concat format a number with sprintf).
-- Each is found by the number and by its digits (a claim's own head keeps its distances as the worker sent them:
-- snapshot.lua's merge_claim); any other (a fraction, or digits written otherwise) is written from its number.
local BETWEEN, AFTER, WIDTH = {}, {}, {}
for d = 0, 64 do
  local digits = '' .. d  -- (a library's top level has no tostring)
  BETWEEN[d] = '","distance":' .. digits .. '},{"incident_id":"'
  AFTER[d] = '","distance":' .. digits .. '}]'
  WIDTH[d] = #digits
  BETWEEN[digits], AFTER[digits], WIDTH[digits] = BETWEEN[d], AFTER[d], WIDTH[d]
end

-- IDs that need no escape, kept as they are seen (an ID's check is then one look-up), up to PLAIN_KEPT bytes of them,
-- then forgotten all at once. A near storm lists its cap of matches in every alert, nearly all of them listed before
-- (benchmarks/journal/near-storms.md, section 15): checking each by pattern took a third of making their JSON.
local PLAIN_KEPT = 262144
local plain_ids = {ids = {}, bytes = 0}

local function remember_plain(id)
  if plain_ids.bytes > PLAIN_KEPT then plain_ids.ids, plain_ids.bytes = {}, 0 end
  plain_ids.ids[id] = true
  plain_ids.bytes = plain_ids.bytes + #id + 40  -- (a key's table slot and string header, about)
end

local function is_plain(id)
  if string.find(id, '^[^%z\1-\31\127"\\]*$') == nil then return false end
  pcall(remember_plain, id)  -- (a server whose Lua tables were read-only keeps nothing: each ID is checked again)
  return true
end

-- The alert's `matches` written the long way (matches_json_within): each ID checked, its bytes counted, up to the
-- longest head that fits, in pieces joined once: each ID as it is unless it needs escapes, then its distance and
-- what follows it up to the next ID, one piece made in advance (for a distance of no such piece, as tostring
-- writes its number, -0 included).
local function matches_json_counted(flat)
  local n_flat = #flat
  local parts, n, size = {'[{"incident_id":"'}, 1, 2
  local last_d, last_digits
  for i = 1, n_flat, 2 do
    local id, d = flat[i], flat[i + 1]
    if not is_plain(id) then id = string.sub(json_string(id), 2, -2) end
    local width = WIDTH[d]
    local digits = nil
    if not width or d == 0 and 1 / d < 0 then
      digits = tostring(tonumber(d))
      width = #digits
    end
    -- the ID in its quotes, the distance, and 27 (as the alert's byte cap has always counted a match)
    size = size + #id + 2 + width + 27
    if size > MAX_MATCHES_BYTES and i > 1 then break end
    if i > 1 then
      parts[n + 1] = last_digits and '","distance":' .. last_digits .. '},{"incident_id":"' or BETWEEN[last_d]
      n = n + 1
    end
    parts[n + 1] = id
    n = n + 1
    last_d, last_digits = d, digits
  end
  parts[n + 1] = last_digits and '","distance":' .. last_digits .. '}]' or AFTER[last_d]
  return table.concat(parts)
end

-- The alert's `matches`: [{"incident_id":"<id>","distance":<d>},...] of the longest head of `flat` (id, d, ...)
-- whose JSON fits in MAX_MATCHES_BYTES, at least one match. The usual list (IDs that need no escape, most of them
-- known so already; each distance with its pieces; the whole list within the cap) is written in one pass of two
-- look-ups a match and one join, its bytes counted from the join's length: the cap counts each match 2 bytes fewer
-- than it takes, and the list 1 more (that count is the JSON's length + 1 - 2n). Anything else is written the long
-- way. A near storm lists its cap of matches in every alert: its JSON was most of such an event's time on the
-- primary (near-storms journal, sections 9 and 15).
local function matches_json_within(flat)
  local n_flat = #flat
  if n_flat == 0 then return '[]' end
  local plain = plain_ids.ids
  local parts = {'[{"incident_id":"'}
  local d
  for i = 1, n_flat, 2 do
    local id = flat[i]
    d = flat[i + 1]
    local between = BETWEEN[d]
    if not between or d == 0 and 1 / d < 0 or not plain[id] and not is_plain(id) then
      return matches_json_counted(flat)
    end
    parts[i + 1] = id
    parts[i + 2] = between
  end
  parts[n_flat + 1] = AFTER[d]
  local json = table.concat(parts)
  if #json + 1 - n_flat > MAX_MATCHES_BYTES then return matches_json_counted(flat) end
  return json
end
