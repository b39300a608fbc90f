"""The copy's read of the change log (`ChangeFollower._read_log`) through `transport.round_trip` against redis-py's
pipeline, which it replaces on a standalone client: the same replies, the same retries of a dropped connection
(killed by the server, or a server gone), the same errors raised."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import worker.readpath
from tests.redis_server import RedisServer
from worker.bands import BandLayout
from worker.keys import IndexKeys
from worker.readpath import CHANGES_FLOOR_FIELD, ChangeFollower
from worker.transport import round_trip

KEYS = IndexKeys("snap")


def _change(client: Any, incident_id: str, fp: int) -> None:
    client.hset(KEYS.fingerprints, incident_id, f"{fp:016x}")
    client.xadd(KEYS.changes, {"add": incident_id, "fp": f"{fp:016x}", "prev": ""})


def _both(follower: ChangeFollower, monkeypatch: pytest.MonkeyPatch, position: str, count: int) -> list[Any]:
    """What the round trip reads, then what the pipeline reads (the same position and count)."""
    fast = follower._read_log(position, count)
    with monkeypatch.context() as patch:
        patch.setattr(worker.readpath, "sends_packed", lambda client: False)
        slow = follower._read_log(position, count)
    return [fast, slow]


@pytest.mark.parametrize("fake_decodes", [True, False])
def test_the_round_trip_reads_what_the_pipeline_reads(redis_client, monkeypatch: pytest.MonkeyPatch) -> None:
    follower = ChangeFollower(redis_client, KEYS, BandLayout(4, 7))
    assert _both(follower, monkeypatch, "0-0", 10) == [[[], None, 0]] * 2  # no log, no floor, no live worker
    for n in range(30):
        _change(redis_client, f"é{n}", n * 7919)
    redis_client.hset(KEYS.meta, CHANGES_FLOOR_FIELD, "1-0")
    middle = redis_client.xrange(KEYS.changes, count=12)[-1][0]
    fast, slow = _both(follower, monkeypatch, middle, 5)
    assert fast == slow and len(fast[0]) == 5 and fast[0][0][0] == middle and fast[1] is not None
    assert isinstance(fast[0][0], tuple) and isinstance(fast[0][0][1], dict)  # XRANGE's callback, as redis-py's


def test_an_error_reply_is_raised_as_the_pipeline_raises_it(redis_client, monkeypatch: pytest.MonkeyPatch) -> None:
    redis_client.set(KEYS.changes, "not a stream")
    follower = ChangeFollower(redis_client, KEYS, BandLayout(4, 7))
    errors = []
    for sends_packed in (True, False):
        with monkeypatch.context() as patch:
            patch.setattr(worker.readpath, "sends_packed", lambda client, packed=sends_packed: packed)
            with pytest.raises(redis.ResponseError) as raised:
                follower._read_log("0-0", 10)
        errors.append((type(raised.value), str(raised.value)))
    assert errors[0] == errors[1] and "Command # 1 (XRANGE" in errors[0][1] and "WRONGTYPE" in errors[0][1]
    # and the connection is clean for the next round trip (the HGET's reply was read too)
    redis_client.delete(KEYS.changes)
    assert round_trip(redis_client, [("HGET", KEYS.meta, CHANGES_FLOOR_FIELD)]) == [None]


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own (stopped by one of the tests)."""
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()


def _client(server: RedisServer, retries: int) -> redis.Redis:
    return redis.Redis.from_url(server.url, retry=Retry(NoBackoff(), retries), socket_timeout=2)


@pytest.mark.parametrize("retries", [0, 1, 3])
def test_a_connection_killed_mid_read_is_sent_again_as_the_pipeline_sends_it(
    own_server: RedisServer, retries: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CLIENT KILL of the copy's connection once the read has it from the pool (after the pool's own check): with
    retries, the read is sent again on a new connection and the copy follows; without, the same error is raised."""
    client, admin = _client(own_server, retries), _client(own_server, 0)
    _change(client, "a", 1)
    pool = client.connection_pool
    taken = pool.get_connection

    def killed(*args: Any, **kwargs: Any) -> Any:
        connection = taken(*args, **kwargs)
        connection.send_command("CLIENT", "ID")
        admin.client_kill_filter(_id=connection.read_response())
        return connection

    outcomes = []
    for sends_packed in (True, False):
        follower = ChangeFollower(client, KEYS, BandLayout(4, 7))
        follower.load()
        got = []
        with monkeypatch.context() as patch:
            patch.setattr(worker.readpath, "sends_packed", lambda client, packed=sends_packed: packed)
            patch.setattr(pool, "get_connection", killed)
            for n in range(5):
                _change(admin, f"b{sends_packed}{n}", n + 2)
                try:
                    got.append(follower.catch_up())
                except redis.ConnectionError as error:
                    got.append((type(error), str(error)))
        outcomes.append(got)
        if retries:
            assert got == [1] * 5
            assert dict(follower.index.items())[f"b{sends_packed}4"] == 6
    assert outcomes[0] == outcomes[1]
    if not retries:
        assert all(isinstance(outcome, tuple) for outcome in outcomes[0])
    admin.close()
    client.close()


@pytest.mark.parametrize("retries", [0, 3])
def test_a_server_gone_is_retried_then_raised_as_the_pipeline_does(
    own_server: RedisServer, retries: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server stopped: both ways try to connect as many times (the client's retries), then raise the same error."""
    client = _client(own_server, retries)
    _change(client, "a", 1)
    follower = ChangeFollower(client, KEYS, BandLayout(4, 7))
    follower.load()
    own_server.stop()
    attempts: list[int] = []
    errors = []
    connect = redis.connection.AbstractConnection.connect_check_health
    for sends_packed in (True, False):
        tried = [0]

        def counted(self: Any, *args: Any, tried: list[int] = tried, **kwargs: Any) -> Any:
            tried[0] += 1
            return connect(self, *args, **kwargs)

        client.connection_pool.disconnect()  # each way from the same state: no connection open
        with monkeypatch.context() as patch:
            patch.setattr(worker.readpath, "sends_packed", lambda client, packed=sends_packed: packed)
            patch.setattr(redis.connection.AbstractConnection, "connect_check_health", counted)
            with pytest.raises(redis.ConnectionError) as raised:
                follower.catch_up()
        attempts.append(tried[0])
        errors.append((type(raised.value), str(raised.value)))
    assert attempts[0] == attempts[1] == retries + 1, (attempts, errors)
    assert errors[0] == errors[1]
    client.close()
