"""The worker-side copy of the index (worker/snapshot.py) against the brute-force oracle."""

from __future__ import annotations

import itertools
import json
import math
import random
import threading
import time
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import worker.copyrows
import worker.snapshot
from tests.oracle import Oracle, assert_postings_match, clustered, flip
from worker.bands import BandLayout
from worker.fingerprint import format_fingerprint, stored_fingerprint
from worker.loadedrows import RowsBuilder
from worker.snapshot import MemoryIndex

LAYOUTS = [(4, 7), (3, 7), (8, 7), (5, 7), (2, 3), (1, 0), (6, 12)]


def _expected(oracle: Oracle, fp: int, exclude: str | None, limit: int) -> tuple[int, list[tuple[str, int]]]:
    found = oracle.matches(fp, exclude=exclude)
    return len(found), found[:limit] if limit else found


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    layout=st.sampled_from(LAYOUTS),
    seed=st.integers(0, 2**32),
    ops=st.lists(
        st.tuples(st.sampled_from(["set", "set", "set", "delete"]), st.integers(0, 40), st.integers(0, 11)),
        max_size=120,
    ),
    limit=st.sampled_from([0, 1, 3, 100]),
)
def test_search_equals_a_linear_scan_through_sets_deletes_and_twins(
    layout, seed, ops, limit, seal_at, direct_tables, few_hits
) -> None:
    bands, max_distance = layout
    rng = random.Random(seed)
    # few distinct fingerprints, so that twins (storms) and near pairs are common
    pool = clustered(rng, 12, max_distance, centers=2)
    index = MemoryIndex(BandLayout(bands, max_distance))
    oracle = Oracle(max_distance)
    for op, incident, which in ops:
        incident_id = f"i{incident}"
        if op == "set":
            index.set(incident_id, pool[which])
            oracle.fps[incident_id] = pool[which]
        else:
            index.delete(incident_id)
            oracle.fps.pop(incident_id, None)
    assert dict(index.items()) == oracle.fps
    for fp in [*pool, flip(pool[0], max_distance, rng), flip(pool[1], max_distance + 1, rng)]:
        for exclude in (None, "i0", "i1"):
            result = index.search(fp, exclude=exclude, limit=limit)
            assert (result.match_count, result.matches) == _expected(oracle, fp, exclude, limit)


def _loaded_then_changed(
    layout: BandLayout, pool: list[int], loaded: list[tuple[int, int]], ops: list[tuple[str, int, int]]
) -> tuple[MemoryIndex, Oracle]:
    """A copy loaded in one go (one numpy tier) with `loaded` (incident, pool index), then changed by `ops` (set,
    delete, compact: rows in the tail or new tiers, tier rows emptied, all numbered anew in one tier), beside the
    oracle of the same."""
    index = MemoryIndex(layout)
    oracle = Oracle(layout.max_distance)
    for incident, which in loaded:
        oracle.fps[f"i{incident}"] = pool[which]
    index.load(oracle.fps.items())
    assert index.base_rows == len(set(oracle.fps.values()))
    for op, incident, which in ops:
        incident_id = f"i{incident}"
        if op == "set":
            index.set(incident_id, pool[which])
            oracle.fps[incident_id] = pool[which]
        elif op == "delete":
            index.delete(incident_id)
            oracle.fps.pop(incident_id, None)
        else:
            index.compact()
            assert index.overlay_rows == 0 and index.base_rows == index.distinct
    assert dict(index.items()) == oracle.fps
    return index, oracle


def _change_both(index: MemoryIndex, oracle: Oracle, pool: list[int], changes: list[tuple[str, int, int]]) -> None:
    """Each (set or delete, incident, pool index) of `changes` made in the copy and in the oracle."""
    for op, incident, which in changes:
        if op == "set":
            index.set(f"i{incident}", pool[which])
            oracle.fps[f"i{incident}"] = pool[which]
        else:
            index.delete(f"i{incident}")
            oracle.fps.pop(f"i{incident}", None)


def _change_rounds(*, incidents: int, pool: int, changes: int, rounds: int) -> st.SearchStrategy:
    """Rounds of changes (set or delete, incident, pool index), each searched after it."""
    change = st.tuples(st.sampled_from(["set", "set", "delete"]), st.integers(0, incidents), st.integers(0, pool))
    return st.lists(st.lists(change, max_size=changes), min_size=1, max_size=rounds)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    layout=st.sampled_from(LAYOUTS),
    seed=st.integers(0, 2**32),
    loaded=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 11)), max_size=60),
    ops=st.lists(
        st.tuples(st.sampled_from(["set", "set", "delete", "compact"]), st.integers(0, 40), st.integers(0, 11)),
        max_size=80,
    ),
    limit=st.sampled_from([0, 1, 3, 100]),
    max_distance=st.sampled_from([None, 0, 2]),
)
def test_the_numpy_base_and_the_rows_made_after_it_search_like_a_linear_scan(
    layout, seed, loaded, ops, limit, max_distance, seal_at, direct_tables, few_hits
) -> None:
    """A copy loaded in one go (one numpy tier), then changed (rows in the tail and in tiers, rows emptied) and
    compacted."""
    bands, layout_distance = layout
    rng = random.Random(seed)
    pool = clustered(rng, 12, layout_distance, centers=2)
    index, oracle = _loaded_then_changed(BandLayout(bands, layout_distance), pool, loaded, ops)
    r = layout_distance if max_distance is None else min(max_distance, layout_distance)
    for fp in [*pool, flip(pool[0], layout_distance, rng), flip(pool[1], layout_distance + 1, rng)]:
        for exclude in (None, "i0", "i1"):
            result = index.search(fp, max_distance=max_distance, exclude=exclude, limit=limit)
            found = oracle.matches(fp, limit=r, exclude=exclude)
            assert (result.match_count, result.matches) == (len(found), found[:limit] if limit else found)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    layout=st.sampled_from(LAYOUTS),
    seed=st.integers(0, 2**32),
    loaded=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 11)), min_size=1, max_size=60),
    rounds=_change_rounds(incidents=30, pool=11, changes=12, rounds=4),
    kept=st.sampled_from([1, 3, 65_536]),
)
def test_loaded_rows_read_once_are_read_again_after_they_change(layout, seed, loaded, rounds, kept) -> None:
    """A loaded row's members, once a search has read them, are kept (`_read`, a storm lists the same rows for each
    event), and a change of that row (a twin set beside its incidents, one of them deleted or moved) is what the next
    search reads: each round of changes is searched like a linear scan, the kept rows full (`_READ_KEPT`) or not."""
    bands, layout_distance = layout
    rng = random.Random(seed)
    pool = clustered(rng, 12, layout_distance, centers=2)
    index, oracle = _loaded_then_changed(BandLayout(bands, layout_distance), pool, loaded, [])
    queries = [(fp, exclude) for fp in pool for exclude in (None, "i0")]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(worker.copyrows, "_READ_KEPT", kept)
        for changes in [[], *rounds]:
            _change_both(index, oracle, pool, changes)
            results = index.search_many(queries, limit=100)
            assert len(index._read) <= kept
            for (fp, exclude), result in zip(queries, results, strict=True):
                found = oracle.matches(fp, limit=layout_distance, exclude=exclude)
                assert (result.match_count, result.matches) == (len(found), found)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    layout=st.sampled_from(LAYOUTS),
    seed=st.integers(0, 2**32),
    loaded=st.lists(st.tuples(st.integers(0, 60), st.integers(0, 15)), max_size=80),
    changed=st.lists(
        st.tuples(st.sampled_from(["set", "delete"]), st.integers(0, 60), st.integers(0, 15)), max_size=40
    ),
    limit=st.sampled_from([0, 1, 3, 100]),
    max_distance=st.sampled_from([None, 1]),
)
def test_a_batch_of_searches_answers_each_as_a_linear_scan(
    layout, seed, loaded, changed, limit, max_distance, seal_at, direct_tables, few_hits
) -> None:
    """search_many (one numpy pass over the base for a send's events) against the oracle, query by query; each the
    same as its own search, but for the candidates, fewer once a search built a tier anew without rows that went."""
    bands, layout_distance = layout
    rng = random.Random(seed)
    pool = clustered(rng, 16, layout_distance, centers=3)
    index, oracle = _loaded_then_changed(BandLayout(bands, layout_distance), pool, loaded, changed)
    queries = [(fp, rng.choice([None, "i0", "i1", "i2"])) for fp in pool]
    queries += [(flip(pool[0], layout_distance, rng), None), (rng.getrandbits(64), "i3")]
    rng.shuffle(queries)
    r = layout_distance if max_distance is None else min(max_distance, layout_distance)
    rebuilds = index.tier_rebuilds
    results = index.search_many(queries, max_distance=max_distance, limit=limit)
    assert len(results) == len(queries)
    for (fp, exclude), result in zip(queries, results, strict=True):
        found = oracle.matches(fp, limit=r, exclude=exclude)
        assert (result.match_count, result.matches) == (len(found), found[:limit] if limit else found)
        single = index.search(fp, max_distance=max_distance, exclude=exclude, limit=limit)
        assert (single.match_count, single.matches) == (result.match_count, result.matches)
        assert (
            single.candidates == result.candidates
            if rebuilds == index.tier_rebuilds
            else single.candidates <= result.candidates
        )


def test_the_numpy_base_gathers_every_candidate_of_many_probes() -> None:
    """Many rows under each probed band value: the candidates of every probe, none twice within a band."""
    index = MemoryIndex(BandLayout(4, 7))
    rng = random.Random(9)
    center = rng.getrandbits(64)
    pairs = [(f"n{k}", flip(center, rng.randint(0, 9), rng)) for k in range(3000)]
    pairs += [(f"far{k}", rng.getrandbits(64)) for k in range(3000)]
    index.load(pairs)
    oracle = Oracle(7)
    oracle.fps.update(pairs)
    result = index.search(center)
    assert result.match_count == len(oracle.matches(center))
    assert result.matches == oracle.matches(center)


def test_a_storm_of_twins_is_one_candidate() -> None:
    index = MemoryIndex(BandLayout(4, 7))
    rng = random.Random(3)
    fp = rng.getrandbits(64)
    for n in range(5000):
        index.set(f"storm-{n:05d}", fp)
    result = index.search(fp, limit=100)
    assert result.candidates == 1
    assert result.match_count == 5000
    assert result.matches == [(f"storm-{n:05d}", 0) for n in range(100)]
    assert index.distinct == 1


def test_deleting_every_twin_frees_the_row_and_its_postings() -> None:
    index = MemoryIndex(BandLayout(4, 7))
    index.set("a", 1)
    index.set("b", 1)
    index.set("b", 2)
    index.delete("a")
    index.delete("b")
    assert len(index) == 0 and index.distinct == 0
    assert index.search(1).match_count == 0
    assert index.overlay_rows == 2  # the rows of 1 and 2, both free
    index.set("c", 3)
    index.set("d", 4)
    index.set("e", 5)
    assert index.overlay_rows == 3  # two taken again, one new
    assert index.search(4, max_distance=1).matches == [("d", 0), ("e", 1)]


