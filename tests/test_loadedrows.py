"""The loaded part of a worker's copy in arrays (worker/loadedrows.py, `MemoryIndex`'s base) against the oracle:
loads with IDs given twice and IDs that hash alike, then sets, deletes, upserts to twins and compactions."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import worker.loadedrows
from tests.oracle import Oracle, clustered, flip
from worker.bands import BandLayout
from worker.fingerprint import stored_fingerprint
from worker.loadedrows import _PREFIX, LoadedRows, RowsBuilder, _argsort_uint64, parse_stored_fingerprints
from worker.snapshot import MemoryIndex

HASHES = {
    "python": hash,
    "by-length": lambda key: len(key) % 3,  # IDs of one length hash alike: every lookup compares bytes
    "one": lambda key: 7,  # every ID hashes alike
    "low-bits": lambda key: hash(key) & 0xFF,  # hashes that differ only in the bits the table keeps its incidents in
}

IDS = ["i0", "i1", "i2", "i10", "i11", "é", "ü1", "x" * 40, "i3", "i4", "i5", "i6", "a b", "Z"]


@pytest.fixture(params=list(HASHES))
def id_hash(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(worker.loadedrows, "_id_hash", HASHES[request.param])
    return str(request.param)


def _check(index: MemoryIndex, oracle: Oracle, pool: list[int], rng: random.Random) -> None:
    assert dict(index.items()) == oracle.fps
    assert len(index) == len(oracle.fps)
    assert index.distinct == len(set(oracle.fps.values()))
    for incident_id in [*IDS, "absent", "i"]:
        assert index.get(incident_id) == oracle.fps.get(incident_id)
    r = index.layout.max_distance
    for fp in [*pool, flip(pool[0], r, rng), flip(pool[-1], r + 1, rng)]:
        for exclude in (None, "i0", "é", "x" * 40):
            for limit in (0, 2):
                found = oracle.matches(fp, exclude=exclude)
                result = index.search(fp, exclude=exclude, limit=limit)
                assert (result.match_count, result.matches) == (len(found), found[:limit] if limit else found)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    layout=st.sampled_from([(4, 7), (3, 7), (2, 3), (6, 12)]),
    seed=st.integers(0, 2**32),
    loaded=st.lists(st.tuples(st.integers(0, len(IDS) - 1), st.integers(0, 9)), max_size=30),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["set", "set", "delete", "compact"]), st.integers(0, len(IDS) - 1), st.integers(0, 9)
        ),
        max_size=60,
    ),
)
def test_a_loaded_copy_answers_as_the_oracle_through_changes(
    layout, seed, loaded, ops, id_hash: str, seal_at: int, direct_tables: str
) -> None:
    bands, max_distance = layout
    rng = random.Random(seed)
    pool = clustered(rng, 10, max_distance, centers=2)  # few fingerprints: twins and near pairs are common
    index = MemoryIndex(BandLayout(bands, max_distance))
    oracle = Oracle(max_distance)
    pairs = [(IDS[k], pool[which]) for k, which in loaded]  # an ID given twice: its last fingerprint
    for incident_id, fp in pairs:
        oracle.fps[incident_id] = fp
    index.load(pairs)
    _check(index, oracle, pool, rng)
    for op, k, which in ops:
        if op == "set":
            index.set(IDS[k], pool[which])
            oracle.fps[IDS[k]] = pool[which]
        elif op == "delete":
            index.delete(IDS[k])
            oracle.fps.pop(IDS[k], None)
        else:
            index.compact()
    _check(index, oracle, pool, rng)
    index.compact()
    _check(index, oracle, pool, rng)


def test_ids_that_hash_alike_are_told_apart_and_repeats_keep_their_last(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker.loadedrows, "_id_hash", lambda key: 1)
    builder = RowsBuilder()
    builder.add([b"a", b"b", b"a", b"c"], np.array([5, 6, 7, 6], dtype=np.uint64))
    builder.add([b"b", b"d"], np.array([9, 6], dtype=np.uint64))
    rows = builder.build()
    assert rows is not None
    assert rows.dropped == 2  # the first a and the first b
    found = {key: rows.find(key) for key in ["a", "b", "c", "d", "e"]}
    assert found["e"] == -1
    assert {key: rows.fp_of(incident) for key, incident in found.items() if incident >= 0} == {
        "a": 7,
        "b": 9,
        "c": 6,
        "d": 6,
    }
    six = int(np.searchsorted(rows.fps, 6))
    assert [rows.incident_id(incident) for incident in rows.row_members(six)] == ["c", "d"]  # twins in ID order


def test_twins_of_a_loaded_row_are_in_utf8_byte_order() -> None:
    ids = ["b", "\uff41", "a", "\U0001f600", "B", "\u00e9"]
    index = MemoryIndex(BandLayout(4, 7))
    index.load([(incident_id, 42) for incident_id in ids])
    expected = sorted(ids, key=lambda i: i.encode())
    assert [m for m, _ in index.search(42).matches] == expected == sorted(ids)


def test_a_loaded_copy_holds_at_most_120_bytes_an_incident() -> None:
    rng = np.random.default_rng(5)
    count = 300_000
    fps = rng.integers(0, 2**63, size=count, dtype=np.uint64) | np.uint64(1)
    fps[::50] = fps[1::50]  # some twins
    index = MemoryIndex(BandLayout(4, 7))
    index.load(zip([str(k) for k in range(count)], fps.tolist(), strict=True))
    assert len(index) == count
    # the tiers' direct tables (4 x 2^16 entries) are a fixed 2 MB, 7 bytes an incident here, nothing at 10M
    assert index.nbytes() / count < 120


@pytest.mark.parametrize(
    "values",
    [
        [b"00000000000000ff", b"FFFFFFFFFFFFFFFF", b"0123456789abcdef"],
        ["00000000000000ff", "0123456789abcdef"],
        [b"00000000000000ff", b"0123456789abcdeg"],  # not hex
        [b"00000000000000ff", b"01234567 9abcdef"],  # a space, which bytes.fromhex would skip
        [b"00000000000000ff", b"0123456789abcdef0"],  # too long
        [b"0x23456789abcdef", b"0123456789abcdef"],
        ["00000000000000ff", "0123456789abcdé"],
        [],
    ],
)
def test_fingerprints_read_in_one_step_as_one_by_one(values: list) -> None:
    parsed = parse_stored_fingerprints(values)
    one_by_one = [stored_fingerprint(value) for value in values]
    if None in one_by_one:
        assert parsed is None
    else:
        assert parsed is not None and parsed.tolist() == one_by_one


def test_rows_of_nothing_are_none() -> None:
    assert RowsBuilder().build() is None
    index = MemoryIndex(BandLayout(4, 7))
    index.load([])
    assert len(index) == 0 and index.search(1).match_count == 0
    assert isinstance(LoadedRows, type)


@settings(max_examples=200, deadline=None)
@given(
    tops=st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=4),
    picks=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2**20)), max_size=300),
)
def test_the_order_of_packed_keys_is_a_stable_argsort(tops: list[int], picks: list[tuple[int, int]]) -> None:
    """Values that share their top bits and differ in the low ones (which the sort first replaces by positions), equal
    values, 0 and 2**64 - 1: the order is numpy's stable argsort's."""
    values = np.array([(tops[k % len(tops)] & ~0xFFFFF) | low for k, low in picks], dtype=np.uint64)
    assert _argsort_uint64(values).tolist() == np.argsort(values, kind="stable").tolist()


_TWIN_IDS = [
    b"",
    b"\x00",
    b"a",
    b"a\x00",
    b"a\x00\x00",
    b"a\x00b",
    b"a\r\nb",
    b"\xff",
    b"\xff\x00",
    b"p" * _PREFIX,
    b"p" * _PREFIX + b"\x00",
    b"p" * _PREFIX + b"a",
    b"p" * _PREFIX + b"b",
    b"p" * (_PREFIX + 9) + b"a",
    b"p" * (_PREFIX - 1) + b"q" + b"z",
    b"p" * (_PREFIX + 1),
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    added=st.lists(
        st.lists(st.tuples(st.sampled_from(_TWIN_IDS), st.sampled_from([3, 3, 5, 2**64 - 1])), max_size=12), max_size=3
    )
)
def test_loaded_rows_hold_each_id_once_with_its_last_fingerprint_twins_in_byte_order(added, id_hash: str) -> None:
    """IDs of any bytes (NUL, CR LF, prefixes of one another, longer than the twins' compared prefix and alike in
    it), given again in the same or a later batch: each is found with its last fingerprint, and each row lists its
    IDs in byte order, as sorting the bytes does."""
    builder = RowsBuilder()
    last: dict[bytes, int] = {}
    for batch in added:
        builder.add([incident_id for incident_id, _ in batch], np.array([fp for _, fp in batch], dtype=np.uint64))
        last.update(batch)
    rows = builder.build()
    if not last:
        assert rows is None
        return
    assert rows is not None
    assert rows.dropped == sum(len(batch) for batch in added) - len(last)
    for incident_id in _TWIN_IDS:
        found = rows.find(incident_id.decode("utf-8", "surrogateescape"))
        assert (rows.fp_of(found) if found >= 0 else None) == last.get(incident_id)
    assert rows.fps.tolist() == sorted(set(last.values()))
    for row, fp in enumerate(rows.fps.tolist()):
        members = [rows.id_bytes(incident) for incident in rows.row_members(row)]
        assert members == sorted(incident_id for incident_id, value in last.items() if value == fp)
