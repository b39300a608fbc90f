"""A copy's listings written by the compiled loop (`copylisting._written`, `compiled.write_listings`) from its rows'
IDs kept as bytes (`copywritten.WrittenIds`): the same pairs as the linear scan lists, in the same order, and the
same claim arguments as the Python writer (`snapshotadds._listing`), through rounds of changes that give rows new
members, take them away and empty them (each written row forgotten and written again), with what they leave behind
dropped at once or kept; queries whose rows hold an ID that is not ASCII, and listings of every match or of more
than the kept IDs, listed in Python instead."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import worker.copyarrays
import worker.copywritten
import worker.snapshot
from tests.conftest import loops_compiled
from tests.oracle import Oracle, claim_arguments, flip
from worker.bands import BandLayout
from worker.copywritten import KEPT, WrittenListing
from worker.snapshot import MemoryIndex

# spelled so that the order they are made in, their numbers' order and their byte order all differ; the long ones
# alike in their first 8 bytes and more (the loop sorts by those first, then such runs by every byte)
_PREFIXES = ["b", "a", "B", "Z", "a-", "", "~", "a\x00", "aa", "incident-2026-", "incident-2026-12-", "incident-"]


@pytest.fixture(autouse=True)
def _loops_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Listings are written once the loops are compiled; a send's matches listed in arrays whatever their number."""
    loops_compiled()
    monkeypatch.setattr(worker.snapshot, "_FEW_HITS", 0)


def _plain(incident_id: str) -> bool:
    """Whether JSON writes the ID as it is."""
    return not any(c in '"\\' or ord(c) < 32 or ord(c) == 127 for c in incident_id)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32),
    loaded=st.integers(0, 150),
    rounds=st.integers(1, 6),
    limit=st.sampled_from([1, 2, 17, 116, KEPT - 1]),
    scan=st.booleans(),
    drop=st.booleans(),
)
def test_written_listings_list_as_the_linear_scan_through_rounds_of_changes(
    seed, loaded, rounds, limit, scan, drop
) -> None:
    """A storm's few fingerprints within a few bits of one another, held by many IDs (twin groups larger than a
    listing takes from one row too), some loaded, then rounds of adds, upserts and deletes, each round searched in a
    send with excluded IDs that often share a row with others: every listing written, equal to the oracle's, and its
    arguments the Python writer's. Through the bands or compared with every row (`scan`); what changed rows leave
    behind dropped at every write (`drop`) or kept."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(worker.snapshot, "_SCAN_SHARE", 2**62 if scan else 0)
        if drop:
            patch.setattr(worker.copywritten, "_DROP_FROM", -(2**62))
        _rounds(seed, loaded, rounds, limit)


def _rounds(seed: int, loaded: int, rounds: int, limit: int) -> None:
    rng = random.Random(seed)
    center = rng.getrandbits(64)
    pool = [center] + [flip(center, rng.randint(1, 4), rng) for _ in range(9)] + [rng.getrandbits(64)]
    oracle = Oracle(7)
    made = 0

    def name() -> str:
        nonlocal made
        made += 1
        return f"{rng.choice(_PREFIXES)}{made}"

    loaded_pairs = {name(): rng.choice(pool) for _ in range(loaded)}
    index = MemoryIndex(BandLayout(4, 7))
    index.load(loaded_pairs)
    oracle.fps.update(loaded_pairs)
    for _ in range(rounds):
        for _ in range(rng.randint(0, 80)):
            ids = sorted(oracle.fps)
            move = rng.random()
            if ids and move < 0.2:
                incident_id = rng.choice(ids)
                index.delete(incident_id)
                del oracle.fps[incident_id]
                continue
            incident_id = rng.choice(ids) if ids and move < 0.4 else name()
            fp = rng.choice(pool)
            index.set(incident_id, fp)
            oracle.fps[incident_id] = fp
        ids = sorted(oracle.fps)
        queries = [(fp, rng.choice([None, *rng.sample(ids, min(2, len(ids)))])) for fp in pool]
        shown = rng.choice([0, 1, limit // 2, limit])  # (where a JSON listing closes the alert's array)
        searched = index.search_many(queries, limit=limit, shown=shown)
        for (fp, exclude), result in zip(queries, searched, strict=True):
            found = oracle.matches(fp, exclude=exclude)
            assert (result.match_count, result.matches) == (len(found), found[:limit])
            if result.match_count:
                assert isinstance(result.matches, WrittenListing)
                assert len(result.matches) == min(limit, len(found))
                listed = found[:limit]
                assert result.matches.as_json == all(_plain(i) for i, _ in listed)
                assert result.matches.written == claim_arguments(listed, result.matches.as_json, shown)


def test_a_query_near_an_id_that_is_not_ascii_is_listed_in_python_and_the_others_written() -> None:
    """Byte order is code point order only for ASCII (a lone surrogate's bytes are not a code point's): a row holding
    any other ID is not written, and the queries that reach it are listed in Python, their send's others written."""
    rng = random.Random(7)
    center, far = rng.getrandbits(64), rng.getrandbits(64)
    oracle = Oracle(7)
    index = MemoryIndex(BandLayout(4, 7))
    for k in range(300):
        incident_id, fp = f"n{k}", flip(center, rng.randint(0, 3), rng)
        index.set(incident_id, fp)
        oracle.fps[incident_id] = fp
    for k, incident_id in enumerate(["é1", "\udce92", "z3"]):
        fp = flip(far, k, rng)
        index.set(incident_id, fp)
        oracle.fps[incident_id] = fp
    near, other = index.search_many([(center, None), (far, None)], limit=100)
    assert isinstance(near.matches, WrittenListing)
    assert type(other.matches) is list
    assert near.matches == oracle.matches(center)[:100]
    assert other.matches == oracle.matches(far)[:100]


