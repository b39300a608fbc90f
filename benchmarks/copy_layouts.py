"""The worker copy's search at a large N, per layout: candidates an event, the share cut at the per-event budget,
and microseconds a query, in process (benchmarks/journal/ten-million.md).

    .venv/bin/python benchmarks/copy_layouts.py --size 10000000 --layouts 4,3

The index is the benchmark's pre-load (`Workload.fingerprints`, seed 1); the queries are the events that follow it,
searched 16 at a time as a worker searches a send (`SNAPSHOT_SEND`), with each of `--budgets` (default: none and the
primary's default, MAX_CANDIDATES).
"""

from __future__ import annotations

import argparse
import json
import os
import time

from worker.bands import BandLayout
from worker.devtools.workload import Workload
from worker.fingerprint import fingerprint
from worker.limits import DEFAULT_MAX_CANDIDATES
from worker.readpath import SNAPSHOT_SEND
from worker.snapshot import MemoryIndex


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--layouts", default="4,3")
    parser.add_argument("--queries", type=int, default=3000)
    parser.add_argument(
        "--budgets", default=f"0,{DEFAULT_MAX_CANDIDATES}", help="budgets searched with, comma-separated (0: none)"
    )
    args = parser.parse_args()
    workload = Workload(seed=1)
    ids, fps = workload.fingerprints(args.size)
    fp_list = fps.tolist()
    del fps
    queries = [(fingerprint(bag), incident_id) for incident_id, bag in workload.take(args.queries)]
    for bands in (int(b) for b in args.layouts.split(",")):
        layout = BandLayout(bands, 7)
        copy = MemoryIndex(layout)
        started = time.perf_counter()
        copy.load(zip(ids, fp_list, strict=True))
        row = {"layout": layout.description, "load_s": round(time.perf_counter() - started, 1)}
        row["bytes_per_incident"] = round(copy.nbytes() / len(copy), 1)
        for budget in (int(b) for b in args.budgets.split(",")):
            started = time.perf_counter()
            results = []
            for start in range(0, len(queries), SNAPSHOT_SEND):
                results += copy.search_many(queries[start : start + SNAPSHOT_SEND], limit=116, budget=budget)
            elapsed = time.perf_counter() - started
            counts = sorted(r.candidates for r in results)
            row[f"budget_{budget}"] = {
                "us_per_query": round(elapsed * 1e6 / len(queries), 1),
                "candidates_mean": round(sum(r.candidates for r in results) / len(results), 1),
                "candidates_p50_p99_max": [counts[len(counts) // 2], counts[len(counts) * 99 // 100], counts[-1]],
                "cut_share": round(sum(r.cut for r in results) / len(results), 3),
                "matches_mean": round(sum(r.match_count for r in results) / len(results), 2),
            }
        row["load_average"] = os.getloadavg()[0]
        print(json.dumps(row), flush=True)
        del copy


if __name__ == "__main__":
    main()
