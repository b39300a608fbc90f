"""The snapshot read path's copy alone (worker/snapshot.py, no Redis): build time, search time, memory per incident.

`incident-worker bench` measures the whole pipeline; this measures the part that grows with the index in a worker on
the snapshot path, on the benchmark's seeded Zipf workload, both ways a copy holds its rows:

* ``base``: `MemoryIndex.load` (what a worker does at start: every row in the numpy base, a CSR of the band
  postings searched with one gather per query, or per send of queries: `search_many`, as a worker searches);
* ``dicts``: `MemoryIndex.set` one incident at a time (the rows a copy makes while it follows the change log, in
  Python dicts of band value -> rows; before the numpy base, a loaded copy was all dicts).

Memory is what tracemalloc counts for the copy (a second, smaller build: tracemalloc slows building), per incident.
Usage: python benchmarks/snapshot_copy.py [--size N] [--queries Q] [--memory-size M] [--seed S]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # run as a script from anywhere, without installing the package

from worker.bands import BandLayout  # noqa: E402
from worker.devtools.workload import Workload  # noqa: E402
from worker.fingerprint import fingerprint  # noqa: E402
from worker.readpath import SNAPSHOT_SEND  # noqa: E402
from worker.snapshot import MemoryIndex  # noqa: E402


def build(pairs: list[tuple[str, int]], how: str) -> MemoryIndex:
    index = MemoryIndex(BandLayout(4, 7))
    if how == "base":
        index.load(pairs)
    else:
        for incident_id, fp in pairs:
            index.set(incident_id, fp)
    return index


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--memory-size", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    workload = Workload(seed=args.seed)
    pairs = [(incident_id, fingerprint(bag)) for incident_id, bag in workload.take(args.size)]
    queries = [fingerprint(bag) for _, bag in workload.take(args.queries)]
    print(f"N = {args.size:,}, {args.queries:,} queries, load average {os.getloadavg()[0]:.2f}")
    print(
        f"| copy | build s (us/incident) | search us/query | us/query, {SNAPSHOT_SEND} at a time | candidates/query "
        "| bytes/incident (tracemalloc) |"
    )
    print("|---|---|---|---|---|---|")
    for how in ("base", "dicts"):
        gc.collect()
        started = time.perf_counter()
        index = build(pairs, how)
        built = time.perf_counter() - started
        gc.collect()
        gc.freeze()  # as the worker does: the copy out of the collector's full passes
        candidates = []
        started = time.perf_counter()
        for fp in queries:
            candidates.append(index.search(fp, limit=116).candidates)
        searched = (time.perf_counter() - started) / len(queries)
        started = time.perf_counter()
        for start in range(0, len(queries), SNAPSHOT_SEND):
            index.search_many([(fp, None) for fp in queries[start : start + SNAPSHOT_SEND]], limit=116)
        batched = (time.perf_counter() - started) / len(queries)
        del index
        gc.unfreeze()
        gc.collect()
        small = pairs[: args.memory_size]
        tracemalloc.start()
        index = build(small, how)
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        del index
        print(
            f"| {how} | {built:.1f} ({built / args.size * 1e6:.1f}) | {searched * 1e6:.0f} | {batched * 1e6:.0f} | "
            f"{statistics.fmean(candidates):.0f} | {held / len(small):.0f} (at N = {len(small):,}) |"
        )
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
