"""benchmarks/near_storm_structure.py: the simulation behind the decision not to cluster near twins counts exactly.

Its figures (docs/contract.md, "The per-event budget") are only as good as the simulation: for every event of a
small storm and every delta, the clusters counted whole plus the members opened must give the brute-force count,
and the branch and bound the brute-force closest distances.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from near_storm_structure import clusters, today

from worker.bands import DEFAULT_BANDS, BandLayout
from worker.devtools.near_storm import near_storm_bags
from worker.fingerprint import fingerprint


@pytest.mark.parametrize("delta", [0, 1, 2, 3])
def test_the_cluster_simulation_counts_and_lists_what_a_linear_scan_finds(delta: int) -> None:
    layout = BandLayout(DEFAULT_BANDS, 7)
    events = np.array([fingerprint(bag) for bag in near_storm_bags(400)], dtype=np.uint64)
    found = clusters(events, layout, delta, 7, cap=10, check=True)
    assert found["clusters"] <= len(set(events.tolist()))
    if delta == 0:
        # clusters of radius 0 are today's twin groups: one label per distinct fingerprint, each read as a candidate
        assert found["clusters"] == len(set(events.tolist()))
        assert found["labels_read"] == today(events, layout)["candidates"]
