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

-- The alert's `matches`: [{"incident_id":"<id>","distance":<d>},...] of the longest head of `flat` (id, d, ...)
-- whose JSON fits in MAX_MATCHES_BYTES, at least one match; in pieces joined once: each ID as it is unless it needs
-- escapes (all of them checked with one anchored match over them joined, or, when one does, each with its own), then
-- its distance and what follows it up to the next ID, one piece made in advance. A near storm lists its cap of
-- matches in every alert: making each ID's JSON twice, once to size it and once to write it, was most of such an
-- event's time on the primary; then the distances written by sprintf, five pieces a match and a match of each ID
-- were most of what was left (benchmarks/journal/near-storms.md, section 9).
local function matches_json_within(flat)
  local n_flat = #flat
  if n_flat == 0 then return '[]' end
  local find = string.find
  -- whether no ID needs an escape, in one pass over them all (the usual case); else each is checked
  local ids = {}
  for i = 1, n_flat, 2 do ids[#ids + 1] = flat[i] end
  local plain = find(table.concat(ids), '^[^%z\1-\31\127"\\]*$') ~= nil
  local parts, n, size = {'[{"incident_id":"'}, 1, 2
  local last_d, last_digits
  for i = 1, n_flat, 2 do
    local id, d = flat[i], flat[i + 1]
    if not plain and not find(id, '^[^%z\1-\31\127"\\]*$') then id = string.sub(json_string(id), 2, -2) end
    local width = WIDTH[d]
    local digits = nil  -- (a distance of no piece made in advance: as tostring writes its number, -0 included)
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
