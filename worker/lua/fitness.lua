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
  local acl = redis.acl_check_cmd
  if acl then  -- (Redis 7; fakeredis has no ACL)
    -- every command the apply step's files send (tests/test_library.py holds the list to them), each check a call
    -- of its own, not a table of arguments unpacked: this runs before every stream FCALL (about 0.3 us a check)
    local function need(allowed, command, key)
      if not allowed then
        out[#out + 1] = 'denied'
        out[#out + 1] = command
        out[#out + 1] = key or ''
      end
    end
    need(acl('HGET', meta, 'f'), 'HGET', meta)
    need(acl('HSET', meta, 'f', 'v'), 'HSET', meta)
    need(acl('HGETALL', meta), 'HGETALL', meta)
    need(acl('EXISTS', meta), 'EXISTS', meta)
    need(acl('HINCRBY', meta, 'f', '1'), 'HINCRBY', meta)
    need(acl('HGET', fp, 'i'), 'HGET', fp)
    need(acl('HMGET', fp, 'i'), 'HMGET', fp)
    need(acl('HSET', fp, 'i', 'v'), 'HSET', fp)
    need(acl('HDEL', fp, 'i'), 'HDEL', fp)
    need(acl('HEXISTS', fp, 'i'), 'HEXISTS', fp)
    need(acl('XADD', changes, '*', 'f', 'v'), 'XADD', changes)
    need(acl('XRANGE', changes, '-', '+'), 'XRANGE', changes)
    need(acl('XACK', events, group, '0-1'), 'XACK', events)
    need(acl('XPENDING', events, group, '-', '+', '1'), 'XPENDING', events)
    need(acl('XADD', alerts, 'MAXLEN', '~', '1', '*', 'f', 'v'), 'XADD', alerts)
    need(acl('HEXISTS', meta, 'f'), 'HEXISTS', meta)
    need(acl('HGET', member, 'i'), 'HGET', member)
    need(acl('HSET', member, 'i', 'v'), 'HSET', member)
    need(acl('HDEL', member, 'i'), 'HDEL', member)
    need(acl('HEXISTS', member, 'i'), 'HEXISTS', member)
    need(acl('HGET', size, 'i'), 'HGET', size)
    need(acl('HSET', size, 'i', 'v'), 'HSET', size)
    need(acl('HDEL', size, 'i'), 'HDEL', size)
    need(acl('HINCRBY', size, 'i', '1'), 'HINCRBY', size)
    need(acl('HEXISTS', size, 'i'), 'HEXISTS', size)
    need(acl('HGET', merged, 'i'), 'HGET', merged)
    need(acl('HEXISTS', merged, 'i'), 'HEXISTS', merged)
    need(acl('ZADD', active, '0', 'i'), 'ZADD', active)
    need(acl('ZREM', active, 'i'), 'ZREM', active)
    need(acl('ZCARD', active), 'ZCARD', active)
    need(acl('ZSCORE', active, 'i'), 'ZSCORE', active)
    need(acl('ZREMRANGEBYRANK', active, '0', '0'), 'ZREMRANGEBYRANK', active)
    need(acl('ZADD', expiry, '0', 'i'), 'ZADD', expiry)
    need(acl('ZREM', expiry, 'i'), 'ZREM', expiry)
    need(acl('ZSCORE', expiry, 'i'), 'ZSCORE', expiry)
    need(acl('TIME'), 'TIME')
    need(acl('FCALL', 'f', '0'), 'FCALL')  -- (refused, a call never runs: only the start's check can name it)
    if dead then need(acl('XADD', dead, 'MAXLEN', '~', '1', '*', 'f', 'v'), 'XADD', dead) end
    if posting then
      need(acl('SADD', posting, 'i'), 'SADD', posting)
      need(acl('SREM', posting, 'i'), 'SREM', posting)
      need(acl('SMEMBERS', posting), 'SMEMBERS', posting)
      need(acl('SUNION', posting, posting), 'SUNION', posting)
      need(acl('SINTER', posting, posting), 'SINTER', posting)
      need(acl('SCARD', posting), 'SCARD', posting)
      need(acl('SISMEMBER', posting, 'i'), 'SISMEMBER', posting)
      need(acl('SRANDMEMBER', posting, '1'), 'SRANDMEMBER', posting)
    end
    if twins then
      need(acl('ZADD', twins, '0', 'i'), 'ZADD', twins)
      need(acl('ZREM', twins, 'i'), 'ZREM', twins)
      need(acl('ZRANGE', twins, '0', '0'), 'ZRANGE', twins)
      need(acl('ZCARD', twins), 'ZCARD', twins)
      need(acl('DEL', twins), 'DEL', twins)
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
