-- fitness.lua: whether a call can finish what it starts. A function stops at the first command refused (a right the
-- user lacks, a key of another type) and keeps what it wrote before it: Redis rolls nothing back. A call refused its
-- XADD to the change log or the alerts, or its XACK, after indexing left an incident indexed without its change or
-- its alert, and its retry took it for a repeat. So the worker checks at its start (`preflight`, start.lua), and
-- every stream call of apply and apply_batch checks again before its first write (`unfit`): a right taken away or a
-- key replaced while workers run refuses the whole call, which changes nothing.

--- @include "base"

-- What the calling user may not run among the commands the apply, apply_batch and dead_letter functions send, and
-- which of the keys they write hold another type, as a flat list: 'denied', command, key (or ''), ... and 'type',
-- key, the type it must be, ... A key given as nil is not checked (apply has no dead-letter stream).
local function unfit_for(meta, fp, changes, events, alerts, dead, posting, twins, expiry, group)
  local out = {}
  local prefix = string.sub(meta, 1, -5)  -- '{N}:' of '{N}:meta': the group keys (groups.lua)
  local member, size, merged, active = prefix .. 'group', prefix .. 'groupsize', prefix .. 'groupmerged',
                                       prefix .. 'groupactive'
  if redis.acl_check_cmd then  -- (Redis 7; fakeredis has no ACL)
    local checks = {
      {'HGET', meta, 'f'}, {'HSET', meta, 'f', 'v'}, {'HGETALL', meta}, {'EXISTS', meta}, {'HINCRBY', meta, 'f', '1'},
      {'HGET', fp, 'i'}, {'HMGET', fp, 'i'}, {'HSET', fp, 'i', 'v'}, {'HDEL', fp, 'i'}, {'HEXISTS', fp, 'i'},
      {'XADD', changes, '*', 'f', 'v'}, {'XRANGE', changes, '-', '+'},
      {'XACK', events, group, '0-1'}, {'XPENDING', events, group, '-', '+', '1'},
      {'XADD', alerts, 'MAXLEN', '~', '1', '*', 'f', 'v'},
      {'HSET', member, 'i', 'v'}, {'HDEL', member, 'i'}, {'HINCRBY', size, 'i', '1'}, {'HEXISTS', merged, 'i'},
      {'ZADD', active, '0', 'i'}, {'ZREM', active, 'i'}, {'ZREMRANGEBYRANK', active, '0', '0'},
      {'ZADD', expiry, '0', 'i'}, {'ZREM', expiry, 'i'}, {'ZSCORE', expiry, 'i'},
      {'TIME'},
    }
    if dead then checks[#checks + 1] = {'XADD', dead, 'MAXLEN', '~', '1', '*', 'f', 'v'} end
    local more = {{'SADD', posting, 'i'}, {'SREM', posting, 'i'}, {'SMEMBERS', posting}, {'SUNION', posting, posting},
                  {'SINTER', posting, posting}, {'ZADD', twins, '0', 'i'}, {'ZREM', twins, 'i'},
                  {'ZRANGE', twins, '0', '0'}, {'ZCARD', twins}, {'DEL', twins}}
    for i = 1, #more do
      if more[i][2] then checks[#checks + 1] = more[i] end
    end
    for i = 1, #checks do
      local check = checks[i]
      if not redis.acl_check_cmd(unpack(check)) then
        out[#out + 1] = 'denied'
        out[#out + 1] = check[1]
        out[#out + 1] = check[2] or ''
      end
    end
  end
  -- the keys written after a call's first write, and {N}:fp: read before anything is written, so a call fails whole,
  -- but every call does, and each entry of the stream would end as poison
  local probes = {{'XLEN', changes, 'stream'}, {'XLEN', alerts, 'stream'}, {'XLEN', dead, 'stream'},
                  {'ZCARD', expiry, 'sorted set'}, {'HLEN', fp, 'hash'}, {'HLEN', member, 'hash'},
                  {'HLEN', size, 'hash'}, {'HLEN', merged, 'hash'}, {'ZCARD', active, 'sorted set'}}
  for i = 1, #probes do
    if probes[i][2] then
      local reply = redis.pcall(probes[i][1], probes[i][2])
      if type(reply) == 'table' and reply.err and string.find(tostring(reply.err), 'WRONGTYPE', 1, true) then
        out[#out + 1] = 'type'
        out[#out + 1] = probes[i][2]
        out[#out + 1] = probes[i][3]
      end
    end
  end
  return out
end

-- nil when a stream call of apply can finish (keys and group as apply's: see apply.lua), else the error reply that
-- refuses it whole: UNFIT, then what unfit_for found (the worker then runs its start's check, which names it and
-- what to do, and waits for the repair).
local function unfit(keys, ko, nk, group)
  local posting = nk >= 9 and keys[ko + 9] or nil
  local found = unfit_for(keys[ko + 1], keys[ko + 2], keys[ko + 3], keys[ko + 4], keys[ko + 5], nil, posting,
                          keys[ko + 6], keys[ko + 8], group)
  if #found == 0 then return nil end
  return redis.error_reply('UNFIT ' .. table.concat(found, ' '))
end
