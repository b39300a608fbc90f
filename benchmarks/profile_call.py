"""Where Redis spends the time of one query: the server-side call taken apart, on a real redis-server.

`incident-worker bench` measures the whole pipeline; this splits one event's Redis time into its parts, so that
the figures in BENCHMARKS.md ("Where the time goes") can be checked and redone. For each layout it pre-loads N
incidents of the benchmark's seeded Zipf workload, then runs the probe keys of the same query bags through a
series of Redis Functions that each do a little more of the real work, and reads the server's own clock from
INFO commandstats (the FCALL line counts the whole call, the lines of the commands inside it their share):

* ``keys``: the call with every probe key and nothing done (passing the keys into the function);
* ``exists``: one EXISTS per probe key (a key lookup each, found or not);
* ``sunion``: SUNION of the probe keys, the candidates returned to Lua;
* ``sunion+hmget``: and HMGET of the candidates' fingerprints from ``{N}:fp``;
* ``neighbours``: the product's read-only query (adds the distances, sorting, the reply);
* ``add``: the product's apply call for a new incident (adds the writes: SADD, HSET, the changes stream).

Usage: python benchmarks/profile_call.py [--size N] [--bands 3,4] [--queries Q] [--seed S]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # run as a script from anywhere, without installing the package

import redis  # noqa: E402 (after the sys.path line)

from worker import library  # noqa: E402
from worker.bands import BandLayout  # noqa: E402
from worker.devtools.redis_server import RedisServer  # noqa: E402
from worker.devtools.workload import Workload  # noqa: E402
from worker.fingerprint import fingerprint  # noqa: E402
from worker.index import FingerprintIndex  # noqa: E402

# keys[1] = {N}:meta, keys[2] = {N}:fp, keys[3..] = the probe keys (as the product's neighbours function gets them)
PROFILE_LIBRARY = r"""#!lua name=incident_profile
local function keys_only(keys, args) return #keys end

local function exists(keys, args)
  local found = 0
  for i = 3, #keys do found = found + redis.call('EXISTS', keys[i]) end
  return found
end

local function union(keys)
  if #keys == 3 then return redis.call('SMEMBERS', keys[3]) end
  return redis.call('SUNION', unpack(keys, 3))
end

local function sunion(keys, args) return #union(keys) end

local function sunion_hmget(keys, args)
  local candidates = union(keys)
  local n, read = #candidates, 0
  for first = 1, n, 4000 do
    local last = first + 3999
    if last > n then last = n end
    read = read + #redis.call('HMGET', keys[2], unpack(candidates, first, last))
  end
  return read
end

