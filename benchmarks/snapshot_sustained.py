"""Whether the snapshot read path holds its rate over a long run: events/s window after window, as the worker's copy
follows the changes of every event it indexes.

Pre-loads N incidents of the benchmark's seeded Zipf workload into a redis-server of its own, starts one
`StreamWorker` (the code of `incident-worker run`, in this process) on the snapshot path, then, window after window,
publishes W events (not timed) and times the worker until the stream is idle. Prints each window's events/s, the
worker's CPU per event, the primary's time per event (INFO commandstats), and the copy's shape (tiers, tail, rows);
the first window is the run's own control. Run it on two commits to compare how a change holds up over time.

Usage: python benchmarks/snapshot_sustained.py [--size N] [--windows K] [--window W] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # run as a script from anywhere, without installing the package

from snapshot_calls import loaded_worker, publish  # noqa: E402

from worker.devtools.redis_server import RedisServer  # noqa: E402
from worker.logs import configure_logging  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--windows", type=int, default=10)
    parser.add_argument("--window", type=int, default=30_000)
    parser.add_argument("--json", type=Path, help="also write the windows' figures to this file")
    args = parser.parse_args()
    configure_logging("json", "error")
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        server = RedisServer(Path(directory))
        server.start()
        try:
            started = time.perf_counter()
            client, workload, settings, worker = loaded_worker(server, args.size, "snapshot")
            print(f"loaded {args.size:,} incidents in {time.perf_counter() - started:.0f} s", flush=True)
            done = 0
            for window in range(args.windows):
                publish(client, settings, workload, args.window)
                client.config_resetstat()
                started, cpu = time.perf_counter(), time.process_time()
                worker.run(until_idle=True)
                elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
                done += args.window
                fcall = client.info("commandstats").get("cmdstat_fcall", {}).get("usec", 0)
                copy = worker.snapshot.index if worker.snapshot is not None else None
                row = {
                    "window": window + 1,
                    "events_so_far": done,
                    "events_per_s": round(args.window / elapsed),
                    "worker_cpu_us_per_event": round(cpu * 1e6 / args.window),
                    "fcall_us_per_event": round(fcall / args.window, 1),
                    "copy_rows": len(copy) if copy is not None else None,
                    "tiers": getattr(copy, "tiers", None),  # None: code from before the tiers
                    "tail": copy.overlay_rows if copy is not None else None,
                }
                rows.append(row)
                print(
                    f"window {row['window']:>2} (events {done:>9,}): {row['events_per_s']:>6,} events/s, worker CPU "
                    f"{row['worker_cpu_us_per_event']:>4} us/event, FCALL {row['fcall_us_per_event']:>6} us/event; "
                    f"copy {row['copy_rows']:,} incidents, {row['tiers']} tiers, tail {row['tail']:,}",
                    flush=True,
                )
        finally:
            server.stop()
    if args.json:
        args.json.write_text(json.dumps({"size": args.size, "window": args.window, "windows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
