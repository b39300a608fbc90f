-- base.lua: what every part of the library uses: the library's name and `register`, which names each function
-- after it; `slice`; byte order of strings; stream entry IDs compared as numbers; the server's clock and which run
-- of the server this is; whether an entry is pending.

-- The library's name as written here; worker/library.py replaces it with the versioned one when it loads the
-- library, so every function's name carries the version too.
local LIBRARY = 'incident_index_v2'

-- Register `callback` as the function `<library>_<name>`. Each function's name is written once, here in its
-- `register` call: worker/library.py reads the names from these calls (FN_APPLY is the function registered as
-- 'apply', and so on).
local function register(name, callback, flags)
  redis.register_function{function_name = LIBRARY .. '_' .. name, callback = callback, flags = flags}
end

-- Lua 5.1's `unpack` stops near 8,000 values: candidate IDs are read in chunks.
local CHUNK = 4000

local function slice(list, first, last)
  local out = {}
  for i = first, last do out[#out + 1] = list[i] end
  return out
end

-- A verify step's findings for one subject: its number, then each (kind, field, value) triple of `out`, onto `reply`.
local function add_findings(reply, number, out)
  for j = 1, #out, 3 do
    reply[#reply + 1] = number
    reply[#reply + 1] = out[j]
    reply[#reply + 1] = out[j + 1]
    reply[#reply + 1] = out[j + 2]
  end
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

local function is_pending(events_key, group, entry_id)
  local pending = redis.call('XPENDING', events_key, group, entry_id, entry_id, 1)
  return #pending > 0
end