def _assert_tiers_hold_their_shape(index: MemoryIndex) -> None:
    """The tiers cover rows 0.. in order, each strictly larger than the next (a binary counter: at most log2 of the
    rows of them), and `empty_rows` counts exactly the tiers' rows no incident holds. Each tier's postings hold the
    fingerprints of its rows live when it was built, in its own part of the arena; `stale` of those went since, and
    never as many as would have it built anew."""
    tiers = index._tiers
    for t in tiers:
        live = {index._fp_at(row) for row in range(t.first, t.end) if index._held(row) is not None}
        assert t.size - t.stale == len(live)
        assert t.length == t.size * index.layout.bands
        run = index._arena[t.at : t.at + t.size].tolist()  # the first band's: each fingerprint once
        assert len(set(run)) == t.size
        assert {fp for fp in run if t.first <= (index._row(fp) if index._row(fp) is not None else -1) < t.end} == live
        assert not (t.stale >= worker.snapshot._SEAL_AT and t.stale * worker.snapshot._STALE_SHARE >= t.size)
    assert all(a.at + a.length <= b.at for a, b in itertools.pairwise(tiers))
    assert [t.first for t in tiers] == [0, *[t.end for t in tiers]][: len(tiers)]
    assert index.base_rows == (tiers[-1].end if tiers else 0)
    assert all(a.end - a.first > b.end - b.first for a, b in itertools.pairwise(tiers))
    assert all(t.size <= t.end - t.first for t in tiers)
    assert len(tiers) <= max(1, index.base_rows).bit_length()
    assert index.empty_rows == sum(1 for row in range(index.base_rows) if index._held(row) is None)
    assert index.overlay_rows < worker.snapshot._SEAL_AT


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    layout=st.sampled_from(LAYOUTS),
    seed=st.integers(0, 2**32),
    loaded=st.integers(0, 30),
    rounds=_change_rounds(incidents=60, pool=40, changes=30, rounds=6),
    seal=st.sampled_from([1, 2, 5]),
)
def test_tiers_sealed_and_merged_while_the_copy_changes_search_like_a_linear_scan(
    layout, seed, loaded, rounds, seal, direct_tables
) -> None:
    """Rows sealed into tiers every few changes and merged as they come (upserts and deletes emptying rows of older
    tiers, fingerprints held again after their row went): after each round every query answers as the oracle, and
    `compact` gives the empty rows back without changing an answer."""
    bands, max_distance = layout
    rng = random.Random(seed)
    pool = clustered(rng, 41, max_distance, centers=4)
    saved = worker.snapshot._SEAL_AT
    worker.snapshot._SEAL_AT = seal
    try:
        index = MemoryIndex(BandLayout(bands, max_distance))
        oracle = Oracle(max_distance)
        oracle.fps.update((f"i{k}", pool[rng.randrange(41)]) for k in range(loaded))
        index.load(dict(oracle.fps))
        queries = [*pool[:8], flip(pool[0], max_distance, rng), flip(pool[1], max_distance + 1, rng)]
        for ops in rounds:
            _change_both(index, oracle, pool, ops)
            _assert_tiers_hold_their_shape(index)
            results = index.search_many([(fp, "i0") for fp in queries], limit=3)
            for fp, result in zip(queries, results, strict=True):
                found = oracle.matches(fp, exclude="i0")
                assert (result.match_count, result.matches) == (len(found), found[:3])
        index.compact()
        assert index.empty_rows == 0 and index.tiers <= 1 and index.base_rows == index.distinct
        for fp in queries:
            found = oracle.matches(fp)
            assert index.search(fp).matches == found
    finally:
        worker.snapshot._SEAL_AT = saved


def _assert_searches_match(index: MemoryIndex, oracle: Oracle, queries: list[int]) -> list[int]:
    """Every query answers as the oracle; the candidates each verified."""
    results = index.search_many([(fp, None) for fp in queries])
    for fp, result in zip(queries, results, strict=True):
        found = oracle.matches(fp)
        assert (result.match_count, result.matches) == (len(found), found)
    return [result.candidates for result in results]


