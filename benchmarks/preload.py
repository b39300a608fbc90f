"""Where a benchmark's pre-load goes, and a worker's copy of it (benchmarks/journal/ten-million.md).

    .venv/bin/python benchmarks/preload.py --size 200000 --rounds 2

On a redis-server of its own, alternately in each round: making N incidents the old way (`Workload.take`, a dict per
bag, then `fingerprint`) and the new (`Workload.fingerprints`, numpy); `bulk_load` through redis-py pipelines (the
general way, worker/bulkload.py `_general`) and the raw way; then a worker's copy loaded from it (`ChangeFollower`):
its load time, `MemoryIndex.nbytes` and the process's resident memory grown, a byte an incident.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import tempfile
import time
from pathlib import Path

import redis

from worker import library
from worker.bands import BandLayout
from worker.bulkload import _general
from worker.devtools.redis_server import RedisServer
from worker.devtools.workload import Workload
from worker.fingerprint import fingerprint
from worker.index import FingerprintIndex, batched
from worker.keys import IndexKeys
from worker.readpath import ChangeFollower


def _rss() -> int:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--copy-only", action="store_true", help="only the copy's load and memory")
    args = parser.parse_args()
    n = args.size
    server = RedisServer(Path(tempfile.mkdtemp(prefix="preload-")))
    server.start()
    client = redis.Redis.from_url(server.url, socket_timeout=600)
    rounds = []
    try:
        for _ in range(args.rounds):
            row: dict[str, float] = {}
            if not args.copy_only:
                started = time.perf_counter()
                old = [(i, fingerprint(bag)) for i, bag in Workload(seed=1).take(n)]
                row["make_dicts_per_s"] = n / (time.perf_counter() - started)
            started = time.perf_counter()
            ids, fps = Workload(seed=1).fingerprints(n)
            items = list(zip(ids, fps.tolist(), strict=True))
            row["make_numpy_per_s"] = n / (time.perf_counter() - started)
            del ids, fps
            for way in ("general", "raw") if not args.copy_only else ("raw",):
                client.flushall()
                client.function_flush()
                library.load(client)
                index = FingerprintIndex(client, "bench")
                index._ensure_open()
                started = time.perf_counter()
                if way == "general":
                    _general(index, batched(old, 5000), False)
                else:
                    index.bulk_load(items, chunk=200_000)
                row[f"bulk_{way}_per_s"] = n / (time.perf_counter() - started)
            del items
            gc.collect()
            before = _rss()
            follower = ChangeFollower(client, IndexKeys("bench"), BandLayout(4, 7))
            started = time.perf_counter()
            follower.load()
            row["copy_load_s"] = time.perf_counter() - started
            gc.collect()
            row["copy_rss_per_incident"] = (_rss() - before) / n
            row["copy_nbytes_per_incident"] = follower.index.nbytes() / n
            del follower
            row["load_average"] = os.getloadavg()[0]
            rounds.append({k: round(v, 1) for k, v in row.items()})
            print(json.dumps(rounds[-1]), flush=True)
    finally:
        client.close()
        server.stop()


if __name__ == "__main__":
    main()
