"""What a count of the near storm that visits no match would cost the primary (issue 23; a prototype, not the index).

    .venv/bin/python benchmarks/subcube_count.py [--count 12000] [--cap 100] [--json out.json]

The bench's near storm (worker/devtools/near_storm.py) fixes 50 of the 64 bits and leaves f = 14 free
(benchmarks/journal/near-storms.md, section 2), so its fingerprints are points of a 2^14 cube. This prototype keeps,
in a Redis string, a table of how many points of each high half of the free bits lie at each distance from each low
half (f/2 bits each: 2^7 x 2^7 x 8 counters of 16 bits, 256 KB): a query reads one 2 KB row (GETRANGE) and sums at
most 8 counters for each of the 128 high halves, which gives the number of points at each distance within r, exact
and without reading any of them; the `cap` closest are then read by probing the patterns of the ball around the
query, in rings of growing radius, only as far as the counts say the cap is reached (HMGET of the patterns; ties at
the last radius sorted by ID, as the alerts list them). An insert adds 1 to the 128 counters of its high half (one
BITFIELD) and writes its ID under its pattern.

It measures, on a real Redis, the server's CPU an event for that step alone (search, count, list and insert; no
alert, no change log, no postings, no group) and checks every count and listing against brute force. It does not
say how a worker would learn the storm's free bits, nor keep the table through deletes, retention, migration, a
snapshot copy or `verify`: it prices the idea. The functions library it loads is its own (`subcube_proto`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from worker.bands import DEFAULT_MAX_DISTANCE
from worker.devtools.near_storm import near_storm_bags
from worker.devtools.redis_server import RedisServer
from worker.fingerprint import fingerprint

EDGE = 2000

LIBRARY = r"""#!lua name=subcube_proto
local POP, NAME = {}, {}
for v = 0, 65535 do
  local n, x = 0, v
  while x > 0 do n = n + x % 2; x = (x - x % 2) / 2 end
  POP[v] = n
end

local SLOT = {}