def test_tiers_sealed_after_a_load_are_written_behind_it_not_into_a_copy_of_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The arena a load fills has room behind it (and so have the rows' counts): the tiers sealed from the changes
    that follow are written there, and the loaded tier's fingerprints are never copied (at 10M, copying them into
    fresh memory at the first seal stopped the worker for half a second: the snapshot path's p99), nor the rows'
    counts when the rows made since outgrow their first 1,024. Answers stay the oracle's."""
    monkeypatch.setattr(worker.snapshot, "_SEAL_AT", 64)
    rng = random.Random(5)
    pool = clustered(rng, 300, 7, centers=6)
    oracle = Oracle(7)
    oracle.fps.update((f"i{k}", pool[k % 300] ^ (k // 300)) for k in range(3000))
    index = MemoryIndex(BandLayout(4, 7))
    index.load(dict(oracle.fps))
    loaded, counts = index._arena, index._sizes
    for k in range(1500):
        fp = flip(pool[rng.randrange(300)], rng.randrange(8), rng)
        index.set(f"n{k}", fp)
        oracle.fps[f"n{k}"] = fp
    assert index.tiers > 1 and index._arena is loaded, "a seal after the load copied the loaded tier"
    assert len(index._fps) > 1024  # the rows made since outgrew their first 1,024
    assert index._sizes is counts, "a row made after the load copied the loaded rows' counts"
    _assert_searches_match(index, oracle, [*pool[:20], flip(pool[0], 7, rng)])


def test_deletes_in_every_new_tier_do_not_chain_tiers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiers merge by the rows they span, not the rows they hold. Sealed every 64 rows, each new tier losing r + 1 of
    its rows in round r: merged by the rows they held, every tier was smaller than the one before it, so none merged
    (60 tiers at 7,680 rows, each a search pays for); by span, a binary counter, at most about log2(rows / 64)."""
    monkeypatch.setattr(worker.snapshot, "_SEAL_AT", 64)
    index = MemoryIndex(BandLayout(4, 7))
    oracle = Oracle(7)
    rng = random.Random(12)
    made = 0
    most = 0
    for r in range(120):
        batch = [f"i{made + k}" for k in range(64)]
        made += 64
        for incident_id in batch:
            fp = rng.getrandbits(64)
            index.set(incident_id, fp)
            oracle.fps[incident_id] = fp
        assert index.overlay_rows == 0  # the 64th sealed the tail
        for incident_id in batch[: r + 1]:
            index.delete(incident_id)
            del oracle.fps[incident_id]
        assert index.tiers <= math.log2(index.base_rows / 64) + 2, f"round {r}"
        most = max(most, index.tiers)
    assert index.base_rows == 7680
    assert most <= 9
    _assert_tiers_hold_their_shape(index)
    queries = [rng.getrandbits(64) for _ in range(20)]
    queries += [flip(fp, rng.randint(0, 8), rng) for fp in rng.sample(sorted(oracle.fps.values()), 20)]
    _assert_searches_match(index, oracle, queries)


def _storm(rng: random.Random, center: int, count: int) -> list[int]:
    """`count` distinct near-duplicates of `center` (1 to 5 bits from it)."""
    fps: set[int] = set()
    while len(fps) < count:
        fps.add(flip(center, rng.randint(1, 5), rng))
    return sorted(fps)


def _loaded_with_storm(
    seed: int, bands: int, storm_size: int, others: int
) -> tuple[random.Random, MemoryIndex, Oracle, int, dict[str, int]]:
    """A copy (and its oracle) loaded with a storm of `storm_size` near-duplicates of a random center (IDs ``s0``...)
    and `others` random fingerprints (``r0``...): the generator, the copy, the oracle, the center and the storm."""
    rng = random.Random(seed)
    index = MemoryIndex(BandLayout(bands, 7))
    oracle = Oracle(7)
    center = rng.getrandbits(64)
    storm = {f"s{k}": fp for k, fp in enumerate(_storm(rng, center, storm_size))}
    oracle.fps.update(storm)
    oracle.fps.update((f"r{k}", rng.getrandbits(64)) for k in range(others))
    index.load(dict(oracle.fps))
    return rng, index, oracle, center, storm


def test_wide_bands_get_tables_in_large_tiers_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bands of 22 bits (3 bands, the layout `stats` advises at 10M): a tier of at least 2^22 / _DIRECT_SHARE rows
    finds its postings in tables of int32 positions, a smaller one (made from the tail) by binary searches, and a
    search across both answers as the oracle."""
    monkeypatch.setattr(worker.snapshot, "_DIRECT_SHARE", (1 << 22) // 500)  # tables from 500 rows, not 524,288
    monkeypatch.setattr(worker.snapshot, "_SEAL_AT", 64)
    rng = random.Random(7)
    pool = clustered(rng, 900, 7, centers=30)
    index, oracle = MemoryIndex(BandLayout(3, 7)), Oracle(7)
    loaded = [(f"i{k}", fp) for k, fp in enumerate(pool[:600])]
    index.load(loaded)
    oracle.fps.update(loaded)
    for k, fp in enumerate(pool[600:]):
        index.set(f"n{k}", fp)
        oracle.fps[f"n{k}"] = fp
    tiers = index._tiers
    assert tiers[0].starts is not None and tiers[0].keys is None and tiers[0].starts.dtype == np.int32
    assert len(tiers[0].starts) == (1 << 22) + 2 * (1 << 21) + 3
    assert any(t.keys is not None and t.starts is None for t in tiers[1:])
    queries = [*pool[::7], *(flip(fp, 7, rng) for fp in pool[::11])]
    for fp, result in zip(queries, index.search_many([(fp, None) for fp in queries]), strict=True):
        assert (result.match_count, result.matches) == _expected(oracle, fp, None, 0)


@pytest.mark.parametrize("bands", [4, 3])
def test_a_tier_mostly_deleted_is_built_anew_without_its_rows_that_went(bands: int, direct_tables: str) -> None:
    """Most rows of the loaded tier deleted (and the copy mostly live overall, so `compact` is far off): once the
    rows that went reach half of the tier's, the tier is built anew without them, and searches no longer read
    them. Deletes of the rows of a later tier count against that tier."""
    rng, index, oracle, center, storm = _loaded_with_storm(4, bands, 6000, 2000)
    for k in range(6000):  # new rows: a tier of 4,096 (two seals merged) and the tail
        fp = rng.getrandbits(64)
        index.set(f"n{k}", fp)
        oracle.fps[f"n{k}"] = fp
    queries = [flip(center, rng.randint(0, 3), rng) for _ in range(4)] + [rng.getrandbits(64) for _ in range(4)]
    [before] = _assert_searches_match(index, oracle, queries[:1])
    assert index.tier_rebuilds == 0
    loaded = index._tiers[0]
    for n, incident_id in enumerate(storm):
        if n % 1000 == 0:  # searched as the storm goes, with no search near it, so only the deletes count
            _assert_searches_match(index, oracle, queries[4:])
        index.delete(incident_id)
        del oracle.fps[incident_id]
        if index.tier_rebuilds:
            break
    assert index.tier_rebuilds == 1
    assert n + 1 == 4000  # half the loaded tier's 8,000 rows
    assert index._tiers[0].first == loaded.first and index._tiers[0].end == loaded.end
    assert index._tiers[0].size == loaded.size - (n + 1) and index._tiers[0].stale == 0
    assert index.empty_rows == n + 1  # the rows stay (numbered) until compact gives them back
    _assert_tiers_hold_their_shape(index)
    [after, *_] = _assert_searches_match(index, oracle, queries)
    assert after < before - 4000  # the storm's rows that went are no longer verified
    for incident_id in list(storm)[n + 1 :]:
        index.delete(incident_id)
        del oracle.fps[incident_id]
    _assert_tiers_hold_their_shape(index)
    _assert_searches_match(index, oracle, queries)
    # a later tier: the first 4,096 rows made after the load, most of them deleted
    later = index._tiers[1]
    assert later.first == 8000 and later.end - later.first == 4096 == later.size
    rebuilds = index.tier_rebuilds
    for k in range(3000):
        index.delete(f"n{k}")
        del oracle.fps[f"n{k}"]
    assert (
        index.tier_rebuilds == rebuilds + 1
        and index._tiers[1].size == 4096 - 2048
        and index._tiers[1].stale == 3000 - 2048
    )
    _assert_tiers_hold_their_shape(index)
    _assert_searches_match(index, oracle, queries)


def test_searches_near_a_deleted_storm_have_its_tier_built_anew() -> None:
    """A storm of near-duplicates, a small share of the loaded tier, deleted: too few deletes to rebuild the tier,
    but every query near the storm reads and verifies all its rows that went. Once the searches have thrown away as
    many of the tier's candidates as it holds rows, it is built anew without them."""
    rng, index, oracle, center, storm = _loaded_with_storm(5, 4, 3000, 30_000)
    for incident_id in storm:
        index.delete(incident_id)
        del oracle.fps[incident_id]
    assert index.tier_rebuilds == 0 and index._tiers[0].stale == 3000
    queries = [flip(center, rng.randint(0, 3), rng) for _ in range(40)]
    candidates = []
    for fp in queries:
        [count] = _assert_searches_match(index, oracle, [fp])
        candidates.append(count)
    assert index.tier_rebuilds == 1
    wasted = 0
    for k, count in enumerate(candidates):  # each query before the rebuild verified the storm again  # noqa: B007
        if count < 3000:
            break
        wasted += count
    assert 0 < k < 40 and wasted >= 33_000  # about the tier's rows in candidates thrown away
    assert max(candidates[k:]) < 1000
    _assert_tiers_hold_their_shape(index)


def test_a_fingerprint_outside_64_bits_changes_nothing() -> None:
    """numpy cannot hold it (OverflowError): refused before any part of the copy changed, whether the incident is
    new or had a fingerprint, and whether a free row or a seal was next."""
    rng = random.Random(6)
    index = MemoryIndex(BandLayout(4, 7))
    oracle = Oracle(7)
    oracle.fps.update((f"i{k}", rng.getrandbits(64)) for k in range(100))
    index.load(dict(oracle.fps))
    for k in range(worker.snapshot._SEAL_AT - 1):  # the next new row seals the tail
        index.set(f"t{k}", rng.getrandbits(64))
        oracle.fps[f"t{k}"] = index.get(f"t{k}")  # type: ignore[assignment]
    index.set("gone", 7)
    index.delete("gone")  # a free row in the tail, handed out next
    state = (dict(index.items()), index.distinct, index.base_rows, index.overlay_rows, index.tiers, list(index._free))
    for bad in (2**64, -1, 2**70):
        for incident_id in ("i0", "new", "t0"):
            with pytest.raises(OverflowError):
                index.set(incident_id, bad)
            assert (
                dict(index.items()),
                index.distinct,
                index.base_rows,
                index.overlay_rows,
                index.tiers,
                list(index._free),
            ) == state
    _assert_tiers_hold_their_shape(index)
    queries = [*rng.sample(sorted(oracle.fps.values()), 10), 7, rng.getrandbits(64)]
    _assert_searches_match(index, oracle, queries)
    index.set("new", 7)  # the copy goes on as before
    oracle.fps["new"] = 7
    _assert_searches_match(index, oracle, queries)


# -- near storms: thousands of matches at a few distances, counted and listed as a linear scan ---------------------

# spelled so that the order they are made in, their numbers' order and their code point order all differ
_STORM_PREFIXES = ["b", "a", "B", "é", "Z", "ą", "😀", "a-", ""]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32),
    loaded=st.integers(0, 120),
    added=st.integers(0, 120),
    deleted=st.integers(0, 60),
    limit=st.sampled_from([0, 1, 2, 5, 17, 60]),
    budget=st.sampled_from([0, 0, 40]),
    ascii_only=st.booleans(),
)
def test_a_near_storm_lists_its_closest_matches_in_id_order_and_counts_every_twin(
    seed, loaded, added, deleted, limit, budget, ascii_only, seal_at, direct_tables, few_hits
) -> None:
    """Many incidents on a few fingerprints at distances 0 to 3 of one another (so that many matches share a distance
    and most fingerprints are held by twins), some loaded, some set after the load, some deleted, queried in sends
    of several with an excluded ID that often shares a row with others: each search counts every match and lists the
    closest `limit` by distance, then ID in code point order, as the oracle does. The cap falls inside a distance
    with more IDs than it has room for, among rows made in another order than their IDs'. A search cut at `budget`
    lists real matches in the same order, counting at least those. IDs of ASCII only (`ascii_only`) have every
    listing in arrays written by the compiled loop (`copylisting._written`); the others, most of them in Python."""
    rng = random.Random(seed)
    center = rng.getrandbits(64)
    pool = [center] + [flip(center, rng.randint(1, 3), rng) for _ in range(11)] + [rng.getrandbits(64)]
    oracle = Oracle(7)
    prefixes = [prefix for prefix in _STORM_PREFIXES if prefix.isascii() or not ascii_only]

    def name(k: int) -> str:
        return f"{rng.choice(prefixes)}{k}"

    loaded_pairs = {name(k): rng.choice(pool) for k in range(loaded)}
    index = MemoryIndex(BandLayout(4, 7))
    index.load(loaded_pairs)
    oracle.fps.update(loaded_pairs)
    for k in range(loaded, loaded + added):
        incident_id, fp = name(k), rng.choice(pool)
        index.set(incident_id, fp)
        oracle.fps[incident_id] = fp
    for incident_id in rng.sample(sorted(oracle.fps), min(deleted, len(oracle.fps))):
        index.delete(incident_id)
        del oracle.fps[incident_id]
    ids = sorted(oracle.fps)
    queries = [(fp, rng.choice([None, *ids[:1], *rng.sample(ids, min(3, len(ids)))])) for fp in pool]
    results = index.search_many(queries, limit=limit, budget=budget)
    for (fp, exclude), result in zip(queries, results, strict=True):
        found = oracle.matches(fp, exclude=exclude)
        if not result.cut:
            assert (result.match_count, result.matches) == (len(found), found[:limit] if limit else found)
            continue
        assert budget, "a search cut without a budget"
        assert set(result.matches) <= set(found), "a cut search listed something that is not a match"
        assert result.matches == sorted(result.matches, key=lambda m: (m[1], m[0]))
        assert len(result.matches) <= result.match_count <= len(found)
        if limit:
            assert len(result.matches) == min(limit, result.match_count)


def _storm_copy(
    seed: int, layout: tuple[int, int], loaded: int, added: int, deleted: int
) -> tuple[MemoryIndex, list[int]]:
    """A copy of near-duplicates of one center (1 to 5 bits from it, some twins), some loaded, some set after the
    load, some deleted (rows that went stay in their tiers: searches throw them away, `_waste`)."""
    rng = random.Random(seed)
    center = rng.getrandbits(64)
    pool = [flip(center, rng.randint(1, 5), rng) for _ in range((loaded + added) // 2 + 1)]
    index = MemoryIndex(BandLayout(*layout))
    index.load({f"l{k}": rng.choice(pool) for k in range(loaded)})
    for k in range(added):
        index.set(f"a{k}", rng.choice(pool))
    for k in rng.sample(range(loaded), min(deleted, loaded)):
        index.delete(f"l{k}")
    return index, pool


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32),
    layout=st.sampled_from([(4, 7), (3, 7), (5, 7), (6, 12), (2, 3)]),
    loaded=st.integers(0, 300),
    added=st.integers(0, 200),
    deleted=st.integers(0, 200),
    limit=st.sampled_from([0, 1, 17, 100]),
    budget=st.sampled_from([0, 30, 150, 600]),
    max_distance=st.sampled_from([None, 2, 5]),
    mixed=st.booleans(),
)
def test_a_storm_searched_in_arrays_answers_and_counts_as_the_plain_way(
    seed, layout, loaded, added, deleted, limit, budget, max_distance, mixed, seal_at, direct_tables, monkeypatch
) -> None:
    """A send of storm queries searched with its matches in arrays (a row several bands reach kept once, from the
    first band that reaches it: `BandReach.later`, and listed without sorting them all) and in plain Python (every
    band's read kept, made unique in a dict) on two copies made alike: the same results, cut ones included (a cut
    query's earlier band may have lost the row a later band found: all its matches are kept), and the same candidates
    thrown away against each tier (`_waste`: a row that went counts once for each band that reached it). `mixed`:
    tiers of an even number of rows get tables, the others binary searches, so that a tier of either kind may come
    before one of the other."""
    results, wasted = [], []
    with monkeypatch.context() as patch:  # (undone after each example: the next may have another layout)
        if mixed and max(BandLayout(*layout).widths) <= 16:  # (tables of wider bands in every tier: too much memory)
            patch.setattr(MemoryIndex, "_direct", lambda self, rows: rows % 2 == 0)
        for few in (0, 2**62):
            patch.setattr(worker.snapshot, "_FEW_HITS", few)
            index, pool = _storm_copy(seed, layout, loaded, added, deleted)
            rng = random.Random(seed + 1)
            queries = [
                (flip(rng.choice(pool), rng.randint(0, 3), rng), rng.choice([None, "a0", "l1"])) for _ in range(9)
            ]
            results.append(index.search_many(queries, limit=limit, budget=budget, max_distance=max_distance))
            wasted.append(([tier.wasted for tier in index._tiers], index.tier_rebuilds))
    assert results[0] == results[1]
    assert wasted[0] == wasted[1]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32),
    layout=st.sampled_from([(4, 7), (3, 7), (5, 7), (6, 12), (2, 3)]),
    loaded=st.integers(0, 300),
    added=st.integers(0, 200),
    deleted=st.integers(0, 200),
    limit=st.sampled_from([0, 1, 17, 100]),
    budget=st.sampled_from([0, 30, 600]),
    max_distance=st.sampled_from([None, 2, 5]),
    mixed=st.booleans(),
    step=st.sampled_from([1 << 20, 7, 1]),
)
def test_a_storm_compared_with_every_row_answers_and_counts_as_through_the_bands(
    seed, layout, loaded, added, deleted, limit, budget, max_distance, mixed, step, seal_at, direct_tables, monkeypatch
) -> None:
    """A send of storm queries compared with every row of the copy (`_scan`: distances to each tier's first band
    and to the tail, counted by bincount, the cap's rows picked out) and searched through the bands (the arrays'
    way) on two copies made alike: the same results (twins, excluded IDs holding a row or sharing one, rows that
    went, loaded tiers and tiers of rows made since, the tail), the same candidates counted, and the same candidates
    thrown away against each tier (`_waste`: a row that went counts once for each band that would have reached it).
    A send some query of which was cut at its budget goes through the bands either way. `step`: the XORs made a few
    queries at a time (`_SCAN_STEP`)."""
    results, wasted = [], []
    with monkeypatch.context() as patch:  # (undone after each example: the next may have another layout)
        if mixed and max(BandLayout(*layout).widths) <= 16:
            patch.setattr(MemoryIndex, "_direct", lambda self, rows: rows % 2 == 0)
        patch.setattr(worker.snapshot, "_FEW_HITS", 0)
        patch.setattr(worker.snapshot, "_SCAN_STEP", step)
        for share in (0, 2**62):
            patch.setattr(worker.snapshot, "_SCAN_SHARE", share)
            index, pool = _storm_copy(seed, layout, loaded, added, deleted)
            rng = random.Random(seed + 1)
            queries = [
                (flip(rng.choice(pool), rng.randint(0, 3), rng), rng.choice([None, "a0", "l1", "l2", "zz"]))
                for _ in range(9)
            ]
            results.append(index.search_many(queries, limit=limit, budget=budget, max_distance=max_distance))
            wasted.append(([tier.wasted for tier in index._tiers], index.tier_rebuilds))
    assert results[0] == results[1]
    assert wasted[0] == wasted[1]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32),
    layout=st.sampled_from([(4, 7), (3, 7), (6, 12)]),
    loaded=st.integers(0, 300),
    added=st.integers(50, 250),
    budgets=st.lists(st.sampled_from([0, 30, 100_000]), min_size=4, max_size=4),
    mixed=st.booleans(),
)
def test_a_storms_sends_after_a_scan_count_as_a_first_send_does(
    seed, layout, loaded, added, budgets, mixed, seal_at, monkeypatch
) -> None:
    """After a send compared with every row, a storm's next sends are counted from each tier's table without their
    ranges (`_scan_counted`) and scanned, or, when that count says the send would not be (a query cut at its budget,
    too few candidates), searched as any send: each of four sends (budgets that cut some queries, none, or all)
    answers as on a copy made alike that never takes that way, candidates and cuts included, and changes between
    the sends. `mixed`: some tiers search their keys (no table: the count is not taken then)."""
    results, counted = [], []
    original = MemoryIndex._scan_counted
    with monkeypatch.context() as patch:
        if mixed:
            patch.setattr(MemoryIndex, "_direct", lambda self, rows: rows % 2 == 0)
        patch.setattr(worker.snapshot, "_FEW_HITS", 0)
        for fresh in (False, True):
            index, pool = _storm_copy(seed, layout, loaded, added, 10)
            answers, taken = [], []
            patch.setattr(
                MemoryIndex,
                "_scan_counted",
                lambda self, *args, taken=taken: taken.append(result := original(self, *args)) or result,
            )
            rng = random.Random(seed + 1)
            for k, budget in enumerate(budgets):
                if fresh:
                    index._scanning = False  # (every send decided from its ranges, as the first one is)
                queries = [
                    (flip(rng.choice(pool), rng.randint(0, 3), rng), rng.choice([None, "a0", "l1"])) for _ in range(7)
                ]
                answers.append(index.search_many(queries, limit=17, budget=budget))
                index.set(f"n{k}", rng.choice(pool))
            results.append(answers)
            counted.append(taken)
    assert results[0] == results[1]
    assert not counted[1]  # (the copy made alike never took it)


