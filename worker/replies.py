"""Redis replies read one way, whatever the client decodes and whichever protocol (RESP2 or RESP3) it speaks.

* `text(value)`: a reply value (bytes or not) as str; bytes that are not UTF-8 survive as surrogate escapes.
* `pairs(flat)`: a flat `[id, distance, id, distance, ...]` reply as `[(id, distance), ...]`.
* `stream_entries(reply)`: the `(entry ID, fields)` of an XREAD/XREADGROUP reply on one stream.
* `info(reply)`, `group_info`, `consumers_info`: XINFO GROUPS/CONSUMERS rows as dicts with text keys.
* `entry_time_ms(entry_id)`, `entry_time_text(entry_id)`: the server time in a stream entry ID.
* `entries(client, stream, ...)`: every entry of an XRANGE (or XREVRANGE) range, page by page, as a lazy iterator.

Pure functions over replies, plus the two readers that follow a cursor; nothing here writes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .connection import RedisClient

__all__ = [
    "as_bytes",
    "consumers_info",
    "entries",
    "entry_time_ms",
    "entry_time_text",
    "group_info",
    "info",
    "pairs",
    "stream_entries",
    "text",
]

Fields = Mapping[Any, Any]
"""A stream entry's fields as the client returned them: bytes or str names and values."""


def as_bytes(value: Any) -> bytes:
    """A reply value (or a value to send) as bytes: bytes as they are, else `str` encoded as `text` decodes it."""
    return value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogateescape")


def text(value: Any) -> str:
    """A reply value as text: bytes decoded as UTF-8 (undecodable bytes kept as surrogate escapes), else `str`."""
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else str(value)


def pairs(flat: Sequence[Any]) -> list[tuple[str, int]]:
    """`[id, distance, id, distance, ...]` (as the index's functions reply) as `[(id, distance), ...]`."""
    ids = flat[0::2]
    # (a near storm's replies list a hundred matches each: one comprehension of decodes, not a call a match)
    if all(isinstance(value, bytes) for value in ids):
        names = [value.decode("utf-8", "surrogateescape") for value in ids]
    else:
        names = [text(value) for value in ids]
    return list(zip(names, map(int, flat[1::2]), strict=True))


def stream_entries(reply: Any) -> list[tuple[str, Fields]]:
    """The entries of an XREAD/XREADGROUP reply on one stream (a RESP2 list or a RESP3 map), IDs as text.

    Fields are left as the client returned them; an entry deleted while pending has None or {} for fields.
    """
    if not reply:
        return []
    if isinstance(reply, dict):
        return [(text(i), f) for found in reply.values() for i, f in found[0]]
    return [(text(entry_id), fields) for entry_id, fields in reply[0][1]]


def info(row: Mapping[Any, Any]) -> dict[str, Any]:
    """One row of XINFO GROUPS/CONSUMERS (or XPENDING) with text keys and text for bytes values.

    Numbers and None (the `lag` Redis cannot count) stay as they are.
    """
    return {text(k): text(v) if isinstance(v, bytes) else v for k, v in row.items()}


def group_info(client: RedisClient, stream: str, group: str) -> dict[str, Any] | None:
    """XINFO GROUPS of `stream` for one group; None when the group does not exist.

    Raises the server's ResponseError when the stream does not exist.
    """
    for row in client.xinfo_groups(stream):
        found = info(row)
        if found.get("name") == group:
            return found
    return None


def consumers_info(client: RedisClient, stream: str, group: str) -> list[dict[str, Any]]:
    """XINFO CONSUMERS of a group: one dict per consumer (`name`, `pending`, `idle`, `inactive` on Redis 7.2+)."""
    return [info(row) for row in client.xinfo_consumers(stream, group)]


def entry_time_ms(entry_id: str) -> int:
    """The millisecond timestamp in a stream entry ID (the Redis server's clock at XADD)."""
    return int(entry_id.split("-", 1)[0])


def entry_time_text(entry_id: str) -> str:
    """The UTC time in a stream entry ID, as `2024-05-01T12:00:00.123Z`."""
    millis = entry_time_ms(entry_id)
    moment = datetime.fromtimestamp(millis / 1000, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{millis % 1000:03d}Z"


def entries(
    client: RedisClient,
    stream: str,
    start: str = "-",
    end: str = "+",
    *,
    reverse: bool = False,
    limit: int | None = None,
    page: int = 500,
) -> Iterator[tuple[str, Fields]]:
    """Every entry from `start` to `end` (XRANGE syntax: `-`, `+`, an ID, or `(ID` for exclusive), oldest first.

    `reverse` walks from `end` down to `start` (XREVRANGE), newest first. At most `limit` entries (None: all), read
    `page` at a time: stopping early reads no further page. Entries added behind the cursor meanwhile are not seen.
    """
    left = limit
    while left is None or left > 0:
        count = page if left is None else min(page, left)
        if reverse:
            found = client.xrevrange(stream, end, start, count=count)
        else:
            found = client.xrange(stream, start, end, count=count)
        if not found:
            return
        for raw_id, fields in found:
            yield text(raw_id), fields or {}
        last = text(found[-1][0])
        if reverse:
            end = "(" + last
        else:
            start = "(" + last
        if left is not None:
            left -= len(found)
        if len(found) < count:
            return
