"""Storms of exact duplicates (SPEC sections 4 and 5): twin groups, capped alerts, and a cost that does not grow.

The posting sets hold one representative per distinct fingerprint and `{N}:twins:<fingerprint>` holds every incident
with it. Everything here is checked against the brute-force oracle, on a real redis-server and on fakeredis.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tests.conftest import fast_settings
from tests.oracle import Oracle, assert_postings_match, flip
from tests.streams import alerts, pending_count, publish
from worker import library
from worker.errors import LayoutMismatchError
from worker.fingerprint import fingerprint, format_fingerprint
from worker.index import FingerprintIndex
from worker.library import ApplyResult, parse_apply
from worker.replies import text
from worker.stream import StreamWorker


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _apply(index: FingerprintIndex, op: str, incident_id: str, fp: int | None, cap: int) -> ApplyResult:
    """One apply call as the worker makes it, returning the whole result (match_count and candidates too)."""
    expected: Any = "*" if op == "add" else index.get(incident_id)
    [reply] = index.execute([index.apply_command(op, incident_id, fp, expected=expected, max_matches=cap)])
    return parse_apply(reply)


def _twins(client: Any, namespace: str, fp: int) -> list[str]:
    return [_text(m) for m in client.zrange(f"{{{namespace}}}:twins:{format_fingerprint(fp)}", 0, -1)]


BASE = 0x5A5A_F0F0_1234_8001
STORM_FPS = [BASE, BASE ^ 1, BASE ^ 0b110, flip(BASE, 6, random.Random(1)), flip(BASE, 9, random.Random(2))]
"""A few fingerprints, some within 7 of each other and one beyond: every twin group meets other groups."""


@settings(
    max_examples=30, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
class StormMachine(RuleBasedStateMachine):
    """Many IDs over a handful of fingerprints: add, upsert, delete and capped queries equal the linear scan, and
    the postings hold one ID per distinct fingerprint with every twin in its group."""

    client: redis.Redis

    @initialize(bands=st.sampled_from([3, 4, 8]))
    def open(self, bands: int) -> None:
        self.client.flushall()
        self.index = FingerprintIndex(self.client, "storm", bands=bands)
        self.index.open()
        self.oracle = Oracle(7)

    ids = st.sampled_from([f"t{i:02d}" for i in range(24)])
    fps = st.sampled_from(STORM_FPS)
    caps = st.sampled_from([0, 1, 2, 3, 5, 100])

    def _check(self, result: ApplyResult, expected: list[tuple[str, int]], cap: int) -> None:
        assert result.match_count == len(expected)
        assert result.matches == (expected[:cap] if cap else expected)
        assert result.candidates <= len(set(self.oracle.fps.values())), "a twin was verified, not only its group"

    @rule(incident_id=ids, fp=fps, cap=caps)
    def add(self, incident_id: str, fp: int, cap: int) -> None:
        repeat = self.oracle.fps.get(incident_id) == fp
        expected = self.oracle.add(incident_id, fp)
        result = _apply(self.index, "add", incident_id, fp, cap)
        if expected == "duplicate":
            assert result.status == "duplicate"
        elif repeat:
            assert result.status == "repeat"
        else:
            assert result.status == "indexed"
            assert isinstance(expected, list)
            self._check(result, expected, cap)

    @rule(incident_id=ids, fp=fps, cap=caps)
    def upsert(self, incident_id: str, fp: int, cap: int) -> None:
        unchanged = self.oracle.fps.get(incident_id) == fp
        expected = self.oracle.upsert(incident_id, fp)
        result = _apply(self.index, "upsert", incident_id, fp, cap)
        assert result.status == ("repeat" if unchanged else "indexed")
        if not unchanged:
            self._check(result, expected, cap)

    @rule(incident_id=ids)
    def delete(self, incident_id: str) -> None:
        assert self.index.delete(incident_id) == self.oracle.delete(incident_id)

    @rule(fp=fps, limit=st.integers(0, 7), cap=caps)
    def neighbours(self, fp: int, limit: int, cap: int) -> None:
        expected = self.oracle.matches(fp, limit)
        found = self.index.search(fp, limit, max_matches=cap)
        assert found.match_count == len(expected)
        assert found.matches == (expected[:cap] if cap else expected)
        assert found.candidates <= len(set(self.oracle.fps.values()))

    @precondition(lambda self: hasattr(self, "index"))
    @invariant()
    def one_posting_per_fingerprint_and_every_twin_grouped(self) -> None:
        stored = {_text(k): int(_text(v), 16) for k, v in self.client.hgetall("{storm}:fp").items()}
        assert stored == self.oracle.fps
        assert_postings_match(self.client, "storm", self.index.layout.bands, self.oracle.fps)


@pytest.mark.slow
def test_storm_state_machine(redis_client: redis.Redis) -> None:
    StormMachine.client = redis_client
    StormMachine.TestCase().runTest()


def test_cost_of_an_event_does_not_grow_with_the_storm(redis_client: redis.Redis) -> None:
    """Every copy of a storm verifies the same number of candidates (its representative and the near incidents),
    lists the capped closest, and counts every earlier copy."""
    index = FingerprintIndex(redis_client)
    rng = random.Random(3)
    near = [flip(BASE, rng.randint(1, 7), rng) for _ in range(5)]
    for n, fp in enumerate(near):
        index.add_fingerprint(f"near{n}", fp)
    candidates = []
    for i in range(400):
        result = _apply(index, "add", f"s{i:04d}", BASE, 100)
        assert result.match_count == i + len(near)
        assert len(result.matches) == min(100, i + len(near))
        assert result.matches[: min(i, 100)] == [(f"s{k:04d}", 0) for k in range(min(i, 100))]
        candidates.append(result.candidates)
    assert set(candidates[1:]) == {len(near) + 1}, "candidates verified grew with the storm"
    assert index.search(BASE, max_matches=3).candidates == len(near) + 1
    # the storm is one posting per band and one group of 400
    assert len(_twins(redis_client, "incidents", BASE)) == 400
    for key in index.posting_keys(BASE):
        assert {_text(m) for m in redis_client.smembers(key)} <= {"s0000", *(f"near{n}" for n in range(5))}


def test_deleting_the_representative_promotes_the_first_twin(redis_client: redis.Redis) -> None:
    index = FingerprintIndex(redis_client)
    for incident_id in ["m", "b", "z", "a"]:
        index.add_fingerprint(incident_id, BASE)
    assert {_text(m) for m in redis_client.smembers(index.posting_keys(BASE)[0])} == {"m"}
    assert index.twin_group(BASE) == (4, "m")
    assert index.delete("m")
    assert index.twin_group(BASE) == (3, "a")  # the first in byte order takes over the postings
    assert index.matches_of(BASE) == [("a", 0), ("b", 0), ("z", 0)]
    assert index.upsert_fingerprint("a", BASE ^ 1) == [("b", 1), ("z", 1)]
    assert index.twin_group(BASE) == (2, "b")
    assert index.delete("z")  # the last but one leaves: no group of one is kept
    assert index.twin_group(BASE) == (1, "b")
    assert redis_client.keys("{incidents}:twins:*") == []
    assert index.matches_of(BASE) == [("b", 0), ("a", 1)]
    assert index.delete("b") and index.delete("a")
    assert redis_client.keys("{incidents}:*band*") == [] and redis_client.keys("{incidents}:twins:*") == []


def test_capped_list_merges_groups_at_one_distance_in_byte_order(redis_client: redis.Redis) -> None:
    """Two groups and single incidents at the same distance: the cap takes the first IDs of all of them merged."""
    index = FingerprintIndex(redis_client)
    oracle = Oracle(7)
    rng = random.Random(8)
    work = [(f"g{i:03d}", BASE ^ 1) for i in range(60)] + [(f"h{i:03d}", BASE ^ 2) for i in range(60)]
    work += [(f"a{i}", BASE ^ 4) for i in range(3)] + [(f"e{i}", BASE) for i in range(30)]
    rng.shuffle(work)
    for incident_id, fp in work:
        oracle.add(incident_id, fp)
        index.add_fingerprint(incident_id, fp, max_matches=7)
    expected = oracle.matches(BASE)
    for cap in (1, 29, 30, 31, 75, 100, 122, 500, 0):
        found = index.search(BASE, max_matches=cap)
        assert found.match_count == len(expected) == 153
        assert found.matches == (expected[:cap] if cap else expected), f"cap {cap}"
    assert index.search(BASE).candidates == 4
    assert_postings_match(redis_client, "incidents", index.layout.bands, oracle.fps)


def test_bulk_load_groups_twins_and_finds_fingerprints_indexed_before(redis_client: redis.Redis) -> None:
    index = FingerprintIndex(redis_client)
    index.add_fingerprint("first", BASE)
    items = [(f"b{i}", BASE if i % 3 else BASE ^ 0xFF00) for i in range(40)]
    assert index.bulk_load(items, chunk=7) == 40
    fps = {"first": BASE, **dict(items)}
    assert_postings_match(redis_client, "incidents", index.layout.bands, fps)
    assert index.twin_group(BASE) == (27, "first")
    assert index.search(BASE ^ 1).match_count == 27


def test_an_index_of_the_old_format_is_refused_with_what_to_do(redis_client: redis.Redis) -> None:
    index = FingerprintIndex(redis_client, "old")
    old_tag = index.layout_tag.replace("/format=2", "/format=1")
    redis_client.hset("{old}:meta", mapping={"layout": old_tag, "format_version": "1"})
    with pytest.raises(LayoutMismatchError, match=r"index format 1.*format 2.*\{old\}:twins:"):
        index.add_fingerprint("a", BASE)
    assert redis_client.hlen("{old}:fp") == 0


# -- through the stream workers ------------------------------------------------------------------------------------

DOCK = {"dock": 3, "scanner": 2, "timeout": 1}


def _near_bags(rng: random.Random, count: int) -> list[dict[str, int]]:
    """Bags whose fingerprints lie within 1 to 7 of DOCK's, and some at 8 to 12 (near, but not a match)."""
    center, found = fingerprint(DOCK), []
    while len(found) < count:
        bag = {**DOCK, f"extra{rng.randrange(10**6)}": rng.randint(1, 2)}
        if 1 <= (fingerprint(bag) ^ center).bit_count() <= 12:
            found.append(bag)
    return found


