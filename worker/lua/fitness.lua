-- fitness.lua: whether a call can finish what it starts. A function stops at the first command refused (a right the
-- user lacks, a key of another type) and keeps what it wrote before it: Redis rolls nothing back. A call refused its
-- XADD to the change log or the alerts, or its XACK, after indexing left an incident indexed without its change or
-- its alert, and its retry took it for a repeat. So the worker checks at its start (`preflight`, start.lua), and
-- every stream call of apply and apply_batch checks again before its first write (`unfit`): a right taken away or a
-- key replaced while workers run refuses the whole call, which changes nothing.

--- @include "base"

-- Every command the apply step's files send, with the key it is sent to (by its part: see unfit_for) and arguments
-- that make it whole (ACL checks the command and its keys only: a group's or a field's name is any): made once, at
-- load, so that the check before each stream FCALL allocates nothing a command (tests/test_library.py holds this list
-- to the commands the files send, and users.acl to this list).
local ACL_CHECKS = {
  {'HGET', 'meta', 'f'}, {'HSET', 'meta', 'f', 'v'}, {'HGETALL', 'meta'}, {'EXISTS', 'meta'},
  {'HINCRBY', 'meta', 'f', '1'}, {'HEXISTS', 'meta', 'f'},
  {'HGET', 'fp', 'i'}, {'HMGET', 'fp', 'i'}, {'HSET', 'fp', 'i', 'v'}, {'HDEL', 'fp', 'i'}, {'HEXISTS', 'fp', 'i'},
  {'XADD', 'changes', '*', 'f', 'v'}, {'XRANGE', 'changes', '-', '+'},
  {'XACK', 'events', 'g', '0-1'}, {'XPENDING', 'events', 'g', '-', '+', '1'},
  {'XADD', 'alerts', 'MAXLEN', '~', '1', '*', 'f', 'v'}, {'XADD', 'dead', 'MAXLEN', '~', '1', '*', 'f', 'v'},
  {'HGET', 'member', 'i'}, {'HSET', 'member', 'i', 'v'}, {'HDEL', 'member', 'i'}, {'HEXISTS', 'member', 'i'},
  {'HGET', 'size', 'i'}, {'HSET', 'size', 'i', 'v'}, {'HDEL', 'size', 'i'}, {'HINCRBY', 'size', 'i', '1'},
  {'HEXISTS', 'size', 'i'}, {'HGET', 'merged', 'i'}, {'HEXISTS', 'merged', 'i'},
  {'ZADD', 'active', '0', 'i'}, {'ZREM', 'active', 'i'}, {'ZCARD', 'active'}, {'ZSCORE', 'active', 'i'},
  {'ZREMRANGEBYRANK', 'active', '0', '0'},
  {'ZADD', 'expiry', '0', 'i'}, {'ZREM', 'expiry', 'i'}, {'ZSCORE', 'expiry', 'i'},
  {'SADD', 'posting', 'i'}, {'SREM', 'posting', 'i'}, {'SMEMBERS', 'posting'}, {'SUNION', 'posting'},
  {'SINTER', 'posting'}, {'SCARD', 'posting'}, {'SISMEMBER', 'posting', 'i'}, {'SRANDMEMBER', 'posting', '1'},
  {'ZADD', 'twins', '0', 'i'}, {'ZREM', 'twins', 'i'}, {'ZRANGE', 'twins', '0', '0'}, {'ZCARD', 'twins'},
  {'DEL', 'twins'},
}
-- Commands of no key: TIME, and FCALL (refused, a call never runs: only the start's check can name it).
local KEYLESS_CHECKS = {{'TIME'}, {'FCALL', 'f', '0'}}
-- The keys written after a call's first write, and {N}:fp (read before anything is written, so a call fails whole,
-- but every call does, and each entry of the stream would end as poison), each with a read its type answers.
local TYPE_PROBES = {{'XLEN', 'changes', 'stream'}, {'XLEN', 'alerts', 'stream'}, {'XLEN', 'dead', 'stream'},
                     {'ZCARD', 'expiry', 'sorted set'}, {'HLEN', 'fp', 'hash'}, {'HLEN', 'member', 'hash'},
                     {'HLEN', 'size', 'hash'}, {'HLEN', 'merged', 'hash'}, {'ZCARD', 'active', 'sorted set'}}

-- What the calling user may not run among the commands the apply, apply_batch and dead_letter functions send, and
-- which of the keys they write hold another type, as a flat list: 'denied', command, key (or ''), ... and 'type',
-- key, the type it must be, ... A key given as nil is not checked (apply has no dead-letter stream).
local function unfit_for(meta, fp, changes, events, alerts, dead, posting, twins, expiry)
  local out = {}
  local prefix = string.sub(meta, 1, -5)  -- '{N}:' of '{N}:meta': the group keys (groups.lua)
  local part = {meta = meta, fp = fp, changes = changes, events = events, alerts = alerts, dead = dead,
                posting = posting, twins = twins, expiry = expiry, member = prefix .. 'group',
                size = prefix .. 'groupsize', merged = prefix .. 'groupmerged', active = prefix .. 'groupactive'}
  local acl = redis.acl_check_cmd
  if acl then  -- (Redis 7; fakeredis has no ACL)
    for i = 1, #ACL_CHECKS do
      local check = ACL_CHECKS[i]
      local key = part[check[2]]
      if key and not acl(check[1], key, unpack(check, 3)) then
        out[#out + 1] = 'denied'
        out[#out + 1] = check[1]
        out[#out + 1] = key
      end
    end
    for i = 1, #KEYLESS_CHECKS do
      if not acl(unpack(KEYLESS_CHECKS[i])) then
        out[#out + 1] = 'denied'
        out[#out + 1] = KEYLESS_CHECKS[i][1]
        out[#out + 1] = ''
      end
    end
  end
  for i = 1, #TYPE_PROBES do
    local probe = TYPE_PROBES[i]
    local key = part[probe[2]]
    local reply = key and redis.pcall(probe[1], key)
    if type(reply) == 'table' and reply.err and string.find(tostring(reply.err), 'WRONGTYPE', 1, true) then
      out[#out + 1] = 'type'
      out[#out + 1] = key
      out[#out + 1] = probe[3]
    end
  end
  return out
end

-- nil when a stream call of apply can finish (keys and group as apply's: see apply.lua), else the error reply that
-- refuses it whole: UNFIT, then what unfit_for found (the worker then runs its start's check, which names it and
-- what to do, and waits for the repair).
local function unfit(keys, ko, nk)
  local posting = nk >= 9 and keys[ko + 9] or nil
  local found = unfit_for(keys[ko + 1], keys[ko + 2], keys[ko + 3], keys[ko + 4], keys[ko + 5], nil, posting,
                          keys[ko + 6], keys[ko + 8])
  if #found == 0 then return nil end
  return redis.error_reply('UNFIT ' .. table.concat(found, ' '))
end
