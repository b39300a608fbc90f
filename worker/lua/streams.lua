-- streams.lua: the events stream and the dead letters: reading new, own pending and idle entries with their size
-- known first, dead-lettering an entry, and removing a consumer that has gone.

--- @include "base"

-- Dead-letter a stream entry and acknowledge it, unless it is no longer pending (another consumer finished it).
--
-- keys[1] = events stream   keys[2] = dead-letter stream
-- args[1] = consumer group   args[2] = entry ID   args[3] = approximate MAXLEN of the dead stream (0 = none)
-- args[4 ..] = the dead letter's field, value pairs
--
-- Returns the dead letter's entry ID, or '' when the entry was not pending.
local function dead_letter(keys, args)
  local group, entry_id, maxlen = args[1], args[2], tonumber(args[3])
  if not is_pending(keys[1], group, entry_id) then return '' end
  -- its XACK refused after its XADD would leave the letter written and the entry pending: a second letter at its
  -- retry. So it checks both, and the dead stream's type, first (fitness.lua: the worker waits for the repair)
  local wrong = redis.pcall('XLEN', keys[2])
  if (redis.acl_check_cmd and not (redis.acl_check_cmd('XADD', keys[2], '*', 'f', 'v') and
      redis.acl_check_cmd('XACK', keys[1], group, entry_id))) or (type(wrong) == 'table' and wrong.err) then
    return redis.error_reply('UNFIT dead_letter: XADD to ' .. keys[2] .. ' or XACK on ' .. keys[1])
  end
  local fields = slice(args, 4, #args)
  local dead_id
  if maxlen > 0 then
    dead_id = redis.call('XADD', keys[2], 'MAXLEN', '~', maxlen, '*', unpack(fields))
  else
    dead_id = redis.call('XADD', keys[2], '*', unpack(fields))
  end
  redis.call('XACK', keys[1], group, entry_id)
  return dead_id
end

-- Remove a consumer from the group, but only if it has nothing pending (checked and done in one step, so a
-- consumer that just read entries is never dropped with them).
--
-- keys[1] = events stream   args[1] = consumer group   args[2] = consumer
--
-- Returns 1 when it removed the consumer, 0 when the consumer had entries pending.
local function forget_consumer(keys, args)
  if #redis.call('XPENDING', keys[1], args[1], '-', '+', 1, args[2]) > 0 then return 0 end
  redis.call('XGROUP', 'DELCONSUMER', keys[1], args[1], args[2])
  return 1
end

-- Reading entries with their size known first (read_new, read_pending, claim below). A stream entry leaves the
-- server whole only when its field names and values total at most `limit` bytes; a larger one travels as a bounded
-- summary (prefixes and sizes), so that no entry, however large, reaches a worker whole. Server side, the entry is
-- in Lua's memory only for the duration of the call.
--
-- Each entry in a reply is a list {id, deliveries, kind, ...}:
--   kind 'f' (full):    name1, value1, name2, value2, ... every field in order, repeated names kept
--   kind 'o' (oversized): total bytes, field count, then for each of the first SUMMARY_FIELDS fields:
--                       name prefix, name bytes, value prefix, value bytes (prefixes of `prefix` bytes)
--   kind 'm' (missing): the entry is no longer in the stream (deleted or trimmed while pending)
local SUMMARY_FIELDS = 1000

-- The reply of one entry and the bytes it carries.
local function entry_reply(id, deliveries, fields, limit, prefix)
  if not fields or #fields == 0 then return {id, deliveries, 'm'}, 0 end
  local total = 0
  for i = 1, #fields do total = total + #fields[i] end
  if total <= limit then
    local out = {id, deliveries, 'f'}
    for i = 1, #fields do out[3 + i] = fields[i] end
    return out, total
  end
  local count = #fields / 2
  local out = {id, deliveries, 'o', total, count}
  local kept, size = count, 0
  if kept > SUMMARY_FIELDS then kept = SUMMARY_FIELDS end
  local sub = string.sub
  for i = 1, kept do
    local name, value = fields[2 * i - 1], fields[2 * i]
    local n = #out
    out[n + 1], out[n + 2] = sub(name, 1, prefix), #name
    out[n + 3], out[n + 4] = sub(value, 1, prefix), #value
    size = size + #out[n + 1] + #out[n + 3]
  end
  return out, size
end

-- The entries of an XREADGROUP reply of one stream (none: {}). Redis answers {{stream, {entry, ...}}} or nil;
-- fakeredis answers {stream, {entry, ...}} or {}.
local function stream_entries(reply)
  if not reply or not reply[1] then return {} end
  if type(reply[1]) == 'table' then return reply[1][2] end
  return reply[2]
end

-- Deliver the group's next new entries to a consumer until `count` entries or until the reply carries `budget`
-- bytes (at least one entry when there is one). An entry adds at most `most` bytes to a reply: `limit` when sent
-- whole, the prefixes of at most SUMMARY_FIELDS fields otherwise. So each XREADGROUP takes as many entries as would
-- fit the bytes left even if every one of them were that large (at least one): they are the very entries that one
-- XREADGROUP COUNT 1 an entry would take (before each of them, the budget is not spent yet), and the reply stays
-- within the budget plus one entry as before; but small entries, the common case, come several to a call (an
-- XREADGROUP from Lua costs ~10 us beside its entries). With the defaults (8 MiB budget, 1 MiB entries, 1 KiB
-- prefixes: `most` is 2,000 KiB) a call takes 4 at first, so Lua holds at most 4 entries, however large, at once.
--
-- keys[1] = events stream
-- args[1] = consumer group  args[2] = consumer  args[3] = most entries  args[4] = byte budget of the reply
-- args[5] = largest entry sent whole (bytes)  args[6] = bytes kept of each field of a larger entry
--
-- Returns {'', entry, entry, ...}.
local function read_new(keys, args)
  local group, consumer = args[1], args[2]
  local count, budget = tonumber(args[3]), tonumber(args[4])
  local limit, prefix = tonumber(args[5]), tonumber(args[6])
  local most = 2 * prefix * SUMMARY_FIELDS
  if limit > most then most = limit end
  local out = {''}
  while #out <= count and budget > 0 do
    local take = math.floor(budget / most)
    if take < 1 then take = 1 end
    if take > count + 1 - #out then take = count + 1 - #out end
    local reply = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', take, 'STREAMS', keys[1], '>')
    local entries = stream_entries(reply)
    for i = 1, #entries do
      local item, size = entry_reply(entries[i][1], 1, entries[i][2], limit, prefix)
      out[#out + 1] = item
      budget = budget - size
    end
    if #entries < take then break end
  end
  return out
end

-- A consumer's own pending entries from `start` on, with their delivery counts, without delivering them again:
-- XPENDING and XRANGE leave the counts alone (an XREADGROUP of the history would add one to each, so a worker
-- that reconnects often would turn good entries into poison). With args[7] = '1' each one still in the stream is
-- counted as delivered once more (XCLAIM RETRYCOUNT): for the entries a crashed predecessor left.
--
-- keys[1] = events stream
-- args[1] = consumer group  args[2] = consumer  args[3] = first entry ID  args[4] = most entries
-- args[5] = byte budget  args[6] = largest entry sent whole  args[7] = prefix bytes  args[8] = '1' to count
--
-- Returns {'', entry, ...} in ID order.
local function read_pending(keys, args)
  local group, consumer = args[1], args[2]
  local budget, limit, prefix = tonumber(args[5]), tonumber(args[6]), tonumber(args[7])
  local rows = redis.call('XPENDING', keys[1], group, args[3], '+', tonumber(args[4]), consumer)
  local out = {''}
  for i = 1, #rows do
    if budget <= 0 then break end
    local id, deliveries = rows[i][1], rows[i][4]
    local found = redis.call('XRANGE', keys[1], id, id)
    local fields = found[1] and found[1][2]
    if fields and args[8] == '1' then
      deliveries = deliveries + 1
      redis.call('XCLAIM', keys[1], group, consumer, 0, id, 'RETRYCOUNT', deliveries, 'JUSTID')
    end
    local item, size = entry_reply(id, deliveries, fields, limit, prefix)
    out[#out + 1] = item
    budget = budget - size
  end
  return out
end

-- Take over entries pending longer than `min_idle` ms with any consumer (XAUTOCLAIM, which counts a delivery:
-- an entry whose holder went silent may be what silenced it), one at a time until `count` or the byte budget.
--
-- keys[1] = events stream
-- args[1] = consumer group  args[2] = consumer  args[3] = min idle ms  args[4] = cursor  args[5] = most entries
-- args[6] = byte budget  args[7] = largest entry sent whole  args[8] = prefix bytes
--
-- Returns {next cursor ('0-0' when the scan is complete), entry, ...}.
local function claim(keys, args)
  local group, consumer, min_idle = args[1], args[2], args[3]
  local cursor, count, budget = args[4], tonumber(args[5]), tonumber(args[6])
  local limit, prefix = tonumber(args[7]), tonumber(args[8])
  local out = {cursor}
  local scans = 0
  while #out <= count and budget > 0 and scans < 10 * count do
    scans = scans + 1
    local reply = redis.call('XAUTOCLAIM', keys[1], group, consumer, min_idle, cursor, 'COUNT', 1)
    cursor = reply[1]
    local entry = reply[2][1]
    if entry then
      local row = redis.call('XPENDING', keys[1], group, entry[1], entry[1], 1)
      local deliveries = row[1] and row[1][4] or 1
      local item, size = entry_reply(entry[1], deliveries, entry[2], limit, prefix)
      out[#out + 1] = item
      budget = budget - size
    end
    if cursor == '0-0' then break end
  end
  out[1] = cursor
  return out
end

register('dead_letter', dead_letter)
-- (allow-oom: removing a consumer frees memory; refused while Redis is full, it stopped the worker before its upkeep)
register('forget_consumer', forget_consumer, {'allow-oom'})
-- allow-oom: reading and claiming allocate next to nothing, and a worker must keep reading while Redis is full
-- (it then holds what it read until writes work again)
register('read_new', read_new, {'allow-oom'})
register('read_pending', read_pending, {'allow-oom'})
register('claim', claim, {'allow-oom'})