def test_a_storms_next_send_is_counted_from_the_tables_and_scanned() -> None:
    """The storm's second send takes `_scan_counted` (the test above holds it equal to a first send): its candidates
    counted, the send scanned, with the same answers as a copy that counts it from its ranges."""
    answers, taken = [], []
    original = MemoryIndex._scan_counted
    for fresh in (False, True):
        index, pool = _storm_copy(3, (4, 7), 3000, 200, 20)
        rng = random.Random(4)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(
                MemoryIndex,
                "_scan_counted",
                lambda self, *args, taken=taken: taken.append(result := original(self, *args)) or result,
            )
            for _ in range(3):
                if fresh:
                    index._scanning = False
                queries = [(flip(rng.choice(pool), 1, rng), None) for _ in range(8)]
                answers.append(index.search_many(queries, limit=100, budget=60_000))
    assert taken == [True, True]  # (the first send of the first copy learnt from its ranges; the fresh copy never asks)
    assert answers[:3] == answers[3:]
    assert all(result.candidates > 0 for result in answers[1])


def test_a_near_storms_send_is_compared_with_every_row() -> None:
    """The storm's send takes `_scan` by default (more candidates than rows): the path the test above holds equal."""
    index, pool = _storm_copy(3, (4, 7), 300, 200, 20)
    rng = random.Random(4)
    queries = [(flip(rng.choice(pool), 1, rng), None) for _ in range(8)]
    scanned = []
    original = MemoryIndex._scan
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(MemoryIndex, "_scan", lambda self, *args: scanned.append(1) or original(self, *args))
        index.search_many(queries, limit=100, budget=0)
    assert scanned


def test_the_copy_names_the_holder_of_a_fingerprint_whatever_the_budget() -> None:
    """`holder`: the first ID in code point order holding the fingerprint exactly, other than the excluded one, found
    without the postings (a search cut at its budget may not reach it)."""
    rng = random.Random(5)
    center = rng.getrandbits(64)
    index = MemoryIndex(BandLayout(4, 7))
    index.load({f"n{k}": flip(center, 1 + k % 3, rng) for k in range(200)})
    assert index.holder(center) is None
    index.set("é", center)
    index.set("z", center)
    assert index.search(center, budget=5).cut
    assert index.holder(center) == "z"
    assert index.holder(center, exclude="z") == "é"
    index.delete("z")
    assert index.holder(center, exclude="é") is None
    assert index.holder(center) == "é"


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), steps=st.integers(0, 60))
def test_a_sends_holders_are_each_ones_holder(seed: int, steps: int) -> None:
    """`holders` (one numpy look-up for a send, as SnapshotReader.claims asks) names what `holder` names for each
    (fingerprint, excluded ID): rows loaded or made since, twins, rows that went, IDs held or not."""
    rng = random.Random(seed)
    fps = [rng.getrandbits(64) for _ in range(12)]
    index = MemoryIndex(BandLayout(4, 7))
    index.load({f"n{k}": fps[k % 8] for k in range(20)})
    for _ in range(steps):  # sets (new rows, twins, moves) and deletes after the load
        incident = f"n{rng.randrange(26)}"
        if rng.random() < 0.3:
            index.delete(incident)
        else:
            index.set(incident, rng.choice(fps))
    queries = [(rng.choice(fps), rng.choice([None, f"n{rng.randrange(26)}"])) for _ in range(16)]
    assert index.holders(queries) == [index.holder(fp, exclude) for fp, exclude in queries]
    assert index.holders([]) == []


def test_ids_sort_in_utf8_byte_order_as_redis_sorts_them() -> None:
    index = MemoryIndex(BandLayout(4, 7))
    ids = ["é", "z", "Z", "a", "aa", "\U0001f600", "\uffff"]
    for incident_id in ids:
        index.set(incident_id, 42)
    listed = [m for m, _ in index.search(42).matches]
    assert listed == sorted(ids, key=lambda s: s.encode())


# -- the follower, on a real server and on fakeredis ----------------------------------------------------------

from worker.keys import IndexKeys  # noqa: E402
from worker.readpath import CHANGES_FLOOR_FIELD, ChangeFollower, SnapshotLostError, _add_scanned  # noqa: E402


def _change(client, keys: IndexKeys, op: str, incident_id: str, fp: int | None, prev: int | None) -> None:
    """What the index's functions write: the fingerprint hash, then one change-log entry with both fingerprints."""
    if fp is None:
        client.hdel(keys.fingerprints, incident_id)
    else:
        client.hset(keys.fingerprints, incident_id, f"{fp:016x}")
    client.xadd(
        keys.changes,
        {op: incident_id, "fp": "" if fp is None else f"{fp:016x}", "prev": "" if prev is None else f"{prev:016x}"},
    )


def test_follower_loads_then_follows_the_change_log(redis_client) -> None:
    keys = IndexKeys("snap")
    rng = random.Random(5)
    truth: dict[str, int] = {}
    for n in range(300):
        fp = rng.getrandbits(64)
        _change(redis_client, keys, "add", f"a{n}", fp, None)
        truth[f"a{n}"] = fp
    follower = ChangeFollower(redis_client, keys, BandLayout(4, 7), batch=64)
    follower.load()
    assert dict(follower.index.items()) == truth
    for n in range(0, 300, 3):
        new = rng.getrandbits(64)
        _change(redis_client, keys, "upsert", f"a{n}", new, truth[f"a{n}"])
        truth[f"a{n}"] = new
    for n in range(1, 300, 7):
        _change(redis_client, keys, "delete", f"a{n}", None, truth.pop(f"a{n}"))
    assert follower.catch_up() > 0
    assert dict(follower.index.items()) == truth
    last = redis_client.xrevrange(keys.changes, "+", "-", count=1)[0][0]
    assert follower.index.position == (last.decode() if isinstance(last, bytes) else last)


def test_follower_refuses_a_log_trimmed_past_its_position(redis_client) -> None:
    keys = IndexKeys("snap")
    _change(redis_client, keys, "add", "x", 1, None)
    follower = ChangeFollower(redis_client, keys, BandLayout(4, 7))
    follower.load()
    _change(redis_client, keys, "add", "y", 2, None)
    redis_client.hset(keys.meta, CHANGES_FLOOR_FIELD, "99999999999999-0")
    with pytest.raises(SnapshotLostError):
        follower.catch_up()