@pytest.mark.parametrize("limit", [0, KEPT, 5 * KEPT])
def test_a_listing_of_every_match_or_of_more_than_the_kept_ids_is_made_in_python(limit: int) -> None:
    """A row's IDs are kept up to KEPT: a listing that may take more of one row than that (every match, or a cap of
    KEPT or more) is made in Python, from the rows' members, as the linear scan lists it."""
    rng = random.Random(limit)
    center = rng.getrandbits(64)
    oracle = Oracle(7)
    index = MemoryIndex(BandLayout(4, 7))
    for k in range(6 * KEPT):
        incident_id, fp = f"t{k}", center if k % 2 else flip(center, 1 + k % 3, rng)
        index.set(incident_id, fp)
        oracle.fps[incident_id] = fp
    [result] = index.search_many([(center, "t1")], limit=limit)
    found = oracle.matches(center, exclude="t1")
    assert type(result.matches) is list
    assert (result.match_count, result.matches) == (len(found), found[:limit] if limit else found)


def test_a_written_listing_reads_back_as_its_pairs() -> None:
    """What a written listing holds, read back from its arguments (for a call built argument by argument): IDs with
    the separators of the protocol inside them, long and empty ones, every distance."""
    pairs = [("", 0), ("a\r\nb", 3), ("$5\r\n", 9), ("x" * 300, 10), ("q", 64)]
    for as_json, listed in ((True, [("", 0), ("a},{b:1,", 3), ("x" * 300, 10), ("q", 64)]), (False, [])):
        listing = WrittenListing(claim_arguments(listed, as_json), len(listed), as_json)
        assert listing.pairs() == listed
        assert listing.arguments == (1 if as_json else 0)
    listing = WrittenListing(claim_arguments(pairs), len(pairs))
    assert listing.pairs() == pairs
    assert listing == pairs and pairs == listing and list(listing) == pairs
    assert listing[1] == ("a\r\nb", 3) and listing[1:3] == pairs[1:3]
    assert listing != pairs[:-1] and listing != "text"
    assert len(listing) == 5


@pytest.mark.parametrize("scan", [False, True])
def test_a_row_emptied_and_made_again_for_another_fingerprint_is_written_anew(scan: bool) -> None:
    """A row of the tail whose fingerprint went is used again for the next new one: its IDs written while it held
    the old one (or none) are not the new one's."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(worker.snapshot, "_SCAN_SHARE", 2**62 if scan else 0)
        rng = random.Random(3)
        center = rng.getrandbits(64)
        oracle = Oracle(7)
        index = MemoryIndex(BandLayout(4, 7))
        for k in range(40):
            incident_id, fp = f"s{k}", flip(center, k % 4, rng)
            index.set(incident_id, fp)
            oracle.fps[incident_id] = fp
        for step in range(30):
            victim = rng.choice(sorted(oracle.fps))
            queries = [(center, None), (oracle.fps[victim], None)]
            index.delete(victim)
            del oracle.fps[victim]
            for (fp, _), result in zip(queries, index.search_many(queries, limit=100), strict=True):
                assert result.matches == oracle.matches(fp)[:100]
            incident_id, fp = f"r{step}", flip(center, rng.randint(0, 4), rng)
            index.set(incident_id, fp)
            oracle.fps[incident_id] = fp
            [result] = index.search_many([(fp, None)], limit=100)
            assert result.matches == oracle.matches(fp)[:100]


def test_listings_written_through_growths_of_the_row_tables_and_drops_list_as_the_linear_scan() -> None:
    """The per-row tables grow as the copy's rows do (past 1,024, then doubling; rows written before a growth keep
    their entries, others are written when first listed), and a drop starts a new epoch: through several of each,
    every listing is the oracle's."""
    with pytest.MonkeyPatch.context() as patch:
        rng = random.Random(11)
        center = rng.getrandbits(64)
        oracle = Oracle(7)
        index = MemoryIndex(BandLayout(4, 7))
        made = 0
        for step in range(6):
            if step == 4:  # (then a drop at every listing)
                patch.setattr(worker.copywritten, "_DROP_FROM", -(2**62))
            for _ in range(900):
                incident_id, fp = f"g{made}", flip(center, rng.randint(1, 6), rng)
                index.set(incident_id, fp)
                oracle.fps[incident_id] = fp
                made += 1
            queries = [(flip(center, rng.randint(0, 2), rng), None) for _ in range(4)]
            for (fp, _), result in zip(queries, index.search_many(queries, limit=100), strict=True):
                assert isinstance(result.matches, WrittenListing)
                assert result.matches == oracle.matches(fp)[:100]
        assert len(index._written._epoch) >= index._row_count()
        assert index._written._now > 1
