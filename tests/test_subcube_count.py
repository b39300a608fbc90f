"""benchmarks/subcube_count.py: the prototype that prices a count of the near storm visiting no match.

Its figures (benchmarks/journal/near-storms.md) are only as good as its answers: on a real Redis, every event of a
small storm must get the brute-force count within r and the brute-force closest matches, in (distance, ID) order.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from subcube_count import run


@pytest.mark.parametrize("cap", [0, 1, 10])
def test_the_prototype_counts_and_lists_what_a_linear_scan_finds(cap: int) -> None:
    result = run(600, cap, check_every=1)
    assert result["free_bits"] == 14  # the storm's shape the journal describes
    assert result["checked"] == 600
    assert result["wrong"] == 0
    assert max(phase["mean_count"] for phase in result["phases"]) > 50  # the storm's events do match one another
