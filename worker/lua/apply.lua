-- apply.lua: the apply step, one atomic call per event: check, search (or validate a snapshot's claim), index,
-- log the change, publish the alert and acknowledge the entry. Registers `apply` and `apply_batch` (several apply
-- calls in one FCALL, for the snapshot path).

--- @include "base"
--- @include "meta"
--- @include "search"
--- @include "snapshot"
--- @include "apply_context"
--- @include "groups"
--- @include "alert_json"
--- @include "fitness"

-- Append to `out` the keys of a call numbered first .. last that it has (1 .. nk), keys[ko + i] for its key i: the
-- keys of a call of apply_batch are read in place, in the FCALL's keys (ko = the keys of the calls before it), not
-- copied to a table of their own first; what slice gives from a table of the call's keys alone.
local function call_keys(out, keys, ko, nk, first, last)
  for i = first, last do
    if i >= 1 and i <= nk then
      local key = keys[ko + i]
      if key ~= nil then out[#out + 1] = key end
    end
  end
  return out
end

-- Add, upsert or delete one incident; in stream mode also publish its alert and acknowledge its entry.
--
-- KEYS, in this order (worker/library.py's ApplyKeys names the same, in the same order: a test holds them equal).
-- A name ending in ... is a list of keys, as many as the count in ARGV says.
--   [1] meta            {N}:meta
--   [2] fingerprints    {N}:fp
--   [3] changes         {N}:changes (a stream: one entry <op> <ID> a change)
--   [4] events          the events stream
--   [5] alerts          the alerts stream
--   [6] new_group       {N}:twins:<new fingerprint> (delete: of the expected one)
--   [7] old_group       {N}:twins:<the fingerprint the client expects to replace> (add, or none expected: new_group)
--   [8] expiry          {N}:expiry (retention bookkeeping: scored with the server's time on add and upsert while
--                       retention is on, see retention_on; the incident leaves it on delete)
--   new_postings...     n_new keys: the new fingerprint's posting keys, band 0 first
--   old_postings...     n_old keys: the posting keys of the fingerprint the client expects to replace, band 0 first
--   probes...           the other probe keys of the new fingerprint
--   target_new...       while a migration builds another layout (ARGV migration): the new fingerprint's posting keys
--                       in it, n_target of them when n_new > 0 (none otherwise)
--   target_old...       then those of the fingerprint the client expects to replace, n_target when n_old > 0
-- The groups of the matches found are read under the prefix of new_group (all in the index's hash tag): their names
-- depend on fingerprints that only the server knows.
--
-- ARGV, in this order (worker/library.py's ApplyArgs, likewise). The optional parts a call may carry (a snapshot's
-- claim, a migration) travel packed, one value each; only the snapshot's listed matches, which can be many, are a
-- list of their own, last, read in place (decoding them from one value would cost each event).
--   [1] op              add | upsert | delete
--   [2] incident_id     the incident's ID
--   [3] fingerprint     the new fingerprint (hex; '' for delete)
--   [4] expected        the fingerprint the client expects stored now: hex, '-' for none, '*' for "any" (add)
--   [5] layout_tag      must equal {N}:meta's `layout`
--   [6] max_distance    the layout's max distance
--   [7] n_new           how many new_postings
--   [8] n_old           how many old_postings
--   [9] group           consumer group ('' = library mode: no acknowledgement, no alert)
--   [10] entry_id       the stream entry's ID
--   [11] alerts_maxlen  approximate MAXLEN of the alerts stream (0 = no trimming)
--   [12] limits         '<max_matches> <max_candidates> <max_replied>': most matches to list (0 = all), the
--                       per-event budget, most representatives a search verifies (0 = no bound; see find_matches),
--                       and most of the listed matches the reply repeats (the alert lists max_matches; a stream
--                       worker reads only the few its log line names); without max_replied: all of them;
--                       '<max_matches>' alone: no bound either
--   [13] probed         how many of new_postings (band 0 first) are probed too; the rest are only written
--   [14] alert_text     text to publish in the alert's `text` field ('' = none)
--   [15] tokenizer      tokenizer version of a text incident ('' for a bag): refused (error TOKENIZER) when it
--                       differs from {N}:meta's `tokenizer`; recorded there by the first call that indexes a text
--   [16] snapshot       '' (search the postings here), or a snapshot's claim '<position> <count> <complete>': its
--                       position in {N}:changes, its match count, and 1 when it listed every match, else 0, or 2
--                       when its search was cut at the budget (see validate_snapshot)
--   [17] migration      '' (none), or '<n_target> <layout tag>': the layout a migration is building, which this
--                       call writes too (it must equal {N}:meta's `building`, refused with MIGRATION otherwise),
--                       and its posting keys per fingerprint
--   [18] alert_extra    '' (nothing), or '<opens><fields>': opens 1 to publish an alert for an incident that opens
--                       a group too (match_count 0, opens_group 1), else 0; then event fields copied into the alert,
--                       each name and value as '<bytes>:<text>' (see parse_alert_extra)
--   listed...           the snapshot's listed matches: id, d, ... (none without a snapshot); or one argument, the
--                       listing as its alert's JSON with where each match starts (claim_json.lua)
--
-- Returns {status, match_count, candidates_verified, alert_entry_id_or_'', id1, d1, id2, d2, ...} where status is
-- indexed | repeat | duplicate | stale | deleted | absent | not_pending | unvalidated (| deferred: see apply_batch);
-- indexed and repeat put the incident's group after the alert entry: {status, match_count, candidates, alert, group ID, group size, id1, d1,
-- ...}, so that a caller of the Python API needs no group_of (the alert's group_id and group_size). Only indexed, repeat,
-- deleted and absent acknowledge the entry; duplicate, stale, not_pending and unvalidated change nothing.
-- candidates_verified counts the representatives read, never their twins (on the snapshot path: the changes
-- validated). match_count is '<n>+' when the search was cut at the budget (budget_count): the alert then carries
-- `incomplete` 1, and n, its match_count, is a lower bound.
--
-- apply_at runs the call whose keys are keys[ko + 1 .. ko + nk] and arguments args[ao + 1 .. ao + na] (apply_batch's
-- calls, in place); apply, a call of its own, is apply_at with all of them.
local ARGS = 18  -- the arguments before `listed`

-- apply's alert_extra: whether an incident that opens a group gets an alert, and the event fields to copy (a flat
-- list name, value, ...); nil when it is malformed.
local function parse_alert_extra(s)
  local fields = {}
  if s == '' then return false, fields end
  local opens = string.sub(s, 1, 1)
  if opens ~= '0' and opens ~= '1' then return nil end
  local pos, n = 2, #s
  while pos <= n do
    local colon = string.find(s, ':', pos, true)
    local len = colon and tonumber(string.sub(s, pos, colon - 1))
    if not len or colon + len > n then return nil end
    fields[#fields + 1] = string.sub(s, colon + 1, colon + len)
    pos = colon + len + 1
  end
  if #fields % 2 == 1 then return nil end
  return opens == '1', fields
end

local function apply_at(keys, ko, nk, args, ao, na, context)
  local meta_key, fp_key, changes_key = keys[ko + 1], keys[ko + 2], keys[ko + 3]
  local events_key, alerts_key = keys[ko + 4], keys[ko + 5]
  local new_group, old_group, expiry_key = keys[ko + 6], keys[ko + 7], keys[ko + 8]
  local op, id, fp, expected = args[ao + 1], args[ao + 2], args[ao + 3], args[ao + 4]
  local limit, n_new, n_old = tonumber(args[ao + 6]), tonumber(args[ao + 7]), tonumber(args[ao + 8])
  local group, entry_id = args[ao + 9], args[ao + 10]
  local alerts_maxlen = tonumber(args[ao + 11])
  local cap, budget, replied = string.match(args[ao + 12], '^(%d+) (%d+) (%d+)$')
  if not cap then cap, budget = string.match(args[ao + 12], '^(%d+) (%d+)$') end
  if cap then
    cap, budget, replied = tonumber(cap), tonumber(budget), tonumber(replied)
  else
    cap, budget = tonumber(args[ao + 12]), 0
  end
  local streaming = group ~= ''
  local FIRST = 9

  -- the packed parts, read before anything is written
  local position, claimed, complete, cut, holder = '', 0, false, false, nil
  local snapshot = args[ao + 16] or ''
  if snapshot ~= '' then
    local count, all, rest
    position, count, all, rest = string.match(snapshot, '^(%S+) (%d+) ([012])()')
    local held_by = position and string.sub(snapshot, rest, rest + 1)
    if not position or not (held_by == '' or held_by == ' 0' or held_by == ' 1') or
        (held_by ~= ' 1' and #snapshot > rest + 1) then
      return redis.error_reply('ERR apply: snapshot "' .. string.sub(snapshot, 1, 80) ..
        '" is not "<position> <count> <0, 1 or 2>", then " 0" or " 1<ID>" or nothing')
    end
    claimed, complete, cut = tonumber(count), all == '1', all == '2'
    if held_by == ' 1' then
      holder = string.sub(snapshot, rest + 2)
    elseif held_by == ' 0' then
      holder = false
    end
  end
  local building, n_target = '', 0
  local migration = args[ao + 17] or ''
  if migration ~= '' then
    local n
    n, building = string.match(migration, '^(%d+) (.+)$')
    if not n then
      return redis.error_reply('ERR apply: migration "' .. migration .. '" is not "<n_target> <layout tag>"')
    end
    n_target = tonumber(n)
  end
  local open_alerts, extra_fields = parse_alert_extra(args[ao + 18] or '')
  if open_alerts == nil then
    return redis.error_reply('ERR apply: alert_extra "' .. string.sub(args[ao + 18], 1, 80) ..
      '" is not "<0 or 1>" followed by "<bytes>:<text>" names and values')
  end

  local meta = meta_of(context, meta_key)
  local refused = layout_refusal(meta_key, meta.layout, args[ao + 5])
  if refused then return refused end
  -- a migration's target layout, written beside the current one (see check_building)
  refused = building_refusal(meta_key, meta.building, building)
  if refused then return refused end
  local t_new = n_new > 0 and n_target or 0
  local t_old = n_old > 0 and n_target or 0
  local LAST_PROBE = nk - t_new - t_old
  local tokenizer = args[ao + 15] or ''
  if tokenizer ~= '' and meta.tokenizer and meta.tokenizer ~= tokenizer then
    return redis.error_reply('TOKENIZER the text incidents of ' .. meta_key .. ' were made by tokenizer version ' ..
      meta.tokenizer .. ', not ' .. tokenizer .. '; run workers of that version, or use a new namespace')
  end
  if streaming and not entry_pending(context, events_key, group, entry_id) then
    return {'not_pending', 0, 0, ''}
  end

  local old = stored_fp(context, fp_key, id)
  if expected ~= '*' and (old or '-') ~= expected then
    return {'stale', 0, 0, ''}
  end

  if op == 'delete' then
    if not old then
      if streaming then ack_entry(context, events_key, group, entry_id) end
      return {'absent', 0, 0, ''}
    end
    unindex(id, old_group, call_keys(call_keys({}, keys, ko, nk, FIRST + n_new, FIRST - 1 + n_new + n_old),
                                     keys, ko, nk, LAST_PROBE + t_new + 1, nk))
    redis.call('HDEL', fp_key, id)
    stored_now(context, fp_key, id, false)
    redis.call('ZREM', expiry_key, id)
    group_leave(context_group_keys(context, meta_key), fp_key, id)
    log_change(context, changes_key, op, id, '', old)
    if streaming then ack_entry(context, events_key, group, entry_id) end
    return {'deleted', 0, 0, ''}
  end

  -- an add or upsert, a repeat of the stored fingerprint included, starts the incident's retention window again
  if old == fp then
    if retention_window(meta.retention_ms) then redis.call('ZADD', expiry_key, now_ms(), id) end
    if streaming then ack_entry(context, events_key, group, entry_id) end
    local gk = context_group_keys(context, meta_key)
    local label = group_label(gk, id)
    return {'repeat', 0, 0, '', label, group_size(gk, label)}
  end
  if old and op == 'add' then
    return {'duplicate', 0, 0, old}
  end

  -- A snapshot's claim is validated before anything is written: `unvalidated` must change nothing.
  local verified, matched, flat, twin, held, changed_holder, matches_json
  local n_listed = na > ARGS and na - ARGS or 0
  if position ~= '' then
    verified, matched, flat, held, changed_holder, matches_json = validate_snapshot(context, meta_key, changes_key, fp,
      limit, id, cap, position, claimed, args, ao + ARGS, n_listed, complete, cut, replied)
    if not verified then return {'unvalidated', 0, 0, ''} end
  end

  -- Nothing refuses from here on. An upsert takes its old self out first: it never matches itself, and a
  -- representative leaving hands its postings to a twin, which then matches like any other incident.
  local gk = context_group_keys(context, meta_key)
  if old then
    unindex(id, old_group, call_keys(call_keys({}, keys, ko, nk, FIRST + n_new, FIRST - 1 + n_new + n_old),
                                     keys, ko, nk, LAST_PROBE + t_new + 1, nk))
    group_leave(gk, fp_key, id)  -- an upsert's group is decided again, as an add's is
  end

  if position == '' then
    local probes = call_keys({}, keys, ko, nk, FIRST, FIRST - 1 + (tonumber(args[ao + 13]) or n_new))
    call_keys(probes, keys, ko, nk, FIRST + n_new + n_old, LAST_PROBE)
    local twin_prefix = string.sub(new_group, 1, -17)
    verified, matched, flat, twin, cut = find_matches(fp_key, twin_prefix, probes, fp, limit, cap, budget,
                                                      meta.posting_bound)
    if cut and not twin then
      twin = representative_of(fp_key, new_group, fp, call_keys({}, keys, ko, nk, FIRST, FIRST - 1 + n_new))
    end
  elseif holder ~= nil then
    -- the copy said who held `fp` at its position: see claimed_twin
    twin = claimed_twin(context, fp_key, id, fp, holder, changed_holder)
    if twin == nil then
      twin = representative_of(fp_key, new_group, fp, call_keys({}, keys, ko, nk, FIRST, FIRST - 1 + n_new))
    end
  elseif not surely_unheld(held, claimed, args, ao + ARGS, n_listed) then
    -- (the common case, a fingerprint nobody holds, needs no read: see surely_unheld)
    twin = representative_of(fp_key, new_group, fp, call_keys({}, keys, ko, nk, FIRST, FIRST - 1 + n_new))
  end

  -- the first text incident indexed records its tokenizer (a text event that indexes nothing records nothing: an
  -- index of bags stays open to workers of any tokenizer version)
  if tokenizer ~= '' and not meta.tokenizer then
    redis.call('HSET', meta_key, 'tokenizer', tokenizer)
    meta.tokenizer = tokenizer
  end
  local postings = call_keys(call_keys({}, keys, ko, nk, FIRST, FIRST - 1 + n_new),
                             keys, ko, nk, LAST_PROBE + 1, LAST_PROBE + t_new)
  index_one(id, twin, new_group, postings)
  if not twin then  -- (added to its posting sets: see meta.lua's posting_bound)
    if position == '' then raise_bound(meta_key, postings, meta) else drop_bound(meta_key, meta) end
  end
  redis.call('HSET', fp_key, id, fp)
  stored_now(context, fp_key, id, fp)
  if retention_window(meta.retention_ms) then redis.call('ZADD', expiry_key, now_ms(), id) end
  log_change(context, changes_key, op, id, fp, old or '')
  -- its group: the closest match's (flat's first on both read paths: sorted by distance, then ID), or its own
  local label, size
  if matched > 0 then
    label, size = group_join(gk, id, flat[1])
  else
    label, size = group_open(gk, meta_key, fp_key, id)
  end

  local alert_id = ''
  if streaming then
    if matched > 0 or open_alerts then
      local fields = {'incident_id', id, 'fingerprint', fp, 'matches', matches_json or matches_json_within(flat),
                      'match_count', matched, 'max_distance', limit, 'source_entry', entry_id, 'op', op,
                      'group_id', label, 'group_size', size}
      if matched == 0 then
        fields[#fields + 1] = 'opens_group'
        fields[#fields + 1] = 1
      end
      local text = args[ao + 14] or ''
      if text ~= '' then
        fields[#fields + 1] = 'text'
        fields[#fields + 1] = text
      end
      if cut then
        fields[#fields + 1] = 'incomplete'
        fields[#fields + 1] = '1'
      end
      for i = 1, #extra_fields do fields[#fields + 1] = extra_fields[i] end
      if alerts_maxlen > 0 then
        alert_id = redis.call('XADD', alerts_key, 'MAXLEN', '~', alerts_maxlen, '*', unpack(fields))
      else
        alert_id = redis.call('XADD', alerts_key, '*', unpack(fields))
      end
    end
    ack_entry(context, events_key, group, entry_id)
  end
  local reply = {'indexed', budget_count(matched, cut), verified, alert_id, label, size}
  -- (a claim's own head keeps its distances as sent: numbers here, as every reply gives them)
  local n_replied = #flat
  if replied and 2 * replied < n_replied then n_replied = 2 * replied end
  for i = 1, n_replied, 2 do reply[6 + i], reply[7 + i] = flat[i], distance_number(flat[i + 1]) end
  return reply
end

local function apply(keys, args)
  local refused = #keys >= 8 and (args[9] or '') ~= '' and unfit(keys, 0, #keys)  -- (a stream call)
  return refused or apply_at(keys, 0, #keys, args, 0, #args, {})
end

-- Several apply calls in one FCALL, run in order, each exactly as the apply function runs it; for the snapshot path,
-- whose calls of one send share their position in {N}:changes: the changes after it are read from the log once, and
-- each call's own change is added to what the later calls validate (see changes_after).
--
-- keys = the keys of every call, one call's after the other's
-- args[1] = n, the number of calls   args[2 .. 2n+1] = each call's number of keys and of arguments, in turn
-- args[2n+2 ..] = the arguments of every call, one call's after the other's
--
-- Returns one reply per call, in order: what apply returns, or the error it met (as an error reply in the array;
-- the calls after it still run, as separate calls would). After a call that changed nothing to be applied again
-- (unvalidated, stale), the later calls answer `deferred` and change nothing: the worker applies them after it, in
-- stream order. A batch of stream calls its user could not finish (fitness.lua) is refused whole, with UNFIT.
local function apply_batch(keys, args)
  local n, refused = batch_shape(keys, args)  -- then, for stream calls, the first call's keys and group (fitness.lua)
  if n and tonumber(args[2]) >= 8 and (args[2 * n + 10] or '') ~= '' then
    refused = unfit(keys, 0, tonumber(args[2]))
  end
  if refused then return refused end
  local context = {}
  local replies = {}
  if n > 1 then prefetch(context, keys, args, n) end
  local k, a = 0, 1 + 2 * n
  -- each call's fingerprint (its third argument), for the validation's window (register_queries)
  local queries = {}
  for i = 1, n do
    queries[i] = args[a + 3]
    a = a + (tonumber(args[2 * i + 1]) or 0)
  end
  register_queries(context, queries)
  a = 1 + 2 * n
  local deferring = false
  for i = 1, n do
    local nk, na = tonumber(args[2 * i]), tonumber(args[2 * i + 1])
    local ok, reply
    if deferring then
      ok, reply = true, {'deferred', 0, 0, ''}
    elseif nk >= 8 and na >= ARGS then  -- (batch_shape checked that the counts fit)
      -- the call's keys and arguments read in place (every one it reads is its own: see apply_at, call_keys)
      ok, reply = pcall(apply_at, keys, k, nk, args, a, na, context)
    else
      local call_keys_of, call_args_of = slice(keys, k + 1, k + nk), slice(args, a + 1, a + na)
      ok, reply = pcall(apply_at, call_keys_of, 0, #call_keys_of, call_args_of, 0, #call_args_of, context)
    end
    if not ok then reply = {err = type(reply) == 'table' and reply.err or 'ERR ' .. tostring(reply)} end
    replies[i] = reply
    deferring = deferring or reply[1] == 'unvalidated' or reply[1] == 'stale'
    k, a = k + nk, a + na
  end
  flush_acks(context)
  return replies
end

register('apply', apply)
register('apply_batch', apply_batch)
