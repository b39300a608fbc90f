"""The producers' fenced way in: the inbox list `{N}:inbox` (docs/contract.md#events-in).

Redis 7's ACLs cannot filter XADD's arguments, so a user that may XADD to the events stream may also empty it
(`MAXLEN 0`) or choose an entry ID (the largest one stops every later `XADD *`). The shipped producer user may only
append to the inbox list (RPUSH, and FCALL of the library's `submit`, whose RPUSH runs with the caller's rights);
the workers move the inbox into the events stream with server-assigned IDs (the library's `intake`, one atomic call,
at the start of each read round and while the inbox has more). An element is one event, its field/value pairs
encoded as `<bytes>:<name><bytes>:<value>...` (lengths in decimal, bytes of UTF-8 or anything else), which `encode`
writes.

* `encode(fields)`: the element of an event, for a producer that RPUSHes itself.
* `submit(client, inbox, fields, limit)`: append one event through the library (checked and encoded there);
  `submit_command` is its FCALL, to pipeline.
* `intake(client, inbox, target, settings, consumer)`: move up to a batch into the events stream; `Intake` says what
  it did.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from .connection import RedisClient
from .library import FN_INTAKE, FN_SUBMIT, StreamTarget
from .replies import as_bytes
from .settings import Settings

__all__ = ["Intake", "encode", "intake", "submit", "submit_command"]


def _pairs(fields: Mapping[Any, Any] | Iterable[tuple[Any, Any]]) -> list[bytes]:
    items = fields.items() if isinstance(fields, Mapping) else fields
    return [as_bytes(part) for pair in items for part in pair]


def encode(fields: Mapping[Any, Any] | Iterable[tuple[Any, Any]]) -> bytes:
    """The inbox element of an event: each field name and value, in order, as its length in bytes, ':' and its bytes.

    >>> encode({"incident_id": "47", "text": "disk full"})
    b'11:incident_id2:474:text9:disk full'
    """
    return b"".join(b"%d:%s" % (len(part), part) for part in _pairs(fields))


def submit_command(
    inbox: str, fields: Mapping[Any, Any] | Iterable[tuple[Any, Any]], limit: int = 0
) -> tuple[Any, ...]:
    """The FCALL of `submit` for one event (to send as it is, or pipelined)."""
    return ("FCALL", FN_SUBMIT, 1, inbox, limit, *_pairs(fields))


def submit(
    client: RedisClient, inbox: str, fields: Mapping[Any, Any] | Iterable[tuple[Any, Any]], limit: int = 0
) -> int:
    """Append one event to the inbox through the library's `submit` (which refuses, appending nothing, an event of
    more than `limit` bytes of field names and values, or of no field). Returns the inbox's length."""
    return int(client.execute_command(*submit_command(inbox, fields, limit)))


class Intake(NamedTuple):
    """What one `intake` call did."""

    moved: int
    """entries appended to the events stream"""
    too_large: int
    """entries over max_entry_bytes, dead-lettered (`too_large`)"""
    bad: int
    """elements that are not an encoded event, dead-lettered (`bad_inbox_entry`)"""
    left: int
    """entries still in the inbox"""


def intake(client: RedisClient, inbox: str, target: StreamTarget, settings: Settings, consumer: str) -> Intake:
    """Move the inbox's oldest entries (at most `batch_size` of them, about `max_batch_bytes`) into the events stream
    in one atomic call; an entry over `max_entry_bytes`, or an element that is no event, goes to the dead letters."""
    reply = client.fcall(
        FN_INTAKE,
        3,
        inbox,
        target.events_stream,
        target.dead_stream,
        settings.batch_size,
        settings.max_batch_bytes,
        settings.max_entry_bytes,
        settings.dead_letter_prefix_bytes,
        target.dead_maxlen,
        consumer,
    )
    return Intake(*(int(value) for value in reply))
