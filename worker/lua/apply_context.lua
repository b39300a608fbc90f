-- apply_context.lua: what the apply calls of one FCALL share (their `context`): whether their entries are
-- pending and what {N}:fp holds for their incidents, read for all of them at once (prefetch), and their
-- acknowledgements, sent with one XACK at the end; and the check that a batch's counts describe its calls.

--- @include "base"

-- What the calls of one apply_batch each read first, read for all of them at once (see prefetch below) and kept in
-- their `context`: `pending[entry ID]` true for an entry known to be pending in `pending_stream`'s `pending_group`,
-- and `stored[ID]` the value {N}:fp (`stored_key`) holds for an incident (false: none). Only the batch's own calls
-- change either while it runs (an entry leaves the pending list only when acknowledged, {N}:fp changes only by
-- HSET and HDEL, and no other command runs meanwhile), and each notes its change as it makes it. A call that finds
-- nothing here reads for itself, as a call of its own does.
local function entry_pending(context, events_key, group, entry_id)
  if context.acks and context.acked[entry_id] and context.pending_stream == events_key and
     context.pending_group == group then
    return false
  end
  if context.pending and context.pending[entry_id] and context.pending_stream == events_key and
     context.pending_group == group then
    return true
  end
  return is_pending(events_key, group, entry_id)
end

-- Acknowledge an entry. In an apply_batch whose calls share a stream and group (prefetch), the entries are
-- acknowledged together, with one XACK after the last call (nothing outside the FCALL sees the difference), and
-- meanwhile count as not pending to the later calls of the batch.
local function ack_entry(context, events_key, group, entry_id)
  if context.acks and context.pending_stream == events_key and context.pending_group == group then
    if not context.acked[entry_id] then
      context.acks[#context.acks + 1] = entry_id
      context.acked[entry_id] = true
    end
  else
    redis.call('XACK', events_key, group, entry_id)
  end
  if context.pending then context.pending[entry_id] = nil end
end

local function flush_acks(context)
  local acks = context.acks
  if not acks or #acks == 0 then return end
  for first = 1, #acks, CHUNK do
    local last = first + CHUNK - 1
    if last > #acks then last = #acks end
    redis.call('XACK', context.pending_stream, context.pending_group, unpack(acks, first, last))
  end
end

local function stored_fp(context, fp_key, id)
  if context.stored_key == fp_key then
    local value = context.stored[id]
    if value ~= nil then return value end
  end
  return redis.call('HGET', fp_key, id)
end

local function stored_now(context, fp_key, id, value)
  if context.stored_key == fp_key then context.stored[id] = value end
end

-- Fill `context` with what the calls of a batch read first (see entry_pending): whether their entries are pending,
-- from one XPENDING of the range of entry IDs they span (an entry not among its rows, not pending or past the rows
-- asked for when other consumers' entries share the range, is asked about again by its call), and their incidents'
-- stored fingerprints, with one HMGET.
-- Only when every call names the same {N}:fp, events stream and group; on any error it leaves `context` as it was
-- (each call then meets that error itself, as separate calls would).
local function prefetch(context, keys, args, n)
  local fp_key, events_key, group = nil, nil, nil
  local ids, entries = {}, {}
  local k, a = 0, 1 + 2 * n
  for i = 1, n do
    local nk, na = tonumber(args[2 * i]), tonumber(args[2 * i + 1])
    if nk < 8 or na < 10 then return end
    local f, e, g = keys[k + 2], keys[k + 4], args[a + 9]
    if i == 1 then fp_key, events_key, group = f, e, g end
    if f ~= fp_key or e ~= events_key or g ~= group then return end
    ids[i], entries[i] = args[a + 2], args[a + 10]
    k, a = k + nk, a + na
  end
  local ok, stored = pcall(redis.call, 'HMGET', fp_key, unpack(ids))
  if not ok or type(stored) ~= 'table' then return end
  local known = {}
  for i = 1, n do known[ids[i]] = stored[i] end
  context.stored_key, context.stored = fp_key, known
  if group == '' then return end
  -- (as id_less compares them, each ID parsed once)
  local low, high = entries[1], entries[1]
  local ranged = pcall(function()
    local low_ms, low_seq = parse_id(low)
    local high_ms, high_seq = low_ms, low_seq
    for i = 2, n do
      local ms, seq = parse_id(entries[i])
      if parsed_less(ms, seq, low_ms, low_seq) then low, low_ms, low_seq = entries[i], ms, seq end
      if parsed_less(high_ms, high_seq, ms, seq) then high, high_ms, high_seq = entries[i], ms, seq end
    end
  end)
  if not ranged then return end
  local asked = 4 * n + 16
  local rows
  ok, rows = pcall(redis.call, 'XPENDING', events_key, group, low, high, asked)
  if not ok or type(rows) ~= 'table' then return end
  local pending = {}
  for i = 1, #rows do pending[rows[i][1]] = true end
  context.pending_stream, context.pending_group, context.pending = events_key, group, pending
  context.acks, context.acked = {}, {}
end

-- The number of calls of a batch and its keys' and arguments' counts, or nil and an error reply: checked before any
-- loop, so that each is bounded by the call's length (an FCALL of a few bytes, `1e15` calls, may not spin Redis).
local function batch_shape(keys, args)
  local n, n_keys, n_args = tonumber(args[1]), #keys, #args
  local problem
  if not n or n < 1 or n % 1 ~= 0 or 1 + 2 * n > n_args then
    problem = 'args[1] must be the number of calls, followed by each call\'s count of keys and of arguments'
  else
    local k, a = 0, 1 + 2 * n
    for i = 1, n do
      local nk, na = tonumber(args[2 * i]), tonumber(args[2 * i + 1])
      if not nk or not na or nk < 0 or na < 0 or nk % 1 ~= 0 or na % 1 ~= 0 then
        problem = 'call ' .. i .. '\'s counts of keys and arguments must be whole numbers'
        break
      end
      k, a = k + nk, a + na
    end
    if not problem and (k ~= n_keys or a ~= n_args) then
      problem = 'the calls\' counts add up to ' .. k .. ' keys and ' .. a .. ' arguments; the call has ' .. n_keys ..
        ' and ' .. n_args
    end
  end
  if problem then return nil, redis.error_reply('ERR apply_batch: ' .. problem) end
  return n
end
