"""A copy of one index's fingerprints in the worker's memory, for the search of the snapshot read path.

The atomic step on the Redis primary costs about 1 us a probe key and 2 us a candidate of the primary's one thread
(BENCHMARKS.md): at a million incidents that is over a millisecond an event, and more worker processes add nothing.
A snapshot moves that search into the worker process. Each worker keeps every fingerprint of the index here, fed
from the index's change log (`{N}:changes`, whose entries carry the incident ID, its new fingerprint and the one it
replaced), and searches it; the primary's atomic step then only re-checks the changes made after the snapshot's
position in the log (docs/contract.md, "Snapshot reads"), so it costs what the writes cost, whatever the size.

Pure Python and numpy, no Redis: the multi-index hashing of the bands (the same layout as the index, so the same
recall argument holds) over rows of distinct fingerprints; incidents that share one exact fingerprint (a storm) share
one row, so a storm costs one candidate, not one per twin.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from .bands import BandLayout

__all__ = ["MemoryIndex", "SearchResult"]

_NUMPY_FROM = 384
"""Candidates from which numpy's gather and popcount beat a Python loop over them (measured on the Zipf workload)."""


@dataclass(frozen=True)
class SearchResult:
    """What a search found: every match counted, the closest listed (sorted by distance, then ID)."""

    match_count: int
    matches: list[tuple[str, int]]
    candidates: int


class MemoryIndex:
    """Incident ID -> fingerprint, with band postings over distinct fingerprints, searchable like the Redis index.

    `position` is the change-log entry ID the contents reflect (every change up to it applied, none after it).
    """

    def __init__(self, layout: BandLayout) -> None:
        self.layout = layout
        self.position = "0-0"
        self._fp_of: dict[str, int] = {}
        self._row_of: dict[int, int] = {}
        # row -> the IDs sharing that fingerprint: one str, or a sorted list once there are twins
        self._members: list[str | list[str] | None] = []
        # each row's fingerprint twice: a list for Python's fast path, an array for numpy's
        self._fp_list: list[int] = []
        self._fps = np.zeros(1024, dtype=np.uint64)
        self._free: list[int] = []
        self._bands: list[tuple[int, int, tuple[int, ...], dict[int, list[int]]]] = [
            (offset, (1 << width) - 1, masks, {})
            for offset, width, masks in zip(layout.offsets, layout.widths, layout.probe_masks, strict=True)
        ]
        self._tables: list[dict[int, list[int]]] = [table for *_, table in self._bands]

    def __len__(self) -> int:
        return len(self._fp_of)

    @property
    def distinct(self) -> int:
        """Distinct fingerprints held (rows in use)."""
        return len(self._row_of)

    def get(self, incident_id: str) -> int | None:
        return self._fp_of.get(incident_id)

    def items(self) -> Iterable[tuple[str, int]]:
        return self._fp_of.items()

    # -- changes --------------------------------------------------------------------------------------------

    def set(self, incident_id: str, fp: int) -> None:
        """Index `incident_id` under `fp`, replacing whatever it had."""
        old = self._fp_of.get(incident_id)
        if old == fp:
            return
        if old is not None:
            self._unlink(incident_id, old)
        self._fp_of[incident_id] = fp
        row = self._row_of.get(fp)
        if row is None:
            self._new_row(incident_id, fp)
            return
        members = self._members[row]
        if isinstance(members, str):
            self._members[row] = sorted((members, incident_id))
        else:
            assert members is not None
            bisect.insort(members, incident_id)

    def delete(self, incident_id: str) -> None:
        old = self._fp_of.pop(incident_id, None)
        if old is not None:
            self._unlink(incident_id, old)

    def _new_row(self, incident_id: str, fp: int) -> None:
        if self._free:
            row = self._free.pop()
        else:
            row = len(self._members)
            if row == len(self._fps):
                self._fps = np.concatenate([self._fps, np.zeros(len(self._fps), dtype=np.uint64)])
            self._members.append(None)
            self._fp_list.append(0)
        self._members[row] = incident_id
        self._fps[row] = fp
        self._fp_list[row] = fp
        self._row_of[fp] = row
        for offset, width_mask, _, table in self._bands:
            value = (fp >> offset) & width_mask
            rows = table.get(value)
            if rows is None:
                table[value] = [row]
            else:
                rows.append(row)

    def _unlink(self, incident_id: str, fp: int) -> None:
        row = self._row_of[fp]
        members = self._members[row]
        if isinstance(members, list):
            del members[bisect.bisect_left(members, incident_id)]
            if len(members) == 1:
                self._members[row] = members[0]
            return
        # the last incident of this fingerprint: the row goes
        self._members[row] = None
        del self._row_of[fp]
        self._free.append(row)
        for offset, width_mask, _, table in self._bands:
            value = (fp >> offset) & width_mask
            rows = table[value]
            if len(rows) == 1:
                del table[value]
            else:
                rows.remove(row)

    # -- search ---------------------------------------------------------------------------------------------

    def search(
        self, fp: int, *, max_distance: int | None = None, exclude: str | None = None, limit: int = 0
    ) -> SearchResult:
        """Every incident within `max_distance` (default: the layout's) of `fp`, other than `exclude`.

        Counts them all; lists the closest `limit` (0: all), sorted by distance, then ID in code point order
        (which is the byte order of their UTF-8, as Redis sorts).
        """
        r = self.layout.max_distance if max_distance is None else max_distance
        masks_of = self.layout.masks(r) if max_distance is not None else None
        candidates: list[int] = []
        for band, (offset, width_mask, masks, table) in enumerate(self._bands):
            if masks_of is not None:
                masks = masks_of[band]
            if not masks:
                continue
            value = (fp >> offset) & width_mask
            get = table.get
            for mask in masks:
                rows = get(value ^ mask)
                if rows:
                    candidates += rows
        if not candidates:
            return SearchResult(0, [], 0)
        if len(candidates) < _NUMPY_FROM:
            # a row reached through several bands is verified once; Python's int.bit_count beats numpy's call
            # overhead on a few hundred candidates
            fps = self._fp_list
            unique = set(candidates)
            hits = [(row, d) for row in unique if (d := (fps[row] ^ fp).bit_count()) <= r]
            verified = len(unique)
        else:
            # no np.unique: sorting costs more than verifying the few rows that several bands reach twice
            rows_array = np.asarray(candidates, dtype=np.intp)
            distances = np.bitwise_count(self._fps[rows_array] ^ np.uint64(fp))
            near = distances <= r
            hits = list(dict(zip(rows_array[near].tolist(), distances[near].tolist(), strict=True)).items())
            verified = len(rows_array)
        count = 0
        groups: list[tuple[int, list[str]]] = []
        for row, distance in hits:
            members = self._members[row]
            if isinstance(members, str):
                if members != exclude:
                    count += 1
                    groups.append((distance, [members]))
                continue
            assert members is not None
            ids = members
            if exclude is not None and self._fp_of.get(exclude) == self._fp_list[row]:
                ids = (
                    [m for m in members[: limit + 1] if m != exclude] if limit else [m for m in members if m != exclude]
                )
                count += len(members) - 1
            else:
                count += len(members)
            groups.append((distance, ids[:limit] if limit else ids))
        listed = sorted((distance, incident_id) for distance, ids in groups for incident_id in ids)
        if limit:
            listed = listed[:limit]
        return SearchResult(count, [(incident_id, distance) for distance, incident_id in listed], verified)