def test_a_copy_loaded_from_a_log_trimmed_empty_starts_at_its_floor(redis_client) -> None:
    keys = IndexKeys("snap")
    _change(redis_client, keys, "add", "x", 1, None)
    seconds, _ = redis_client.time()
    floor = f"{int(seconds) * 1000}-0"  # as a trim writes it: behind the server's clock (a floor ahead is refused)
    redis_client.hset(keys.meta, CHANGES_FLOOR_FIELD, floor)
    redis_client.xtrim(keys.changes, maxlen=0)
    follower = ChangeFollower(redis_client, keys, BandLayout(4, 7))
    follower.load()  # no SnapshotLostError: the scan holds every change below the floor
    assert follower.index.position == floor
    assert dict(follower.index.items()) == {"x": 1}
    redis_client.xadd(keys.changes, {"add": "y", "fp": f"{2:016x}", "prev": ""}, id="99999999999999-1")
    redis_client.hset(keys.fingerprints, "y", f"{2:016x}")
    assert follower.catch_up() == 1
    assert dict(follower.index.items()) == {"x": 1, "y": 2}


@pytest.mark.parametrize("how", ["deleted", "went-back"])
def test_follower_refuses_a_log_that_no_longer_holds_its_position(redis_client, how) -> None:
    """The index's keys deleted, or taken back to an earlier moment, then written again: the copy's position, an
    entry it applied, is not in the log; its later entries (with later IDs) must not be applied over a copy that
    holds incidents the index lost."""
    keys = IndexKeys("snap")
    _change(redis_client, keys, "add", "x", 1, None)
    saved = {key: redis_client.dump(key) for key in (keys.changes, keys.fingerprints)}
    follower = ChangeFollower(redis_client, keys, BandLayout(4, 7))
    follower.load()
    _change(redis_client, keys, "add", "lost", 2, None)
    assert follower.catch_up() == 1
    redis_client.delete(keys.changes, keys.fingerprints)
    if how == "went-back":
        for key, value in saved.items():
            redis_client.restore(key, 0, value)
    _change(redis_client, keys, "add", "z", 3, None)  # a later entry ID than the copy's position
    with pytest.raises(SnapshotLostError, match="no longer holds this copy's position"):
        follower.catch_up()
    follower.load()
    assert dict(follower.index.items()) == ({"x": 1, "z": 3} if how == "went-back" else {"z": 3})


def test_follower_refuses_entries_without_fingerprints(redis_client) -> None:
    keys = IndexKeys("snap")
    follower = ChangeFollower(redis_client, keys, BandLayout(4, 7))
    follower.load()
    redis_client.xadd(keys.changes, {"add": "old-format"})
    with pytest.raises(SnapshotLostError):
        follower.catch_up()


# -- the validation step alone: a stale copy's search, validated by the apply call, equals a linear scan --------

from worker.index import FingerprintIndex  # noqa: E402
from worker.library import FN_TRIM_CHANGES, ApplyArgs, SnapshotClaim, parse_apply  # noqa: E402


def _claim(
    follower: ChangeFollower, fp: int, exclude: str, cap: int, extra: int, *, holder: bool = True, budget: int = 0
) -> SnapshotClaim:
    """The claim the worker sends (readpath.py), or without its holder (as a claim that does not say)."""
    index = follower.index
    result = index.search(fp, exclude=exclude, limit=cap + extra if cap else 0, budget=budget)
    return SnapshotClaim(
        index.position,
        result.match_count,
        result.matches,
        len(result.matches) == result.match_count,
        cut=result.cut,
        holder=index.holder(fp, exclude) if holder else True,
    )


def _stale_copy(redis_client, seed: int, before, after):
    """An index after the `before` changes, a copy of it loaded then, and the `after` changes the copy has not seen."""
    redis_client.flushall()
    rng = random.Random(seed)
    pool = clustered(rng, 10, 7, centers=2)
    index = FingerprintIndex(redis_client, "v", bands=4, max_distance=7)
    index.open()
    oracle = Oracle(7)
    _run_ops(index, oracle, pool, before)
    follower = ChangeFollower(redis_client, index.keys, index.layout)
    follower.load()
    _run_ops(index, oracle, pool, after)
    return rng, pool, index, oracle, follower


def _run_ops(index: FingerprintIndex, oracle: Oracle, pool: list[int], ops) -> None:
    """Apply (op, incident number, pool index) changes to the index, one call each, and to the oracle."""
    for kind, n, which in ops:
        incident_id, fp = f"i{n}", pool[which]
        if kind == "add":
            if oracle.add(incident_id, fp) != "duplicate":
                index.add_fingerprint(incident_id, fp)
        elif kind == "upsert":
            index.upsert_fingerprint(incident_id, fp)
            oracle.upsert(incident_id, fp)
        else:
            index.delete(incident_id)
            oracle.delete(incident_id)


def _changes(max_size: int):
    """Changes made to the index before or after a snapshot: (operation, incident number, fingerprint number)."""
    change = st.tuples(st.sampled_from(["add", "upsert", "delete"]), st.integers(0, 30), st.integers(0, 9))
    return st.lists(change, max_size=max_size)


def _batch(unique_ids: bool):
    """One batch of events for the atomic step; with unique_ids, no incident twice in the batch."""
    return st.lists(
        st.tuples(st.sampled_from(["add", "add", "upsert", "delete"]), st.integers(0, 40), st.integers(0, 9)),
        min_size=1,
        max_size=12,
        unique_by=(lambda event: event[1]) if unique_ids else None,
    )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32),
    before=_changes(max_size=40),
    after=_changes(max_size=25),
    cap=st.sampled_from([0, 1, 2, 5]),
    extra=st.sampled_from([0, 2]),
    query=st.integers(0, 9),
    op=st.sampled_from(["add", "upsert"]),
)
def test_a_validated_stale_snapshot_finds_exactly_what_a_full_search_finds(
    redis_client, seed, before, after, cap, extra, query, op
) -> None:
    rng, pool, index, oracle, follower = _stale_copy(redis_client, seed, before, after)
    new_id = "i3" if op == "upsert" else "new"
    fp = flip(pool[query], rng.randint(0, 3), rng)
    claim = _claim(follower, fp, new_id, cap, extra)
    expected = oracle.matches(fp, exclude=new_id)
    command = index.apply_command(
        op, new_id, fp, expected="*" if op == "add" else index.get(new_id), max_matches=cap, snapshot=claim
    )
    result = parse_apply(redis_client.execute_command(*command))
    if result.status == "unvalidated":
        # only allowed when the copy listed too little to cover the cap after removals
        assert not claim.complete
        return
    if op == "upsert" and oracle.fps.get(new_id) == fp:
        assert result.status == "repeat"
        return
    assert result.status == "indexed"
    assert result.match_count == len(expected)
    assert result.matches == (expected[:cap] if cap else expected)
    # indexed under the right representative: its twins' group, or its own postings (the pool has exact twins)
    oracle.fps[new_id] = fp
    assert_postings_match(redis_client, "v", 4, oracle.fps)
    # and the change log says what the copy needs to follow
    follower.catch_up()
    assert follower.index.get(new_id) == fp


def _near_through_one_byte(rng: random.Random, fp: int, byte: int, distance: int) -> int:
    """`fp` with `distance` bits flipped (7 or 8), one in each byte but `byte` (0 = the most significant) while it
    can: at 7, the fingerprint agrees with `fp` on that byte alone; at 8, one bit more in `byte` too."""
    flipped = fp
    for j in range(8):
        if j != byte:
            flipped ^= 1 << (56 - 8 * j + rng.randrange(8))
    if distance == 8:
        flipped ^= 1 << (56 - 8 * byte + rng.randrange(8))
    return flipped


@pytest.mark.parametrize("byte", range(8))
@pytest.mark.parametrize("role", ["added", "moved away", "moved near"])
@pytest.mark.parametrize("sent", ["apply", "apply_batch"])
def test_validation_finds_a_change_that_agrees_with_the_query_on_one_byte_only(redis_client, byte, role, sent) -> None:
    """The validation reads only the changes that share one of 8 byte bands with the query (worker/lua/snapshot.lua:
    note_bands for one call, note_near for the registered queries of an apply_batch, after a call of its own): a
    change within 7 bits shares one, whichever it is, as what it was or as what it is now."""
    redis_client.flushall()
    rng = random.Random(byte * 10 + len(role))
    index = FingerprintIndex(redis_client, "v", bands=4, max_distance=7)
    index.open()
    oracle = Oracle(7)
    query = rng.getrandbits(64)
    near, far = _near_through_one_byte(rng, query, byte, 7), _near_through_one_byte(rng, query, byte, 8)
    for incident_id, fp in [("base", rng.getrandbits(64)), ("x", near if role == "moved away" else far)]:
        index.add_fingerprint(incident_id, fp)
        oracle.add(incident_id, fp)
    follower = ChangeFollower(redis_client, index.keys, index.layout)
    follower.load()
    later = {"added": [("y", near), ("z", far)], "moved away": [("x", far)], "moved near": [("x", near)]}[role]
    for incident_id, fp in later:
        index.upsert_fingerprint(incident_id, fp)
        oracle.upsert(incident_id, fp)
    claim = _claim(follower, query, "new", 0, 0)
    command = index.apply_command("add", "new", query, snapshot=claim)
    if sent == "apply":
        result = parse_apply(redis_client.execute_command(*command))
    else:  # after a call that adds an incident far from the query, with the same copy's position
        other = query ^ 0xFFFF_FFFF_0000_0000
        oracle.add("other", other)
        first = index.apply_command("add", "other", other, snapshot=_claim(follower, other, "other", 0, 0))
        replies = redis_client.execute_command(*apply_batch([first, command]))
        assert parse_apply(replies[0]).status == "indexed"
        result = parse_apply(replies[1])
    assert result.status == "indexed"
    expected = oracle.matches(query, exclude="new")
    assert (result.match_count, result.matches) == (len(expected), expected)
    assert len(expected) == (0 if role == "moved away" else 1)


def test_a_snapshot_behind_a_trimmed_log_is_not_validated(redis_client) -> None:
    index = FingerprintIndex(redis_client, "v", bands=4, max_distance=7)
    index.add_fingerprint("a", 1)
    follower = ChangeFollower(redis_client, index.keys, index.layout)
    follower.load()
    index.add_fingerprint("b", 3)
    redis_client.hset(index.keys.meta, CHANGES_FLOOR_FIELD, "99999999999999-0")
    claim = _claim(follower, 7, "c", 100, 0)
    command = index.apply_command("add", "c", 7, snapshot=claim, max_matches=100)
    result = parse_apply(redis_client.execute_command(*command))
    assert result.status == "unvalidated"
    assert index.get("c") is None  # it changed nothing