@pytest.fixture(params=["real", "fake"])
def stream_clients(request: pytest.FixtureRequest) -> Iterator[list[redis.Redis]]:
    """Two clients (bytes replies, as the worker needs) of one clean Redis: the real server or one fakeredis."""
    if request.param == "real":
        server = request.getfixturevalue("server")
        clients = [server.client(), server.client()]
    else:
        shared = fakeredis.FakeServer(version=7)
        clients = [fakeredis.FakeRedis(server=shared), fakeredis.FakeRedis(server=shared)]
        library.load(clients[0])  # as the deployment's administrator step does
    yield clients
    for client in clients:
        client.close()


@pytest.mark.usefixtures("no_worker_env")
def test_storm_through_two_workers_reports_every_pair_once_with_exact_counts(stream_clients: list[redis.Redis]) -> None:
    """A storm of 260 copies with near duplicates among it, through two workers at once: each alert lists exactly
    the closest 100 of what was indexed before it (the order is read back from {N}:changes) and counts all of it,
    so every pair within r is counted once, by the incident indexed second."""
    rng = random.Random(10)
    events: list[dict[str, Any]] = [{"incident_id": f"s{i:03d}", "features": DOCK} for i in range(260)]
    events += [{"incident_id": f"n{i:02d}", "features": bag} for i, bag in enumerate(_near_bags(rng, 40))]
    events += [{"incident_id": f"o{i:02d}", "features": {f"other{i}": 1, "x": 2}} for i in range(20)]
    rng.shuffle(events)
    client = stream_clients[0]
    publish(client, events)
    workers = [StreamWorker(c, fast_settings(consumer=f"w{k}", batch_size=16)) for k, c in enumerate(stream_clients)]
    died: list[BaseException] = []

    def run(worker: StreamWorker) -> None:
        try:
            worker.run(until_idle=True)
        except BaseException as error:  # a worker thread's death must fail the test, not leave its entries behind
            died.append(error)
            raise

    threads = [threading.Thread(target=run, args=(w,)) for w in workers]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 300
    for thread in threads:
        thread.join(timeout=max(0.1, deadline - time.monotonic()))
    if any(thread.is_alive() for thread in threads):
        for worker in workers:
            worker.stop()
        pytest.fail(f"the workers were not idle within 300 s; {pending_count(client)} entries pending")
    assert not died, f"a worker died: {died!r}"
    assert pending_count(client) == 0
    fps = {e["incident_id"]: fingerprint(e["features"]) for e in events}
    order = [text(next(iter(fields.values()))) for _, fields in client.xrange("{incidents}:changes")]
    assert sorted(order) == sorted(fps), "every incident indexed once"
    by_id = {alert.incident_id: alert for alert in alerts(client)}
    oracle, counted = Oracle(7), 0
    for incident_id in order:
        expected = oracle.add(incident_id, fps[incident_id])
        assert isinstance(expected, list)
        alert = by_id.pop(incident_id, None)
        if not expected:
            assert alert is None, f"{incident_id} alerted with nothing indexed within r before it"
            continue
        assert alert is not None, f"{incident_id} matched {len(expected)} but was not alerted"
        assert alert.match_count == len(expected)
        assert [(m.incident_id, m.distance) for m in alert.matches] == expected[:100]
        counted += alert.match_count
    assert not by_id, "alerts of incidents never indexed"
    pairs = sum(1 for i, x in enumerate(fps) for y in list(fps)[i + 1 :] if (fps[x] ^ fps[y]).bit_count() <= 7)
    assert counted == pairs >= 260 * 259 // 2
    assert_postings_match(client, "incidents", 4)
