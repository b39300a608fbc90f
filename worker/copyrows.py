"""The rows of a copy of the index (worker/snapshot.py's `MemoryIndex`): distinct fingerprints, the loaded ones in
arrays (worker/loadedrows.py) and those made since in Python, each row's members (its incident IDs) and their count,
and what the search and the listing read of them (`CopyRows`). `MemoryIndex` adds the tiers that find rows by band,
and the changes and searches that keep them."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence

import numpy as np

from .copywritten import WrittenIds
from .loadedrows import LoadedRows

__all__ = ["CopyRows"]

_READ_KEPT = 65_536
"""Loaded rows whose members a copy keeps as it read them (`CopyRows._held`), emptied when full: a near storm in a
loaded copy lists the same rows for every event (a copy loaded with the storm's first 300 incidents searched it 1.25x
as long when each listing decoded them again, benchmarks/journal/near-storms.md)."""


class CopyRows:
    """A copy's rows and their members (`MemoryIndex` is one)."""

    def __init__(self) -> None:
        # What `load` read: rows 0.._base_rows-1 and their incidents, in arrays (worker/loadedrows.py), with what
        # went from them since: incidents `_gone` (deleted, or set to another fingerprint), rows given other members
        # (`_over`, None for a row no incident holds any more, also marked in `_dead`).
        self._base: LoadedRows | None = None
        self._base_rows = 0
        self._base_live = 0  # incidents of the base not gone
        self._base_live_rows = 0
        self._gone = np.zeros(0, dtype=bool)
        self._dead = np.zeros(0, dtype=bool)
        self._over: dict[int, str | list[str] | None] = {}
        # the members of loaded rows as read (decoded from the base once: a storm lists the same rows query after
        # query), up to _READ_KEPT rows; `_over` comes first, so a row given other members is never read from here
        self._read: dict[int, str | list[str]] = {}
        # What changed since the load, in Python: the incidents set since (not the base's), the rows made since
        # (row _base_rows + k at [k]) and their fingerprints (`_row_of`)
        self._fp_of: dict[str, int] = {}
        self._row_of: dict[int, int] = {}
        # a row made since -> the IDs sharing that fingerprint: one str, or a sorted list once there are twins
        self._members: list[str | list[str] | None] = []
        # each such row's fingerprint twice: a list for Python's fast path, an array for numpy's (row _base_rows + k
        # at [k] in both; the base's rows have theirs in the base)
        self._fp_list: list[int] = []
        self._fps = np.zeros(1024, dtype=np.uint64)
        # every row's members counted (0: none), the base's rows and those made since, for the searches' counts
        # (`_hits_of`): at least as long as the base's rows and `_fps` together
        self._sizes = np.zeros(1024, dtype=np.int32)
        self._written = WrittenIds()  # rows' IDs as bytes, for listings written by a compiled loop (copywritten)

    def __len__(self) -> int:
        return len(self._fp_of) + self._base_live

    @property
    def distinct(self) -> int:
        """Distinct fingerprints held (rows in use)."""
        return len(self._row_of) + self._base_live_rows

    def get(self, incident_id: str) -> int | None:
        fp = self._fp_of.get(incident_id)
        if fp is None and self._base is not None:
            incident = self._base.find(incident_id)
            if incident >= 0 and not self._gone[incident]:
                return self._base.fp_of(incident)
        return fp

    def holder(self, fp: int, exclude: str | None = None) -> str | None:
        """The first (in ID order) incident other than `exclude` holding `fp` exactly, or None: one look-up, whatever
        a search's budget."""
        row = self._row(fp)
        return self._first_other(row, exclude) if row is not None else None

    def holders(self, queries: Sequence[tuple[int, str | None]]) -> list[str | None]:
        """`holder` of each (fingerprint, excluded ID), their rows found in one numpy step (a send's claims)."""
        if not queries:
            return []
        rows = self._rows_of(np.array([fp for fp, _ in queries], dtype=np.uint64)).tolist()
        first_other = self._first_other
        return [None if row < 0 else first_other(row, exclude) for row, (_, exclude) in zip(rows, queries, strict=True)]

    def _first_other(self, row: int, exclude: str | None) -> str | None:
        members = self._held(row)
        if isinstance(members, str):
            return members if members != exclude else None
        if members:
            return members[0] if members[0] != exclude else members[1] if len(members) > 1 else None
        return None

    def items(self) -> Iterable[tuple[str, int]]:
        base = self._base
        if base is not None:
            for incident in np.flatnonzero(~self._gone).tolist():
                yield base.incident_id(incident), base.fp_of(incident)
        yield from self._fp_of.items()

    # -- rows: the base's (loaded) and those made since -------------------------------------------------------

    def _row_count(self) -> int:
        return self._base_rows + len(self._members)

    def _held(self, row: int) -> str | list[str] | None:
        """The IDs of a row: one str, a sorted list of twins, or None (no incident holds it)."""
        if row >= self._base_rows:
            return self._members[row - self._base_rows]
        if row in self._over:
            return self._over[row]
        held = self._read.get(row)
        if held is None:
            assert self._base is not None
            base = self._base
            incidents = base.row_members(row)
            held = (
                base.incident_id(incidents[0])
                if len(incidents) == 1
                else [base.incident_id(incident) for incident in incidents]
            )
            if len(self._read) >= _READ_KEPT:
                self._read.clear()
            self._read[row] = held
        return held

    def _hold(self, row: int, members: str | list[str] | None) -> None:
        self._sizes[row] = 0 if members is None else 1 if isinstance(members, str) else len(members)
        self._written.forget(row)
        if row >= self._base_rows:
            self._members[row - self._base_rows] = members
            return
        self._over[row] = members
        if members is None:
            self._dead[row] = True
            self._base_live_rows -= 1

    def _fp_at(self, row: int) -> int:
        if row >= self._base_rows:
            return self._fp_list[row - self._base_rows]
        assert self._base is not None
        return int(self._base.fps[row])

    def _row(self, fp: int) -> int | None:
        """The row of a fingerprint some incident holds, or None."""
        row = self._row_of.get(fp)
        if row is None and self._base_rows:
            fps = self._base.fps  # type: ignore[union-attr]
            at = int(fps.searchsorted(np.uint64(fp)))
            if at < self._base_rows and fps[at] == fp and not self._dead[at]:
                return at
        return row

    def _rows_of(self, fps: np.ndarray) -> np.ndarray:
        """`_row` of each of `fps` (uint64), -1 for none."""
        rows = np.full(len(fps), -1, dtype=np.int64)
        if self._base_rows:
            base_fps = self._base.fps  # type: ignore[union-attr]
            at = np.minimum(base_fps.searchsorted(fps), self._base_rows - 1)
            found = (base_fps[at] == fps) & ~self._dead[at]
            rows[found] = at[found]
        if self._row_of:
            row_of = self._row_of
            missing = (rows < 0).nonzero()[0]
            for k, fp in zip(missing.tolist(), fps[missing].tolist(), strict=True):
                rows[k] = row_of.get(fp, -1)
        return rows

    def _row_fps(self, first: int, end: int) -> np.ndarray:
        """The fingerprints of rows first..end (a view where they are all the base's or all made since)."""
        split = min(max(first, self._base_rows), end)
        made = self._fps[split - self._base_rows : end - self._base_rows]
        if first >= split:
            return made
        assert self._base is not None
        loaded = self._base.fps[first:split]
        return loaded if split == end else np.concatenate([loaded, made])

    def _live(self, first: int, end: int) -> np.ndarray:
        """Whether each row of first..end is held by some incident."""
        split = min(max(first, self._base_rows), end)
        parts = [~self._dead[first:split]] if first < split else []
        if split < end:
            tail = self._members[split - self._base_rows : end - self._base_rows]
            parts.append(np.fromiter((held is not None for held in tail), dtype=bool, count=end - split))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=bool)

    def _members_of(self, rows: np.ndarray) -> list[str | list[str] | None]:
        """`_held` of each of `rows`: those made since the load gathered in one step (a storm's thousands of matches
        are rows made since the copy's load), then the loaded ones put in their places one by one."""
        if not len(rows):
            return []
        made = rows - self._base_rows
        if int(made.max()) < 0:
            return [self._held(row) for row in rows.tolist()]
        got = operator.itemgetter(*np.maximum(made, 0).tolist())(self._members)
        members = list(got) if len(rows) > 1 else [got]
        loaded = np.flatnonzero(made < 0)
        if len(loaded):
            held = self._held
            for k, row in zip(loaded.tolist(), rows[loaded].tolist(), strict=True):
                members[k] = held(row)
        return members
