"""The copy's candidates verified by its compiled loop (`compiled.near_ranges`), against the plain gather; a near
storm's send counted and picked by its two compiled passes over every row (`scan_counts`, `scan_picks`), against the
table of distances; the numpy steps a copy searches with while the loops compile (`copyarrays.PLAIN_LOOPS`) against
the same; and searches whose loop had too little room for its near candidates (it runs again with room for all)
against searches with room to spare and the oracle.

An ordinary send finds a few dozen near candidates, within the loop's first room; a near storm's send thousands. Here
a room of a few candidates makes every search run the loop twice, ranges that are empty or find nothing included."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import worker.compiled
import worker.copyarrays
import worker.snapshot
from tests.oracle import Oracle, clustered, flip
from worker.bands import BandLayout
from worker.copyarrays import PLAIN_LOOPS, ranges
from worker.snapshot import MemoryIndex

pytestmark = pytest.mark.usefixtures("compiled_loops")  # (the searches here run the compiled loops)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32),
    lengths=st.lists(st.sampled_from([0, 0, 1, 2, 3, 5, 9, 40]), max_size=30),
    r=st.sampled_from([0, 1, 7, 30, 33, 64]),
    room=st.sampled_from([1, 2, 7, 4096]),
    near_values=st.booleans(),
    plain=st.booleans(),
)
def test_the_loop_finds_what_the_plain_gather_finds(
    seed, lengths, r, room, near_values, plain, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every candidate within r found, in order, with its XOR; at every distance up to 64 (popcount of a value with
    the top bit set included: r = 33 and 64 take values of any weight, a signed or float comparison breaks them).
    `plain`: the numpy steps used while the loop compiles."""
    monkeypatch.setattr(worker.compiled, "_ROOM", room)
    near_ranges = PLAIN_LOOPS.near_ranges if plain else worker.compiled.near_ranges
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 2**64, size=200, dtype=np.uint64)
    fps = rng.integers(0, 2**64, size=len(lengths), dtype=np.uint64)
    if near_values:  # (values a few bits from the queries: most candidates near)
        values = values.copy()
        values[: len(fps)] = fps ^ (np.uint64(1) << rng.integers(0, 64, size=len(fps)).astype(np.uint64))
    counts = np.array(lengths, dtype=np.int64)
    starts = np.array([int(rng.integers(0, 201 - n)) for n in lengths], dtype=np.int64)
    near, apart = near_ranges(values, starts, counts, fps, r)
    every = values.take(ranges(starts, starts + counts)) ^ fps.repeat(counts)
    expected = (np.bitwise_count(every) <= r).nonzero()[0]
    assert near.dtype == np.int64 and apart.dtype == np.uint64
    assert near.tolist() == expected.tolist()
    assert apart.tolist() == every[expected].tolist()


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


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32),
    rows=st.sampled_from([0, 1, 2, 7, 64, 300]),
    n=st.sampled_from([1, 2, 16]),
    r=st.sampled_from([0, 3, 7, 12]),
    room=st.sampled_from([1, 3, 4096]),
    plain=st.booleans(),
)
def test_a_scan_counts_and_picks_what_the_table_of_distances_gives(
    seed, rows, n, r, room, plain, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`scan_counts` and `scan_picks` (a near storm's send compared with every row: `copylisting.scanned_results`)
    against the table of every distance they spare: each query's member counts by distance (`np.bincount` weighted
    by them), and the (query, row, distance) of the rows of members within each query's bound, in the same order;
    fingerprints near the queries and far, rows with no member, bounds of 0 to r, and too little room at first.
    `plain`: the numpy steps used while the loops compile, their XORs made a few pairs at a time."""
    loops = PLAIN_LOOPS if plain else worker.compiled
    monkeypatch.setattr(worker.copyarrays, "_PLAIN_STEP", room)
    rng = np.random.default_rng(seed)
    centre = rng.integers(0, 2**64, dtype=np.uint64, endpoint=False)
    fps = centre ^ rng.integers(0, 2**64, rows, dtype=np.uint64, endpoint=False)
    near = rng.random(rows) < 0.7  # (most of them within a few bits of the queries, as a storm's are)
    flips = np.array([sum(1 << b for b in rng.choice(64, rng.integers(0, 9), replace=False)) for _ in range(rows)])
    fps[near] = centre ^ flips.astype(np.uint64)[near]
    sizes = rng.choice(np.array([0, 1, 1, 1, 2, 5], dtype=np.int32), rows)
    queries = centre ^ np.array([1 << int(b) for b in rng.integers(0, 64, n)], dtype=np.uint64)
    table = np.bitwise_count(fps ^ queries[:, None]).astype(np.int64)
    counts = np.zeros((n, r + 1), dtype=np.int64)
    loops.scan_counts(fps, sizes, queries, r, counts)
    for k in range(n):
        assert counts[k].tolist() == np.bincount(table[k], weights=sizes, minlength=65)[: r + 1].astype(int).tolist()
    bound = rng.integers(0, r + 1, n).astype(np.uint64)
    monkeypatch.setattr(worker.compiled, "_ROOM", room)
    which, at, distance = loops.scan_picks(fps, sizes, queries, bound)
    expected_which, expected_at = ((table <= bound[:, None].astype(np.int64)) & (sizes > 0)).nonzero()
    assert which.tolist() == expected_which.tolist()
    assert at.tolist() == expected_at.tolist()
    assert distance.tolist() == table[expected_which, expected_at].tolist()


@settings(max_examples=100, deadline=None)
@given(
    seed=st.integers(0, 2**32), n=st.sampled_from([1, 3, 16]), probes=st.sampled_from([1, 5, 68]), plain=st.booleans()
)
def test_probe_totals_add_what_each_querys_probes_reach(seed, n, probes, plain) -> None:
    """`probe_totals` (the candidates of a near storm's next send, counted without their ranges:
    `MemoryIndex._scan_counted`) against the candidates of each probe taken one at a time from a tier's table of
    positions (int32, as a copy's tables are): added to what `totals` held, empty values (a value no fingerprint
    holds) included."""
    loops = PLAIN_LOOPS if plain else worker.compiled
    rng = np.random.default_rng(seed)
    table = np.concatenate(([0], np.cumsum(rng.choice([0, 0, 1, 3, 40], 300)))).astype(np.int32) + 7
    grid = rng.integers(0, 300, (n, probes), dtype=np.int64)
    totals = rng.integers(0, 1000, n, dtype=np.int64)
    expected = [int(totals[k]) + sum(int(table[s + 1]) - int(table[s]) for s in grid[k]) for k in range(n)]
    loops.probe_totals(table, grid, totals)
    assert totals.tolist() == expected


@pytest.mark.parametrize("room", [1, 5, 64])
@pytest.mark.parametrize("budget", [0, 40])
def test_searches_whose_loop_had_little_room_answer_as_with_room_to_spare(
    room, budget, seal_at, few_hits, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every answer, count of candidates and cut the same as with the loop's full room (and, without a budget, the
    oracle's); rows that went found where they are (the searches' thrown-away candidates build tiers anew alike).
    Sends are searched through the bands whatever their candidates (never compared with every row: `_scan`)."""
    monkeypatch.setattr(worker.snapshot, "_SCAN_SHARE", 0)
    layout = BandLayout(4, 7)
    spare, oracle, pool = _copy(11, layout)
    little, _, _ = _copy(11, layout)
    rng = random.Random(5)
    for _ in range(12):
        queries = [(flip(rng.choice(pool), rng.randint(0, 8), rng), rng.choice([None, "i1", "i2"])) for _ in range(16)]
        expected = spare.search_many(queries, limit=5, budget=budget)
        monkeypatch.setattr(worker.compiled, "_ROOM", room)
        got = little.search_many(queries, limit=5, budget=budget)
        monkeypatch.setattr(worker.compiled, "_ROOM", 4096)
        assert got == expected
        assert little.tier_rebuilds == spare.tier_rebuilds
        if not budget:
            for (fp, exclude), result in zip(queries, got, strict=True):
                found = oracle.matches(fp, exclude=exclude)
                assert (result.match_count, result.matches) == (len(found), found[:5])


@pytest.mark.parametrize("scan_share", [0, 2**62])
def test_a_copy_searches_with_numpy_while_its_loops_compile(scan_share, monkeypatch: pytest.MonkeyPatch) -> None:
    """Until `compile_soon`'s thread is done, `loops` gives the numpy steps, and a copy's searches (through the
    bands, or a near storm's send compared with every row: `scan_share`) answer as the compiled loops do, and as the
    oracle; once it is done, the compiled loops."""
    assert worker.copyarrays.loops() is worker.compiled
    monkeypatch.setattr(worker.snapshot, "_SCAN_SHARE", scan_share)
    layout = BandLayout(4, 7)
    compiled, oracle, pool = _copy(13, layout)
    plain, _, _ = _copy(13, layout)
    rng = random.Random(7)
    running = threading.Event()
    thread = threading.Thread(target=running.wait, daemon=True)  # (a compiler still at work)
    thread.start()
    try:
        for _ in range(8):
            queries = [(flip(rng.choice(pool), rng.randint(0, 8), rng), rng.choice([None, "i1"])) for _ in range(16)]
            with monkeypatch.context() as compiling:
                compiling.setattr(worker.copyarrays, "_compiled", None)
                compiling.setattr(worker.copyarrays, "_compiler", thread)
                assert worker.copyarrays.loops() is PLAIN_LOOPS
                got = plain.search_many(queries, limit=5)
            assert compiled.search_many(queries, limit=5) == got
            for (fp, exclude), result in zip(queries, got, strict=True):
                found = oracle.matches(fp, exclude=exclude)
                assert (result.match_count, result.matches) == (len(found), found[:5])
    finally:
        running.set()
        thread.join(timeout=5)


def test_a_process_forked_while_its_loops_compiled_compiles_them_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process forked while the compiler's thread ran has the thread's record but not the thread (nor its
    answer): its first search compiles the loops itself rather than search in numpy's steps for good."""
    gone = threading.Thread(target=lambda: None)
    gone.start()
    gone.join()
    monkeypatch.setattr(worker.copyarrays, "_compiler", gone)
    monkeypatch.setattr(worker.copyarrays, "_compiled", None)
    assert worker.copyarrays.loops() is worker.compiled
    assert worker.copyarrays._compiled is worker.compiled


def _compile_refused(monkeypatch: pytest.MonkeyPatch, stage: str) -> list[dict[str, Any]]:
    """The compiler's thread run once with `stage` (worker/compiled.py's `warm_search` or `warm_listing`) refused as a
    hardened host refuses (or a broken numba fails); the log lines it wrote."""

    def refused() -> None:
        raise RuntimeError("cannot allocate executable memory")

    monkeypatch.setattr(worker.compiled, stage, refused)
    monkeypatch.setattr(worker.copyarrays, "_compiled", None)
    with structlog.testing.capture_logs() as logs:
        worker.copyarrays._compile()
    return logs


def test_a_copy_whose_loops_cannot_compile_searches_with_numpy_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host that refuses to run the code numba makes (or a broken numba): the thread's failure is logged once, as
    an error with what to check, and the copy searches on with the numpy steps, answering as the oracle."""

    logs = _compile_refused(monkeypatch, "warm_search")
    assert worker.copyarrays.loops() is PLAIN_LOOPS
    [line] = logs
    assert line["log_level"] == "error"
    assert "RuntimeError: cannot allocate executable memory" in line["error"]
    assert "numba" in line["hint"]
    index, oracle, pool = _copy(17, BandLayout(4, 7))
    rng = random.Random(3)
    queries = [(flip(rng.choice(pool), rng.randint(0, 8), rng), rng.choice([None, "i2"])) for _ in range(16)]
    for (fp, exclude), result in zip(queries, index.search_many(queries, limit=5), strict=True):
        found = oracle.matches(fp, exclude=exclude)
        assert (result.match_count, result.matches) == (len(found), found[:5])


def test_a_copy_whose_listing_loop_cannot_compile_searches_compiled_and_lists_in_python(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The search's loops compile first, the listing's after them (`warm_search`, `warm_listing`): the listing's
    failure is logged once, and the copy searches with the compiled loops and lists in Python, as the oracle; so
    while the listing's loop compiles (the thread alive), and a process forked then compiles it at its next search."""

    logs = _compile_refused(monkeypatch, "warm_listing")
    loops = worker.copyarrays.loops()
    assert loops.scan_picks is worker.compiled.scan_picks and not hasattr(loops, "write_listings")
    assert worker.copyarrays.loops() is loops  # (for good: not compiled again at each search)
    [line] = logs
    assert line["log_level"] == "error" and "listing" in line["event"] and "numba" in line["hint"]
    index, oracle, pool = _copy(17, BandLayout(4, 7))
    rng = random.Random(3)
    queries = [(flip(rng.choice(pool), rng.randint(0, 8), rng), rng.choice([None, "i2"])) for _ in range(16)]
    monkeypatch.setattr(worker.snapshot, "_FEW_HITS", 0)
    for (fp, exclude), result in zip(queries, index.search_many(queries, limit=5), strict=True):
        found = oracle.matches(fp, exclude=exclude)
        assert (result.match_count, result.matches) == (len(found), found[:5])
        assert type(result.matches) is list
    # the listing's loop still compiling, then the thread gone (a process forked meanwhile)
    monkeypatch.undo()
    searching = worker.copyarrays._searching
    assert searching is not None
    alive, release = threading.Event(), threading.Event()
    running = threading.Thread(target=lambda: (alive.set(), release.wait(10)))
    running.start()
    alive.wait(10)
    monkeypatch.setattr(worker.copyarrays, "_compiler", running)
    monkeypatch.setattr(worker.copyarrays, "_compiled", searching)
    assert worker.copyarrays.loops() is searching
    release.set()
    running.join()
    assert worker.copyarrays.loops() is worker.compiled


def test_the_loop_runs_where_numba_has_nowhere_to_cache_it() -> None:
    """A read-only install without a home (the Docker image's user): numba refuses `cache=True` when it finds no
    writable place for its cache. The loop is then compiled in the process and answers as anywhere else. Run in a
    process of its own, with numba told of no place at all (its list of places emptied before the import)."""
    script = textwrap.dedent(
        """
        import numba.core.caching as caching
        import numpy as np

        impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl")
        impl._locator_classes = []
        import worker.compiled

        assert type(worker.compiled._near._cache).__name__ == "NullCache"
        values = np.array([0, 1, 3, 7, 2**64 - 1], dtype=np.uint64)
        near, apart = worker.compiled.near_ranges(
            values, np.array([0, 2], dtype=np.int64), np.array([3, 3], dtype=np.int64),
            np.array([0, 2**64 - 1], dtype=np.uint64), 1,
        )
        print(near.tolist(), apart.tolist())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=Path(__file__).parent.parent
    )
    assert done.returncode == 0, done.stderr
    # candidates 0, 1, 3 against 0 (0 and 1 within 1 bit), then 3, 7, 2**64 - 1 against 2**64 - 1 (only itself)
    assert done.stdout.split("\n")[0] == "[0, 1, 5] [0, 1, 0]"


def test_searches_run_the_loops_warm_compiled_and_compile_none_again() -> None:
    """numba compiles a loop again, in the caller's thread, for each new combination of argument types (a read-only
    array for a writable one is one): `warm` must compile the types the searches pass, or the first search of each
    kind waits ~1.5 s (a storm's first send, at `auto`'s switch, where the cache is not kept). Every path, with and
    without an excluded ID, leaves each loop with the one signature warm made."""
    rng = random.Random(4)
    center = rng.getrandbits(64)
    index = MemoryIndex(BandLayout(4, 7))
    index.load({f"l{k}": flip(center, rng.randint(1, 5), rng) for k in range(500)})
    for k in range(500):
        index.set(f"m{k}", flip(center, rng.randint(1, 5), rng))
    with pytest.MonkeyPatch.context() as patch:
        for share, few in ((2**62, 0), (0, 0)):  # (compared with every row; through the bands, in arrays)
            patch.setattr(worker.snapshot, "_SCAN_SHARE", share)
            patch.setattr(worker.snapshot, "_FEW_HITS", few)
            for exclude in ("l3", "m3", "absent", None):
                index.search_many([(center, exclude), (center ^ 1, None)], limit=116)
    loops = [
        worker.compiled._near,
        worker.compiled._scan_counts,
        worker.compiled._scan_picks,
        worker.compiled._probe_totals,
    ]
    assert [len(loop.signatures) for loop in [*loops, worker.compiled._write_listings]] == [1, 1, 1, 1, 1]
