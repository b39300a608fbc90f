"""Pipelined calls, one interface for standalone and cluster clients.

`open_transport(client)` gives a `Transport`: `send` a batch of commands, later `receive` its replies (each reply, or
the ResponseError it got), oldest batch first; `close` when done (or use it as a context manager). `execute(client,
commands)` does one batch in one round trip. Meant for FCALL and other commands whose replies redis-py passes through
unchanged: a reply that redis-py would convert (SET's OK to True) may come back either way.

* `ConnectionTransport` (a standalone `redis.Redis`, fakeredis included): commands packed by hiredis and written
  directly on one connection, with more than one batch in flight. A worker sends batch k + 1 before it reads the
  replies of batch k, so the server always has work while the client handles replies and prepares the next batch:
  on two cores that overlap is worth a third of the throughput. redis-py's pipeline would inspect each of ~90
  arguments per event in Python first.
* `PipelineTransport` (a `RedisCluster`, which routes each command to its slot's node): one redis-py pipeline per
  batch, run when it is sent; its replies wait for `receive`. Same results, without the overlap.

`round_trip(client, commands)` is a redis-py pipeline's `execute()` on a standalone client (the snapshot copy's read
of the change log, before every send), without the pipeline's own steps: the same connection of the pool, the same
retries of a dropped connection (the connection's `Retry`), the same replies and the same errors raised.

A command may also arrive already packed (`Packed`: the protocol's bytes, written with `bulk`), when its caller can
write it faster than hiredis packs it argument by argument (the snapshot path's apply_batch call:
`FingerprintIndex.snapshot_adds`); only a `ConnectionTransport` takes one (`sends_packed`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from redis import Redis
from redis.client import Pipeline
from redis.connection import ConnectionPool
from redis.exceptions import ResponseError

from .connection import RedisClient

__all__ = [
    "Command",
    "ConnectionTransport",
    "Packed",
    "PipelineTransport",
    "Transport",
    "bulk",
    "execute",
    "open_transport",
    "round_trip",
    "scan_slot",
    "sends_packed",
]

Command = tuple[Any, ...]
"""A Redis command as its arguments: ("FCALL", name, numkeys, *keys, *args)."""

_pack_command: Callable[[Command], bytes] | None
try:
    from hiredis import pack_command as _pack_command
except ImportError:  # pragma: no cover - hiredis is a dependency; without it every client gets a PipelineTransport
    _pack_command = None


class Packed(bytes):
    """A command already in the protocol's form (an array of bulk strings), sent as it is; see `sends_packed`."""


def bulk(value: str) -> str:
    """One argument in the protocol's form: `$<length>`, the text, CRLF each. Only for ASCII text (its length is then
    its length in bytes): a caller checks the whole command with `str.isascii` before it encodes it."""
    return f"${len(value)}\r\n{value}\r\n"


def sends_packed(client: RedisClient) -> bool:
    """Whether `execute` and the transports of this client take `Packed` commands (a standalone client with hiredis;
    a cluster client's pipelines need each command's arguments)."""
    return isinstance(client, Redis) and _pack_command is not None


class Transport(ABC):
    """Batches of commands sent in order; the replies of each batch come back from `receive`, oldest batch first."""

    @abstractmethod
    def send(self, commands: Sequence[Command | Packed]) -> None:
        """Send a batch; its replies come from a later `receive`."""

    @abstractmethod
    def receive(self) -> list[Any]:
        """The replies of the oldest batch sent, in order: each reply, or the ResponseError it got."""

    @abstractmethod
    def close(self) -> None:
        """Give the connection back; replies not received yet are dropped with it."""

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class ConnectionTransport(Transport):
    """Batches packed by hiredis and written on one connection of a standalone client, several in flight."""

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        self._connection: Any = pool.get_connection()
        self._in_flight: deque[int] = deque()

    def send(self, commands: Sequence[Command | Packed]) -> None:
        assert _pack_command is not None
        try:
            # no health check here: its PING would read the replies of the batch in flight
            self._connection.send_packed_command(
                [b"".join([c if isinstance(c, Packed) else _pack_command(c) for c in commands])],
                check_health=False,
            )
        except BaseException:
            self._broken()
            raise
        self._in_flight.append(len(commands))

    def receive(self) -> list[Any]:
        count = self._in_flight.popleft()
        replies: list[Any] = []
        try:
            for _ in range(count):
                try:
                    replies.append(self._connection.read_response())
                except ResponseError as error:
                    replies.append(error)
        except BaseException:
            self._broken()
            raise
        return replies

    def _broken(self) -> None:
        # replies may still be on their way: this connection must never be reused
        self._in_flight.clear()
        self._connection.disconnect()

    def close(self) -> None:
        if self._connection is None:
            return
        if self._in_flight:
            self._broken()
        self._pool.release(self._connection)
        self._connection = None


