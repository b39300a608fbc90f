"""How a worker's copy slows as it gains rows after its numpy base, and what a rebuild (`compact`) costs.

A copy loaded at start holds its rows in the numpy base; the rows it makes while it follows the change log sit in
Python dicts (searched by probing their bands once there are more than 4,096), until `compact` rebuilds the base,
which `SnapshotReader.refresh` does once they outnumber the base (worker/readpath.py, COMPACT_FROM). This loads N
random fingerprints, adds rows in steps, and times `search_many` (sends of 16, best of 3) at each step, then
`compact`. No Redis. Random fingerprints: a query's candidates are the layout's expectation, so only the trend
matters here; the benchmark's Zipf workload has more.

Usage: python benchmarks/snapshot_overlay.py [--size N] [--steps 4000,16000,64000,...] [--queries Q] [--seed S]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # run as a script from anywhere, without installing the package

from worker.bands import BandLayout  # noqa: E402
from worker.snapshot import MemoryIndex  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--steps", default="0,4000,8000,16000,32000,64000,128000,256000")
    parser.add_argument("--queries", type=int, default=1600)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    index = MemoryIndex(BandLayout(4, 7))
    started = time.perf_counter()
    index.load({str(n): rng.getrandbits(64) for n in range(args.size)})
    print(f"loaded {args.size:,} in {time.perf_counter() - started:.2f} s")
    queries: list[tuple[int, str | None]] = [(rng.getrandbits(64), None) for _ in range(args.queries)]

    def us_per_query() -> float:
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            for k in range(0, len(queries), 16):
                index.search_many(queries[k : k + 16])
            best = min(best, (time.perf_counter() - started) / len(queries) * 1e6)
        return best

    added = 0
    for step in (int(s) for s in args.steps.split(",")):
        while added < step:
            index.set(f"n{added}", rng.getrandbits(64))
            added += 1
        print(f"rows after the base {index.overlay_rows:>9,}: {us_per_query():7.1f} us a query", flush=True)
    started = time.perf_counter()
    index.compact()
    print(f"compact: {time.perf_counter() - started:.2f} s; then {us_per_query():.1f} us a query")


if __name__ == "__main__":
    main()
