"""A copy's listings written by a compiled loop (worker/compiled.py's `write_listings`): the IDs of the rows a search
lists kept as bytes beside the copy's rows (`WrittenIds`), and each query's listing written from them as the claim's
arguments at once (`WrittenListing`), with no Python object a match: one argument, the listing as its alert's JSON
(worker/lua/claim_json.lua), when no ID of it needs a JSON escape, else two a match.

A near storm's claim lists 116 matches (the alert's cap and `CLAIM_EXTRA`), nearly all of them listed by earlier
claims too. Made as (ID, distance) pairs in Python, sorted, and written as arguments one by one, they were about half
of a storm worker's time (benchmarks/journal/near-storms.md, section 17). The same rows are listed send after send,
so each row's IDs are written as bytes once, when a listing first reaches it, and again only after it changed
(`MemoryIndex._hold` forgets it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

import numpy as np

__all__ = ["KEPT", "WrittenIds", "WrittenListing"]

KEPT = 128
"""IDs of a twin group kept as bytes: its first (in order). A listing of `limit` matches takes at most `limit` + 1 of
one row (every one before the distance where its cap falls, fewer than `limit`; the first `need` + 1 at that one),
so listings of a limit up to KEPT - 1 are written from them (the snapshot path's: the alert's cap of 100 and 16)."""

_DROP_FROM = 1 << 20
"""Bytes that rows written and changed since may leave behind (beyond twice those of the rows as they are) before they
are all dropped and the rows written anew as listings reach them."""

_UNWRITABLE = -1
"""`WrittenIds._first` of a row that cannot be written (an ID that is not ASCII: the claim is then built argument by
argument, `snapshotadds.pack_adds`); else its first ID's place + 1."""


class WrittenIds:
    """Each row's IDs as bytes: a row's `count` IDs are items `first - 1` onward, each `length` bytes of `arena` from
    `start`. Rows are written when a listing first reaches them (`ensure`), forgotten when they change (`forget`);
    what changed rows leave behind is dropped, all at once, when it outgrows what is kept. A row's entries hold only
    while its `epoch` is the current one: a drop starts a new epoch rather than clearing every row's."""

    def __init__(self) -> None:
        # per row (zeros are pages the system maps on their first write, and only written rows are ever copied or
        # cleared: a copy of ten million rows pays for the rows its storms list)
        self._epoch = np.zeros(1024, dtype=np.int32)
        self._first = np.zeros(1024, dtype=np.int64)
        self._count = np.zeros(1024, dtype=np.int32)
        self._bytes = np.zeros(1024, dtype=np.int32)
        self._now = 1
        self._arena = np.zeros(1 << 16, dtype=np.uint8)
        self._start = np.zeros(4096, dtype=np.int64)
        self._length = np.zeros(4096, dtype=np.int64)
        self._end = 0  # of the arena
        self._items = 0
        self._live = 0  # bytes of the rows written and not changed since
        self._rows = 0  # rows written since the arena was last dropped

    def nbytes(self) -> int:
        """Bytes held: the arena and its items' tables, and the rows written (20 bytes each)."""
        return sum(a.nbytes for a in (self._arena, self._start, self._length)) + 20 * self._rows

    def forget(self, row: int) -> None:
        """Row `row`'s members changed: written again at its next listing."""
        if row < len(self._epoch) and self._epoch[row] == self._now:
            self._live -= int(self._bytes[row])
            self._epoch[row] = 0

    def ensure(self, rows: np.ndarray, members_of: Callable[[np.ndarray], list[Any]]) -> tuple[np.ndarray, np.ndarray]:
        """Each of `rows`' first item + 1 (or _UNWRITABLE) and its count, those not written yet written now from
        `members_of` (the copy's `_members_of`)."""
        if len(rows) and int(rows.max()) >= len(self._epoch):
            self._grow_rows(int(rows.max()) + 1)
        if self._end > 2 * self._live + _DROP_FROM:  # (what changed rows left: dropped, every row written anew)
            self._now += 1
            self._end = self._items = self._live = self._rows = 0
        missing = rows[self._epoch[rows] != self._now]
        if len(missing):
            self._write(np.unique(missing), members_of)
        return self._first[rows], self._count[rows]

    def _write(self, rows: np.ndarray, members_of: Callable[[np.ndarray], list[Any]]) -> None:
        ids: list[str] = []
        counts: list[int] = []
        written: list[int] = []
        unwritable: list[int] = []
        for row, held in zip(rows.tolist(), members_of(rows), strict=True):
            if held is None:
                held = []
            elif type(held) is str:
                held = [held]
            else:
                held = held[:KEPT]
            if not all(map(str.isascii, held)):
                unwritable.append(row)
                continue
            ids += held
            counts.append(len(held))
            written.append(row)
        self._epoch[rows] = self._now
        if unwritable:
            self._first[unwritable] = _UNWRITABLE
            self._bytes[unwritable] = 0
        if not written:
            return
        joined = "".join(ids).encode("ascii")
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        self._reserve(len(joined), len(ids))
        at, items = self._end, self._items
        self._arena[at : at + len(joined)] = np.frombuffer(joined, dtype=np.uint8)
        self._length[items : items + len(ids)] = lengths
        self._start[items : items + len(ids)] = at + lengths.cumsum() - lengths
        numbers = np.array(counts, dtype=np.int64)
        places = np.array(written, dtype=np.int64)
        self._first[places] = items + numbers.cumsum() - numbers + 1
        self._count[places] = numbers
        within = np.concatenate(([0], lengths.cumsum()))
        self._bytes[places] = within[numbers.cumsum()] - within[numbers.cumsum() - numbers]
        self._end += len(joined)
        self._items += len(ids)
        self._live += len(joined)
        self._rows += len(written)

    def _grow_rows(self, rows: int) -> None:
        size = max(2 * len(self._epoch), rows + 1024)
        written = np.flatnonzero(self._epoch == self._now)  # (copied alone: rows never listed stay pages never written)
        for name in ("_epoch", "_first", "_count", "_bytes"):
            old = getattr(self, name)
            grown = np.zeros(size, dtype=old.dtype)
            grown[written] = old[written]
            setattr(self, name, grown)

    def _reserve(self, nbytes: int, items: int) -> None:
        if self._end + nbytes > len(self._arena):
            grown = np.zeros(max(2 * len(self._arena), self._end + nbytes), dtype=np.uint8)
            grown[: self._end] = self._arena[: self._end]
            self._arena = grown
        if self._items + items > len(self._start):
            size = max(2 * len(self._start), self._items + items)
            for name in ("_start", "_length"):
                old = getattr(self, name)
                grown = np.zeros(size, dtype=np.int64)
                grown[: self._items] = old[: self._items]
                setattr(self, name, grown)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The arena, and each item's start and length (for `compiled.write_listings`)."""
        return self._arena, self._start, self._length


