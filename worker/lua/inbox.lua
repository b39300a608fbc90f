-- inbox.lua: the producers' fenced way in. Redis 7's ACLs cannot filter XADD's arguments, so a user that may XADD
-- may also trim the stream (MAXLEN 0) or choose entry IDs (the largest one stops every later XADD *). A producer's
-- user is given RPUSH on the namespace's inbox list ({N}:inbox) instead, which can only append; `submit` checks and
-- encodes an event there, and the workers' `intake` moves the inbox into the events stream with server-assigned IDs.
--
-- An inbox element is one event: for each field name and value in order, its length in bytes in decimal, ':', and
-- its bytes ("11:incident_id2:47" ...): binary-safe, the same field/value pairs an XADD would carry, repeated names
-- kept. docs/contract.md#events-in.

--- @include "base"

-- The most fields an inbox event may carry (an event needs four; Lua's unpack stops near 8,000 values).
local INBOX_FIELDS = 1000

-- The element of the field/value pairs `fields`.
local function encode_event(fields)
  local parts = {}
  for i = 1, #fields do parts[i] = #fields[i] .. ':' .. fields[i] end
  return table.concat(parts)
end

-- The field/value pairs of an inbox element, or nil and what is wrong with it.
local function decode_event(raw)
  local fields, pos, n = {}, 1, #raw
  local find, sub = string.find, string.sub
  while pos <= n do
    local first, last = find(raw, '^%d+:', pos)
    if not first or last - first > 10 then
      return nil, 'byte ' .. pos .. ' starts no length (decimal digits and a colon)'
    end
    local size = tonumber(sub(raw, first, last - 1))
    if last + size > n then
      return nil, 'a field of ' .. size .. ' bytes at byte ' .. pos .. ' runs past the end (' .. n .. ' bytes)'
    end
    if #fields >= 2 * INBOX_FIELDS then return nil, 'more than ' .. INBOX_FIELDS .. ' fields' end
    fields[#fields + 1] = sub(raw, last + 1, last + size)
    pos = last + size + 1
  end
  if #fields == 0 then return nil, 'no field' end
  if #fields % 2 == 1 then return nil, 'a field name without its value' end
  return fields
end

-- Append one event to the inbox, with the caller's rights (a producer's user needs RPUSH on keys[1] only).
--
-- keys[1] = {N}:inbox   args[1] = most bytes of field names and values (0: no check)
-- args[2 ..] = the event's field, value pairs
--
-- Returns the inbox's length, or an error reply saying what was wrong (nothing is appended then).
local function submit(keys, args)
  local limit = tonumber(args[1])
  local fields = slice(args, 2, #args)
  if not limit or #fields == 0 or #fields % 2 == 1 then
    return redis.error_reply('ERR submit takes the byte limit, then field, value pairs (at least one pair)')
  end
  if #fields > 2 * INBOX_FIELDS then
    return redis.error_reply('ERR an event has at most ' .. INBOX_FIELDS .. ' fields; this one has ' .. #fields / 2)
  end
  local total = 0
  for i = 1, #fields do total = total + #fields[i] end
  if limit > 0 and total > limit then
    return redis.error_reply('ERR the event is ' .. total .. ' bytes, over the limit of ' .. limit ..
      ' (max_entry_bytes); nothing was appended')
  end
  return redis.call('RPUSH', keys[1], encode_event(fields))
end

-- The dead letter of an inbox element the events stream must not take, as field/value pairs (formats.DeadLetter):
-- too large (a prefix of each field and the sizes are kept, as for an oversized stream entry) or not an event
-- (a prefix of the element is kept as `entry`).
local DEAD_OWN = {reason = 1, detail = 1, source_entry = 1, source_stream = 1, consumer = 1, deliveries = 1}

local function inbox_letter(inbox, consumer, raw, fields, total, limit, prefix, problem)
  local sub = string.sub
  local out
  if fields then
    out = {'reason', 'too_large', 'detail', 'the inbox entry is ' .. total .. ' bytes in ' .. #fields / 2 ..
      ' fields, over the limit of max_entry_bytes=' .. limit .. '; this dead letter keeps the first ' .. prefix ..
      ' bytes of each field, original_sizes their full sizes', 'source_entry', '', 'source_stream', inbox,
      'consumer', consumer, 'deliveries', '1', 'original_bytes', tostring(total)}
    local sizes = {}
    for i = 1, #fields, 2 do sizes[#sizes + 1] = '[' .. #fields[i] .. ',' .. #fields[i + 1] .. ']' end
    out[#out + 1], out[#out + 2] = 'original_sizes', '[' .. table.concat(sizes, ',') .. ']'
    for i = 1, #fields, 2 do
      local name = sub(fields[i], 1, prefix)
      if DEAD_OWN[name] or sub(name, 1, 9) == 'original_' then name = 'original_' .. name end
      out[#out + 1], out[#out + 2] = name, sub(fields[i + 1], 1, prefix)
    end
  else
    out = {'reason', 'bad_inbox_entry', 'detail', 'the inbox entry (' .. #raw .. ' bytes) is not an event in ' ..
      'the inbox encoding: ' .. problem .. '; this dead letter keeps its first ' .. prefix .. ' bytes as entry',
      'source_entry', '', 'source_stream', inbox, 'consumer', consumer, 'deliveries', '1',
      'original_bytes', tostring(#raw), 'entry', sub(raw, 1, prefix)}
  end
  return out
end

-- Move the oldest entries of the inbox into the events stream, each with a server-assigned ID, in one atomic step:
-- an entry is either still in the inbox or in the stream (or, too large or not an event, in the dead letters),
-- never both and never neither, however many workers call it at once (a stream that refuses an entry's XADD gives
-- it back to the inbox's head: the error NOTMOVED). Entries leave the inbox one at a time, so the call holds one
-- element, however large, at a time; it stops after `count` entries or `budget` bytes.
--
-- keys[1] = {N}:inbox   keys[2] = events stream   keys[3] = dead-letter stream
-- args[1] = most entries   args[2] = byte budget   args[3] = max_entry_bytes   args[4] = prefix bytes of a dead
-- letter's fields   args[5] = approximate MAXLEN of the dead stream (0 = none)   args[6] = consumer
--
-- Returns {moved, dead-lettered too_large, dead-lettered bad_inbox_entry, entries left in the inbox}.
local function intake(keys, args)
  local count, budget = tonumber(args[1]), tonumber(args[2])
  local limit, prefix, maxlen, consumer = tonumber(args[3]), tonumber(args[4]), tonumber(args[5]), args[6]
  -- an empty inbox (every read round of a worker whose producers XADD) costs one LLEN
  if redis.call('LLEN', keys[1]) == 0 then return {0, 0, 0, 0} end
  -- nothing may fail once an entry has left the inbox: a stream key of another type stops the call before that
  local wanted = {'list', 'stream', 'stream'}
  for i = 2, 3 do
    local kind = redis.call('TYPE', keys[i]).ok
    if kind ~= wanted[i] and kind ~= 'none' then
      return redis.error_reply('WRONGTYPE ' .. keys[i] .. ' holds a ' .. kind .. ', not a ' .. wanted[i] ..
        '; nothing was moved')
    end
  end
  -- and an entry a stream refuses goes back with LPUSH: a user that may not is stopped here too (Redis 7; fakeredis
  -- has no ACL), having moved nothing, rather than lose that entry
  if redis.acl_check_cmd and not redis.acl_check_cmd('LPUSH', keys[1], 'x') then
    return redis.error_reply('NOPERM this user may not LPUSH to ' .. keys[1] .. ' (to put back an entry a stream ' ..
      'refuses); nothing was moved')
  end
  local moved, large, bad = 0, 0, 0
  while moved + large + bad < count and budget > 0 do
    local raw = redis.call('LPOP', keys[1])
    if not raw then break end
    budget = budget - #raw
    local fields, problem = decode_event(raw)
    local total = 0
    if fields then
      for i = 1, #fields do total = total + #fields[i] end
    end
    local into, added
    if fields and total <= limit then
      into, added = keys[2], redis.pcall('XADD', keys[2], '*', unpack(fields))
      moved = moved + 1
    else
      local letter = inbox_letter(keys[1], consumer, raw, fields, total, limit, prefix, problem)
      into = keys[3]
      if maxlen > 0 then
        added = redis.pcall('XADD', keys[3], 'MAXLEN', '~', maxlen, '*', unpack(letter))
      else
        added = redis.pcall('XADD', keys[3], '*', unpack(letter))
      end
      if fields then large = large + 1 else bad = bad + 1 end
    end
    -- A stream can refuse XADD * after the LPOP: one whose last ID is the largest (XADDed by hand) refuses every
    -- one. A function's writes stay when it fails, so the element goes back to the head of the inbox, in its place.
    if type(added) == 'table' and added.err then
      redis.call('LPUSH', keys[1], raw)
      return redis.error_reply('NOTMOVED ' .. into .. ' refused the inbox entry (' .. tostring(added.err) .. '); it was put ' ..
        'back at the head of ' .. keys[1] .. ', and the ' .. (moved + large + bad - 1) .. ' before it in this call ' ..
        'stay moved')
    end
  end
  return {moved, large, bad, redis.call('LLEN', keys[1])}
end

register('submit', submit)
-- (not allow-oom: at maxmemory the whole call is refused before it starts, and the inbox keeps its entries)
register('intake', intake)
