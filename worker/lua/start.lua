-- start.lua: what a worker calls as it starts: the meta written on first use, the check of its permissions and of
-- the types of the keys it writes, and which run of the server this is.

--- @include "base"

-- What the calling user may not do among the commands the apply, apply_batch and dead_letter functions send, and
-- which of the keys they write hold another type: checked once, when a worker starts. A function stops at the first
-- command refused and keeps what it wrote before it (Redis rolls nothing back), so a call refused its XADD to the
-- change log or the alerts, or its XACK, after indexing left an entry indexed without its change or its alert, and
-- its retry found the incident indexed already: a repeat, acknowledged without an alert.
--
-- keys[1] = {N}:meta   keys[2] = {N}:fp   keys[3] = {N}:changes   keys[4] = events stream   keys[5] = alerts stream
-- keys[6] = dead-letter stream   keys[7] = a posting set key   keys[8] = a twin group key   keys[9] = {N}:expiry
-- args[1] = consumer group
--
-- Returns a flat list: 'denied', command, key (or ''), ... and 'type', key, the type it must be, ...
local function preflight(keys, args)
  local out = {}
  if redis.acl_check_cmd then  -- (Redis 7; fakeredis has no ACL)
    local g = args[1]
    local checks = {
      {'HGET', keys[1], 'f'}, {'HSET', keys[1], 'f', 'v'}, {'HGETALL', keys[1]}, {'EXISTS', keys[1]},
      {'HGET', keys[2], 'i'}, {'HMGET', keys[2], 'i'}, {'HSET', keys[2], 'i', 'v'}, {'HDEL', keys[2], 'i'},
      {'XADD', keys[3], '*', 'f', 'v'}, {'XRANGE', keys[3], '-', '+'},
      {'XACK', keys[4], g, '0-1'}, {'XPENDING', keys[4], g, '-', '+', '1'},
      {'XADD', keys[5], 'MAXLEN', '~', '1', '*', 'f', 'v'}, {'XADD', keys[6], 'MAXLEN', '~', '1', '*', 'f', 'v'},
      {'SADD', keys[7], 'i'}, {'SREM', keys[7], 'i'}, {'SMEMBERS', keys[7]}, {'SUNION', keys[7], keys[7]},
      {'SINTER', keys[7], keys[7]},
      {'ZADD', keys[8], '0', 'i'}, {'ZREM', keys[8], 'i'}, {'ZRANGE', keys[8], '0', '0'}, {'ZCARD', keys[8]},
      {'DEL', keys[8]},
      {'ZADD', keys[9], '0', 'i'}, {'ZREM', keys[9], 'i'}, {'ZSCORE', keys[9], 'i'},
      {'TIME'},
    }
    for i = 1, #checks do
      local check = checks[i]
      if not redis.acl_check_cmd(unpack(check)) then
        out[#out + 1] = 'denied'
        out[#out + 1] = check[1]
        out[#out + 1] = check[2] or ''
      end
    end
  end
  -- The keys written after a call's first write (probed with commands a worker's user has: TYPE is not among them),
  -- and {N}:fp: read before anything is written, so a call fails whole, but every call does, and each entry of the
  -- stream would end as poison.
  local probes = {{'XLEN', keys[3], 'stream'}, {'XLEN', keys[5], 'stream'}, {'XLEN', keys[6], 'stream'},
                  {'ZCARD', keys[9], 'sorted set'}, {'HLEN', keys[2], 'hash'}}
  for i = 1, #probes do
    local reply = redis.pcall(probes[i][1], probes[i][2])
    if type(reply) == 'table' and reply.err and string.find(tostring(reply.err), 'WRONGTYPE', 1, true) then
      out[#out + 1] = 'type'
      out[#out + 1] = probes[i][2]
      out[#out + 1] = probes[i][3]
    end
  end
  return out
end

-- Write the index's meta on first use; report what is there.
--
-- keys[1] = {N}:meta   args[1] = layout tag   args[2 ..] = the other meta field, value pairs
--
-- Returns the stored layout tag (the new one when this call wrote it), or '' when the key holds a hash
-- without a layout (not an index of ours).
local function ensure_meta(keys, args)
  local current = redis.call('HGET', keys[1], 'layout')
  if current then return current end
  -- a meta holding only `changes_trimmed_to` is ours: an earlier version's trim wrote it into a namespace a restart
  -- without persistence had emptied
  local fields = redis.call('HLEN', keys[1])  -- (HLEN and HGET: commands the worker's user has; HKEYS is not)
  if fields > 1 or (fields == 1 and not redis.call('HGET', keys[1], 'changes_trimmed_to')) then return '' end
  redis.call('HSET', keys[1], 'layout', args[1], unpack(slice(args, 2, #args)))
  -- an index of no incidents has no posting set to bound (meta.lua's posting_bound); a meta re-created beside
  -- incidents (deleted by hand), or beside an {N}:fp of another type (which preflight then names), leaves the bound
  -- unknown: its searches read their sets' sizes
  if redis.pcall('HLEN', string.sub(keys[1], 1, -5) .. 'fp') == 0 then
    redis.call('HSET', keys[1], 'posting_bound', 0)
  end
  return args[1]
end

-- Raise {N}:meta's posting_bound (meta.lua) to `size`, the largest posting set a bulk load wrote, when the index has
-- one. keys[1] = {N}:meta   args[1] = size
local function raise_posting_bound(keys, args)
  local bound, size = tonumber(redis.call('HGET', keys[1], 'posting_bound')), tonumber(args[1])
  if bound and size and size > bound then redis.call('HSET', keys[1], 'posting_bound', size) end
  return bound and math.max(bound, size or 0) or false
end

-- (allow-oom: it writes a few fields, once; a worker restarted while Redis is full must get to its upkeep)
register('ensure_meta', ensure_meta, {'allow-oom'})
register('raise_posting_bound', raise_posting_bound)
register('preflight', preflight, {'no-writes'})
-- Which run of the server this is (server_run): verify compares it before and after its walk, whose SCAN cursors
-- are only good in one server process. keys[1] = {N}:meta (unused: it routes the call to the index's node)
register('server_run', function() return server_run() end, {'no-writes'})
