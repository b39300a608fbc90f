"""How a worker's copy searches as it follows changes after its load, and what the tiers of those changes cost.

A copy loaded at start holds its rows in one numpy tier; the rows it makes while it follows the change log go to a
short tail (compared one by one), sealed into a tier every 2,048 rows, tiers merged as a binary counter
(worker/snapshot.py). This loads N random fingerprints, adds new ones in steps, and times `search_many` (sends of
16, best of 3) at each step, and what the changes themselves cost (sets, seals and merges, per change); then
`compact`. No Redis. Random fingerprints: a query's candidates are the layout's expectation, so only the trend
matters here; the benchmark's Zipf workload has more.

With --storm S, instead: N random fingerprints and S distinct near-duplicates of one (1 to 5 bits from it) loaded
into two copies, the storm deleted from both, and each searched in turn (random queries, and queries near the storm):
one as this code leaves it (its tier built anew once searches near the storm have thrown away as many candidates as
it holds rows: the first send near it pays for that, timed apart), the other with those rebuilds turned off (the
copy before them: every search near the storm verifies all of it until a merge); then the latter compacted.

Usage: python benchmarks/snapshot_overlay.py [--size N] [--steps 4000,16000,64000,...] [--queries Q] [--seed S]
       [--bands B] [--storm S]
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
    parser.add_argument("--storm", type=int, default=0, help="near-duplicates loaded then deleted (see above)")
    args = parser.parse_args()
    if args.storm:
        storm(args)
        return
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


def _time_sends(index: MemoryIndex, queries: list[tuple[int, str | None]]) -> tuple[float, float]:
    """One pass of `queries` in sends of 16: us a query, candidates a query."""
    started = time.perf_counter()
    candidates = 0
    for k in range(0, len(queries), 16):
        candidates += sum(result.candidates for result in index.search_many(queries[k : k + 16]))
    return (time.perf_counter() - started) / len(queries) * 1e6, candidates / len(queries)


def storm(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    center = rng.getrandbits(64)

    def near() -> int:
        fp = center
        for bit in rng.sample(range(64), rng.randint(1, 5)):
            fp ^= 1 << bit
        return fp

    near_ones: set[int] = set()
    while len(near_ones) < args.storm:
        near_ones.add(near())
    pairs = {str(n): rng.getrandbits(64) for n in range(args.size)}
    storm_ids = [f"s{n}" for n in range(args.storm)]
    pairs.update(zip(storm_ids, sorted(near_ones), strict=True))
    copies = {
        "before (no rebuild)": MemoryIndex(BandLayout(args.bands, 7)),
        "this code": MemoryIndex(BandLayout(args.bands, 7)),
    }
    before = copies["before (no rebuild)"]
    # the copy as it was before tiers were rebuilt: searches and deletes never rebuild it
    before._rebuild = lambda k: None  # type: ignore[method-assign]
    before._waste = lambda positions: None  # type: ignore[method-assign]
    for name, index in copies.items():
        started = time.perf_counter()
        index.load(dict(pairs))
        print(f"{name}: loaded {len(pairs):,} ({index.distinct:,} rows) in {time.perf_counter() - started:.2f} s")
    random_queries: list[tuple[int, str | None]] = [(rng.getrandbits(64), None) for _ in range(args.queries)]
    near_queries: list[tuple[int, str | None]] = [(near(), None) for _ in range(max(16, args.queries // 10))]
    for name, index in copies.items():
        started = time.perf_counter()
        for incident_id in storm_ids:
            index.delete(incident_id)
        spent = time.perf_counter() - started
        print(
            f"{name}: deleted the storm, {spent / len(storm_ids) * 1e6:.2f} us a delete; empty rows "
            f"{index.empty_rows:,} of {index.base_rows:,}, rebuilds {index.tier_rebuilds}"
        )
    fixed = copies["this code"]
    rebuild, rebuilding = fixed._rebuild, [0.0]

    def timed_rebuild(k: int) -> None:
        started = time.perf_counter()
        rebuild(k)
        rebuilding[0] += time.perf_counter() - started

    fixed._rebuild = timed_rebuild  # type: ignore[method-assign]
    first, candidates = _time_sends(fixed, near_queries[:16])
    print(
        f"this code: the first send near the storm: {first * 16 / 1e3:.1f} ms, {candidates:,.0f} candidates a query "
        f"(as before); rebuilds {fixed.tier_rebuilds}, {rebuilding[0] * 1e3:.1f} ms of it"
    )
    best: dict[tuple[str, str], tuple[float, float]] = {}
    for _ in range(3):  # the two copies in turn, best of 3: the machine's noise hits both
        for name, index in copies.items():
            for kind, queries in (("random", random_queries), ("near the storm", near_queries)):
                timed = _time_sends(index, queries)
                best[name, kind] = min(best.get((name, kind), timed), timed)
    for kind in ("random", "near the storm"):
        (a, a_candidates), (b, b_candidates) = best["before (no rebuild)", kind], best["this code", kind]
        print(
            f"queries {kind}: before {a:8.1f} us ({a_candidates:,.0f} candidates), this code {b:6.1f} us "
            f"({b_candidates:,.0f}): {a / b:.1f}x"
        )
    started = time.perf_counter()
    before.compact()
    spent = time.perf_counter() - started
    kinds = {"random": random_queries, "near": near_queries}
    after = {kind: min(_time_sends(before, queries)[0] for _ in range(3)) for kind, queries in kinds.items()}
    print(
        f"before, compacted in {spent:.2f} s: {after['random']:.1f} us a random query, "
        f"{after['near']:.1f} near the storm"
    )


if __name__ == "__main__":
    main()