-- RINGS[f][d]: the XOR masks of weight d in f bits (built once, for the f a call names)
local RINGS = {}
local function rings(f)
  local by = RINGS[f]
  if not by then
    for v = 0, 2 ^ f - 1 do NAME[v] = tostring(v) end
    by = {}
    for d = 0, f do by[d] = {} end
    for m = 0, 2 ^ f - 1 do
      local w = POP[m % 65536] + POP[(m - m % 65536) / 65536]
      local list = by[w]
      list[#list + 1] = m
    end
    RINGS[f] = by
  end
  return by
end

-- KEYS: table, ids. ARGV: pattern, id, hi bits, lo bits, radius, cap
local function step(keys, args)
  local p, id = tonumber(args[1]), args[2]
  local hb, lb, radius, cap = tonumber(args[3]), tonumber(args[4]), tonumber(args[5]), tonumber(args[6])
  local nlo, width = 2 ^ lb, lb + 1
  local lo = p % nlo
  local hi = (p - lo) / nlo
  local rowlen = 2 ^ hb * width * 2
  local row = redis.call('GETRANGE', keys[1], lo * rowlen, lo * rowlen + rowlen - 1)
  local at = {}
  for d = 0, radius do at[d] = 0 end
  local bxor = bit.bxor
  local byte = string.byte
  for h = 0, 2 ^ hb - 1 do
    local dh = POP[bxor(h, hi)]
    if dh <= radius then
      local top = radius - dh
      if top > lb then top = lb end
      local base = h * width * 2
      local b = {byte(row, base + 1, base + 2 * top + 2)}
      for k = 0, top do
        local v = b[2 * k + 1] * 256 + b[2 * k + 2]
        if v > 0 then at[dh + k] = at[dh + k] + v end
      end
    end
  end
  local count, reach = 0, -1
  for d = 0, radius do
    count = count + at[d]
    if reach < 0 and count >= cap then reach = d end
  end
  if reach < 0 then reach = radius end
  local listed, n = {}, 0
  if count > 0 and cap > 0 then
    local by = rings(hb + lb)
    for d = 0, reach do
      if at[d] > 0 and n < 2 * cap then
        local ring, names = by[d], {}
        for i = 1, #ring do names[i] = NAME[bxor(p, ring[i])] end
        local ids = {}
        for first = 1, #names, 4000 do
          local last = math.min(first + 3999, #names)
          local got = redis.call('HMGET', keys[2], unpack(names, first, last))
          for k = 1, #got do
            local v = got[k]
            if v then
              if string.find(v, ' ', 1, true) then
                for member in string.gmatch(v, '[^ ]+') do ids[#ids + 1] = member end
              else
                ids[#ids + 1] = v
              end
            end
          end
        end
        table.sort(ids)
        for i = 1, #ids do
          if n == 2 * cap then break end
          listed[n + 1] = ids[i]; listed[n + 2] = d; n = n + 2
        end
      end
    end
  end
  -- insert: one counter per low half, at the distance of this point's low half from it
  local ops = {keys[1]}
  for x = 0, nlo - 1 do
    local index = (x * 2 ^ hb + hi) * width + POP[bxor(x, lo)]
    local at_index = SLOT[index]
    if not at_index then at_index = '#' .. index; SLOT[index] = at_index end
    local m = #ops
    ops[m + 1] = 'INCRBY'; ops[m + 2] = 'u16'; ops[m + 3] = at_index; ops[m + 4] = '1'
  end
  redis.call('BITFIELD', unpack(ops))
  local name = tostring(p)
  local old = redis.call('HGET', keys[2], name)
  redis.call('HSET', keys[2], name, old and (old .. ' ' .. id) or id)
  return {count, listed}
end

redis.register_function('subcube_step', step)
"""


def pext(value: int, positions: list[int]) -> int:
    out = 0
    for i, position in enumerate(positions):
        out |= ((value >> position) & 1) << i
    return out


def brute(points: list[tuple[int, str]], p: int, radius: int, cap: int) -> tuple[int, list[tuple[str, int]]]:
    found = [(bin(p ^ q).count("1"), i) for q, i in points]
    within = sorted((d, i) for d, i in found if d <= radius)
    return len(within), [(i, d) for d, i in within[:cap]]


def free_bits(fps: list[int]) -> list[int]:
    """The bit positions in which the fingerprints do not all agree."""
    ones = zeros = (1 << 64) - 1
    for fp in fps:
        ones &= fp
        zeros &= ~fp & ((1 << 64) - 1)
    return [b for b in range(64) if not ((ones | zeros) >> b) & 1]


def run(count: int, cap: int, check_every: int) -> dict[str, Any]:
    """The storm of `count` through the prototype on a redis-server of its own; every `check_every`-th event's count
    and listing compared with brute force."""
    fps = [fingerprint(bag) for bag in near_storm_bags(count)]
    free = free_bits(fps)
    f = len(free)
    lb, hb = f // 2, f - f // 2
    radius = DEFAULT_MAX_DISTANCE
    points: list[tuple[int, str]] = []
    counts: list[int] = []
    stamps: list[tuple[int, float]] = []
    checked = wrong = 0
    with tempfile.TemporaryDirectory() as directory:
        server = RedisServer(Path(directory), load_functions=False)
        server.start()
        try:
            client = server.client()
            client.function_load(LIBRARY, replace=True)
            client.setrange("sc:t", 2 ** (hb + lb) * (lb + 1) * 2 - 1, b"\0")

            def cpu() -> float:
                info = client.info("cpu")
                return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

            stamps.append((0, cpu()))
            for n, fp in enumerate(fps):
                p = pext(fp, free)
                incident = f"storm-{n:05d}"
                found, listed = client.fcall("subcube_step", 2, "sc:t", "sc:ids", p, incident, hb, lb, radius, cap)
                counts.append(found)
                if n % check_every == 0:
                    got = (found, [(listed[k].decode(), int(listed[k + 1])) for k in range(0, len(listed), 2)])
                    checked += 1
                    wrong += got != brute(points, p, radius, cap)
                points.append((p, incident))
                if (n + 1) % EDGE == 0 or n + 1 == count:
                    stamps.append((n + 1, cpu()))
            memory = client.memory_usage("sc:t") + (client.memory_usage("sc:ids") or 0)
            calls = {
                name.removeprefix("cmdstat_"): round(stat["usec"] / count, 1)
                for name, stat in client.info("commandstats").items()
                if name.removeprefix("cmdstat_") in ("fcall", "bitfield", "getrange", "hmget", "hget", "hset")
            }
        finally:
            server.stop()
    phases = [
        {
            "events": f"{a + 1}-{b}",
            "redis_cpu_us_per_event": round((cb - ca) / (b - a) * 1e6, 1),
            "mean_count": round(sum(counts[a:b]) / (b - a), 1),
        }
        for (a, ca), (b, cb) in itertools.pairwise(stamps)
    ]
    return {
        "count": count,
        "free_bits": f,
        "halves": [hb, lb],
        "cap": cap,
        "checked": checked,
        "wrong": wrong,
        "phases": phases,
        "usec_per_event_by_command": calls,
        "memory_bytes": memory,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=12_000)
    parser.add_argument("--cap", type=int, default=100, help="matches listed an event (0: the count alone)")
    parser.add_argument("--check-every", type=int, default=7, help="compare every Nth event with brute force")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = run(args.count, args.cap, args.check_every)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if result["wrong"]:
        sys.exit(f"{result['wrong']} of {result['checked']} events differ from brute force")


if __name__ == "__main__":
    main()