redis.register_function{function_name='profile_keys', callback=keys_only, flags={'no-writes'}}
redis.register_function{function_name='profile_exists', callback=exists, flags={'no-writes'}}
redis.register_function{function_name='profile_sunion', callback=sunion, flags={'no-writes'}}
redis.register_function{function_name='profile_hmget', callback=sunion_hmget, flags={'no-writes'}}
"""

STEPS = ("keys", "exists", "sunion", "sunion+hmget", "neighbours", "add")


def _usec(client: redis.Redis) -> dict[str, float]:
    return {name.removeprefix("cmdstat_"): float(row["usec"]) for name, row in client.info("commandstats").items()}


def profile_layout(
    client: redis.Redis, bands: int, preload: list[tuple[str, int]], queries: list[int]
) -> dict[str, Any]:
    """Per-query server microseconds of each step, for one layout, on a freshly loaded index."""
    client.flushall()
    client.function_flush()
    library.load(client)
    before = int(client.info("memory")["used_memory"])
    index = FingerprintIndex(client, "profile", bands=bands)
    index.bulk_load(preload)
    memory = (int(client.info("memory")["used_memory"]) - before) / max(len(preload), 1)
    client.function_load(PROFILE_LIBRARY, replace=True)
    calls = []
    for fp in queries:
        own, probed, others = index.probe_keys(fp)
        calls.append([index.keys.meta, index.keys.fingerprints, *own[:probed], *others])

    candidates = [client.fcall("profile_sunion", len(keys), *keys) for keys in calls]  # before `add` adds more
    keyspace = int(client.dbsize())

    def measure(run: Any) -> dict[str, float]:
        client.config_resetstat()
        for position, keys in enumerate(calls):
            run(position, keys)
        return {name: usec / len(calls) for name, usec in _usec(client).items()}

    functions = {"keys": "profile_keys", "exists": "profile_exists", "sunion": "profile_sunion"}
    functions["sunion+hmget"] = "profile_hmget"
    steps: dict[str, dict[str, float]] = {}
    for step, function in functions.items():
        steps[step] = measure(lambda _, keys, f=function: client.fcall(f, len(keys), *keys))
    steps["neighbours"] = measure(lambda position, _: index.matches_of(queries[position]))
    steps["add"] = measure(lambda position, _: index.add_fingerprint(f"profile-{position}", queries[position]))
    return {
        "bands": bands,
        "layout": BandLayout(bands, 7).description,
        "indexed": len(preload),
        "keys_in_redis": keyspace,
        "memory_per_incident": round(memory, 1),
        "probe_keys": len(calls[0]) - 2,
        "candidates_mean": round(statistics.fmean(candidates), 1),
        "steps": steps,
    }


def report(result: dict[str, Any]) -> str:
    steps, probes, candidates = result["steps"], result["probe_keys"], result["candidates_mean"]
    lines = [
        f"\n{result['layout']}; N = {result['indexed']:,}, {result['keys_in_redis']:,} keys in Redis, "
        f"{result['memory_per_incident']} bytes per incident; {probes} probe keys and "
        f"{candidates} candidates per query",
        "",
        "| step | call, us per query | inside: us per query |",
        "|---|---|---|",
    ]
    for step in STEPS:
        row = steps[step]
        call = row.get("fcall", 0.0) + row.get("fcall_ro", 0.0)
        inner = ", ".join(
            f"{name} {usec:.0f}"
            for name, usec in sorted(row.items())
            if name not in ("fcall", "fcall_ro", "config|resetstat") and usec >= 0.5
        )
        lines.append(f"| {step} | {call:.0f} | {inner} |")
    key_cost = steps["keys"].get("fcall", 0.0) / max(probes, 1)
    lookup = steps["exists"].get("exists", 0.0) / max(probes, 1)
    union = steps["sunion"].get("sunion", 0.0)
    hmget = steps["sunion+hmget"].get("hmget", 0.0) / max(candidates, 1)
    lines += [
        "",
        f"per probe key: {key_cost:.2f} us to pass it in (with the call's fixed cost), {lookup:.2f} us to look it up; "
        f"SUNION {union:.0f} us in all; per candidate: HMGET {hmget:.2f} us",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1_000_000, help="incidents pre-loaded (default 1,000,000)")
    parser.add_argument("--bands", default="3,4", help="layouts to profile, comma-separated band counts")
    parser.add_argument("--queries", type=int, default=2000, help="query bags per step")
    parser.add_argument("--seed", type=int, default=1, help="seed of the workload")
    args = parser.parse_args(argv)
    workload = Workload(seed=args.seed)
    started = time.perf_counter()
    preload = [(incident_id, fingerprint(bag)) for incident_id, bag in workload.take(args.size)]
    queries = [fingerprint(bag) for _, bag in workload.take(args.queries)]
    print(f"workload: {args.size:,} incidents and {args.queries:,} queries in {time.perf_counter() - started:.0f} s")
    with tempfile.TemporaryDirectory(prefix="incident-profile-") as directory:
        server = RedisServer(Path(directory))
        server.start()
        try:
            with redis.Redis(port=server.port, socket_timeout=600) as client:
                print(f"redis-server {client.info('server')['redis_version']} on port {server.port}")
                for bands in (int(b) for b in args.bands.split(",") if b):
                    print(report(profile_layout(client, bands, preload, queries)), flush=True)
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