def test_a_snapshot_whose_position_the_log_no_longer_holds_is_not_validated(redis_client) -> None:
    """A copy that followed a log since reset (or taken back to an older save): its claim names incidents the index
    lost, and the log holds later entries that a lookup "after the position" would take for the copy's future."""
    index = FingerprintIndex(redis_client, "v", bands=4, max_distance=7)
    index.add_fingerprint("a", 1)
    follower = ChangeFollower(redis_client, index.keys, index.layout)
    follower.load()
    index.add_fingerprint("lost", 3)
    follower.catch_up()
    claim = _claim(follower, 7, "c", 100, 0)
    assert claim.listed == [("lost", 1), ("a", 2)]
    redis_client.delete(index.keys.changes, index.keys.fingerprints, *redis_client.keys(f"{index.keys.tag}:band:*"))
    time.sleep(0.002)  # (a log written again within the same millisecond may reuse an ID: the worker's check sees it)
    index.add_fingerprint("far", (1 << 64) - 1)  # the new log's entries come after the copy's position
    command = index.apply_command("add", "c", 7, snapshot=claim, max_matches=100)
    result = parse_apply(redis_client.execute_command(*command))
    assert result.status == "unvalidated"  # not "indexed" with two matches the index no longer has
    assert index.get("c") is None  # it changed nothing
    command = index.apply_command("add", "c", 7, max_matches=100)  # the full search the worker then sends
    result = parse_apply(redis_client.execute_command(*command))
    assert (result.status, result.match_count) == ("indexed", 0)


# -- the batched form: one apply_batch call per send, every claim from the same stale copy ----------------------

from worker.library import FN_APPLY_BATCH, apply_batch  # noqa: E402
from worker.transport import execute  # noqa: E402


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32),
    before=_changes(max_size=40),
    after=_changes(max_size=15),
    batch=_batch(unique_ids=True),
    cap=st.sampled_from([0, 1, 2, 5]),
    extra=st.sampled_from([0, 2]),
    stale=st.booleans(),
)
def test_a_batch_validated_against_one_stale_snapshot_equals_the_events_one_by_one(
    redis_client, seed, before, after, batch, cap, extra, stale
) -> None:
    """Every call of a send claims what the same copy (at one position) found; the batch validates each against the
    changes after that position and the calls before it in the batch (indexed just before it, not in the copy): each
    reply equals what the oracle finds with the events applied one by one."""
    rng, pool, index, oracle, follower = _stale_copy(redis_client, seed, before, after if stale else [])
    commands, events = [], []
    for kind, n, which in batch:
        incident_id = f"i{n}"
        fp = None if kind == "delete" else flip(pool[which], rng.randint(0, 3), rng)
        claim = None if fp is None else _claim(follower, fp, incident_id, cap, extra)
        expected = "*" if kind == "add" else oracle.fps.get(incident_id)
        commands.append(index.apply_command(kind, incident_id, fp, expected=expected, max_matches=cap, snapshot=claim))
        events.append((kind, incident_id, fp, claim))
    command = apply_batch(commands)
    assert command[1] == FN_APPLY_BATCH
    [replies] = execute(redis_client, [command])
    assert len(replies) == len(events)
    deferring = False
    for (kind, incident_id, fp, claim), reply in zip(events, replies, strict=True):
        result = parse_apply(reply)
        if deferring:  # after a fallback, every later call changes nothing: the worker applies them after it, in order
            assert result.status == "deferred"
            continue
        if kind == "delete":
            assert result.status == ("deleted" if oracle.delete(incident_id) else "absent")
            continue
        if kind == "add" and incident_id in oracle.fps:
            assert result.status == ("repeat" if oracle.fps[incident_id] == fp else "duplicate")
            continue
        if oracle.fps.get(incident_id) == fp:
            assert result.status == "repeat"
            continue
        if result.status == "unvalidated":
            # only allowed when the copy listed too little to cover the cap after removals; nothing changed
            assert claim is not None and not claim.complete
            assert index.get(incident_id) == oracle.fps.get(incident_id)
            deferring = True
            continue
        expected_matches = oracle.matches(fp, exclude=incident_id)
        assert result.status == "indexed"
        assert (result.match_count, result.matches) == (
            len(expected_matches),
            expected_matches[:cap] if cap else expected_matches,
        )
        oracle.fps[incident_id] = fp
    assert {k: index.get(k) for k in oracle.fps} == oracle.fps
    assert len(index) == len(oracle.fps)
    # one representative per fingerprint and a group for each shared one, whoever held it when (copy, log, batch)
    assert_postings_match(redis_client, "v", 4, oracle.fps)
    # the copy follows the batch's changes like any others
    follower.catch_up()
    assert dict(follower.index.items()) == oracle.fps


@pytest.mark.parametrize("cap", [0, 3, 100])
@pytest.mark.parametrize("shuffled", ["ids", "distances", "sorted"])
def test_a_claim_listed_out_of_order_is_sorted_and_one_in_order_is_passed_on_as_listed(
    redis_client, cap, shuffled
) -> None:
    """A claim's listed matches no change touched, in order, are passed on as they came (merge_claim's own head,
    with nothing added or dropped, and the order checked without a call a match); out of order (a worker that sorts
    otherwise), they are sorted first. Either way the same reply as the sorted claim's, which is the full search's."""
    index = FingerprintIndex(redis_client, "v", bands=4, max_distance=7)
    index.open()
    query = 0x0123_4567_89AB_CDEF
    near = {"b": 1, "a": 1, "é": 1, 'z"q': 1, "aa": 2, "c": 2, "B": 3, "d\\n": 7}
    for incident_id, bits in near.items():
        index.add_fingerprint(incident_id, query ^ ((1 << bits) - 1) << (7 * len(incident_id) % 40))
    follower = ChangeFollower(redis_client, index.keys, index.layout)
    follower.load()
    claim = _claim(follower, query, "new", cap, 2)
    expected = index.search(query, max_matches=cap)
    listed = list(claim.listed)
    assert listed == sorted(listed, key=lambda m: (m[1], m[0].encode()))
    if shuffled == "ids":
        listed.reverse()
        listed.sort(key=lambda m: m[1])  # each distance's IDs in reverse
    elif shuffled == "distances":
        listed.reverse()
    if shuffled != "sorted":
        assert listed != list(claim.listed)
    claim = replace(claim, listed=listed)
    result = parse_apply(
        redis_client.execute_command(*index.apply_command("add", "new", query, snapshot=claim, max_matches=cap))
    )
    assert (result.status, result.match_count, result.matches) == ("indexed", expected.match_count, expected.matches)


def test_an_error_in_one_call_of_a_batch_leaves_the_others_alone(redis_client) -> None:
    index = FingerprintIndex(redis_client, "v", bands=4, max_distance=7)
    index.open()
    follower = ChangeFollower(redis_client, index.keys, index.layout)
    follower.load()
    good = [index.apply_command("add", f"a{n}", n, snapshot=_claim(follower, n, f"a{n}", 10, 0)) for n in (1, 2)]
    bad = index.apply_command("add", "bad", 3, snapshot=_claim(follower, 3, "bad", 10, 0))
    layout_at = 3 + bad[2] + ApplyArgs._fields.index("layout_tag")
    bad = (*bad[:layout_at], "some other layout", *bad[layout_at + 1 :])
    commands = [good[0], bad, good[1]]
    [replies] = execute(redis_client, [apply_batch(commands)])
    assert parse_apply(replies[0]).status == "indexed"
    assert isinstance(replies[1], Exception) and "LAYOUT" in str(replies[1])
    second = parse_apply(replies[2])
    # a2 (fingerprint 2) is within 7 of a1 (1), indexed by the first call of the batch, after the copy's position
    assert (second.status, second.matches) == ("indexed", [("a1", 2)])
    assert index.get("bad") is None


# -- who holds the new fingerprint: read from the copy and the changes after it, or from the postings ------------


@pytest.mark.parametrize("where", ["copy", "log", "batch", "nowhere"])
def test_the_new_fingerprint_joins_whoever_holds_it_whether_the_copy_log_or_batch_knows(redis_client, where) -> None:
    """The apply step skips reading the postings only when neither the copy nor a later change has an incident of
    the new fingerprint (see surely_unheld in snapshot.lua): each place a holder can come from makes a twin group."""
    index = FingerprintIndex(redis_client, "v", bands=4, max_distance=7)
    index.open()
    index.add_fingerprint("far", 0xFFFF_0000_FFFF_0000)
    if where == "copy":
        index.add_fingerprint("holder", 0x1234)
    follower = ChangeFollower(redis_client, index.keys, index.layout)
    follower.load()
    if where == "log":
        index.add_fingerprint("holder", 0x1234)
        index.upsert_fingerprint("moved", 0x1234)  # held after the position, then no longer
        index.upsert_fingerprint("moved", 0x9999_0000)
    commands = []
    if where == "batch":
        commands.append(index.apply_command("add", "holder", 0x1234, snapshot=_claim(follower, 0x1234, "holder", 0, 0)))
    claim = _claim(follower, 0x1234, "new", 0, 0)
    commands.append(index.apply_command("add", "new", 0x1234, snapshot=claim))
    [replies] = execute(redis_client, [apply_batch(commands)])
    result = parse_apply(replies[-1])
    assert result.status == "indexed"
    fps = {"far": 0xFFFF_0000_FFFF_0000, "new": 0x1234}
    if where != "nowhere":
        fps["holder"] = 0x1234
        assert (result.match_count, result.matches) == (1, [("holder", 0)])
        assert index.twin_group(0x1234)[0] == 2
    else:
        assert result.match_count == 0
    if where == "log":
        fps["moved"] = 0x9999_0000
    assert_postings_match(redis_client, "v", 4, fps)


# -- what a batch reads once for all its calls: pending entries and stored fingerprints --------------------------

from worker.library import StreamTarget  # noqa: E402


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@pytest.mark.parametrize("others", [0, 3, 200])
def test_a_batch_knows_which_entries_are_pending_and_what_its_own_calls_changed(redis_client, others) -> None:
    """The calls of one apply_batch share one XPENDING and one HMGET (see prefetch, apply_context.lua): an entry another
    consumer finished before the batch is not pending, an entry a call of the batch acknowledged is not pending to a
    later call, and a later call of the same incident sees what the earlier one stored; `others` entries of another
    consumer pending between them (more than the one XPENDING asks for, at 200) change nothing."""
    index = FingerprintIndex(redis_client, "v", bands=4, max_distance=7)
    index.open()
    stream = StreamTarget("{v}:events", "{v}:alerts", "{v}:dead", "g")
    redis_client.xgroup_create(stream.events_stream, "g", id="0", mkstream=True)

    def entry(consumer: str) -> str:
        redis_client.xadd(stream.events_stream, {"x": "1"})
        [[_, [(entry_id, _)]]] = redis_client.xreadgroup("g", consumer, {stream.events_stream: ">"}, count=1)
        return _text(entry_id)

    mine = []
    for n in range(5):
        mine.append(entry("w1"))
        for _ in range(others if n == 1 else 0):
            entry("w2")
    redis_client.xack(stream.events_stream, "g", mine[2])  # another consumer finished it
    follower = ChangeFollower(redis_client, index.keys, index.layout)
    follower.load()

    def call(op, incident_id, fp, entry_id, expected):
        claim = None if fp is None else _claim(follower, fp, incident_id, 0, 0)
        return index.apply_command(
            op, incident_id, fp, expected=expected, stream=stream, entry_id=entry_id, snapshot=claim
        )

    commands = [
        call("add", "a", 0x10, mine[0], "*"),
        call("upsert", "a", 0x30, mine[1], 0x10),  # sees the add just before it
        call("add", "b", 0x70, mine[2], "*"),  # acknowledged before the batch
        call("upsert", "a", 0x31, mine[1], 0x30),  # its entry was acknowledged by the second call
        call("delete", "a", None, mine[3], 0x30),
        call("add", "a", 0x11, mine[4], "*"),  # the delete just before it took a out
    ]
    [replies] = execute(redis_client, [apply_batch(commands)])
    statuses = [_text(reply[0]) for reply in replies]
    assert statuses == ["indexed", "indexed", "not_pending", "not_pending", "deleted", "indexed"]
    assert index.get("a") == 0x11 and index.get("b") is None
    pending = {
        _text(row["message_id"]) for row in redis_client.xpending_range(stream.events_stream, "g", "-", "+", 1000)
    }
    assert not pending & set(mine) and len(pending) == others
    assert_postings_match(redis_client, "v", 4)


