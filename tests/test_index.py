"""The Redis index against a brute-force linear scan, on a real redis-server and on fakeredis."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tests.oracle import Oracle, assert_postings_match, clustered, flip, hamming
from worker import library
from worker.bands import MAX_PROBES, BandLayout, probe_count
from worker.errors import DuplicateIncidentError, FunctionsMissingError, LayoutMismatchError
from worker.fingerprint import fingerprint, format_fingerprint
from worker.index import FingerprintIndex
from worker.library import parse_apply
from worker.replies import text


def _largest_distance(bands: int, cap: int = 24) -> int:
    return max(r for r in range(cap + 1) if probe_count(bands, r) <= MAX_PROBES)


LAYOUTS = sorted({(m, r) for m in range(1, 17) for r in (0, 1, _largest_distance(m) // 2, _largest_distance(m))})


def _run_against_oracle(index: FingerprintIndex, rng: random.Random, steps: int, fps: list[int]) -> None:
    oracle = Oracle(index.layout.max_distance)
    ids = [f"inc-{i}" for i in range(len(fps))]
    for step in range(steps):
        action = rng.random()
        incident_id = rng.choice(ids)
        fp = rng.choice(fps) if rng.random() < 0.8 else flip(rng.choice(fps), rng.randint(0, 3), rng)
        if action < 0.6:
            expected = oracle.add(incident_id, fp)
            if expected == "duplicate":
                with pytest.raises(DuplicateIncidentError):
                    index.add_fingerprint(incident_id, fp)
            else:
                assert index.add_fingerprint(incident_id, fp) == expected, f"step {step}: add {incident_id}"
        elif action < 0.75:
            assert index.upsert_fingerprint(incident_id, fp) == oracle.upsert(incident_id, fp), f"step {step}"
        elif action < 0.85:
            assert index.delete(incident_id) == oracle.delete(incident_id), f"step {step}: delete"
        else:
            limit = rng.randint(0, index.layout.max_distance)
            assert index.matches_of(fp, limit) == oracle.matches(fp, limit), f"step {step}: matches"
    assert {i: index.get(i) for i in ids} == {i: oracle.fps.get(i) for i in ids}
    assert_postings_match(index.redis, index.keys.namespace, index.layout.bands, oracle.fps)


@pytest.mark.slow
@pytest.mark.parametrize(("bands", "max_distance"), LAYOUTS, ids=[f"m{m}-r{r}" for m, r in LAYOUTS])
def test_clustered_fingerprints_match_linear_scan(redis_client: redis.Redis, bands: int, max_distance: int) -> None:
    rng = random.Random(bands * 1000 + max_distance)
    index = FingerprintIndex(redis_client, "t", bands=bands, max_distance=max_distance)
    fps = clustered(rng, 30, max_distance)
    _run_against_oracle(index, rng, 70, fps)


@pytest.mark.parametrize("bands", [3, 4, 8])
def test_random_fingerprints_match_linear_scan(redis_client: redis.Redis, bands: int) -> None:
    rng = random.Random(bands)
    index = FingerprintIndex(redis_client, "t", bands=bands, max_distance=7)
    fps = [rng.getrandbits(64) for _ in range(60)]
    _run_against_oracle(index, rng, 120, fps)


def _spread(rng: random.Random, index: FingerprintIndex, query: int, distances: list[int]) -> int:
    """`query` with `distances[b]` random bits flipped inside band b."""
    fp = query
    for offset, width, d in zip(index.layout.offsets, index.layout.widths, distances, strict=True):
        for bit in rng.sample(range(width), d):
            fp ^= 1 << (offset + bit)
    return fp


@pytest.mark.parametrize(("bands", "max_distance"), [(3, 7), (4, 7), (5, 7), (6, 7), (8, 3), (4, 5), (2, 3), (1, 2)])
def test_fingerprints_reachable_through_one_band_only_are_found(
    redis_client: redis.Redis, bands: int, max_distance: int
) -> None:
    """The tightest cases of the probing: for each probed band, a fingerprint at distance r that differs by one bit
    more than its radius in every other band, so that band alone makes it a candidate; and one at r + 1."""
    rng = random.Random(bands * 100 + max_distance)
    index = FingerprintIndex(redis_client, "edge", bands=bands, max_distance=max_distance)
    oracle = Oracle(max_distance)
    query = rng.getrandbits(64)
    beyond = [p + 1 for p in index.layout.radii]
    for round_ in range(3):
        for band, radius in enumerate(index.layout.radii):
            if radius >= 0:
                distances = [*beyond[:band], radius, *beyond[band + 1 :]]
                fp = _spread(rng, index, query, distances)
                assert hamming(fp, query) == max_distance
                index.add_fingerprint(f"only-{band}-{round_}", fp)
                oracle.add(f"only-{band}-{round_}", fp)
        far = _spread(rng, index, query, beyond)
        assert hamming(far, query) == max_distance + 1
        index.add_fingerprint(f"far-{round_}", far)
        oracle.add(f"far-{round_}", far)
    expected = oracle.matches(query)
    assert len(expected) == 3 * index.layout.probed_bands
    assert index.matches_of(query) == expected
    assert index.add_fingerprint("query", query) == expected
    oracle.add("query", query)
    for limit in range(max_distance + 1):  # a narrower query probes its own, tighter radii
        assert index.matches_of(query, limit) == oracle.matches(query, limit)


def _tight_layouts() -> list[tuple[int, int]]:
    """Every layout the product accepts up to distance 24 in which the tightest cases below can be built."""
    found = []
    for bands in range(1, 65):
        for max_distance in range(25):
            if probe_count(bands, max_distance) > MAX_PROBES:
                continue
            layout = BandLayout(bands, max_distance)
            if all(radius + 1 <= width for radius, width in zip(layout.radii, layout.widths, strict=True)):
                found.append((bands, max_distance))
    return found


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=st.sampled_from(_tight_layouts()), seed=st.integers(0, 2**32), edges=st.booleans())
def test_every_layout_finds_the_tightest_cases_at_band_edges(
    redis_client: redis.Redis, layout: tuple[int, int], seed: int, edges: bool
) -> None:
    """For every layout offered: for each probed band, a fingerprint at exactly r reachable through that band alone,
    one at r + 1 reachable through none, and an exact twin, the differing bits at the edges of their bands when
    `edges` (the band's lowest and highest bits first); every answer equals the linear scan."""
    bands, max_distance = layout
    redis_client.flushall()
    rng = random.Random(seed)
    index = FingerprintIndex(redis_client, "tight", bands=bands, max_distance=max_distance)
    oracle = Oracle(max_distance)

    def spread(query: int, distances: list[int]) -> int:
        fp = query
        for offset, width, d in zip(index.layout.offsets, index.layout.widths, distances, strict=True):
            bits = [0, width - 1] if edges and width > 1 else [0]
            bits += rng.sample([b for b in range(width) if b not in bits], width - len(bits))
            for bit in bits[:d] if edges else rng.sample(range(width), d):
                fp ^= 1 << (offset + bit)
        return fp

    query = rng.getrandbits(64)
    beyond = [p + 1 for p in index.layout.radii]
    fps = {"twin": query, "far": spread(query, beyond)}
    for band, radius in enumerate(index.layout.radii):
        if radius >= 0:
            fps[f"only-{band}"] = spread(query, [*beyond[:band], radius, *beyond[band + 1 :]])
    assert hamming(fps["far"], query) == max_distance + 1
    for incident_id, fp in fps.items():
        assert index.add_fingerprint(incident_id, fp) == oracle.add(incident_id, fp)
    assert index.matches_of(query) == oracle.matches(query)
    assert len(oracle.matches(query)) == 1 + index.layout.probed_bands
    assert index.add_fingerprint("query", query) == oracle.add("query", query)
    limit = rng.randint(0, max_distance)  # a narrower query probes its own, tighter radii
    assert index.matches_of(query ^ 1, limit) == oracle.matches(query ^ 1, limit)


@pytest.mark.parametrize(("bands", "max_distance"), [(8, 3), (4, 2), (5, 3), (3, 7), (4, 7)])
def test_a_call_verifies_exactly_the_incidents_of_the_probed_band_values(
    redis_client: redis.Redis, bands: int, max_distance: int
) -> None:
    """Candidates come from the probed bands only: a band probed at no radius is written but never read."""
    rng = random.Random(bands * 10 + max_distance)
    index = FingerprintIndex(redis_client, "probed", bands=bands, max_distance=max_distance)
    index.open()
    layout = index.layout
    fps = clustered(rng, 40, max_distance, centers=3)
    # fingerprints that share only the last (most significant) bands with an earlier one
    fps += [fp ^ rng.getrandbits(layout.offsets[-1]) for fp in fps[:20]]
    rng.shuffle(fps)
    stored: dict[str, int] = {}
    for i, fp in enumerate(fps):
        probed = layout.probe_values(fp)
        # one candidate per distinct fingerprint: exact twins share their representative's postings
        expected = {
            other
            for other in stored.values()
            if any(value in values for value, values in zip(layout.values(other), probed, strict=True))
        }
        [reply] = index.execute([index.apply_command("add", f"i{i}", fp)])
        result = parse_apply(reply)
        assert result.status == "indexed" and result.candidates == len(expected), f"event {i}"
        stored[f"i{i}"] = fp


def test_bags_match_linear_scan(redis_client: redis.Redis) -> None:
    rng = random.Random(7)
    vocabulary = [f"word{i}" for i in range(40)]
    index = FingerprintIndex(redis_client, "bags")
    oracle = Oracle(7)
    base = [{w: rng.randint(1, 5) for w in rng.sample(vocabulary, 12)} for _ in range(8)]
    for i in range(80):
        bag = dict(rng.choice(base))
        for _ in range(rng.randint(0, 3)):  # small edits make near duplicates
            bag[rng.choice(vocabulary)] = rng.randint(1, 5)
        expected = oracle.add(str(i), fingerprint(bag))
        assert index.add(str(i), bag) == expected
        assert index.matches(bag) == oracle.matches(fingerprint(bag))
    assert any(index.matches(b) for b in base)


def test_spec_section_4_example(redis_client: redis.Redis) -> None:
    index = FingerprintIndex(redis_client)
    assert index.add("47", {"dock": 3, "scanner": 2, "timeout": 1}) == []
    assert index.add("83", {"weather": 4, "road": 2}) == []
    assert index.add("90", {"dock": 3, "scanner": 2, "timeout": 1}) == [("47", 0)]
    assert FingerprintIndex(redis_client).matches({"weather": 4, "road": 2}) == [("83", 0)]


def test_query_of_an_indexed_bag_finds_itself_and_only_near_ones(redis_client: redis.Redis) -> None:
    index = FingerprintIndex(redis_client)
    index.add("47", {"dock": 3, "scanner": 2, "timeout": 1})
    index.add("83", {"weather": 4, "road": 2})
    assert index.matches({"dock": 3, "scanner": 2, "timeout": 1}) == [("47", 0)]
    assert index.matches({"weather": 4, "road": 2}) == [("83", 0)]


def test_repeated_add_changes_nothing_and_other_fingerprint_is_refused(redis_client: redis.Redis) -> None:
    index = FingerprintIndex(redis_client)
    index.add("a", {"x": 1})
    index.add("b", {"x": 1, "y": 1})
    before = {text(k): redis_client.dump(k) for k in redis_client.keys("{incidents}:*")}
    assert index.add("a", {"x": 1}) == []
    with pytest.raises(DuplicateIncidentError, match=r"'a'.*upsert"):
        index.add("a", {"z": 1})
    after = {text(k): redis_client.dump(k) for k in redis_client.keys("{incidents}:*")}
    assert before == after
    assert index.get("a") == fingerprint({"x": 1})


def test_upsert_and_delete_replace_a_stored_value_that_is_not_a_fingerprint(redis_client: redis.Redis) -> None:
    # values of {N}:fp mangled by hand: before, reading them as fingerprints raised ValueError and nothing was done
    index = FingerprintIndex(redis_client)
    fp = 0x0123456789ABCDEF
    index.add_fingerprint("twin-1", fp)
    index.add_fingerprint("twin-2", fp)
    index.add_fingerprint("upper", fp ^ 0x0F00)
    redis_client.hset(index.keys.fingerprints, "upper", format_fingerprint(fp ^ 0x0F00).upper())
    redis_client.hset(index.keys.fingerprints, mapping={"junk": "not-a-fingerprint", "junk16": "z" * 16})
    with pytest.raises(DuplicateIncidentError, match=r"'junk'.*not a fingerprint.*upsert"):
        index.add_fingerprint("junk", fp)
    assert index.upsert_fingerprint("junk", fp) == [("twin-1", 0), ("twin-2", 0), ("upper", 4)]
    assert index.upsert_fingerprint("upper", fp ^ 1) == [("junk", 1), ("twin-1", 1), ("twin-2", 1)]
    assert index.delete("junk16") is True
    assert {i: index.get(i) for i in ("junk", "junk16", "upper")} == {"junk": fp, "junk16": None, "upper": fp ^ 1}
    assert_postings_match(redis_client, "incidents", 4)


def test_postings_of_a_fingerprint_whose_holder_was_mangled_are_read_without_raising(redis_client: redis.Redis) -> None:
    # before, twin_group and postings (incident-worker inspect) raised ValueError on the holder's stored value
    index = FingerprintIndex(redis_client)
    fp = 0x0123456789ABCDEF
    index.add_fingerprint("holder", fp)
    redis_client.hset(index.keys.fingerprints, "holder", "not-a-fingerprint")
    assert index.twin_group(fp) == (0, None)
    assert [(p.size, p.member) for p in index.postings("other", fp)] == [(1, False)] * 4


def test_upsert_never_matches_its_old_self(redis_client: redis.Redis) -> None:
    index = FingerprintIndex(redis_client)
    fp = 0x0123456789ABCDEF
    index.add_fingerprint("a", fp)
    assert index.upsert_fingerprint("a", fp ^ 1) == []  # distance 1 from its old self, which is gone
    assert index.get("a") == fp ^ 1
    assert index.matches_of(fp) == [("a", 1)]
    assert index.upsert_fingerprint("a", fp ^ 1) == []  # the same fingerprint again: nothing to do


def test_upsert_of_unknown_id_indexes_it(redis_client: redis.Redis) -> None:
    index = FingerprintIndex(redis_client)
    index.add_fingerprint("a", 5)
    assert index.upsert_fingerprint("b", 7) == [("a", 1)]
    assert index.get("b") == 7


def test_key_layout_is_spec_section_3(redis_client: redis.Redis) -> None:
    index = FingerprintIndex(redis_client, "incidents", bands=4)
    rng = random.Random(3)
    fps = {str(i): rng.getrandbits(64) for i in range(20)}
    for i, fp in fps.items():
        index.add_fingerprint(i, fp)
    assert text(redis_client.type("{incidents}:fp")) == "hash"
    for i, fp in fps.items():
        stored = text(redis_client.hget("{incidents}:fp", i))
        assert stored == format_fingerprint(fp) and len(stored) == 16 and stored == stored.lower()
    band_keys = {text(k) for k in redis_client.keys("{incidents}:band:*")}
    expected_keys = {f"{{incidents}}:band:{b}:{(fp >> (16 * b)) & 0xFFFF:04x}" for fp in fps.values() for b in range(4)}
    assert band_keys == expected_keys
    for key in band_keys:
        assert text(redis_client.type(key)) == "set"
        _, _, band, value = key.split(":")
        members = {text(m) for m in redis_client.smembers(key)}
        assert members == {i for i, fp in fps.items() if (fp >> (16 * int(band))) & 0xFFFF == int(value, 16)}
    meta = {text(k): text(v) for k, v in redis_client.hgetall("{incidents}:meta").items()}
    assert meta["bands"] == "4" and meta["max_distance"] == "7" and meta["band_widths"] == "16,16,16,16"
    assert meta["scheme"] == "simhash64-blake2b8le" and meta["format_version"] == "2"
    # deleting everything leaves no posting behind
    for i in fps:
        assert index.delete(i)
    assert redis_client.keys("{incidents}:band:*") == []
    assert redis_client.hlen("{incidents}:fp") == 0


def test_odd_band_counts_pad_values_to_the_band_width(redis_client: redis.Redis) -> None:
    index = FingerprintIndex(redis_client, "odd", bands=3)
    fp = 0xFFFF_FFFF_FFFF_FFFF
    index.add_fingerprint("x", fp)
    assert {text(k) for k in redis_client.keys("{odd}:band:*")} == {
        "{odd}:band:0:3fffff",  # bits 0..21
        "{odd}:band:1:1fffff",  # bits 22..42
        "{odd}:band:2:1fffff",  # bits 43..63
    }
    index.add_fingerprint("y", 0)
    assert text(redis_client.smembers("{odd}:band:2:000000").pop()) == "y"


def test_reopening_with_another_layout_is_refused(redis_client: redis.Redis) -> None:
    FingerprintIndex(redis_client, "n", bands=4).add("a", {"x": 1})
    with pytest.raises(LayoutMismatchError, match=r"bands=4.*bands=8"):
        FingerprintIndex(redis_client, "n", bands=8).add("b", {"x": 1})
    with pytest.raises(LayoutMismatchError, match="max_distance=7"):
        FingerprintIndex(redis_client, "n", bands=4, max_distance=5).matches({"x": 1})
    assert FingerprintIndex(redis_client, "n", bands=4).matches({"x": 1}) == [("a", 0)]
    assert FingerprintIndex(redis_client, "other", bands=8).add("b", {"x": 1}) == []


def test_foreign_meta_key_is_refused(redis_client: redis.Redis) -> None:
    redis_client.hset("{n}:meta", "owner", "someone else")
    with pytest.raises(LayoutMismatchError, match="not the meta of an incident index"):
        FingerprintIndex(redis_client, "n").add("a", {"x": 1})


def test_index_recovers_when_its_meta_vanishes(redis_client: redis.Redis) -> None:
    index = FingerprintIndex(redis_client)
    index.add("a", {"x": 1})
    redis_client.delete("{incidents}:meta")
    assert index.add("b", {"x": 1}) == [("a", 0)]
    assert redis_client.hget("{incidents}:meta", "bands") in (b"4", "4")


def test_index_without_its_functions_says_what_to_run_and_loads_nothing(redis_client: redis.Redis) -> None:
    # Loading code is an administrator's step (SPEC section 7): the index never does it, at the start or later.
    redis_client.function_flush()
    with pytest.raises(FunctionsMissingError, match="incident-worker load-functions") as missing:
        FingerprintIndex(redis_client).add("a", {"x": 1})
    assert library.LIBRARY_NAME in str(missing.value)
    library.load(redis_client)
    index = FingerprintIndex(redis_client)
    index.add("a", {"x": 1})
    redis_client.function_flush()
    with pytest.raises(FunctionsMissingError):
        index.add("b", {"x": 1})
    with pytest.raises(FunctionsMissingError):
        index.matches({"x": 1})
    assert not redis_client.function_list()


def test_matches_beyond_the_configured_distance_is_refused(redis_client: redis.Redis) -> None:
    index = FingerprintIndex(redis_client, max_distance=5)
    with pytest.raises(ValueError, match="up to 5"):
        index.matches({"x": 1}, max_distance=6)


def test_the_old_name_neighbours_still_answers_with_a_deprecation_warning(redis_client: redis.Redis) -> None:
    index = FingerprintIndex(redis_client)
    index.add("a", {"x": 1})
    with pytest.warns(DeprecationWarning, match="matches"):
        assert index.neighbours({"x": 1}) == index.matches({"x": 1}) == [("a", 0)]
    with pytest.warns(DeprecationWarning, match="matches_of"):
        assert index.neighbours_of(fingerprint({"x": 1})) == [("a", 0)]


@pytest.mark.parametrize("bad_id", ["", "x" * 257, 47, None])
def test_bad_incident_ids_are_refused(redis_client: redis.Redis, bad_id: Any) -> None:
    with pytest.raises(ValueError, match="incident_id"):
        FingerprintIndex(redis_client).add(bad_id, {"x": 1})


def test_matches_are_sorted_by_distance_then_id_bytewise(redis_client: redis.Redis) -> None:
    index = FingerprintIndex(redis_client)
    ids = ["b", "a", "B", "é", "z", "10", "9", "a b", 'quote"d', "back\\slash", "ünï", "中文"]
    for n, incident_id in enumerate(ids):
        index.add_fingerprint(incident_id, 0 if n % 2 else 1)
    found = index.matches_of(0)
    assert found == sorted(((i, 0 if n % 2 else 1) for n, i in enumerate(ids)), key=lambda m: (m[1], m[0]))


def test_storm_of_identical_incidents(redis_client: redis.Redis) -> None:
    index = FingerprintIndex(redis_client)
    for i in range(300):
        index.add_fingerprint(f"s{i:03d}", 42)
    assert index.add_fingerprint("last", 42) == [(f"s{i:03d}", 0) for i in range(300)]


def test_stats_report_count_and_layout(redis_client: redis.Redis) -> None:
    index = FingerprintIndex(redis_client)
    for i in range(5):
        index.add_fingerprint(str(i), i * 977)
    stats = index.stats()
    assert stats["incidents"] == 5 and stats["bands"] == 4 and stats["probes_per_query"] == 68
    assert stats["meta"]["layout"] == index.layout_tag


def test_concurrent_near_duplicates_are_reported_exactly_once(redis_client: redis.Redis) -> None:
    """Threads adding near duplicates at once: every pair within r is reported once, by the one indexed second."""
    rng = random.Random(11)
    fps = clustered(rng, 120, 7, centers=3)
    work = [(f"c{i}", fp) for i, fp in enumerate(fps)]
    reported: dict[str, list[tuple[str, int]]] = {}
    errors: list[BaseException] = []

    def run(part: list[tuple[str, int]]) -> None:
        index = FingerprintIndex(redis_client)
        try:
            for incident_id, fp in part:
                reported[incident_id] = index.add_fingerprint(incident_id, fp)
        except BaseException as error:  # pragma: no cover - surfaced below
            errors.append(error)

    threads = [threading.Thread(target=run, args=(work[k::4],)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    _assert_pairs_reported_once(dict(work), reported, 7)


def _assert_pairs_reported_once(fps: dict[str, int], reported: dict[str, list[tuple[str, int]]], r: int) -> None:
    edges = {(earlier, later) for later, matches in reported.items() for earlier, _ in matches}
    for later, matches in reported.items():
        for earlier, d in matches:
            assert d == hamming(fps[earlier], fps[later]) <= r
    ids = sorted(fps)
    for x in ids:
        for y in ids:
            if x < y and hamming(fps[x], fps[y]) <= r:
                assert ((x, y) in edges) != ((y, x) in edges), (
                    f"pair {x},{y}: reported by {y}: {(x, y) in edges}, by {x}: {(y, x) in edges}"
                )
    # "earlier" must be a consistent order: no cycle among the reports
    order: dict[str, set[str]] = {}
    for earlier, later in edges:
        order.setdefault(later, set()).add(earlier)
    seen: dict[str, int] = {}

    def visit(node: str) -> None:
        state = seen.get(node)
        assert state != 1, "the reports contradict any indexing order"
        if state == 2:
            return
        seen[node] = 1
        for before in order.get(node, ()):
            visit(before)
        seen[node] = 2

    for node in order:
        visit(node)


@settings(
    max_examples=25, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
class IndexMachine(RuleBasedStateMachine):
    """Hypothesis drives add, upsert, delete and matches in any order; every answer equals the linear scan."""

    client: redis.Redis

    @initialize(bands=st.sampled_from([3, 4, 8]))
    def open(self, bands: int) -> None:
        self.client.flushall()
        self.index = FingerprintIndex(self.client, "sm", bands=bands)
        self.oracle = Oracle(7)
        self.center = 0x5A5A_F0F0_1234_8001

    ids = st.sampled_from([f"i{i}" for i in range(8)])
    near = st.lists(st.integers(0, 63), max_size=9)

    def _fp(self, bits: list[int]) -> int:
        fp = self.center
        for bit in bits:
            fp ^= 1 << bit
        return fp

    @rule(incident_id=ids, bits=near)
    def add(self, incident_id: str, bits: list[int]) -> None:
        fp = self._fp(bits)
        expected = self.oracle.add(incident_id, fp)
        if expected == "duplicate":
            try:
                self.index.add_fingerprint(incident_id, fp)
            except DuplicateIncidentError:
                return
            raise AssertionError("duplicate ID was indexed")
        assert self.index.add_fingerprint(incident_id, fp) == expected

    @rule(incident_id=ids, bits=near)
    def upsert(self, incident_id: str, bits: list[int]) -> None:
        fp = self._fp(bits)
        assert self.index.upsert_fingerprint(incident_id, fp) == self.oracle.upsert(incident_id, fp)

    @rule(incident_id=ids)
    def delete(self, incident_id: str) -> None:
        assert self.index.delete(incident_id) == self.oracle.delete(incident_id)

    @rule(bits=near, limit=st.integers(0, 7))
    def matches(self, bits: list[int], limit: int) -> None:
        fp = self._fp(bits)
        assert self.index.matches_of(fp, limit) == self.oracle.matches(fp, limit)

    @precondition(lambda self: hasattr(self, "index"))
    @invariant()
    def same_fingerprints(self) -> None:
        stored = {text(k): int(text(v), 16) for k, v in self.client.hgetall("{sm}:fp").items()}
        assert stored == self.oracle.fps
        assert_postings_match(self.client, "sm", self.index.layout.bands, self.oracle.fps)


@pytest.mark.slow
def test_state_machine(redis_client: redis.Redis) -> None:
    IndexMachine.client = redis_client
    IndexMachine.TestCase().runTest()


def test_changes_stream_records_each_change_in_order(redis_client: redis.Redis) -> None:
    index = FingerprintIndex(redis_client)
    index.add("a", {"x": 1})
    index.add("a", {"x": 1})  # a repeat changes nothing, so records nothing
    index.upsert("a", {"y": 1})
    index.delete("a")
    index.delete("a")  # unknown by now: nothing recorded
    index.bulk_load([("b", 5)])
    entries = redis_client.xrange("{incidents}:changes")
    changes = [tuple(text(x) for x in next(iter(fields.items()))) for _, fields in entries]
    assert changes == [("add", "a"), ("upsert", "a"), ("delete", "a"), ("add", "b")]
    times = [int(text(entry_id).split("-")[0]) for entry_id, _ in entries]
    assert times == sorted(times) and abs(times[-1] / 1000 - time.time()) < 60


def test_concurrent_upserts_and_deletes_leave_postings_consistent(redis_client: redis.Redis) -> None:
    """Threads upserting and deleting the same few IDs at once: the stale check keeps postings and fingerprints
    in step, whatever the interleaving."""
    rng = random.Random(5)
    fps = clustered(rng, 40, 7)
    errors: list[BaseException] = []

    def churn(seed: int) -> None:
        local = random.Random(seed)
        index = FingerprintIndex(redis_client, "churn")
        try:
            for _ in range(60):
                incident_id = f"x{local.randrange(6)}"
                if local.random() < 0.7:
                    index.upsert_fingerprint(incident_id, local.choice(fps))
                else:
                    index.delete(incident_id)
        except BaseException as error:  # pragma: no cover - surfaced below
            errors.append(error)

    threads = [threading.Thread(target=churn, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert_postings_match(redis_client, "churn", 4)


def test_max_matches_keeps_the_closest(redis_client: redis.Redis) -> None:
    from worker.library import parse_apply

    index = FingerprintIndex(redis_client)
    base = 0x0F0F_0F0F_0F0F_0F0F
    for n, bits in enumerate([5, 1, 7, 3, 0, 6, 2]):
        index.add_fingerprint(f"d{n}", flip(base, bits, random.Random(n)))
    [reply] = index.execute([index.apply_command("add", "q", base, max_matches=3)])
    result = parse_apply(reply)
    assert result.match_count == 7
    assert [d for _, d in result.matches] == [0, 1, 2]
