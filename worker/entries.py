"""Reading stream entries whose size is known before they leave the server.

A blocking XREADGROUP, XAUTOCLAIM or XRANGE sends an entry whole, however large: 20 entries of 25 MB once made a
worker under a 1 GiB limit crash-loop while every valid event behind them waited. So the worker reads through three
functions of the index library (worker/lua/streams.lua: `read_new`, `read_pending`, `claim`) that size each entry on
the server and send it whole only when its field names and values total at most `max_entry_bytes`; a larger entry
arrives as a summary (the first `dead_letter_prefix_bytes` of each of its first 1,000 fields, and every size), which
is all its dead letter needs. Each reply also stops at `max_batch_bytes`, so one read never holds more than that
plus one entry.

Reading the worker's own pending entries goes through XPENDING and XRANGE, which leave delivery counts alone: a
worker whose connection drops every few milliseconds re-reads its own entries as often, and must not turn them into
poison (an XREADGROUP of the history counts a delivery each time). What counts toward `max_deliveries` is a first
delivery, a takeover from a silent consumer, a restart of the worker that held the entry, and a failed call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .replies import as_bytes, text

__all__ = ["Entry", "Oversized", "next_id", "parse_entries"]


@dataclass(frozen=True, slots=True)
class Oversized:
    """What the server told about an entry too large to send: its size, its field count, each kept field's sizes."""

    total_bytes: int
    field_count: int
    sizes: list[tuple[int, int]]  # (name bytes, value bytes) of each kept field, in order


@dataclass(slots=True)
class Entry:
    """One stream entry as the worker reads it: every field in order (repeated names kept), or, when `oversized`,
    a bounded prefix of each of its first fields."""

    entry_id: str
    deliveries: int
    fields: list[tuple[bytes, bytes]] = field(default_factory=list)
    oversized: Oversized | None = None

    @property
    def missing(self) -> bool:
        """The entry left the stream (XDEL, trimming) while it was pending: no entry has zero fields."""
        return not self.fields and self.oversized is None


def _entry(raw: Sequence[Any]) -> Entry:
    entry_id, deliveries, kind = text(raw[0]), int(raw[1]), text(raw[2])
    if kind == "f":
        return Entry(entry_id, deliveries, [(as_bytes(raw[i]), as_bytes(raw[i + 1])) for i in range(3, len(raw), 2)])
    if kind == "o":
        fields = [(as_bytes(raw[i]), as_bytes(raw[i + 2])) for i in range(5, len(raw), 4)]
        sizes = [(int(raw[i + 1]), int(raw[i + 3])) for i in range(5, len(raw), 4)]
        return Entry(entry_id, deliveries, fields, Oversized(int(raw[3]), int(raw[4]), sizes))
    return Entry(entry_id, deliveries)


def parse_entries(reply: Sequence[Any]) -> tuple[str, list[Entry]]:
    """The cursor and the entries of a `read_new`, `read_pending` or `claim` reply."""
    return text(reply[0]), [_entry(raw) for raw in reply[1:]]


def next_id(entry_id: str) -> str:
    """The smallest entry ID after `entry_id` (for ranges that must exclude it, on servers without `(` ranges)."""
    millis, _, sequence = entry_id.partition("-")
    if int(sequence or 0) >= 2**64 - 1:
        return f"{int(millis) + 1}-0"
    return f"{millis}-{int(sequence or 0) + 1}"