@pytest.mark.parametrize("path", ["primary", "snapshot"])
@pytest.mark.parametrize("replied", [None, 0, 2, 5, 500])
def test_the_reply_repeats_at_most_max_replied_matches_and_the_alert_lists_its_cap(redis_client, path, replied) -> None:
    """`max_replied` (a stream worker's: the closest its alert's log line names) cuts only the reply's matches: the
    alert lists the cap, match_count counts all, the reply's head is the alert's; on both read paths."""
    index = FingerprintIndex(redis_client, "v", bands=4, max_distance=7)
    index.open()
    stream = StreamTarget("{v}:events", "{v}:alerts", "{v}:dead", "g")
    redis_client.xgroup_create(stream.events_stream, "g", id="0", mkstream=True)
    query = 0x0F0F_0000_FFFF_1234
    for k in range(40):
        index.add_fingerprint(f"n{k:02d}", query ^ (1 << (k % 64)) ^ (1 << ((k * 7 + 3) % 64)) * (k % 3 > 0))
    redis_client.xadd(stream.events_stream, {"x": "1"})
    [[_, [(entry_id, _)]]] = redis_client.xreadgroup("g", "w", {stream.events_stream: ">"}, count=1)
    claim = None
    if path == "snapshot":
        follower = ChangeFollower(redis_client, index.keys, index.layout)
        follower.load()
        claim = _claim(follower, query, "new", 25, 16)
    expected = index.search(query, max_matches=25)
    command = index.apply_command(
        "add",
        "new",
        query,
        stream=stream,
        entry_id=_text(entry_id),
        max_matches=25,
        snapshot=claim,
        max_replied=replied,
    )
    result = parse_apply(redis_client.execute_command(*command))
    assert (result.status, result.match_count) == ("indexed", expected.match_count) and expected.match_count > 25
    assert result.matches == (expected.matches if replied is None else expected.matches[:replied])
    [(_, alert)] = redis_client.xrange(stream.alerts_stream)
    listed = json.loads(alert[b"matches" if b"matches" in alert else "matches"])
    assert [(m["incident_id"], m["distance"]) for m in listed] == expected.matches


# -- the batch's calls read in place, and validation's shortcuts, against calls of their own ---------------------


def _namespace_dump(redis_client, tag: str) -> dict[str, object]:
    """Every key of a namespace but its meta, by name with the tag left out: its value, and for a stream the fields
    of its entries in order (their IDs are times), and for {N}:groupactive its members (its scores are times)."""
    dump: dict[str, object] = {}
    for key in redis_client.scan_iter(match=f"{{{tag}}}:*", count=1000):
        name = _text(key).removeprefix(f"{{{tag}}}")
        kind = _text(redis_client.type(key))
        if name == ":meta":
            continue
        if kind == "set":
            dump[name] = sorted(_text(member) for member in redis_client.smembers(key))
        elif kind == "hash":
            dump[name] = {_text(k): _text(v) for k, v in redis_client.hgetall(key).items()}
        elif name == ":groupactive":
            dump[name] = sorted(_text(member) for member in redis_client.zrange(key, 0, -1))
        elif kind == "zset":
            dump[name] = [(_text(member), score) for member, score in redis_client.zrange(key, 0, -1, withscores=True)]
        elif kind == "stream":
            dump[name] = [{_text(k): _text(v) for k, v in fields.items()} for _, fields in redis_client.xrange(key)]
        else:
            dump[name] = kind
    return dump


def _twin_namespaces(redis_client, seed, before, after, *, mangle=False):
    """Two namespaces, v and w, given the same changes `before`, a copy of each loaded (its follower), then the same
    changes `after`; with `mangle`, the stored fingerprint of each one's first incident edited by hand into upper case.
    Returns the random source (seeded), the fingerprint pool and each namespace's (index, follower)."""
    redis_client.flushall()
    rng = random.Random(seed)
    pool = clustered(rng, 10, 7, centers=2)
    sides = {}
    for tag in ("v", "w"):
        index = FingerprintIndex(redis_client, tag, bands=4, max_distance=7)
        index.open()
        oracle = Oracle(7)
        _run_ops(index, oracle, pool, before)
        follower = ChangeFollower(redis_client, index.keys, index.layout)
        follower.load()
        _run_ops(index, oracle, pool, after)
        if mangle and oracle.fps:
            incident_id = sorted(oracle.fps)[0]
            redis_client.hset(index.keys.fingerprints, incident_id, format_fingerprint(oracle.fps[incident_id]).upper())
        sides[tag] = (index, follower)
    return rng, pool, sides


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32),
    before=_changes(max_size=40),
    after=_changes(max_size=15),
    batch=_batch(unique_ids=False),
    cap=st.sampled_from([0, 1, 2, 5]),
    extra=st.sampled_from([0, 2]),
    shuffle=st.booleans(),
    short=st.booleans(),
)
def test_a_batch_read_in_place_answers_and_writes_as_its_calls_one_by_one(
    redis_client, seed, before, after, batch, cap, extra, shuffle, short
) -> None:
    """apply_batch reads each call's keys and arguments in place (apply_at; a call shorter than the usual 18
    arguments is copied out first), and the validation leaves a claim's list as it is when it is in order already,
    reads the last 8 digits of a change only when the first 8 are within the distance, and finds a later holder of
    the new fingerprint while it reads the changes. Each of these has a general form: the same changes, one call
    each in a twin namespace, whose claims list their matches in order. Replies and every key written are the same,
    with the same incident in a batch more than once (stale and repeat), deletes with their last three (empty)
    arguments left out (`short`), and, with `shuffle`, each claim's list in reverse order but for its first pair
    (the closest, which says whether the copy holds the new fingerprint) and the last of an incomplete list (its
    bound). Up to the first call that changed nothing to be applied again (unvalidated, stale): the batch answers
    `deferred` for the calls after it and writes nothing for them."""
    rng, pool, sides = _twin_namespaces(redis_client, seed, before, after)
    events = []
    for kind, n, which in batch:
        incident_id = f"i{n}"
        fp = None if kind == "delete" else flip(pool[which], rng.randint(0, 3), rng)
        stored = sides["v"][0].get(incident_id)  # before the batch: a later call of the same incident is stale
        expected = "*" if kind == "add" else stored
        events.append((kind, incident_id, fp, expected))
    calls: dict[str, list] = {"v": [], "w": []}
    for tag, (index, follower) in sides.items():
        for kind, incident_id, fp, expected in events:
            claim = None if fp is None else _claim(follower, fp, incident_id, cap, extra)
            if claim is not None and tag == "v" and shuffle and len(claim.listed) > 2:
                first, *rest = claim.listed
                rest = rest[::-1] if claim.complete else [*rest[-2::-1], rest[-1]]
                claim = replace(claim, listed=[first, *rest])
            command = index.apply_command(kind, incident_id, fp, expected=expected, max_matches=cap, snapshot=claim)
            if short and kind == "delete":
                assert command[-3:] == ("", "", ""), "a delete's snapshot, migration and alert_extra are empty"
                command = command[:-3]
            calls[tag].append(command)
    [batched] = execute(redis_client, [apply_batch(calls["v"])])
    alone = []  # one by one, up to the first call to be applied again: the batch defers the calls after it
    for command in calls["w"]:
        [reply] = execute(redis_client, [command])
        alone.append(reply)
        if not isinstance(reply, Exception) and parse_apply(reply).status in ("unvalidated", "stale"):
            break

    def outcome(reply):
        return ("error", str(reply).replace("{w}", "{v}")) if isinstance(reply, Exception) else parse_apply(reply)

    deferred = [parse_apply([b"deferred", 0, 0, b""])] * (len(calls["w"]) - len(alone))
    assert [outcome(reply) for reply in batched] == [outcome(reply) for reply in alone] + deferred
    assert _namespace_dump(redis_client, "v") == _namespace_dump(redis_client, "w")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32),
    before=_changes(max_size=40),
    after=_changes(max_size=15),
    batch=_batch(unique_ids=False),
    cap=st.sampled_from([0, 1, 2, 5]),
    budget=st.sampled_from([0, 0, 2]),
    mangle=st.booleans(),
)
def test_a_claim_naming_the_fingerprints_holder_writes_what_reading_the_postings_writes(
    redis_client, seed, before, after, batch, cap, budget, mangle
) -> None:
    """A claim says who held the new fingerprint in the copy (found by the fingerprint itself, whatever the budget),
    and the apply call takes the new incident's twin from it, or from a change after the copy's position, instead of
    reading the postings (a near storm's SINTER of large posting sets). Twin namespaces, the same changes, the same
    batches; one's claims name the holder, the other's do not: every reply and every key written are the same, with
    exact twins, near twins, deletes and upserts, holders that left or came after the copy's position, claims cut at
    a budget, and (`mangle`) an incident whose stored fingerprint was edited by hand into upper case (no holder for
    the postings' read either)."""
    rng, pool, sides = _twin_namespaces(redis_client, seed, before, after, mangle=mangle)
    calls: dict[str, list] = {"v": [], "w": []}
    for kind, n, which in batch:
        incident_id = f"i{n}"
        fp = None if kind == "delete" else pool[which] if which % 2 else flip(pool[which], rng.randint(0, 2), rng)
        for tag, (index, follower) in sides.items():
            claim = None
            if fp is not None:
                claim = _claim(follower, fp, incident_id, cap, 2, holder=tag == "v", budget=budget)
            expected = "*" if kind == "add" else index.get(incident_id)
            calls[tag].append(
                index.apply_command(kind, incident_id, fp, expected=expected, max_matches=cap, snapshot=claim)
            )
    replies = {tag: execute(redis_client, [apply_batch(calls[tag])])[0] for tag in sides}

    def outcome(reply):
        return ("error", str(reply).replace("{w}", "{v}")) if isinstance(reply, Exception) else parse_apply(reply)

    assert [outcome(reply) for reply in replies["v"]] == [outcome(reply) for reply in replies["w"]]
    assert _namespace_dump(redis_client, "v") == _namespace_dump(redis_client, "w")
    if not mangle:
        assert_postings_match(redis_client, "v", 4)


