-- upkeep.lua: what keeps the index's size bounded: trimming the events stream and the change log, the lease that
-- lets one worker at a time do it, and retention (the window, its backfill, and expiring incidents).

--- @include "base"
--- @include "meta"
--- @include "search"
--- @include "groups"

-- Exact arithmetic on entry IDs for trimming: each part may be any number up to 2^64 - 1 (a producer may give its own
-- IDs), past the 53 bits a Lua number holds, where parse_id rounds (up, too: a bound past an undelivered entry).
-- The parts are compared as decimal text, shorter first (Redis writes them without leading zeros).
local LAST_PART = '18446744073709551615'

local function split_id(id)
  local dash = string.find(id, '-', 1, true)
  return string.sub(id, 1, dash - 1), string.sub(id, dash + 1)
end

local function decimal_less(a, b)
  if #a ~= #b then return #a < #b end
  return bytes_less(a, b)
end

local function exact_id_less(a, b)
  local am, as = split_id(a)
  local bm, bs = split_id(b)
  if am ~= bm then return decimal_less(am, bm) end
  return decimal_less(as, bs)
end

local function decimal_next(n)
  local i = #n
  while i > 0 and string.sub(n, i, i) == '9' do i = i - 1 end
  if i == 0 then return '1' .. string.rep('0', #n) end
  return string.sub(n, 1, i - 1) .. string.char(string.byte(n, i) + 1) .. string.rep('0', #n - i)
end

-- The first entry ID after `id` (`id` itself for the last possible one: nothing can follow it).
local function id_after(id)
  local ms, seq = split_id(id)
  if seq ~= LAST_PART then return ms .. '-' .. decimal_next(seq) end
  if ms == LAST_PART then return id end
  return decimal_next(ms) .. '-0'
end

-- Trim the events stream below the oldest entry any consumer group still needs, never above it.
--
-- A group needs every entry it has not acknowledged (its smallest pending ID, from XPENDING) and every entry not
-- yet delivered to it (those after its last-delivered-id, from XINFO GROUPS). Read and trimmed in one atomic step,
-- so no group can be created, rewound or handed an entry between the reading and the trimming.
--
-- keys[1] = events stream
-- args[1] = the workers' own group: never ignored
-- args[2] = ms: another group whose oldest needed entry is older than this no longer holds the stream (0 = never)
-- args[3] = most entries removed by this call; trimming is approximate (whole stream nodes), so up to one node's
--           worth of entries below the bound can stay until a later call
--
-- Returns {removed, bound ('' = none: no group), then per group: name, position, age_ms, ignored (0/1), lag or -1}
-- where position is the first entry ID the group still needs and age_ms the age of the oldest such entry (0: none).
local function trim_events(keys, args)
  local stream, own, max_age, limit = keys[1], args[1], tonumber(args[2]), tonumber(args[3])
  if redis.call('EXISTS', stream) == 0 then return {0, ''} end
  local now = now_ms()
  local bound
  local reply = {0, ''}
  for _, row in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
    local info = {}
    for i = 1, #row, 2 do info[row[i]] = row[i + 1] end
    local name = info['name']
    local position = id_after(info['last-delivered-id'])
    if tonumber(info['pending']) > 0 then
      local oldest_pending = redis.call('XPENDING', stream, name)[2]
      if oldest_pending and exact_id_less(oldest_pending, position) then position = oldest_pending end
    end
    local age = 0
    local first = redis.call('XRANGE', stream, position, '+', 'COUNT', 1)[1]
    if first then
      age = now - parse_id(first[1])
      if age < 0 then age = 0 end
    end
    local ignored = name ~= own and max_age > 0 and age > max_age
    if not ignored and (bound == nil or exact_id_less(position, bound)) then bound = position end
    local lag = info['lag']
    reply[#reply + 1] = name
    reply[#reply + 1] = position
    reply[#reply + 1] = age
    reply[#reply + 1] = ignored and 1 or 0
    reply[#reply + 1] = lag and tonumber(lag) or -1
  end
  if bound then
    reply[1] = redis.call('XTRIM', stream, 'MINID', '~', bound, 'LIMIT', limit)
    reply[2] = bound
  end
  return reply
end

-- Take or keep a lease: a key holding its holder's name, with a TTL, so that a holder that dies loses it.
--
-- keys[1] = the lease key   args[1] = holder   args[2] = TTL in ms ('0': give the lease up, if held)
--
-- Returns 1 when args[1] holds the lease after this call, else 0.
local function lease(keys, args)
  local holder = redis.call('GET', keys[1])
  if holder and holder ~= args[1] then return 0 end
  if args[2] == '0' then
    if holder then redis.call('DEL', keys[1]) end
    return 0
  end
  redis.call('SET', keys[1], args[1], 'PX', args[2])
  return 1
end

-- Trim the change log below an entry ID, and record that bound first in {N}:meta's `changes_trimmed_to`, so that a
-- snapshot older than it is never validated against a log with a hole (see validate_snapshot).
--
-- keys[1] = {N}:meta   keys[2] = {N}:changes   args[1] = bound (entry ID)   args[2] = most entries removed
--
-- Returns the number of entries removed (approximately: whole stream nodes).
local function trim_changes(keys, args)
  -- No index (Redis restarted without persistence under a running worker): nothing to trim, and the meta is not
  -- created here: a meta without a layout would stop every worker's start as "not the meta of an incident index".
  if not redis.call('HGET', keys[1], 'layout') then return 0 end
  local floor = redis.call('HGET', keys[1], 'changes_trimmed_to')
  if floor and not is_entry_id(floor) then
    return redis.error_reply('ERR ' .. keys[1] .. ' field changes_trimmed_to holds ' .. string.format('%q', floor) ..
      ', not a stream entry ID: set it to the first entry ID of ' .. keys[2] .. ' (HSET, as an administrator)')
  end
  if not floor or id_less(floor, args[1]) then redis.call('HSET', keys[1], 'changes_trimmed_to', args[1]) end
  return redis.call('XTRIM', keys[2], 'MINID', '~', args[1], 'LIMIT', args[2])
end

-- Retention (docs/contract.md, "Retention"). The window lives in {N}:meta's `retention_ms`, so every worker's apply
-- step agrees on whether to keep {N}:expiry, whatever each worker's own setting.

-- Record the retention window. Turning it on starts the backfill: {N}:expiry gets every incident already indexed,
-- scored with the time it was turned on (`retention_since`), in bounded steps (expiry_backfill) from the HSCAN
-- cursor in `retention_backfill`. Turning it off drops {N}:expiry (UNLINK: freed in the background).
--
-- keys[1] = {N}:meta   keys[2] = {N}:expiry   args[1] = layout tag   args[2] = window in ms (0 = off)
--
-- Returns the window recorded before this call (0 = off).
local function set_retention(keys, args)
  local meta_key, expiry_key = keys[1], keys[2]
  local refused = check_layout(meta_key, args[1])
  if refused then return refused end
  local window = tonumber(args[2])
  local was_on, was = retention_on(meta_key)
  if window > 0 then
    redis.call('HSET', meta_key, 'retention_ms', string.format('%.0f', window))
    if not was_on then
      redis.call('UNLINK', expiry_key)
      redis.call('HSET', meta_key, 'retention_since', now_ms(), 'retention_backfill', '0', 'retention_backfill_run',
                 server_run())
    end
  else
    redis.call('HDEL', meta_key, 'retention_ms', 'retention_since', 'retention_backfill', 'retention_backfill_run')
    redis.call('UNLINK', expiry_key)
  end
  return was
end

-- One bounded step of the backfill that set_retention starts: the next HSCAN page of {N}:fp joins {N}:expiry with the
-- score `retention_since`, unless it is there already (ZADD NX: an add or upsert since then is newer).
--
-- keys[1] = {N}:meta   keys[2] = {N}:fp   keys[3] = {N}:expiry   args[1] = HSCAN COUNT
--
-- Returns {cursor ('' once the backfill is done or when none runs), incidents added}.
local function expiry_backfill(keys, args)
  local meta_key, fp_key, expiry_key = keys[1], keys[2], keys[3]
  local cursor = redis.call('HGET', meta_key, 'retention_backfill')
  local since = redis.call('HGET', meta_key, 'retention_since')
  if not cursor or not since or not retention_on(meta_key) then return {'', 0} end
  -- a cursor of another run of the server (see server_run) would skip incidents: start the pass again (ZADD NX)
  if redis.call('HGET', meta_key, 'retention_backfill_run') ~= server_run() then cursor = '0' end
  local reply = redis.call('HSCAN', fp_key, cursor, 'COUNT', tonumber(args[1]))
  local rows = reply[2]
  local added = 0
  local batch = {}
  local function flush()
    if #batch > 0 then
      added = added + redis.call('ZADD', expiry_key, 'NX', unpack(batch))
      batch = {}
    end
  end
  for i = 1, #rows, 2 do
    batch[#batch + 1] = since
    batch[#batch + 1] = rows[i]
    if #batch >= CHUNK then flush() end
  end
  flush()
  local next_cursor = tostring(reply[1])
  if next_cursor == '0' then
    redis.call('HDEL', meta_key, 'retention_backfill', 'retention_backfill_run')
    return {'', added}
  end
  redis.call('HSET', meta_key, 'retention_backfill', next_cursor, 'retention_backfill_run', server_run())
  return {next_cursor, added}
end

-- Expire incidents whose last add or upsert is older than the window: each one, atomically, leaves the postings
-- (a representative hands them to its heir, as in a delete), its twin group, {N}:fp and {N}:expiry, and the change
-- log records `expire <ID> fp '' prev <old>`. Each is conditional: it goes only if {N}:expiry still dates it before
-- now - retention_ms (an add or upsert since it was picked moved it on) and {N}:fp still holds the fingerprint the
-- caller read (whose posting keys it sent).
--
-- keys[1] = {N}:meta   keys[2] = {N}:fp   keys[3] = {N}:changes   keys[4] = {N}:expiry
-- then per incident: {N}:twins:<its fingerprint>, then its n posting keys (band 0 first)
-- args[1] = layout tag   then per incident: ID, the fingerprint read (hex, or '-' for none), n
--
-- Returns {expired, kept (changed since picked, or not due), dropped (in {N}:expiry without a fingerprint)}.
local function expire(keys, args)
  local meta_key, fp_key, changes_key, expiry_key = keys[1], keys[2], keys[3], keys[4]
  local refused = check_layout(meta_key, args[1])
  if refused then return refused end
  local on, window = retention_on(meta_key)
  -- nothing expires while a move to another layout builds its postings (the `building` field of {N}:meta): the
  -- postings of the layout being built would be left behind
  if not on or redis.call('HEXISTS', meta_key, 'building') == 1 then return {0, (#args - 1) / 3, 0} end
  local cutoff = now_ms() - window
  local expired, kept, dropped = 0, 0, 0
  local k = 5
  for i = 2, #args, 3 do
    local id, expected, n = args[i], args[i + 1], tonumber(args[i + 2])
    local group, first = keys[k], k + 1
    k = k + 1 + n
    local score = tonumber(redis.call('ZSCORE', expiry_key, id) or '')
    local old = redis.call('HGET', fp_key, id)
    if not score or score > cutoff then
      kept = kept + 1
    elseif not old then
      redis.call('ZREM', expiry_key, id)
      dropped = dropped + 1
    elseif old ~= expected then
      kept = kept + 1
    else
      unindex(id, group, slice(keys, first, first + n - 1))
      redis.call('HDEL', fp_key, id)
      redis.call('ZREM', expiry_key, id)
      group_leave(group_keys(meta_key), fp_key, id)
      redis.call('XADD', changes_key, '*', 'expire', id, 'fp', '', 'prev', old)
      expired = expired + 1
    end
  end
  return {expired, kept, dropped}
end

-- allow-oom: the upkeep frees memory (trimming, expiry; the lease and the meta it takes first are a few bytes), and
-- it must run while Redis is full (maxmemory with noeviction), or a full Redis stays full until someone steps in
register('trim_events', trim_events, {'allow-oom'})
register('trim_changes', trim_changes, {'allow-oom'})
register('lease', lease, {'allow-oom'})
register('set_retention', set_retention)
register('expiry_backfill', expiry_backfill)
register('expire', expire, {'allow-oom'})
