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
* `InboxMover`: a worker's moves of the inbox, at the start of each read round (`Processor`), and when it leaves the
  inbox alone (refused, of another type, found empty a moment ago).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import redis as redis_lib
from redis.exceptions import OutOfMemoryError, ResponseError

from .connection import RedisClient
from .keys import IndexKeys
from .keytypes import diagnose, is_wrong_type, wrong_types
from .library import FN_INTAKE, FN_SUBMIT, StreamTarget
from .replies import as_bytes
from .settings import Settings

__all__ = ["InboxMover", "Intake", "encode", "intake", "submit", "submit_command"]


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


def _refused(error: ResponseError) -> bool:
    """Whether an error reply is an ACL refusal (of the command itself, or of one a function sent)."""
    message = str(error)
    return (
        isinstance(error, redis_lib.exceptions.NoPermissionError)
        or "can't run this command" in message
        or "NOPERM" in message  # (inside NOTMOVED: the refusal of the XADD the function sent)
    )


_OFF_S = 60.0
"""How long a worker leaves the inbox alone after it could not move it (its user lacks LPOP, the inbox holds
another type, or a stream refused an entry): the error is logged once a period, and the stream's own entries are
read on meanwhile."""


_QUIET_S = 0.02
"""How long a worker leaves an inbox it found empty before it looks again. Under a steady load every worker reads a
round every few milliseconds, and a look is one more call on the primary each: that many calls a second for every
worker of the fleet, for an inbox that may never be used (producers that XADD). An event put in the inbox meanwhile
waits that much longer; an idle worker polls less often than this anyway (up to block_ms)."""


class InboxMover:
    """A worker's moves of the inbox into the events stream (`move`, at the start of each read round), and when it
    leaves the inbox alone: after a refusal or a key of another type (`paused`, _OFF_S), or an empty look (_QUIET_S)."""

    def __init__(
        self, redis: RedisClient, keys: IndexKeys, target: StreamTarget, settings: Settings, outcomes: Any, log: Any
    ) -> None:
        self.redis, self.keys, self.target, self.settings = redis, keys, target, settings
        self.outcomes, self.log = outcomes, log
        self._off_until = 0.0  # the inbox cannot be moved (grant, type): tried again _OFF_S later
        self._quiet_until = 0.0  # the inbox was found empty: looked at again _QUIET_S later

    @property
    def paused(self) -> bool:
        """Whether the inbox is left alone for now, after it could not be moved."""
        return time.monotonic() < self._off_until

    def move(self) -> bool:
        """Move what producers appended to the inbox into the events stream; returns whether the inbox holds more.

        At maxmemory the call is refused whole (the inbox keeps its entries) and the stream is read on; a user that
        may not move the inbox (made from an older users.acl) is told what to grant, once a minute, and a stream that
        refused an entry (NOTMOVED: the entry is back at the inbox's head) is named once a minute too."""
        if self.paused or time.monotonic() < self._quiet_until:
            return False
        inbox = self.keys.inbox
        try:
            done = intake(self.redis, inbox, self.target, self.settings, self.settings.consumer)
        except OutOfMemoryError:
            return False
        except ResponseError as error:
            if is_wrong_type(error) and wrong_types(self.redis, {inbox: "list"}):
                # the inbox holds another type (by hand): the stream's own entries go on, the inbox waits for repair
                self._off_until = time.monotonic() + _OFF_S
                self.log.error("inbox not moved", error=str(diagnose(self.redis, self.keys, only=[inbox])))
                return False
            if _refused(error):  # (also inside NOTMOVED: the XADD of an entry refused by the ACL)
                self._off_until = time.monotonic() + _OFF_S
                self.log.error(
                    "inbox not moved: the worker's user may not",
                    error=str(error),
                    hint=f"grant +lpop +llen +lpush on {inbox} and +xadd on the events stream, whichever the error "
                    "names (deploy/redis/users.acl); events XADDed to the stream go on",
                )
                return False
            if not str(error).startswith("NOTMOVED"):
                raise
            # a stream refused an entry's XADD (its last ID the largest, XADDed by hand): the entry went back to the
            # inbox's head, the stream's own entries go on
            self._off_until = time.monotonic() + _OFF_S
            self.log.error(
                "inbox not moved",
                error=str(error),
                hint="a stream whose last ID is the largest takes no XADD *: delete that entry and set the "
                "stream's ID back (XDEL, XSETID; then XGROUP SETID, as `check` says)",
            )
            return False
        self.outcomes.record_intake(inbox, {"too_large": done.too_large, "bad_inbox_entry": done.bad})
        if done.left == 0 and done.moved + done.too_large + done.bad == 0:
            self._quiet_until = time.monotonic() + _QUIET_S
        return done.left > 0 and done.moved + done.too_large + done.bad > 0
