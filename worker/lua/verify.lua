-- verify.lua: `incident-worker verify`: each subject of the walk checked, and repaired if asked, in one atomic step.

--- @include "base"
--- @include "meta"

-- Integrity check and repair (`incident-worker verify`, docs/contract.md "Verifying and repairing the index").
--
-- The verifier walks the index in bounded batches and sends what it wants checked here, where each subject is read
-- and judged in one atomic step: what a running worker changed between the walk's read and this call is seen as it
-- is now, so a state a concurrent change explains is never reported, and a repair never undoes a worker's change.
-- The same code checks (verify_check, no writes) and repairs (verify_repair: a fix is made only where the check
-- finds a problem at that moment; {N}:fp, the source of truth, is only written for a fingerprint that is not 16
-- lowercase hex digits).

local HEX16 = '^[0-9a-f]+$'

local function is_fingerprint(value)
  return value ~= nil and #value == 16 and string.find(value, HEX16) ~= nil
end

-- The smallest ID of a list in byte order (nil for none).
local function first_id(ids)
  local best = nil
  for i = 1, #ids do
    if best == nil or bytes_less(ids[i], best) then best = ids[i] end
  end
  return best
end

-- One fingerprint's postings and twin group, judged from what can be read without a scan: the incidents in all of its
-- posting sets, the `candidates` given (those the walk met), and its group's members when it has at most two.
-- Incidents of the fingerprint outside all of these are judged when the walk meets them. Appends each finding to
-- `out` as kind, subject, fingerprint; with `repair`, fixes it in the same step.
--
-- The target, as the apply step keeps it: one representative in every posting set (the one already in all of them,
-- else the one in most, else the first in byte order), no other incident of the fingerprint in any of them, and a
-- group (score 0) of all incidents of the fingerprint when two or more share it, none when one does.
local function reconcile(fp_key, group, postings, fp, candidates, repair, out)
  local m = #postings
  local seen, holders, holding = {}, {}, {}
  local group_size = redis.call('ZCARD', group)
  local strays = 0
  local function consider(id, from_group)
    if seen[id] then return end
    seen[id] = true
    if redis.call('HGET', fp_key, id) == fp then
      holders[#holders + 1] = id
      holding[id] = true
    elseif from_group then
      -- a member of the group with another fingerprint, or none
      strays = strays + 1
      out[#out + 1] = 'twin_stray'
      out[#out + 1] = id
      out[#out + 1] = fp
      if repair then redis.call('ZREM', group, id) end
    end
  end
  for i = 1, #candidates do consider(candidates[i], false) end
  if group_size > 0 and group_size <= 2 then
    local members = redis.call('ZRANGE', group, 0, -1)
    for i = 1, #members do consider(members[i], true) end
  end
  local full = m == 1 and redis.call('SMEMBERS', postings[1]) or redis.call('SINTER', unpack(postings))
  local any_full = false
  for i = 1, #full do
    consider(full[i], false)
    if holding[full[i]] then any_full = true end
  end
  if not any_full and m > 1 then
    -- no incident of the fingerprint in all of its posting sets: one in some of them (a representative that lost
    -- a posting) is the one to complete, not a twin that the walk happened to meet first
    local some = redis.call('SUNION', unpack(postings))
    for i = 1, #some do consider(some[i], false) end
  end
  if #holders == 0 then return end
  group_size = group_size - strays

  local count, grouped = {}, {}
  local best_full, best_partial, best_count = {}, nil, 0
  for _, id in ipairs(holders) do
    local c = 0
    for i = 1, m do c = c + redis.call('SISMEMBER', postings[i], id) end
    count[id] = c
    grouped[id] = redis.call('ZSCORE', group, id) ~= false
    if c == m then
      best_full[#best_full + 1] = id
    elseif c > best_count or (c == best_count and c > 0 and bytes_less(id, best_partial)) then
      best_partial, best_count = id, c
    end
  end
  local rep = first_id(best_full) or best_partial or first_id(holders)

  local outside = 0
  for _, id in ipairs(holders) do
    if not grouped[id] then outside = outside + 1 end
  end
  local total = group_size + outside

  if count[rep] < m then
    out[#out + 1] = (count[rep] == 0 and total >= 2) and 'group_without_representative' or 'missing_postings'
    out[#out + 1] = rep
    out[#out + 1] = fp
    if repair then
      for i = 1, m do redis.call('SADD', postings[i], rep) end
      raise_bound(string.sub(fp_key, 1, -3) .. 'meta', postings)  -- ({N}:fp's {N}:meta: see meta.lua)
    end
  end
  for _, id in ipairs(holders) do
    if id ~= rep and count[id] > 0 then
      out[#out + 1] = count[id] == m and 'two_representatives' or 'extra_posting'
      out[#out + 1] = id
      out[#out + 1] = fp
      if repair then
        for i = 1, m do redis.call('SREM', postings[i], id) end
      end
    end
  end
  if total >= 2 then
    for _, id in ipairs(holders) do
      if not grouped[id] then
        out[#out + 1] = 'twin_not_grouped'
        out[#out + 1] = id
        out[#out + 1] = fp
        if repair then redis.call('ZADD', group, 0, id) end
      end
    end
  elseif group_size == 1 then
    out[#out + 1] = 'small_group'
    out[#out + 1] = group
    out[#out + 1] = fp
    if repair then redis.call('DEL', group) end
  end
end

-- The subjects of one verify call. Each is five arguments: code, how many keys it takes (from keys[6] on, in order),
-- and three fields ('' when unused):
--   i  incident      id, its fingerprint as the walk read it            keys: its group, its posting keys
--   b  bad value     id, the value read (not 16 lowercase hex digits)   keys: the group and posting keys of its
--                                                                       lowercase form when that is a fingerprint
--   p  posting       posting key member, the fingerprint read ('' = none): the walk found it does not belong there
--                                                                       keys: the posting key
--   g  group member  member, the group's fingerprint, its score          keys: the group, the fingerprint's postings
--   s  group         the group's fingerprint                             keys: the group, the fingerprint's postings
--   x  bad group key (its name is not a fingerprint)                     keys: the key
--   e  expiry entry  id: an entry of {N}:expiry the walk found without an incident
--
-- keys[1] = {N}:meta   keys[2] = {N}:fp   keys[3] = {N}:migration   keys[4] = {N}:expiry   keys[5] = {N}:changes
-- args[1] = layout tag (must equal {N}:meta's `layout`; '' for a check of an index whose meta is missing)
-- args[2] = '1' when the walk checks that every incident is in {N}:expiry; judged again here against {N}:meta, as
--           everything else is: only while retention is on now and no backfill runs (a worker may have turned it off,
--           or off and on again, since the walk began)
-- args[3 ..] = the subjects
--
-- Returns the findings as a flat list: the subject's number (1 = the first), kind, subject, detail, ... (with
-- repair: each of them fixed in this call).
local function verify(keys, args, repair)
  local meta_key, fp_key, migration_key, expiry_key, changes_key = keys[1], keys[2], keys[3], keys[4], keys[5]
  if args[1] ~= '' then
    local refused = check_layout(meta_key, args[1])
    if refused then return refused end
  end
  if redis.call('EXISTS', migration_key) == 1 then
    return redis.error_reply('MIGRATING ' .. migration_key .. ' says the index is moving to another layout; ' ..
      'run verify after the move has finished or been aborted')
  end
  local expiry_on = args[2] == '1' and retention_on(meta_key)
                    and redis.call('HEXISTS', meta_key, 'retention_backfill') == 0
  local reply = {}
  local k = 6
  for a = 3, #args, 5 do
    local out = {}
    local code, n, f1, f2, f3 = args[a], tonumber(args[a + 1]), args[a + 2], args[a + 3], args[a + 4]
    local sk = slice(keys, k, k + n - 1)
    k = k + n
    if code == 'i' then
      if redis.call('HGET', fp_key, f1) == f2 then
        reconcile(fp_key, sk[1], slice(sk, 2, #sk), f2, {f1}, repair, out)
        if expiry_on and redis.call('ZSCORE', expiry_key, f1) == false then
          out[#out + 1] = 'expiry_missing'
          out[#out + 1] = f1
          out[#out + 1] = f2
          if repair then redis.call('ZADD', expiry_key, now_ms(), f1) end
        end
      end
    elseif code == 'b' then
      local value = redis.call('HGET', fp_key, f1)
      if value == f2 and not is_fingerprint(value) then
        local lower = string.lower(value)
        out[#out + 1] = 'bad_fingerprint'
        out[#out + 1] = f1
        out[#out + 1] = value
        if repair and is_fingerprint(lower) then
          -- the same number in the contract's spelling; then its postings as for any incident
          redis.call('HSET', fp_key, f1, lower)
          reconcile(fp_key, sk[1], slice(sk, 2, #sk), lower, {f1}, repair, out)
        elseif repair then
          -- no number to rebuild from: the incident is taken out, as a delete would (its value is in the report)
          redis.call('HDEL', fp_key, f1)
          redis.call('ZREM', expiry_key, f1)
          redis.call('XADD', changes_key, '*', 'delete', f1, 'fp', '', 'prev', '')
        end
      end
    elseif code == 'p' then
      local stored = redis.call('HGET', fp_key, f2) or ''
      if stored == f3 and redis.call('SISMEMBER', sk[1], f2) == 1 then
        out[#out + 1] = f3 == '' and 'orphan_posting' or 'wrong_posting'
        out[#out + 1] = f2
        out[#out + 1] = sk[1]
        if repair then redis.call('SREM', sk[1], f2) end
      end
    elseif code == 'g' then
      local score = redis.call('ZSCORE', sk[1], f1)
      if score then
        if redis.call('HGET', fp_key, f1) ~= f2 then
          out[#out + 1] = 'twin_stray'
          out[#out + 1] = f1
          out[#out + 1] = f2
          if repair then
            redis.call('ZREM', sk[1], f1)
            reconcile(fp_key, sk[1], slice(sk, 2, #sk), f2, {}, repair, {})
          end
        elseif tonumber(score) ~= 0 then
          out[#out + 1] = 'twin_score'
          out[#out + 1] = f1
          out[#out + 1] = f2
          if repair then redis.call('ZADD', sk[1], 0, f1) end
        end
      end
    elseif code == 's' then
      local first = redis.call('ZRANGE', sk[1], 0, 0)[1]
      if first then reconcile(fp_key, sk[1], slice(sk, 2, #sk), f1, {first}, repair, out) end
    elseif code == 'x' then
      if redis.call('EXISTS', sk[1]) == 1 then
        out[#out + 1] = 'bad_twin_key'
        out[#out + 1] = sk[1]
        out[#out + 1] = ''
        if repair then redis.call('DEL', sk[1]) end
      end
    elseif code == 'e' then
      if redis.call('ZSCORE', expiry_key, f1) and redis.call('HEXISTS', fp_key, f1) == 0 then
        out[#out + 1] = 'expiry_orphan'
        out[#out + 1] = f1
        out[#out + 1] = ''
        if repair then redis.call('ZREM', expiry_key, f1) end
      end
    end
    add_findings(reply, (a - 3) / 5 + 1, out)
  end
  return reply
end

-- The members of a page of posting sets that do not belong there, judged in one read-only step (the walk of
-- `incident-worker verify`; the verdicts are leads, confirmed subject by subject by verify_check).
--
-- keys[1] = {N}:fp   keys[2 ..] = posting keys
-- args[1] = most members of a set read here (a larger set is left to the caller's SSCAN)
-- args[1 + i] = for keys[1 + i]: 'a:<first>:<last>', the hex digits of the fingerprint that spell this band's value
--               when the layout's bands are whole hex digits; 'f' for a key the layout does not have (every member
--               is returned); 'l' for a band the caller compares itself (every member is returned with its value)
--
-- Returns a flat list: key number (1 = keys[2]), member, its stored value ('' = none), ...; a key number with
-- member '' and value '-1' for a set larger than args[1].
local function verify_postings(keys, args)
  local fp_key, most = keys[1], tonumber(args[1])
  local reply = {}
  for i = 2, #keys do
    local spec = args[i]
    local size = redis.call('SCARD', keys[i])
    if size > most then
      reply[#reply + 1] = i - 1
      reply[#reply + 1] = ''
      reply[#reply + 1] = '-1'
    elseif size > 0 then
      local members = redis.call('SMEMBERS', keys[i])
      local stored = redis.call('HMGET', fp_key, unpack(members))
      local first, last, value = nil, nil, nil
      if string.sub(spec, 1, 1) == 'a' then
        local _, _, a, b = string.find(spec, '^a:(%d+):(%d+)$')
        first, last = tonumber(a), tonumber(b)
        value = string.match(keys[i], ':([^:]*)$')
      end
      for j = 1, #members do
        local h = stored[j]
        local keep = true
        if first and h and #h == 16 and string.lower(string.sub(h, first, last)) == value then keep = false end
        if keep then
          reply[#reply + 1] = i - 1
          reply[#reply + 1] = members[j]
          reply[#reply + 1] = h or ''
        end
      end
    end
  end
  return reply
end

local function verify_check(keys, args) return verify(keys, args, false) end
local function verify_repair(keys, args) return verify(keys, args, true) end

-- verify: checks read only; repairs write, and must run while Redis is short of memory no more than any write
register('verify_check', verify_check, {'no-writes'})
register('verify_repair', verify_repair)
register('verify_postings', verify_postings, {'no-writes'})