def test_load_refuses_a_copy_emptied_by_deletes() -> None:
    """A copy whose incidents were all deleted still holds rows (free ones among them): loading into it would hand a
    loaded row out again as free."""
    index = MemoryIndex(BandLayout(4, 7))
    index.set("a", 1)
    index.delete("a")
    with pytest.raises(ValueError, match="new copy"):
        index.load({"b": 2})


@pytest.mark.parametrize(
    "mangled",
    [
        "zzzzzzzzzzzzzzzz",
        "0x000000000000ab",
        " 00000000000000a",
        "+00000000000000a",
        "0000_0000000000a",
        "00000000000000AB",
    ],
)
def test_a_copy_reads_a_hand_mangled_fingerprint_as_the_primary_search_does(redis_client, mangled) -> None:
    """A value of {N}:fp edited by hand into something that is not 16 lowercase hex digits: the copy must load (the
    worker would exit otherwise) and find what the primary's search finds (nothing, unless it is mere uppercase)."""
    index = FingerprintIndex(redis_client, "v", bands=4, max_distance=7)
    index.add_fingerprint("fine", 0xFF00)
    index.add_fingerprint("mangled", 0xAB)  # its postings: those of 0xab
    redis_client.hset(index.keys.fingerprints, "mangled", mangled)
    follower = ChangeFollower(redis_client, index.keys, index.layout)
    follower.load()
    for fp in (0xAB, 0xA, 0xFF00):
        result, primary = follower.index.search(fp), index.search(fp)
        assert (result.match_count, result.matches) == (primary.match_count, primary.matches)


@pytest.mark.parametrize("how", ["trimmed", "reset"])
def test_a_load_whose_log_was_trimmed_or_reset_while_it_scanned_loads_again(redis_client, how) -> None:
    """The upkeep of another worker trims the log past the load's position while the load scans (an index idle for
    longer than changes_keep), or the namespace is reset then: the load starts again instead of failing the worker."""
    index = FingerprintIndex(redis_client, "v", bands=4, max_distance=7)
    index.add_fingerprint("a", 1)
    index.add_fingerprint("b", 2)

    class Interrupted:
        """The client, but its first HSCAN comes after the log was trimmed past every entry (or reset)."""

        def __init__(self) -> None:
            self.scans = 0

        def __getattr__(self, name: str) -> object:
            return getattr(redis_client, name)

        def execute_command(self, *args: object, **kwargs: object) -> object:
            if args[0] != "HSCAN":
                return redis_client.execute_command(*args, **kwargs)
            self.scans += 1
            if self.scans == 1 and how == "trimmed":
                time.sleep(0.002)
                seconds, micros = redis_client.time()
                now = f"{int(seconds) * 1000 + int(micros) // 1000}-0"  # past every entry, before any later one
                redis_client.fcall(FN_TRIM_CHANGES, 2, index.keys.meta, index.keys.changes, now, 100)
            elif self.scans == 1:
                redis_client.delete(index.keys.changes, index.keys.fingerprints)
                time.sleep(0.002)  # (the new log's first entry must not reuse the old one's ID)
                index.add_fingerprint("c", 3)
            return redis_client.execute_command(*args, **kwargs)

    client = Interrupted()
    follower = ChangeFollower(client, index.keys, index.layout)
    follower.load()
    assert client.scans == 2
    assert dict(follower.index.items()) == ({"a": 1, "b": 2} if how == "trimmed" else {"c": 3})
    index.add_fingerprint("d", 4)
    follower.catch_up()
    assert dict(follower.index.items()) == {k: index.get(k) for k in ("a", "b", "c", "d") if index.get(k) is not None}


def test_a_change_log_entry_with_a_mangled_fingerprint_has_the_copy_loaded_again(redis_client) -> None:
    """An entry of {N}:changes written by hand (or another program) with a fingerprint that is not hex: applying it
    raised ValueError out of the refresh, and every worker on the snapshot path exited, at each start, until the entry
    was trimmed. The validation reads such a value as no fingerprint; the copy is loaded again from {N}:fp instead."""
    from worker.readpath import SnapshotReader

    index = FingerprintIndex(redis_client, "v", bands=4, max_distance=7)
    index.add_fingerprint("a", 1)
    reader = SnapshotReader(redis_client, index.keys, index.layout)
    reader.refresh()
    redis_client.xadd(index.keys.changes, {"add": "hand", "fp": "not-hex-at-all!!", "prev": ""})
    with pytest.raises(SnapshotLostError, match="not 16 hex digits"):
        reader.follower.catch_up()
    index.add_fingerprint("b", 2)
    reader.refresh()
    assert reader.reloads == 2
    assert dict(reader.index.items()) == {"a": 1, "b": 2}
    index.add_fingerprint("c", 3)
    reader.refresh()
    assert dict(reader.index.items()) == {"a": 1, "b": 2, "c": 3}


# -- the load's scan: HSCAN replies read by a thread of their own, as flat lists ---------------------------------

_MANGLED = ["zzzzzzzzzzzzzzzz", "0x000000000000ab", "", "00000000000000AB", "0123456789abcde\n", "0123456789abcdef0"]
_VALUES = st.one_of(st.integers(0, 2**64 - 1).map(lambda fp: f"{fp:016x}"), st.sampled_from(_MANGLED))
_ID_TEXT = st.text(
    alphabet=st.one_of(st.sampled_from(["\r", "\n", "\x00", " ", "é", "\U0001f600"]), st.characters(codec="utf-8")),
    max_size=8,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    entries=st.lists(st.tuples(_ID_TEXT, _VALUES), max_size=40),
    binary=st.lists(st.tuples(st.binary(max_size=8), _VALUES), max_size=8),
    filler=st.sampled_from([0, 600]),
    batch=st.integers(1, 50),
)
def test_a_loaded_copy_holds_every_field_of_the_hash_as_hgetall_reads_it(
    redis_client, entries, binary, filler, batch
) -> None:
    """Whatever the IDs (any bytes, CR LF among them), a copy loaded in batches holds each ID whose value is 16 hex
    digits, with that value; the others are left out. (`filler`: enough fields that Redis keeps the hash as a table,
    which HSCAN reads in batches, not all at once.)"""
    keys = IndexKeys("scan")
    redis_client.delete(keys.fingerprints, keys.changes, keys.meta)
    fields: dict[Any, str] = {f"f{n}": f"{n:016x}" for n in range(filler)}
    fields.update(entries)
    if not redis_client.get_encoder().decode_responses:  # IDs that are not UTF-8: a decoding client cannot read them
        fields.update(binary)
    if fields:
        redis_client.hset(keys.fingerprints, mapping=fields)
    stored = redis_client.hgetall(keys.fingerprints)
    expected = {_as_text(incident_id): stored_fingerprint(value) for incident_id, value in stored.items()}
    follower = ChangeFollower(redis_client, keys, BandLayout(4, 7), batch=batch)
    follower.load()
    assert dict(follower.index.items()) == {k: fp for k, fp in expected.items() if fp is not None}
    assert not [t for t in threading.enumerate() if t.name.startswith("hscan")]


def _as_text(incident_id: Any) -> str:
    return incident_id.decode("utf-8", "surrogateescape") if isinstance(incident_id, bytes) else incident_id


@settings(max_examples=60, deadline=None)
@given(
    batches=st.lists(
        st.lists(st.tuples(st.sampled_from([b"a", b"b", b"a\r\nb", b"\xff", b"", b"c" * 30]), _VALUES), max_size=8),
        max_size=4,
    ),
    decoded=st.booleans(),
)
def test_scanned_batches_read_as_flat_lists_give_the_rows_their_pairs_give(batches, decoded) -> None:
    """HSCAN's flat list of field, value, ... read as it is: an ID given again (in another batch, or in the same)
    keeps its last fingerprint; a value that is not 16 hex digits is left out; IDs as bytes, or as text from a
    decoding client, are the same IDs. The same batches as redis-py's dicts (IDs once a batch) give the same rows."""
    expected: dict[str, int] = {}
    flat_rows, dict_rows = RowsBuilder(), RowsBuilder()
    for pairs in batches:
        if decoded:
            pairs = [(i.decode("utf-8", "surrogateescape"), v) for i, v in pairs]
        values_by_id: dict[Any, str] = {}
        for incident_id, value in pairs:
            if stored_fingerprint(value) is not None:
                expected[_as_text(incident_id)] = stored_fingerprint(value)
            values_by_id[incident_id] = value
        _add_scanned(flat_rows, [x for pair in pairs for x in pair])
        if len(values_by_id) == len(pairs):
            _add_scanned(dict_rows, values_by_id)
        else:
            _add_scanned(dict_rows, [x for pair in pairs for x in pair])
    for rows in (flat_rows, dict_rows):
        copy = MemoryIndex(BandLayout(4, 7))
        copy.load_rows(rows)
        assert dict(copy.items()) == expected


def test_an_error_of_the_scan_is_raised_by_the_load_and_ends_its_thread(redis_client) -> None:
    keys = IndexKeys("scan")
    redis_client.hset(keys.fingerprints, mapping={f"f{n}": f"{n:016x}" for n in range(600)})

    class Failing:
        def __init__(self) -> None:
            self.scans = 0

        def __getattr__(self, name: str) -> object:
            return getattr(redis_client, name)

        def execute_command(self, *args: object, **kwargs: object) -> object:
            if args[0] == "HSCAN":
                self.scans += 1
                if self.scans == 3:
                    raise redis.ConnectionError("the connection went")
            return redis_client.execute_command(*args, **kwargs)

    follower = ChangeFollower(Failing(), keys, BandLayout(4, 7), batch=10)
    with pytest.raises(redis.ConnectionError, match="the connection went"):
        follower.load()
    assert not follower.loaded
    assert not [t for t in threading.enumerate() if t.name.startswith("hscan")]


def test_an_error_parsing_the_scan_stops_its_thread(redis_client, monkeypatch: pytest.MonkeyPatch) -> None:
    import worker.readpath

    keys = IndexKeys("scan")
    redis_client.hset(keys.fingerprints, mapping={f"f{n}": f"{n:016x}" for n in range(2000)})

    def fail(rows: object, reply: object) -> None:
        raise ValueError("parsing failed")

    monkeypatch.setattr(worker.readpath, "_add_scanned", fail)
    follower = ChangeFollower(redis_client, keys, BandLayout(4, 7), batch=1)  # more replies than are read ahead
    with pytest.raises(ValueError, match="parsing failed"):
        follower.load()
    assert not [t for t in threading.enumerate() if t.name.startswith("hscan")]
