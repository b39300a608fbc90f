"""The snapshot path's latency tail at a large N: the benchmark's pre-load of N incidents into a Redis of its own,
then one worker fed at a steady rate (`Bench.latency`, the bench's half-load run), with the events past 100 ms and
the slowest (benchmarks/journal/ten-million.md, "The p99 at half load").

    .venv/bin/python benchmarks/snapshot_tail.py --size 3000000 --rate 1200

Run it from two checkouts alternately (each its own .venv) to compare before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import redis

from worker.devtools import benchmark as bench_module
from worker.devtools.redis_server import RedisServer
from worker.index import FingerprintIndex

captured: list[list[dict[str, Any]]] = []
_finish = bench_module._Run.finish


def _keep_reports(self: Any) -> list[dict[str, Any]]:
    reports = _finish(self)
    captured.append(reports)
    return reports


bench_module._Run.finish = _keep_reports  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=3_000_000)
    parser.add_argument("--bands", type=int, default=4)
    parser.add_argument("--rate", type=float, default=1200.0, help="events/s fed to the worker")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        server = RedisServer(Path(directory))
        server.start()
        try:
            client = redis.Redis.from_url(server.url, socket_timeout=300)
            events = bench_module._Events(1, None)
            bench = bench_module.Bench(client, server.url, events, 5000, 60, 8.0, print)
            ids, fps = events.preload(args.size)
            bench.fresh("bench")
            index = FingerprintIndex(client, "bench", bands=args.bands)
            index.bulk_load(zip(ids, fps, strict=True), chunk=bench_module.PRELOAD_CHUNK)
            del ids, fps
            started_load = os.getloadavg()[0]
            latency = bench.latency("bench", args.bands, args.rate, read_path="snapshot")
            values = sorted(v * 1000 for v in captured[-1][0]["latency"])
            print(
                json.dumps(
                    {
                        "size": args.size,
                        "bands": args.bands,
                        **latency,
                        "slowest_ms": round(values[-1], 1),
                        "over_100ms": sum(v > 100 for v in values),
                        "load_average": [round(started_load, 2), round(os.getloadavg()[0], 2)],
                    }
                )
            )
        finally:
            server.stop()


if __name__ == "__main__":
    main()
