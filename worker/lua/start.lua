-- start.lua: what a worker calls as it starts: the meta written on first use, the check of its permissions and of
-- the types of the keys it writes, and which run of the server this is.

--- @include "base"
--- @include "fitness"

-- The check of the worker's rights and keys at its start (fitness.lua's `unfit_for`, which every stream call of
-- apply and apply_batch repeats before its first write).
--
-- keys[1] = {N}:meta   keys[2] = {N}:fp   keys[3] = {N}:changes   keys[4] = events stream   keys[5] = alerts stream
-- keys[6] = dead-letter stream   keys[7] = a posting set key   keys[8] = a twin group key   keys[9] = {N}:expiry
-- args[1] = consumer group (unused: ACL checks a command's keys, not the group it names)
--
-- Returns a flat list: 'denied', command, key (or ''), ... and 'type', key, the type it must be, ...
local function preflight(keys, args)
  return unfit_for(keys[1], keys[2], keys[3], keys[4], keys[5], keys[6], keys[7], keys[8], keys[9])
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
