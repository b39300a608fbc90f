"""Two (or more) versions of the Lua library on the snapshot read path, in interleaved rounds against one Redis.

Pre-loads N incidents of the benchmark's seeded Zipf workload into a redis-server of its own and starts one
`StreamWorker` (the code of `incident-worker run`, snapshot read path) in this process. Each round then, for every
version in turn (the order alternates from round to round), loads that version's library (worker/lua/) under this
code's library name (FUNCTION LOAD REPLACE: the worker's calls do not change), publishes M events, runs the worker
until the stream is idle, and reads FCALL's time by function from SLOWLOG (at 0 us during the round): apply_batch's
us per event and median call, FCALL's us per event (INFO commandstats: every function, read_new included), and the
commands per event (every other line of commandstats: those the functions ran and the worker's own, such as its
copy's reads of the change log). The versions must take the same arguments (this code's Python side builds every
call).

Prints each round, then per version the median of its rounds and the ratio to the first version.

Usage: python benchmarks/snapshot_ab.py [--size N] [--events M] [--rounds R] [VERSION ...]
A VERSION is a git revision (its worker/lua/) or a path to a .lua file; default: main and the work tree.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # run as a script from anywhere, without installing the package

from snapshot_calls import function_calls, loaded_worker, publish  # noqa: E402  (beside this script)

from worker import library  # noqa: E402
from worker.devtools.redis_server import RedisServer  # noqa: E402
from worker.logs import configure_logging  # noqa: E402

INNER = ("fcall", "fcall_ro")


def source_of(version: str) -> str:
    """The library source of a version (a .lua path, 'worktree', or a git revision), named as this code calls it.

    A revision's worker/lua/index.lua is assembled with the files it includes, as worker/library.py does (one of
    before the split, without includes, is the whole library); a .lua path is taken as a whole library."""
    if version == "worktree":
        text = library.assemble(lambda name: (REPO_ROOT / f"worker/lua/{name}.lua").read_text(encoding="utf-8"))
    elif os.path.exists(version):
        text = Path(version).read_text(encoding="utf-8")
    else:

        def read(name: str) -> str:
            return subprocess.run(
                ["git", "-C", str(REPO_ROOT), "show", f"{version}:worker/lua/{name}.lua"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout

        text = library.assemble(read)
    return text.replace("incident_index_v2", library.LIBRARY_NAME)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=200_000, help="incidents pre-loaded (N)")
    parser.add_argument("--events", type=int, default=2000, help="events per version and round (M)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("versions", nargs="*", default=["main", "worktree"])
    options = parser.parse_args()
    sources = {version: source_of(version) for version in options.versions}
    configure_logging("json", "error")
    results: dict[str, list[dict[str, float]]] = {version: [] for version in sources}
    with tempfile.TemporaryDirectory() as directory:
        server = RedisServer(Path(directory))
        server.start()
        try:
            client, workload, settings, worker = loaded_worker(server, options.size, "snapshot")
            client.config_set("slowlog-max-len", 1_000_000)
            for round_number in range(options.rounds):
                order = list(sources) if round_number % 2 == 0 else list(reversed(sources))
                for version in order:
                    client.function_load(sources[version], replace=True)
                    publish(client, settings, workload, options.events)
                    client.config_set("slowlog-log-slower-than", 0)
                    client.slowlog_reset()
                    client.config_resetstat()
                    started = time.perf_counter()
                    worker.run(until_idle=True)
                    elapsed = time.perf_counter() - started
                    stats = client.info("commandstats")
                    client.config_set("slowlog-log-slower-than", 10_000)
                    calls = function_calls(client.slowlog_get(1_000_000))
                    client.slowlog_reset()
                    batch = calls.get("apply_batch", [0])
                    commands = sum(
                        row["calls"]
                        for name, row in stats.items()
                        if name.removeprefix("cmdstat_") not in INNER
                        and not name.startswith("cmdstat_slowlog")
                        and name.removeprefix("cmdstat_") not in ("config", "info", "function|load", "xinfo|groups")
                    )
                    row = {
                        "fcall_us": stats.get("cmdstat_fcall", {}).get("usec", 0) / options.events,
                        "batch_us": sum(batch) / options.events,
                        "batch_median": statistics.median(batch),
                        "commands": commands / options.events,
                        "events_s": options.events / elapsed,
                        "load": os.getloadavg()[0],
                    }
                    results[version].append(row)
                    print(
                        f"round {round_number + 1} {version:>12}: FCALL {row['fcall_us']:6.1f} us/event, "
                        f"apply_batch {row['batch_us']:6.1f} us/event (median call {row['batch_median']:,.0f} us), "
                        f"{row['commands']:.2f} commands/event, load {row['load']:.2f}",
                        flush=True,
                    )
        finally:
            server.stop()
    first = next(iter(results))
    base = {key: statistics.median(r[key] for r in results[first]) for key in ("fcall_us", "batch_us", "batch_median")}
    print(f"medians over {options.rounds} rounds, N = {options.size:,}, {options.events:,} events a round:")
    for version, rows in results.items():
        med = {key: statistics.median(r[key] for r in rows) for key in ("fcall_us", "batch_us", "batch_median")}
        print(
            f"  {version:>12}: FCALL {med['fcall_us']:6.1f} us/event ({med['fcall_us'] / base['fcall_us']:.2f}x), "
            f"apply_batch {med['batch_us']:6.1f} us/event ({med['batch_us'] / base['batch_us']:.2f}x), median call "
            f"{med['batch_median']:,.0f} us ({med['batch_median'] / base['batch_median']:.2f}x), "
            f"{statistics.median(r['commands'] for r in rows):.2f} commands/event"
        )


if __name__ == "__main__":
    main()
