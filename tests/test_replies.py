"""Reply reading and transports, on a real redis-server and on fakeredis: the same answers whichever way they travel."""

from __future__ import annotations

import fakeredis
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from worker import replies
from worker.transport import ConnectionTransport, PipelineTransport, execute, open_transport

STREAM = "{t}:s"


def _fill(client: redis.Redis, count: int) -> list[str]:
    pipe = client.pipeline(transaction=False)
    for i in range(count):
        pipe.xadd(STREAM, {"n": str(i)})
    return [replies.text(entry_id) for entry_id in pipe.execute()]


def test_text_keeps_bytes_that_are_not_utf8() -> None:
    assert replies.text(b"caf\xc3\xa9") == "café"
    assert replies.text(b"\xff").encode("utf-8", "surrogateescape") == b"\xff"
    assert replies.text(7) == "7"


def test_entry_times_read_the_milliseconds_of_an_entry_id() -> None:
    assert replies.entry_time_ms("1714564800123-7") == 1714564800123
    assert replies.entry_time_text("1714564800123-7") == "2024-05-01T12:00:00.123Z"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    count=st.integers(0, 30),
    page=st.integers(1, 7),
    limit=st.none() | st.integers(0, 35),
    reverse=st.booleans(),
    cut=st.integers(0, 30),
)
def test_range_cursor_reads_what_one_xrange_reads(
    redis_client: redis.Redis, count: int, page: int, limit: int | None, reverse: bool, cut: int
) -> None:
    redis_client.delete(STREAM)
    ids = _fill(redis_client, count)
    start = f"({ids[cut]}" if cut < len(ids) else "-"
    whole = [replies.text(i) for i, _ in redis_client.xrange(STREAM, start, "+")]
    expected = (whole[::-1] if reverse else whole)[: len(whole) if limit is None else limit]
    got = [i for i, _ in replies.entries(redis_client, STREAM, start, reverse=reverse, limit=limit, page=page)]
    assert got == expected


def test_group_and_consumer_rows_have_text_keys_whatever_the_client_decodes(redis_client: redis.Redis) -> None:
    _fill(redis_client, 3)
    redis_client.xgroup_create(STREAM, "g", id="0")
    redis_client.xreadgroup("g", "c1", {STREAM: ">"}, count=2)
    group = replies.group_info(redis_client, STREAM, "g")
    assert group is not None and group["name"] == "g" and int(group["pending"]) == 2
    assert isinstance(group["last-delivered-id"], str)
    assert replies.group_info(redis_client, STREAM, "other") is None
    [consumer] = replies.consumers_info(redis_client, STREAM, "g")
    assert consumer["name"] == "c1" and int(consumer["pending"]) == 2


def test_stream_entries_of_an_xreadgroup_reply(redis_client: redis.Redis) -> None:
    ids = _fill(redis_client, 2)
    redis_client.xgroup_create(STREAM, "g", id="0")
    found = replies.stream_entries(redis_client.xreadgroup("g", "c", {STREAM: ">"}))
    assert [entry_id for entry_id, _ in found] == ids
    assert replies.stream_entries(redis_client.xreadgroup("g", "c", {STREAM: ">"})) == []


COMMANDS = [("INCRBY", "{t}:k", "1"), ("INCR", "{t}:k"), ("HSET", "{t}:k", "f", "v"), ("GET", "{t}:k")]


def _shown(reply: object) -> object:
    return ("error", str(reply)) if isinstance(reply, Exception) else replies.text(reply)


@pytest.mark.parametrize("kind", [ConnectionTransport, PipelineTransport])
def test_both_transports_return_each_reply_or_its_error_batch_by_batch(redis_client: redis.Redis, kind: type) -> None:
    transport = ConnectionTransport(redis_client.connection_pool) if kind is ConnectionTransport else kind(redis_client)
    with transport:
        transport.send(COMMANDS)
        transport.send(COMMANDS[1:2])  # a second batch in flight before the first is read
        first, second = transport.receive(), transport.receive()
    assert [_shown(r) for r in first] == ["1", "2", ("error", str(first[2])), "2"]
    assert "WRONGTYPE" in str(first[2])
    assert [_shown(r) for r in second] == ["3"]


def test_a_standalone_client_gets_its_own_connection_and_a_cluster_client_pipelines() -> None:
    client = fakeredis.FakeRedis()
    with open_transport(client) as transport:
        assert isinstance(transport, ConnectionTransport)
    assert execute(client, []) == []
    assert [_shown(r) for r in execute(client, COMMANDS[:2])] == ["1", "2"]
    cluster = redis.RedisCluster.__new__(redis.RedisCluster)  # no nodes needed to choose a transport
    assert isinstance(open_transport(cluster), PipelineTransport)
