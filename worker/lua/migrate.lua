-- migrate.lua: moving a live index to another layout (`incident-worker migrate`): start, build, switch, abort and
-- the removal of the postings no longer used.

--- @include "base"
--- @include "meta"

-- Moving a live index to another layout (docs/contract.md, "Moving to another layout"; worker/migrate.py drives it).
-- {N}:migration holds the move's state: building (the target's postings are built from {N}:fp in bounded batches
-- while every apply call writes both layouts), built (the pass over {N}:fp is done), cleaning (switched: the source's
-- postings are being removed) or aborting (the target's are). Each step below is atomic and checks the state and the
-- cursor its caller started from, so a migrator that crashed resumes from the stored cursor, and a second migrator
-- running at the same time is refused instead of racing the first.

local function migration_refused(migration_key, why)
  return redis.error_reply('MIGRATION ' .. migration_key .. ': ' .. why)
end

-- Start a move, or report the one under way.
--
-- keys[1] = {N}:meta   keys[2] = {N}:migration   keys[3] = {N}:fp
-- args[1] = the source layout tag (must be {N}:meta's `layout`)   args[2] = the target layout tag
-- args[3 ..] = the migration's other field, value pairs (generation, prefixes, the target's meta fields, ...)
--
-- Returns the migration hash as field, value pairs: the one already under way, if any (the caller resumes it only
-- when its target is the same).
local function migrate_start(keys, args)
  local existing = redis.call('HGETALL', keys[2])
  if #existing > 0 then return existing end
  local refused = check_layout(keys[1], args[1])
  if refused then return refused end
  if redis.call('HEXISTS', keys[1], 'building') == 1 then
    return migration_refused(keys[2], 'missing while ' .. keys[1] .. ' says a layout is being built; run migrate --abort')
  end
  redis.call('HSET', keys[2], 'state', 'building', 'source', args[1], 'target', args[2], 'cursor', '0',
             'run', server_run(), 'visited', 0, 'written', 0, 'removed', 0, 'total', redis.call('HLEN', keys[3]),
             'started_at', now_ms(), unpack(slice(args, 3, #args)))
  -- from here on every apply call writes the target too (check_building)
  redis.call('HSET', keys[1], 'building', args[2])
  return redis.call('HGETALL', keys[2])
end

-- One batch of the build: each incident whose fingerprint is still the one the caller read, and which is its
-- fingerprint's representative in the source layout (in its band-0 posting set), is added to its target postings.
-- An incident changed since the caller read it was written to both layouts by that change.
--
-- keys[1] = {N}:meta   keys[2] = {N}:migration   keys[3] = {N}:fp
-- keys[4 ..] = per incident, 1 + n keys: its source band-0 posting key, then its n target posting keys
-- args[1] = target layout tag   args[2] = n   args[3] = the cursor this batch starts from (must be the stored one)
-- args[4] = the cursor after it ('0': the pass over {N}:fp is complete)   args[5 ..] = per incident: ID, fingerprint
--
-- Returns {written, visited}.
local function migrate_build(keys, args)
  local m = redis.call('HMGET', keys[2], 'state', 'target', 'cursor')
  if m[1] ~= 'building' or m[2] ~= args[1] then
    return migration_refused(keys[2], 'not building "' .. args[1] .. '" (state ' .. tostring(m[1]) .. ')')
  end
  if m[3] ~= args[3] then
    return migration_refused(keys[2], 'its cursor moved on to ' .. m[3] .. ': another migrator is running')
  end
  local n = tonumber(args[2])
  local written, visited, k = 0, 0, 4
  local meta = {posting_bound = tonumber(redis.call('HGET', keys[1], 'posting_bound'))}  -- (see meta.lua)
  for i = 5, #args, 2 do
    local id, hex = args[i], args[i + 1]
    visited = visited + 1
    if redis.call('HGET', keys[3], id) == hex and redis.call('SISMEMBER', keys[k], id) == 1 then
      for j = 1, n do redis.call('SADD', keys[k + j], id) end
      raise_bound(keys[1], slice(keys, k + 1, k + n), meta)
      written = written + 1
    end
    k = k + 1 + n
  end
  -- (HMGET and HSET, not HINCRBY: the worker's least-privilege user may run this too, deploy/redis/users.acl)
  local counts = redis.call('HMGET', keys[2], 'visited', 'written', 'run')
  -- the pass is only complete when one run of the server gave all of its cursors (see server_run); otherwise it starts
  -- again from 0 (what this batch wrote stays right: each incident was checked above)
  local next_cursor = counts[3] == server_run() and args[4] or '0'
  redis.call('HSET', keys[2], 'cursor', next_cursor, 'run', server_run(),
             'visited', (tonumber(counts[1]) or 0) + visited, 'written', (tonumber(counts[2]) or 0) + written)
  if next_cursor == '0' and counts[3] == server_run() then
    redis.call('HSET', keys[2], 'state', 'built', 'built_at', now_ms())
  end
  return {written, visited}
end

-- The switch: {N}:meta takes the target layout in one step; from then on every call of the source layout is refused
-- (LAYOUT) and its worker takes the new layout from the meta. The source's postings are left for migrate_remove.
--
-- keys[1] = {N}:meta   keys[2] = {N}:migration
-- args[1] = target layout tag   args[2 ..] = {N}:meta field, value pairs of the target (bands, generation, ...)
--
-- Returns 'switched', or 'already' when an earlier call switched.
local function migrate_switch(keys, args)
  local m = redis.call('HMGET', keys[2], 'state', 'target', 'source', 'source_prefix')
  if m[2] ~= args[1] then return migration_refused(keys[2], 'not moving to "' .. args[1] .. '"') end
  if m[1] == 'cleaning' then return 'already' end
  if m[1] ~= 'built' then
    return migration_refused(keys[2], 'the target is not built yet (state ' .. tostring(m[1]) .. ')')
  end
  local refused = check_layout(keys[1], m[3])
  if refused then return refused end
  -- {N}:meta deleted mid-move (and re-created by a worker) or edited: calls made since wrote the source layout only,
  -- and their incidents are missing from the target. Refused: the move must be made again.
  if redis.call('HGET', keys[1], 'building') ~= args[1] then
    return migration_refused(keys[2], keys[1] .. ' no longer names this move\'s target in `building` (deleted or ' ..
      'edited during the move): incidents indexed since are missing from the target. Run `incident-worker ' ..
      'migrate --abort`, then start the move again')
  end
  local previous = redis.call('HGET', keys[1], 'previous_layouts')
  redis.call('HSET', keys[1], 'layout', args[1], 'previous_layouts', m[3] .. (previous and (' ' .. previous) or ''),
             unpack(slice(args, 2, #args)))
  redis.call('HDEL', keys[1], 'building')
  redis.call('HSET', keys[2], 'state', 'cleaning', 'cursor', '0', 'run', server_run(), 'removing', m[4],
             'switched_at', now_ms())
  return 'switched'
end

-- Abort a move before its switch: {N}:meta stops naming the target (so no call writes it any more), and the target's
-- postings are left for migrate_remove.
--
-- keys[1] = {N}:meta   keys[2] = {N}:migration
--
-- Returns the state after the call: 'aborting', or '' when no move is under way.
local function migrate_abort(keys, args)
  local m = redis.call('HMGET', keys[2], 'state', 'target_prefix')
  if not m[1] then return '' end
  if m[1] == 'cleaning' then
    return migration_refused(keys[2], 'the index already switched to the new layout; it can no longer be aborted ' ..
      '(run migrate again to finish removing the old postings)')
  end
  if m[1] ~= 'aborting' then
    redis.call('HDEL', keys[1], 'building')
    redis.call('HSET', keys[2], 'state', 'aborting', 'cursor', '0', 'run', server_run(), 'removing', m[2],
               'aborted_at', now_ms())
  end
  return 'aborting'
end

-- One batch of removing the postings of the layout that is no longer used (the source after the switch, the target
-- after an abort). Only keys that start with the migration's `removing` prefix followed by a band number are
-- removed; any other key passed is left alone. The batch that ends the pass removes {N}:migration and records the
-- move in {N}:meta's `last_migration`.
--
-- keys[1] = {N}:meta   keys[2] = {N}:migration   keys[3 ..] = posting keys to remove
-- args[1] = state (cleaning | aborting)   args[2] = the cursor this batch starts from (must be the stored one)
-- args[3] = the cursor after it ('0': the pass is complete)
--
-- Returns {removed, done (0/1)}.
local function migrate_remove(keys, args)
  local m = redis.call('HMGET', keys[2], 'state', 'cursor', 'removing', 'source', 'target')
  if m[1] ~= args[1] then
    return migration_refused(keys[2], 'not ' .. args[1] .. ' (state ' .. tostring(m[1]) .. ')')
  end
  if m[2] ~= args[2] then
    return migration_refused(keys[2], 'its cursor moved on to ' .. m[2] .. ': another migrator is running')
  end
  local prefix, removed = m[3], 0
  for i = 3, #keys do
    local key = keys[i]
    if string.sub(key, 1, #prefix) == prefix and string.find(key, '^%d', #prefix + 1) then
      removed = removed + redis.call('UNLINK', key)
    end
  end
  -- a pass of SCAN cursors from another run of the server skipped keys (see server_run): it starts again from 0
  local same_run = redis.call('HGET', keys[2], 'run') == server_run()
  if args[3] ~= '0' or not same_run then
    local before = tonumber(redis.call('HGET', keys[2], 'removed')) or 0
    redis.call('HSET', keys[2], 'cursor', same_run and args[3] or '0', 'run', server_run(), 'removed', before + removed)
    return {removed, 0}
  end
  local done = m[1] == 'cleaning' and 'moved from ' or 'aborted, stayed at '
  redis.call('HSET', keys[1], 'last_migration', done .. m[4] .. (m[1] == 'cleaning' and ' to ' or ' instead of ') ..
             m[5] .. ' at ' .. now_ms())
  redis.call('DEL', keys[2])
  return {removed, 1}
end

register('migrate_start', migrate_start)
register('migrate_build', migrate_build)
register('migrate_switch', migrate_switch)
register('migrate_abort', migrate_abort)
register('migrate_remove', migrate_remove)
