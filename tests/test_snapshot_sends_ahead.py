"""A lone snapshot worker's sends written ahead of their replies (`Processor._send_snapshot`, SNAPSHOT_SENDS_ALONE).

Alone in its namespace (by the live workers in `{N}:workers`, counted with each read of the change log), a worker
searches several sends of 16 on one refresh of its copy and writes each before it reads the previous one's reply,
so every later send's claims name a position its earlier sends' changes came after. The atomic step validates
those like any other change. The invariants are the snapshot path's (every pair within r reported exactly once,
each incident indexed once, nothing pending), checked against the brute-force pair set with near duplicates across
sends, and with another worker writing between a send's search and its validation.
"""

from __future__ import annotations

import collections
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.streams import FP, alerts, assert_pairs_reported_once, fingerprints, pending_count, publish
from worker import flight, readpath
from worker.devtools.workload import Workload
from worker.settings import Settings
from worker.stream import StreamWorker

pytestmark = pytest.mark.usefixtures("no_worker_env")


@pytest.fixture
def fake_decodes() -> bool:
    return False  # the worker refuses a client that decodes replies


def _worker(client: Any, consumer: str, **overrides: Any) -> StreamWorker:
    values: dict[str, Any] = {"consumer": consumer, "block_ms": 50, "summary_interval_s": 60, "read_path": "snapshot"}
    values.update(overrides)
    return StreamWorker(client, Settings(**values))


def _counting(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[int]:
    """How many sends each row written ahead held when it landed, counted by that number (1: a row of one send)."""
    counts: collections.Counter[int] = collections.Counter()
    inner = flight.Flight.land

    def counted(self: flight.Flight) -> None:
        if self.in_row:
            counts[self.in_row] += 1
        inner(self)

    monkeypatch.setattr(flight.Flight, "land", counted)
    return counts


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 10_000),
    batch=st.integers(17, 120),
    depth=st.integers(2, 8),
    between=st.lists(st.integers(0, 3), min_size=1, max_size=8),
)
def test_sends_written_ahead_report_every_pair_once_with_another_worker_writing_between(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch, seed: int, batch: int, depth: int, between: list[int]
) -> None:
    """Near duplicates (most pairs span two sends), a worker alone by its own count writing `depth` sends ahead, and
    a worker on the primary path indexing 0 to 3 entries right after each of its searches, before that send is
    validated: the copy is behind both its own earlier sends and the other's writes, and no answer changes."""
    redis_client.flushall()
    events = [{"incident_id": i, "features": bag} for i, bag in Workload(seed=seed, near_duplicates=0.6).take(300)]
    publish(redis_client, events)
    ahead = _worker(redis_client, "ahead", batch_size=batch, snapshot_sends_alone=depth)
    other = _worker(redis_client, "other", batch_size=1, read_path="primary")
    monkeypatch.setattr(readpath.SnapshotReader, "alone", property(lambda self: True))  # (no heartbeats here)
    turns = iter(between * 1000)
    claims = ahead.processor._claims

    def claims_then_another_writes(items: list[Any]) -> list[Any]:
        found = claims(items)
        for _ in range(next(turns)):
            other.read_and_process()
        return found

    ahead.processor._claims = claims_then_another_writes  # type: ignore[method-assign]
    counts = _counting(monkeypatch)
    ahead.setup()
    other.setup()
    while ahead.read_and_process() + other.read_and_process():
        pass
    assert_pairs_reported_once(fingerprints(events), alerts(redis_client))
    assert redis_client.hlen(FP) == len(events)
    assert pending_count(redis_client) == 0
    assert ahead.snapshot is not None and ahead.snapshot.fallbacks == 0
    assert max(counts) > 1  # sends did go ahead of their replies


@pytest.mark.parametrize("depth", [1, 7])
def test_a_lone_worker_sends_ahead_and_one_with_peers_sends_one_at_a_time(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch, depth: int
) -> None:
    """`alone` is the count of live workers in `{N}:workers` read with the change log: one (itself) until a peer's
    heartbeat enters it, then two. SNAPSHOT_SENDS_ALONE=1 sends one at a time even alone."""
    events = [{"incident_id": i, "features": bag} for i, bag in Workload(seed=3, near_duplicates=0.5).take(300)]
    counts = _counting(monkeypatch)
    first = _worker(redis_client, "first", batch_size=100, snapshot_sends_alone=depth)
    publish(redis_client, events[:100])
    first.run(until_idle=True)
    assert first.snapshot is not None and first.snapshot.alone
    assert first.snapshot.describe()["snapshot_alone"] is True  # (the summary line says so)
    # 100 events: 7 sends, written ahead; the copy of an empty log has no entry a read riding behind a send could
    # prove its position with, so the first send goes alone and the six after it on one refresh
    assert counts == ({} if depth == 1 else {1: 1, 6: 1})
    peer = _worker(redis_client, "peer", read_path="primary")
    peer.heartbeat()
    counts.clear()
    publish(redis_client, events[100:200])
    first.run(until_idle=True)
    assert not first.snapshot.alone and first.snapshot.follower.live_workers == 2
    assert first.snapshot.describe()["snapshot_alone"] is False
    # a peer: one send at a time once a read of the log has counted it; a copy that a read fed moments ago may have
    # written its next send before the reply that counts the peer landed, never more
    assert max(counts, default=0) <= 2
    peer.presence.leave()  # a clean stop takes its name out
    counts.clear()
    publish(redis_client, events[200:])
    first.run(until_idle=True)
    assert first.snapshot.alone
    assert counts == ({} if depth == 1 else {7: 1})
    assert_pairs_reported_once(fingerprints(events), alerts(redis_client))
    assert pending_count(redis_client) == 0


def test_a_refused_count_of_live_workers_is_no_count(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user refused ZCOUNT (a users.acl older than the worker's): the copy follows the log all the same, as a
    worker with peers would (one send at a time)."""
    inner = readpath.round_trip

    def refused(client: Any, commands: Any, **options: Any) -> list[Any]:
        replies = inner(client, commands, **options)
        return [
            redis.exceptions.NoPermissionError("NOPERM this user has no permissions to run the 'zcount' command")
            if command[0] == "ZCOUNT"
            else reply
            for command, reply in zip(commands, replies, strict=True)
        ]

    monkeypatch.setattr(readpath, "round_trip", refused)
    counts = _counting(monkeypatch)
    events = [{"incident_id": i, "features": bag} for i, bag in Workload(seed=5, near_duplicates=0.5).take(100)]
    publish(redis_client, events)
    w = _worker(redis_client, "w", batch_size=100)
    w.run(until_idle=True)
    assert w.snapshot is not None and w.snapshot.follower.live_workers is None and not w.snapshot.alone
    assert not counts
    assert redis_client.hlen(FP) == len(events)
    assert_pairs_reported_once(fingerprints(events), alerts(redis_client))
