"""The snapshot copy's search alone (worker/snapshot.py, no Redis) for a near-duplicate storm, as a worker runs it.

The storm of `incident-worker bench --near-storm` (`near_storm_bags`): its first WARM fingerprints set one by one into
a copy (the rows a worker makes while it follows the change log), then the next QUERIES searched in sends of SEND,
each excluding its own ID, with the claim's listing (the cap 100 and 16) and the snapshot path's default budget:
the CPU time per query (best of 3), and a digest of the answers, so that two versions can be checked to answer alike
(run it on both, alternately: benchmarks/journal/near-storms.md).

Usage: python benchmarks/storm_copy.py [WARM] [QUERIES] [SEND]
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # run as a script from anywhere, without installing the package

from worker.bands import BandLayout  # noqa: E402
from worker.devtools.near_storm import near_storm_bags  # noqa: E402
from worker.fingerprint import fingerprint  # noqa: E402
from worker.limits import DEFAULT_SNAPSHOT_MAX_CANDIDATES  # noqa: E402
from worker.snapshot import MemoryIndex, SearchResult  # noqa: E402

LISTED = 116  # the alert's cap (100) and the claim's 16 more


def main() -> None:
    warm = int(sys.argv[1]) if len(sys.argv) > 1 else 8000
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    send = int(sys.argv[3]) if len(sys.argv) > 3 else 14
    fps = [fingerprint(bag) for bag in near_storm_bags(warm + count)]
    index = MemoryIndex(BandLayout(4, 7))
    for k in range(warm):
        index.set(f"near-{k}", fps[k])
    queries = [(fps[k], f"near-{k}") for k in range(warm, warm + count)]

    def run() -> list[SearchResult]:
        found: list[SearchResult] = []
        for first in range(0, count, send):
            found += index.search_many(
                queries[first : first + send], limit=LISTED, budget=DEFAULT_SNAPSHOT_MAX_CANDIDATES
            )
        return found

    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        results = run()
        best = min(best, time.process_time() - started)
    digest = hashlib.sha1(repr([(r.match_count, r.matches, r.candidates, r.cut) for r in results]).encode())
    print(
        f"storm copy, {warm:,} set, {count:,} queries in sends of {send}: {best * 1e6 / count:,.0f} us a query "
        f"(best of 3), {sum(r.match_count for r in results) / count:,.0f} matches and "
        f"{sum(r.candidates for r in results) / count:,.0f} candidates a query, answers {digest.hexdigest()[:12]}"
    )


if __name__ == "__main__":
    main()
