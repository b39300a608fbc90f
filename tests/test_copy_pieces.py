"""The copy's candidates read a piece at a time (`copyarrays.xor_ranges`), against the plain gather and whole reads.

A search of a send at a million incidents reads one piece; only sends of more than `PIECE` candidates (10M, near
storms) read several. Here pieces of a few candidates make every search read many, ranges longer than a piece and
empty ones included."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import worker.copyarrays
import worker.snapshot
from tests.oracle import Oracle, clustered, flip
from worker.bands import BandLayout
from worker.copyarrays import ranges, xor_ranges
from worker.snapshot import MemoryIndex


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32),
    lengths=st.lists(st.sampled_from([0, 0, 1, 2, 3, 5, 9, 40]), max_size=30),
    piece=st.sampled_from([1, 2, 3, 7, 16, 1 << 15]),
)
def test_pieces_read_what_the_plain_gather_reads(seed, lengths, piece, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker.copyarrays, "PIECE", piece)
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 2**64, size=200, dtype=np.uint64)
    counts = np.array(lengths, dtype=np.int64)
    starts = np.array([int(rng.integers(0, 201 - n)) for n in lengths], dtype=np.int64)
    fps = rng.integers(0, 2**64, size=len(lengths), dtype=np.uint64)
    apart, distances = xor_ranges(values, starts, counts, fps)
    expected = values.take(ranges(starts, starts + counts)) ^ fps.repeat(counts)
    assert apart.dtype == np.uint64 and apart.tolist() == expected.tolist()
    assert distances.tolist() == np.bitwise_count(expected).tolist()


def _copy(seed: int, layout: BandLayout) -> tuple[MemoryIndex, Oracle, list[int]]:
    """A loaded copy with storms of twins and near ones, changed after its load (new rows, rows emptied)."""
    rng = random.Random(seed)
    pool = clustered(rng, 24, layout.max_distance, centers=3)
    index, oracle = MemoryIndex(layout), Oracle(layout.max_distance)
    for k in range(300):
        oracle.fps[f"i{k}"] = rng.choice(pool) if k % 3 else flip(rng.choice(pool), rng.randint(0, 9), rng)
    index.load(oracle.fps.items())
    for k in range(120):
        incident_id = f"i{rng.randrange(400)}"
        if k % 4 == 3:
            index.delete(incident_id)
            oracle.fps.pop(incident_id, None)
        else:
            fp = flip(rng.choice(pool), rng.randint(0, 3), rng)
            index.set(incident_id, fp)
            oracle.fps[incident_id] = fp
    return index, oracle, pool


@pytest.mark.parametrize("piece", [1, 5, 64])
@pytest.mark.parametrize("budget", [0, 40])
def test_searches_read_in_small_pieces_answer_as_whole_reads(
    piece, budget, seal_at, few_hits, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every answer, count of candidates and cut the same as with one piece a send (and, without a budget, the
    oracle's); rows that went found where they are (the searches' thrown-away candidates build tiers anew alike).
    Sends are searched through the bands whatever their candidates (never compared with every row: `_scan`)."""
    monkeypatch.setattr(worker.snapshot, "_SCAN_SHARE", 0)
    layout = BandLayout(4, 7)
    whole, oracle, pool = _copy(11, layout)
    pieces, _, _ = _copy(11, layout)
    rng = random.Random(5)
    for _ in range(12):
        queries = [(flip(rng.choice(pool), rng.randint(0, 8), rng), rng.choice([None, "i1", "i2"])) for _ in range(16)]
        expected = whole.search_many(queries, limit=5, budget=budget)
        monkeypatch.setattr(worker.copyarrays, "PIECE", piece)
        got = pieces.search_many(queries, limit=5, budget=budget)
        monkeypatch.setattr(worker.copyarrays, "PIECE", 1 << 15)
        assert got == expected
        assert pieces.tier_rebuilds == whole.tier_rebuilds
        if not budget:
            for (fp, exclude), result in zip(queries, got, strict=True):
                found = oracle.matches(fp, exclude=exclude)
                assert (result.match_count, result.matches) == (len(found), found[:5])
