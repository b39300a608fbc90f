"""What moving a live index to another layout costs, on a real redis-server started here.

N incidents of the benchmark's seeded workload are bulk-loaded under 4 bands, then `incident-worker migrate` (a
process of its own) moves them to `--to-bands` while a thread here applies events (adds of new incidents) through
the apply step, one call at a time, as fast as it can. Reported: the migration's time, used_memory before, its peak
(both layouts held, sampled 5 times a second) and after, and the events/s and p99 latency of the apply calls for 5 s
before the migration and while it runs.

Usage: python benchmarks/migrate.py [--size N] [--to-bands M] [--batch B]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # run as a script from anywhere, without installing the package

from worker import library  # noqa: E402
from worker.devtools.redis_server import RedisServer  # noqa: E402
from worker.devtools.workload import Workload  # noqa: E402
from worker.fingerprint import fingerprint  # noqa: E402
from worker.index import FingerprintIndex  # noqa: E402


def _used(client: Any) -> int:
    return int(client.info("memory")["used_memory"])


def _load(
    client: Any,
    index: FingerprintIndex,
    items: list[tuple[str, int]],
    seconds: float,
    stop: threading.Event,
    latencies: list[float],
) -> int:
    """Apply adds one call at a time until `stop` or `seconds`; returns how many."""
    done = 0
    deadline = time.monotonic() + seconds
    while not stop.is_set() and time.monotonic() < deadline and done < len(items):
        incident_id, fp = items[done]
        started = time.perf_counter()
        index.add_fingerprint(incident_id, fp)
        latencies.append(time.perf_counter() - started)
        done += 1
    return done


def _p99(values: list[float]) -> float:
    return round(statistics.quantiles(values, n=100)[98] * 1000, 3) if len(values) > 100 else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--to-bands", type=int, default=3)
    parser.add_argument("--batch", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp))
        server.start()
        try:
            client = server.client()
            library.load(client)
            bags = Workload(seed=1).take(args.size + 200_000)
            items = [(f"s{i}", fingerprint(bag)) for i, (_, bag) in enumerate(bags)]
            seed, events = items[: args.size], [(f"e{i}", fp) for i, (_, fp) in enumerate(items[args.size :])]
            index = FingerprintIndex(client, "incidents", 4, 7)
            index.bulk_load(seed)
            before = _used(client)
            worker = FingerprintIndex(server.client(), "incidents", 4, 7)
            idle: list[float] = []
            baseline = _load(client, worker, events, 5.0, threading.Event(), idle)
            events = events[baseline:]

            busy: list[float] = []
            stop = threading.Event()
            counted: list[int] = []
            thread = threading.Thread(target=lambda: counted.append(_load(client, worker, events, 1e9, stop, busy)))
            peak = [before]

            def sample() -> None:  # used_memory 5 times a second: both layouts are held at the switch
                watcher = server.client()
                while not stop.is_set():
                    peak[0] = max(peak[0], _used(watcher))
                    time.sleep(0.2)

            sampler = threading.Thread(target=sample)
            thread.start()
            sampler.start()
            env = {**os.environ, "INCIDENT_WORKER_REDIS_URL": server.url}
            command = [sys.executable, "-m", "worker", "migrate", "--bands", str(args.to_bands), "--batch"]
            started = time.monotonic()
            # its own process, as an operator runs it: it does not share this process's interpreter lock
            output = subprocess.run([*command, str(args.batch)], env=env, capture_output=True, text=True, check=True)
            total = time.monotonic() - started
            stop.set()
            thread.join()
            sampler.join()
            after = _used(client)
            phases = [line.split(": ", 1)[1] for line in output.stderr.splitlines() if "switch" in line][:1]
            result = {
                "incidents": args.size,
                "from_bands": 4,
                "to_bands": args.to_bands,
                "batch": args.batch,
                "migration_seconds": round(total, 2),
                "switch_seen": phases,
                "used_memory_before_mb": round(before / 1e6, 1),
                "used_memory_peak_mb": round(peak[0] / 1e6, 1),
                "used_memory_after_mb": round(after / 1e6, 1),
                "events_per_s_before": round(baseline / 5.0, 1),
                "p99_ms_before": _p99(idle),
                "events_per_s_during": round(counted[0] / total, 1),
                "p99_ms_during": _p99(busy),
            }
            print(json.dumps(result, indent=2))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
