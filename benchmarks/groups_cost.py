"""What group state costs (docs/contract.md, "Groups"): bytes an incident in Redis, and events/s on the snapshot read
path with group work against the same run without it, in interleaved rounds against one Redis.

Bulk-loads N incidents of the benchmark's seeded Zipf workload into a redis-server of its own (bulk_load writes no
group state: every incident alone in the group of its own ID) and starts one `StreamWorker` (the code of
`incident-worker run`, snapshot read path) in this process. Each round then, for each version in turn (the order
alternates from round to round), loads that version's library under this code's library name (FUNCTION LOAD
REPLACE), publishes M more events of the workload, and runs the worker until the stream is idle:

- `groups`: today's library;
- `no-groups`: the same library with the bodies of group_join, group_open and group_leave cut short (they write and
  read nothing; the alert still carries the fields), built here for this benchmark only.

Bytes: MEMORY USAGE of the four group keys (SAMPLES 0: every entry) after each `groups` round minus before it, over
the events of that round. An incident added through the stream costs what the apply step writes for it: nothing when
it opens its own group, a `{N}:group` entry when it joins one (and the group's `{N}:groupsize` entry when it is the
first to join), so the figure is the group keys' bytes an incident of an index filled by the stream at this N (the
incidents bulk-loaded before count as openers, as they would have been had they come first).

Usage: python benchmarks/groups_cost.py [--size N] [--events M] [--rounds R]
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
            client, workload, settings, worker = loaded_worker(server, options.size, "snapshot")
            loaded = time.perf_counter() - started
            print(f"pre-load of {options.size:,} and the worker's copy: {loaded:.1f} s", flush=True)
            keys = IndexKeys("bench")
            for round_number in range(options.rounds):
                order = list(sources) if round_number % 2 == 0 else list(reversed(sources))
                for version in order:
                    client.function_load(sources[version], replace=True)
                    publish(client, settings, workload, options.events)
                    before, joined_before = group_bytes(client, keys), client.hlen(keys.groups)
                    started = time.perf_counter()
                    worker.run(until_idle=True)
                    elapsed = time.perf_counter() - started
                    row = {
                        "events_s": options.events / elapsed,
                        "bytes": (group_bytes(client, keys) - before) / options.events,
                        "joined": (client.hlen(keys.groups) - joined_before) / options.events,
                        "load": os.getloadavg()[0],
                    }
                    rows[version].append(row)
                    print(
                        f"round {round_number + 1} {version:>9}: {row['events_s']:8.1f} events/s, group keys "
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
    grouped = rows["groups"]
    print(
        f"  group keys: {statistics.median(r['bytes'] for r in grouped):.1f} bytes an incident added (median of rounds;"
        f" mean {statistics.mean(r['bytes'] for r in grouped):.1f}), "
        f"{100 * statistics.mean(r['joined'] for r in grouped):.1f}% of them joined a group; load at the end "
        f"{os.getloadavg()}"
    )


if __name__ == "__main__":
    main()
