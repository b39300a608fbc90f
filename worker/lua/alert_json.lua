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

-- The alert's `matches`: [{"incident_id":"<id>","distance":<d>},...] of the longest head of `flat` (id, d, ...)
-- whose JSON fits in MAX_MATCHES_BYTES, at least one match; in pieces joined once, each ID read once (quoted as it
-- is unless it needs escapes: no string made a match). A near storm lists its cap of matches in every alert: making
-- each ID's JSON twice, once to size it and once to write it, was most of such an event's time on the primary.
local function matches_json_within(flat)
  local find = string.find
  local parts, n, size = {'['}, 1, 2
  for i = 1, #flat, 2 do
    local id, d = flat[i], flat[i + 1]
    local quoted = find(id, '[%z\1-\31\127"\\]') and json_string(id)
    -- {"incident_id":,"distance":} and a comma: 27
    size = size + (quoted and #quoted or #id + 2) + #tostring(d) + 27
    if size > MAX_MATCHES_BYTES and i > 1 then break end
    if quoted then
      parts[n + 1] = i == 1 and '{"incident_id":' or ',{"incident_id":'
      parts[n + 2] = quoted
      parts[n + 3] = ',"distance":'
    else
      parts[n + 1] = i == 1 and '{"incident_id":"' or ',{"incident_id":"'
      parts[n + 2] = id
      parts[n + 3] = '","distance":'
    end
    parts[n + 4] = d
    parts[n + 5] = '}'
    n = n + 5
  end
  parts[n + 1] = ']'
  return table.concat(parts)
end
