"""Reads of the change log that ride behind a lone worker's sends (`ChangeFollower.log_read` / `apply_ridden`,
`SnapshotReader.ride` / `ridden` / `fresh`, `Processor._send_ahead`).

A ride is an XRANGE from the copy's position (with the floor and the live workers) written on the send's connection
right behind its FCALL, so its reply holds every change up to that send. Applied, it moves the copy past its own
earlier rides' entries (the reads overlap), and only on the same proofs as `catch_up`: the read starts at the entry
the copy applied, the floor is not past it, and the copy's position is one of its entries. Anything else is left,
the copy behind but exact. The invariants of the snapshot path (every pair within r once, each incident indexed
once, nothing pending) hold with the windows the rides make short.
"""

from __future__ import annotations

import collections
from typing import Any

import pytest
import redis

from tests.streams import FP, alerts, assert_pairs_reported_once, fingerprints, pending_count, publish
from worker import readpath
from worker.bands import BandLayout
from worker.devtools.workload import Workload
from worker.keys import IndexKeys
from worker.readpath import ChangeFollower
from worker.settings import Settings
from worker.stream import StreamWorker
from worker.transport import execute

pytestmark = pytest.mark.usefixtures("no_worker_env")
KEYS = IndexKeys("snap")


@pytest.fixture
def fake_decodes() -> bool:
    return False  # the worker refuses a client that decodes replies


def _change(client: Any, incident_id: str, fp: int) -> None:
    client.hset(KEYS.fingerprints, incident_id, f"{fp:016x}")
    client.xadd(KEYS.changes, {"add": incident_id, "fp": f"{fp:016x}", "prev": ""})


def _ridden(client: Any, read: readpath.LogRead) -> list[Any]:
    """The read's three replies as they come behind a send: through the transport, as the protocol has them."""
    return execute(client, read.commands)


def _loaded(client: Any, count: int) -> ChangeFollower:
    for n in range(count):
        _change(client, f"i{n}", n * 7919)
    follower = ChangeFollower(client, KEYS, BandLayout(4, 7))
    follower.load()
    return follower


def test_overlapping_rides_apply_each_change_once(redis_client: redis.Redis) -> None:
    follower = _loaded(redis_client, 5)
    first = follower.log_read()
    assert first is not None and first.position == follower.index.position
    for n in range(5, 9):
        _change(redis_client, f"i{n}", n * 7919)
    second = follower.log_read()  # written before the first's reply is read: from the same position
    first_replies = _ridden(redis_client, first)
    for n in range(9, 12):
        _change(redis_client, f"i{n}", n * 7919)
    second_replies = _ridden(redis_client, second)  # type: ignore[arg-type]
    assert follower.apply_ridden(first, first_replies)
    assert len(follower.index) == 9
    assert follower.apply_ridden(second, second_replies)  # i5..i8 again: skipped, i9..i11 applied
    assert len(follower.index) == 12 and dict(follower.index.items()) == {f"i{n}": n * 7919 for n in range(12)}
    last = redis_client.xrevrange(KEYS.changes, count=1)[0][0].decode()
    assert follower.index.position == last
    assert follower.live_workers == 0
    assert follower.catch_up() == 0  # nothing left for the long way
    # a stale read (the copy is already past all it holds) is no news, and no harm
    assert follower.apply_ridden(first, first_replies)
    assert len(follower.index) == 12 and follower.index.position == last