class PipelineTransport(Transport):
    """One redis-py pipeline per batch (the way to pipeline on a cluster client), run when it is sent."""

    def __init__(self, client: RedisClient) -> None:
        self._client = client
        self._done: deque[list[Any]] = deque()

    def send(self, commands: Sequence[Command | Packed]) -> None:
        pipe = self._client.pipeline(transaction=False)
        for command in commands:
            if isinstance(command, Packed):
                raise TypeError("a packed command goes only to a ConnectionTransport (see sends_packed)")
            pipe.execute_command(*command)
        self._done.append(list(pipe.execute(raise_on_error=False)))

    def receive(self) -> list[Any]:
        return self._done.popleft()

    def close(self) -> None:
        self._done.clear()


def open_transport(client: RedisClient) -> Transport:
    """The fastest transport the client allows: its own connection for a standalone client, else pipelines."""
    if isinstance(client, Redis) and sends_packed(client):
        return ConnectionTransport(client.connection_pool)
    return PipelineTransport(client)


def execute(client: RedisClient, commands: Sequence[Command | Packed]) -> list[Any]:
    """Send commands in one round trip, in order; returns each reply, or the ResponseError it got."""
    if not commands:
        return []
    with open_transport(client) as transport:
        transport.send(commands)
        return transport.receive()


def round_trip(client: Redis, commands: Sequence[Command], *, raise_on_error: bool = True) -> list[Any]:
    """The replies of `commands` sent in one round trip, as `client.pipeline(transaction=False)` with them, then
    `execute()`, gives them; for a standalone client only (`sends_packed`).

    What the pipeline does, step for step, without the rest of its work (a command stack, its own bookkeeping; about
    half of the copy's refresh, measured: benchmarks/journal/pipeline.md): a connection from the client's pool; the
    commands packed by it and sent at once; a dropped connection (an error its `Retry` retries: a connection error, a
    timeout) closed and the whole round sent again on a new one, as many times and after the same backoff as the
    client's retries allow, then raised; each reply read through the client's `parse_response` (its response
    callbacks: XRANGE's entries as (ID, dict of fields)); the connection closed when reading fails otherwise; the
    first error reply raised once every reply is read, named as the pipeline names it ("Command # 1 (...) of
    pipeline caused error: ..."), or with `raise_on_error` false left in its place, as the pipeline's
    `execute(raise_on_error=False)` leaves it; the connection given back to the pool in any case."""
    pool = client.connection_pool
    connection = pool.get_connection()

    def attempt() -> list[Any]:
        connection.send_packed_command(connection.pack_commands(commands))
        replies: list[Any] = []
        try:
            for command in commands:
                try:
                    replies.append(client.parse_response(connection, command[0]))
                except ResponseError as error:
                    replies.append(error)
        except BaseException:
            connection.disconnect()
            raise
        return replies

    try:
        replies = connection.retry.call_with_retry(attempt, lambda error: connection.disconnect())
    finally:
        pool.release(connection)
    for number, reply in enumerate(replies, 1):
        if isinstance(reply, ResponseError):
            Pipeline.annotate_exception(None, reply, number, commands[number - 1])  # type: ignore[arg-type]
            if raise_on_error:
                raise reply
    return replies


_ANNOTATION = " of pipeline caused error: "


def reply_code(error: BaseException) -> str:
    """The code an error reply starts with (BUSY, NOGROUP, ...), also when a pipeline (redis-py's, or `round_trip`)
    has named it "Command # 1 (...) of pipeline caused error: BUSY ..."; '' for an error that is no reply."""
    message = str(error)
    if message.startswith("Command # ") and _ANNOTATION in message:
        message = message.split(_ANNOTATION, 1)[1]
    return message.split(" ", 1)[0]


def scan_slot(client: Any, home_key: str, cursor: int, match: str, count: int) -> tuple[int, list[Any]]:
    """One SCAN page of the keys matching `match` on the server that holds `home_key` (an index's keys share one
    slot): (next cursor, keys). A `RedisCluster` would scan every master and answer a cursor per node, which no
    caller could store or resume from; this asks the slot's master alone, with a plain cursor."""
    node_of = getattr(client, "get_node_from_key", None)
    if node_of is not None:
        client = client.get_redis_connection(node_of(home_key))
    next_cursor, keys = client.scan(cursor, match=match, count=count)
    return int(next_cursor), list(keys)
