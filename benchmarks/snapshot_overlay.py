"""How a worker's copy searches as it follows changes after its load, and what the tiers of those changes cost.

A copy loaded at start holds its rows in one numpy tier; the rows it makes while it follows the change log go to a
short tail (compared one by one), sealed into a tier every 2,048 rows, tiers merged as a binary counter
(worker/snapshot.py). This loads N random fingerprints, adds new ones in steps, and times `search_many` (sends of
16, best of 3) at each step, and what the changes themselves cost (sets, seals and merges, per change); then
`compact`. No Redis. Random fingerprints: a query's candidates are the layout's expectation, so only the trend
matters here; the benchmark's Zipf workload has more.

Usage: python benchmarks/snapshot_overlay.py [--size N] [--steps 4000,16000,64000,...] [--queries Q] [--seed S]
       [--bands B]
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
    parser.add_argument("--steps", default="0,4000,16000,64000,128000,256000,512000,1000000")
    parser.add_argument("--queries", type=int, default=1600)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--bands", type=int, default=4, help="the layout's bands (4: the default; 3: wider bands)")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    index = MemoryIndex(BandLayout(args.bands, 7))
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

    added = previous = 0
    for step in (int(s) for s in args.steps.split(",")):
        started = time.perf_counter()
        slowest = 0.0
        while added < step:
            one = time.perf_counter()
            index.set(f"n{added}", rng.getrandbits(64))
            slowest = max(slowest, time.perf_counter() - one)
            added += 1
        spent = time.perf_counter() - started
        per_change = f"{spent / max(1, step - previous) * 1e6:5.1f} us a change (slowest {slowest * 1e3:6.1f} ms)"
        previous = step
        print(
            f"changes {added:>9,}: tiers {getattr(index, 'tiers', '-'):>2}, tail {index.overlay_rows:>5,}: "
            f"{us_per_query():6.1f} us a query; {per_change}",
            flush=True,
        )
    started = time.perf_counter()
    index.compact()
    print(f"compact: {time.perf_counter() - started:.2f} s; then {us_per_query():.1f} us a query")


if __name__ == "__main__":
    main()