def test_a_ride_that_proves_nothing_leaves_the_copy_where_it_is(redis_client: redis.Redis) -> None:
    follower = _loaded(redis_client, 5)
    read = follower.log_read()
    assert read is not None
    _change(redis_client, "late", 123)
    replies = _ridden(redis_client, read)
    position = follower.index.position

    def refused(replies: list[Any]) -> None:
        assert not follower.apply_ridden(read, replies)
        assert follower.index.position == position and "late" not in dict(follower.index.items())

    # its first entry is not the copy's position as the copy applied it (the log written again, or another log)
    entries, floor, live = replies
    other = [b"add", b"other", b"fp", b"0000000000000000", b"prev", b""]
    refused([[[entries[0][0], other], *entries[1:]], floor, live])
    refused([entries[1:], floor, live])
    refused([[], floor, live])
    # the floor read after the entries is past the read's position: some entries may be gone
    refused([entries, b"99999999999999-0", live])
    refused([entries, b"garbage", live])  # a damaged floor: the long way names it
    refused([redis.ResponseError("NOPERM"), floor, live])
    refused([entries, redis.ResponseError("NOPERM"), live])
    # the copy's position is not among the entries though they reach past it (the copy followed another log)
    follower.index.position = f"{int(position.split('-')[0])}-{int(position.split('-')[1]) + 1}"
    assert not follower.apply_ridden(read, replies)
    follower.index.position = position
    # and a good one, last: applied, with a refused count of live workers taken as no count
    assert follower.apply_ridden(read, [entries, floor, redis.ResponseError("NOPERM")])
    assert "late" in dict(follower.index.items()) and follower.live_workers is None


def test_a_copy_at_no_entry_has_no_ride(redis_client: redis.Redis) -> None:
    follower = ChangeFollower(redis_client, KEYS, BandLayout(4, 7))
    assert follower.log_read() is None  # not loaded
    follower.load()
    assert follower.index.position == "0-0" and follower.log_read() is None  # nothing to prove its position with
    _change(redis_client, "a", 1)
    follower.catch_up()
    assert follower.log_read() is not None  # at the entry it applied


def _worker(client: Any, consumer: str, **overrides: Any) -> StreamWorker:
    values: dict[str, Any] = {"consumer": consumer, "block_ms": 50, "summary_interval_s": 60, "read_path": "snapshot"}
    values.update(overrides)
    return StreamWorker(client, Settings(**values))


def test_a_lone_workers_sends_each_name_a_newer_position_and_its_batches_need_no_refresh(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With rides, send k + 2 is searched on a copy that holds send k: the claims of one batch name several
    positions (one refresh's position, without rides), and the next batch, read at once, goes without a refresh."""
    events = [{"incident_id": i, "features": bag} for i, bag in Workload(seed=11, near_duplicates=0.5).take(400)]
    w = _worker(redis_client, "w", batch_size=100)
    publish(redis_client, events[:100])
    w.run(until_idle=True)  # the copy loaded, and the worker counted alone
    assert w.snapshot is not None and w.snapshot.alone
    positions: list[str] = []
    claims = w.processor._claims

    def noted(items: list[Any]) -> list[Any]:
        found = claims(items)
        positions.extend(claim.position for claim in found if claim is not None)
        return found

    refreshes = collections.Counter[str]()
    refresh = readpath.SnapshotReader.refresh

    def counted(self: readpath.SnapshotReader) -> None:
        refreshes["refresh"] += 1
        refresh(self)

    monkeypatch.setattr(readpath.SnapshotReader, "refresh", counted)
    w.processor._claims = noted  # type: ignore[method-assign]
    publish(redis_client, events[100:])
    w.run(until_idle=True)  # three batches, each read while the one before runs
    assert len(set(positions[:100])) >= 5  # 7 sends: each after the one two before it is in the copy
    assert refreshes["refresh"] <= 2, refreshes  # (a batch may find the copy older than FRESH_S)
    assert_pairs_reported_once(fingerprints(events), alerts(redis_client))
    assert redis_client.hlen(FP) == len(events) and pending_count(redis_client) == 0
    assert w.snapshot.fallbacks == 0


def test_a_ride_is_not_taken_from_a_replica(redis_client: redis.Redis) -> None:
    """A copy that follows a replica reads its log there: a read behind a send to the primary would mix the two."""
    reader = readpath.SnapshotReader(redis_client, KEYS, BandLayout(4, 7), replica=redis_client)
    _change(redis_client, "a", 1)
    reader.refresh()
    assert reader.source == "replica" and reader.ride() is None
