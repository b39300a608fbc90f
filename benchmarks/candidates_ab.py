"""The copy's candidates read and verified, in-process, alternately: numpy's passes (positions of every candidate by
`ranges`, one `take`, the queries repeated and XORed, popcount: each pass over a whole send) against the compiled
loop the copy uses (`compiled.near_ranges`: each candidate read once), on a copy of N workload fingerprints loaded
from arrays and 4,000 queries in sends of 16 (benchmarks/journal/pipeline.md, issue 25). Checks that both find the
same near candidates, with the same XORs, in every send; prints process time an event per round.

Usage: python benchmarks/candidates_ab.py [--size N] [--rounds R]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # run as a script from anywhere, without installing the package

import numpy as np  # noqa: E402

from worker.bands import BandLayout  # noqa: E402
from worker.compiled import near_ranges, warm  # noqa: E402
from worker.copyarrays import ranges, tile  # noqa: E402
from worker.devtools.workload import Workload  # noqa: E402
from worker.loadedrows import RowsBuilder  # noqa: E402
from worker.snapshot import MemoryIndex  # noqa: E402

QUERIES = 4000
R = 7


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    ids, fps = Workload(seed=7).fingerprints(args.size + QUERIES)
    index = MemoryIndex(BandLayout(4, R))
    builder = RowsBuilder()
    builder.add([incident_id.encode() for incident_id in ids[: args.size]], fps[: args.size])
    index.load_rows(builder)
    del builder
    band_of, masks, first_slot, _ = index._probes(R)
    tables = [tier.starts for tier in index._tiers if tier.starts is not None]
    sends = []
    for start in range(0, QUERIES, 16):
        queries = fps[args.size + start : args.size + start + 16].copy()
        values = (queries[:, None] >> index._offsets) & index._width_masks
        slots = (first_slot + (values[:, band_of] ^ masks).astype(np.int64)).ravel()
        starts = np.concatenate([table[slots] for table in tables]).astype(np.int64)
        ends = np.concatenate([table[slots + 1] for table in tables]).astype(np.int64)
        of = tile(np.arange(len(queries)).repeat(len(band_of)), len(tables))
        sends.append((queries[of], starts, ends))
    arena = index._arena

    def whole() -> list[tuple[np.ndarray, np.ndarray]]:
        found = []
        for query_fps, starts, ends in sends:
            apart = arena.take(ranges(starts, ends)) ^ query_fps.repeat(ends - starts)
            near = (np.bitwise_count(apart) <= R).nonzero()[0]
            found.append((near, apart[near]))
        return found

    def compiled() -> list[tuple[np.ndarray, np.ndarray]]:
        return [near_ranges(arena, starts, ends - starts, query_fps, R) for query_fps, starts, ends in sends]

    warm()
    for (near, apart), (near_c, apart_c) in zip(whole(), compiled(), strict=True):
        assert np.array_equal(near, near_c) and np.array_equal(apart, apart_c)
    print(f"candidates an event: {sum(int((e - s).sum()) for _, s, e in sends) / QUERIES:,.0f}", flush=True)
    for round_ in range(args.rounds):
        took = []
        for run in (whole, compiled):
            started = time.process_time()
            run()
            took.append((time.process_time() - started) * 1e6 / QUERIES)
        ratio = took[1] / took[0]
        print(
            f"round {round_ + 1}: numpy's passes {took[0]:.1f} us/event, the compiled loop {took[1]:.1f} ({ratio:.2f}x)"
        )


if __name__ == "__main__":
    main()