class WrittenListing(Sequence[tuple[str, int]]):
    """A query's listing as `compiled.write_listings` wrote it: the claim's arguments, `written`, for
    `snapshotadds._listing` to send as they are; the (ID, distance) pairs they hold are read from them only when
    something asks (a test, a call built argument by argument). Equal to any sequence of the same pairs."""

    __slots__ = ("_n", "_pairs", "as_json", "written")

    def __init__(self, written: str, n: int, as_json: bool = False) -> None:
        self.written = written
        self.as_json = as_json
        """`written` is one argument, the listing as its alert's JSON (worker/lua/claim_json.lua), not two a match."""
        self._n = n
        self._pairs: list[tuple[str, int]] | None = None

    @property
    def arguments(self) -> int:
        """How many arguments `written` holds."""
        return 1 if self.as_json else 2 * self._n

    def values(self) -> list[str | int]:
        """The arguments `written` holds, as values (for a call built argument by argument)."""
        if self.as_json:
            cut = self.written.index("\r\n")
            return [self.written[cut + 2 : -2]]
        return [part for pair in self.pairs() for part in pair]

    def pairs(self) -> list[tuple[str, int]]:
        """The listing as (ID, distance) pairs, read from `written`."""
        if self._pairs is None and self.as_json:
            payload = self.values()[0]
            assert isinstance(payload, str)
            colon = payload.index(":")
            n = int(payload[: payload.index("/")])  # (<n>/<m>: m, where the alert's array closes, is the Lua's)
            base = colon + 2 + 5 * (n + 1)  # (past the offsets and the array's '[')
            starts = [int(payload[colon + 1 + 5 * k : colon + 6 + 5 * k], 16) for k in range(n + 1)]
            self._pairs = []
            for k in range(n):
                # {"incident_id":"<id>","distance":<d>}, then its ',' (or the ']' after the alert's last)
                entry = payload[base + starts[k] : base + starts[k + 1] - 1]
                middle = entry.rindex('","distance":')
                self._pairs.append((entry[16:middle], int(entry[middle + 13 : -1])))
        if self._pairs is None:
            pairs: list[tuple[str, int]] = []
            text, at = self.written, 0
            while at < len(text):
                cut = text.index("\r\n", at)
                length = int(text[at + 1 : cut])
                incident_id = text[cut + 2 : cut + 2 + length]
                at = cut + 4 + length  # past the ID's \r\n: the distance's $<digits>\r\n<distance>\r\n
                cut = text.index("\r\n", at)
                end = text.index("\r\n", cut + 2)
                pairs.append((incident_id, int(text[cut + 2 : end])))
                at = end + 2
            self._pairs = pairs
        return self._pairs

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, k: int) -> tuple[str, int]: ...

    @overload
    def __getitem__(self, k: slice) -> list[tuple[str, int]]: ...

    def __getitem__(self, k: int | slice) -> tuple[str, int] | list[tuple[str, int]]:
        return self.pairs()[k]

    def __iter__(self) -> Iterator[tuple[str, int]]:
        return iter(self.pairs())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, WrittenListing):
            return self.written == other.written
        return isinstance(other, Sequence) and not isinstance(other, str) and self.pairs() == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"WrittenListing({self.pairs()!r})"
