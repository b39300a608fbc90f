"""What group state costs (docs/contract.md, "Groups"): bytes an incident in Redis, and events/s on the snapshot read
path with group work against the same run without it, in interleaved rounds against one Redis.

Fills a redis-server of its own with N incidents of the benchmark's seeded Zipf workload (`--fill stream`, the
default: published to the events stream and indexed by one `StreamWorker`, the code of `incident-worker run`, on the
snapshot read path, so every incident's group is decided as in production; `--fill bulk`: bulk_load, which writes no
group state, every incident alone in the group of its own ID) and prints the group keys' MEMORY USAGE (SAMPLES 0:
every entry) over N. Each round then, for each version in turn (the order alternates from round to round), loads
that version's library under this code's library name (FUNCTION LOAD REPLACE), publishes M more events of the
workload, and runs the worker until the stream is idle:

- `groups`: today's library;
- `no-groups`: the same library with the bodies of group_join, group_open and group_leave cut short (they write and
  read nothing; the alert still carries the fields), built here for this benchmark only.

Usage: python benchmarks/groups_cost.py [--size N] [--events M] [--rounds R] [--fill stream|bulk]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # run as a script from anywhere, without installing the package

from snapshot_calls import loaded_worker, publish  # noqa: E402  (beside this script)

from worker import library  # noqa: E402
from worker.devtools.redis_server import RedisServer  # noqa: E402
from worker.keys import IndexKeys  # noqa: E402
from worker.logs import configure_logging  # noqa: E402

FILL_CHUNK = 20_000
"""Events published and processed at a time while filling through the stream."""

CUT_SHORT = {
    "local function group_leave(gk, fp_key, id)\n": "  do return end\n",
    "local function group_join(gk, id, match)\n": "  do return match, 2 end\n",
    "local function group_open(gk, meta_key, fp_key, id)\n": "  do return id, 1 end\n",
}


def without_groups(source: str) -> str:
    """The library's source with the group decisions cut short (each function returns at once)."""
    for head, body in CUT_SHORT.items():
        if source.count(head) != 1:
            raise SystemExit(f"worker/lua/groups.lua no longer has {head.strip()!r}: update CUT_SHORT")
        source = source.replace(head, head + body)
    return source


def group_bytes(client: object, keys: IndexKeys) -> int:
    total = 0
    for key in (keys.groups, keys.group_sizes, keys.group_merged, keys.group_active):
        total += client.memory_usage(key, samples=0) or 0  # type: ignore[attr-defined]
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=1_000_000, help="incidents bulk-loaded (N)")
    parser.add_argument("--events", type=int, default=4000, help="events per version and round (M)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--fill", choices=["stream", "bulk"], default="stream")
    options = parser.parse_args()
    sources = {"groups": library.LIBRARY_SOURCE, "no-groups": without_groups(library.LIBRARY_SOURCE)}
    configure_logging("json", "error")
    rows: dict[str, list[dict[str, float]]] = {version: [] for version in sources}
    print(f"load at the start: {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory() as directory:
        server = RedisServer(Path(directory))
        server.start()
        try:
            started = time.perf_counter()
            bulk = options.size if options.fill == "bulk" else 0
            client, workload, settings, worker = loaded_worker(server, bulk, "snapshot")
            keys = IndexKeys("bench")
            if options.fill == "stream":
                used = client.info("memory")["used_memory"]
                for done in range(0, options.size, FILL_CHUNK):
                    publish(client, settings, workload, min(FILL_CHUNK, options.size - done))
                    worker.run(until_idle=True)
                    client.xtrim(settings.events_stream, maxlen=0)  # the events are done with: keep Redis small
                used = client.info("memory")["used_memory"] - used
            loaded = time.perf_counter() - started
            print(f"{options.fill} fill of {options.size:,} and the worker's copy: {loaded:.1f} s", flush=True)
            if options.fill == "stream":
                grouped, entries = group_bytes(client, keys), client.hlen(keys.groups)
                print(
                    f"after the fill: group keys {grouped:,} bytes = {grouped / options.size:.1f} bytes an incident "
                    f"({entries:,} {{N}}:group entries: {100 * entries / options.size:.1f}% joined a group; "
                    f"{client.hlen(keys.group_sizes):,} sizes); Redis used_memory grew {used / options.size:.1f} "
                    f"bytes an incident in all; load {os.getloadavg()}",
                    flush=True,
                )
            for round_number in range(options.rounds):
                order = list(sources) if round_number % 2 == 0 else list(reversed(sources))
                for version in order:
                    client.function_load(sources[version], replace=True)
                    publish(client, settings, workload, options.events)
                    before, joined_before = group_bytes(client, keys), client.hlen(keys.groups)
                    client.config_resetstat()
                    started = time.perf_counter()
                    worker.run(until_idle=True)
                    elapsed = time.perf_counter() - started
                    fcall = client.info("commandstats").get("cmdstat_fcall", {}).get("usec", 0)
                    row = {
                        "events_s": options.events / elapsed,
                        "fcall_us": fcall / options.events,
                        "bytes": (group_bytes(client, keys) - before) / options.events,
                        "joined": (client.hlen(keys.groups) - joined_before) / options.events,
                        "load": os.getloadavg()[0],
                    }
                    rows[version].append(row)
                    print(
                        f"round {round_number + 1} {version:>9}: {row['events_s']:8.1f} events/s, FCALL "
                        f"{row['fcall_us']:6.1f} us/event, group keys "
                        f"{row['bytes']:6.1f} bytes/event, {100 * row['joined']:.1f}% joined, load {row['load']:.2f}",
                        flush=True,
                    )
            total = group_bytes(client, keys)
            print(f"group keys at the end: {total:,} bytes, {client.hlen(keys.groups):,} entries", flush=True)
        finally:
            server.stop()
    base = statistics.median(r["events_s"] for r in rows["no-groups"])
    print(f"medians over {options.rounds} rounds, N = {options.size:,}, {options.events:,} events a round:")
    for version, found in rows.items():
        med = statistics.median(r["events_s"] for r in found)
        pairs = [g["events_s"] / n["events_s"] for g, n in zip(rows["groups"], rows["no-groups"], strict=True)]
        print(
            f"  {version:>9}: {med:8.1f} events/s ({med / base:.3f}x no-groups; per round groups/no-groups "
            f"{' '.join(f'{p:.2f}' for p in pairs)})"
        )
    fcall = {version: statistics.median(r["fcall_us"] for r in found) for version, found in rows.items()}
    print(
        f"  FCALL (the primary's time in the functions) us/event: groups {fcall['groups']:.1f}, no-groups "
        f"{fcall['no-groups']:.1f} ({fcall['groups'] / fcall['no-groups']:.3f}x)"
    )
    grouped = rows["groups"]
    print(
        f"  group keys: {statistics.median(r['bytes'] for r in grouped):.1f} bytes an incident added (median of rounds;"
        f" mean {statistics.mean(r['bytes'] for r in grouped):.1f}), "
        f"{100 * statistics.mean(r['joined'] for r in grouped):.1f}% of them joined a group; load at the end "
        f"{os.getloadavg()}"
    )


if __name__ == "__main__":
    main()
