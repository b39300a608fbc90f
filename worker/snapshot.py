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

The rows come in two parts. The *base*, built in one go by `load` (and again by `compact`), is numpy only: per band,
the rows' fingerprints sorted by their band value, with where each value starts (a CSR of the postings), so a search
reads its candidates and verifies them in a few array operations, whatever their number. Rows made after it
(changes the copy follows) sit in Python dicts of band value -> rows, cheap to change. A base row whose fingerprint
went stays in the arrays, marked empty, and is skipped.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .bands import BandLayout

__all__ = ["MemoryIndex", "SearchResult"]

_DIRECT_WIDTH = 20
"""Bands at most this wide get a table of every value's first position (2^width + 1 entries a band): 16-bit bands,
the default's, cost 0.5 MB a band. Wider bands are searched with two binary searches a band."""

_SCAN_OVERLAY_UP_TO = 4096
"""Rows made since the base up to which a search compares the query with each of them (one numpy pass for all the
queries of a send) instead of probing the dicts of their bands (68 lookups a query with the default layout)."""

_NUMPY_FROM = 384
"""Candidates from which numpy's gather and popcount beat a Python loop over them (measured on the Zipf workload)."""


def _gather(order: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """order[starts[0]:ends[0]], order[starts[1]:ends[1]], ... as one array, without a Python loop."""
    counts = ends - starts
    nonempty = counts > 0
    if not nonempty.any():
        return order[:0]
    starts, ends, counts = starts[nonempty], ends[nonempty], counts[nonempty]
    # positions: each range's start, then +1 within it; at a range's first element, the jump from the previous end
    steps = np.ones(int(counts.sum()), dtype=np.int64)
    first = np.cumsum(counts) - counts
    steps[0] = starts[0]
    steps[first[1:]] = starts[1:] - ends[:-1] + 1
    return order[np.cumsum(steps)]


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
        self._offsets = np.array(layout.offsets, dtype=np.uint64)
        self._width_masks = np.array([(1 << width) - 1 for width in layout.widths], dtype=np.uint64)
        # the base (see the module's docstring): rows below _base_rows, per band (sorted values, rows in that order)
        self._base_rows = 0
        self._base: list[tuple[np.ndarray, np.ndarray]] = []
        self._mask_arrays: dict[int, list[np.ndarray]] = {}
        self._direct: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._slots: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

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

    @property
    def base_rows(self) -> int:
        """Rows in the numpy base (the others are in dicts)."""
        return self._base_rows

    @property
    def overlay_rows(self) -> int:
        """Rows made since the base was built (searched through dicts)."""
        return len(self._members) - self._base_rows

    def load(self, pairs: Iterable[tuple[str, int]] | dict[str, int]) -> None:
        """Set every (incident ID, fingerprint) of `pairs` into an empty copy and build the numpy base of its rows.

        A dict is taken over as the copy's own (not copied: the caller lets go of it). The rows are made in numpy
        (one row per distinct fingerprint, `np.unique`), not one incident at a time: a million in about a second.
        """
        if self._fp_of:
            raise ValueError("load fills an empty copy; use set for changes")
        fp_of = pairs if isinstance(pairs, dict) else dict(pairs)  # an ID given twice: its last fingerprint
        if not fp_of:
            self._build_base()
            return
        ids = list(fp_of)
        fps = np.fromiter(fp_of.values(), dtype=np.uint64, count=len(ids))
        unique, first, inverse, counts = np.unique(fps, return_index=True, return_inverse=True, return_counts=True)
        members: list[str | list[str] | None] = [ids[k] for k in first.tolist()]
        if len(unique) < len(ids):  # twins: the IDs of a shared fingerprint, sorted, in its row
            inverse = inverse.reshape(-1)
            groups: dict[int, list[str]] = {}
            for k in np.flatnonzero(counts[inverse] > 1).tolist():
                groups.setdefault(int(inverse[k]), []).append(ids[k])
            for row, group in groups.items():
                members[row] = sorted(group)
        fp_list = unique.tolist()
        self._fp_of = fp_of
        self._members = members
        self._fp_list = fp_list
        self._row_of = dict(zip(fp_list, range(len(fp_list)), strict=True))
        self._fps = unique
        self._build_base()

    def compact(self) -> None:
        """Move every row into the numpy base (rows made since the last build are searched slower, in dicts)."""
        live = [row for row, held in enumerate(self._members) if held is not None]
        members = [self._members[row] for row in live]
        fp_list = [self._fp_list[row] for row in live]
        self._members = members
        self._fp_list = fp_list
        self._row_of = {fp: row for row, fp in enumerate(fp_list)}
        self._free = []
        self._fps = np.array(fp_list, dtype=np.uint64) if fp_list else np.zeros(1024, dtype=np.uint64)
        for table in self._tables:
            table.clear()
        self._build_base()

    def _build_base(self) -> None:
        rows = len(self._fp_list)
        fps = self._fps[:rows]
        self._base = []
        for offset, width_mask, _, _ in self._bands:
            values = (fps >> np.uint64(offset)) & np.uint64(width_mask)
            order = np.argsort(values, kind="stable")
            self._base.append((values[order], order.astype(np.int64)))
        self._base_rows = rows
        self._direct = None
        if max(self.layout.widths) <= _DIRECT_WIDTH:
            # every band's value -> its first position in one array, so that all probes of a query, over every band,
            # are found with one gather (instead of two binary searches per band). Beside it the fingerprints
            # themselves in that order (not their rows): a probe's candidates are then read from one contiguous run
            # of memory, not gathered row by row across the whole copy (about 0.6 of the search's time at a
            # million); the few within the distance find their row through `_row_of`.
            starts, fps_in_order, base = [], [], 0
            for (values, order), width in zip(self._base, self.layout.widths, strict=True):
                starts.append(np.searchsorted(values, np.arange((1 << width) + 1, dtype=np.uint64)) + base)
                fps_in_order.append(fps[order])
                base += len(order)
            first_slot = np.cumsum([0] + [(1 << w) + 1 for w in self.layout.widths[:-1]])
            self._direct = (np.concatenate(starts), np.concatenate(fps_in_order), first_slot)
            self._base = []  # the sorted values are only read through binary searches: 16 bytes a row and band freed

    def _masks_for(self, r: int) -> list[np.ndarray]:
        arrays = self._mask_arrays.get(r)
        if arrays is None:
            masks = self.layout.masks(r) if r != self.layout.max_distance else [m for _, _, m, _ in self._bands]
            arrays = [np.array(band_masks, dtype=np.uint64) for band_masks in masks]
            self._mask_arrays[r] = arrays
        return arrays

    def _probe_slots(self, r: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For the direct table: each probe's band, its mask, and the first slot of its band's table."""
        cached = self._slots.get(r)
        if cached is None:
            assert self._direct is not None
            masks = self._masks_for(r)
            band_of = np.concatenate([np.full(len(m), b, dtype=np.intp) for b, m in enumerate(masks)])
            cached = (band_of, np.concatenate(masks).astype(np.int64), self._direct[2][band_of])
            self._slots[r] = cached
        return cached

    def _base_candidates(self, fp: int, r: int) -> np.ndarray:
        """Rows of the base reached through the probes of `fp` (a row reached through several bands repeats); for
        bands too wide for the direct table (which `_base_hits` reads itself)."""
        found = []
        for (offset, width_mask, _, _), (values, order), masks in zip(
            self._bands, self._base, self._masks_for(r), strict=True
        ):
            if not len(masks) or not len(values):
                continue
            probes = masks ^ np.uint64((fp >> offset) & width_mask)
            rows = _gather(
                order, np.searchsorted(values, probes, side="left"), np.searchsorted(values, probes, side="right")
            )
            if len(rows):
                found.append(rows)
        if not found:
            return np.zeros(0, dtype=np.int64)
        return found[0] if len(found) == 1 else np.concatenate(found)

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
        if row < self._base_rows:
            return  # a base row stays in the arrays, empty: searches skip it
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
        """Every incident within `max_distance` (default, and at most: the layout's) of `fp`, other than `exclude`.

        Counts them all; lists the closest `limit` (0: all), sorted by distance, then ID in code point order
        (which is the byte order of their UTF-8, as Redis sorts).
        """
        return self.search_many([(fp, exclude)], max_distance=max_distance, limit=limit)[0]

    def search_many(
        self, queries: Sequence[tuple[int, str | None]], *, max_distance: int | None = None, limit: int = 0
    ) -> list[SearchResult]:
        """`search` for each (fingerprint, excluded ID) of `queries`, the numpy base searched for all in one pass.

        A worker searches the events of one send together: the base's gathers and popcounts then cost a few numpy
        calls for the send instead of a few for each event (at a million incidents about half of a search's time
        was those calls' own overhead, measured with benchmarks/snapshot_copy.py).
        """
        # the bands find everything within the layout's distance, not beyond: a larger one searches at the layout's
        r = self.layout.max_distance if max_distance is None else min(max_distance, self.layout.max_distance)
        masks_of = self.layout.masks(r) if max_distance is not None else None
        fps = [fp for fp, _ in queries]
        base_hits = self._base_hits(fps, r) if self._base_rows and fps else None
        scanned = self.overlay_rows if self.overlay_rows <= _SCAN_OVERLAY_UP_TO else 0
        overlay_hits = self._overlay_scan(fps, r) if scanned and fps else None
        results = []
        for k, (fp, exclude) in enumerate(queries):
            hits: dict[int, int]
            if base_hits is not None:
                hits, verified = base_hits[k]
            else:
                hits, verified = {}, 0
            if overlay_hits is not None:
                hits.update(overlay_hits[k])
                verified += scanned
            elif self.overlay_rows:
                verified += self._overlay_hits(fp, r, masks_of, hits)
            results.append(self._result(hits, verified, exclude, limit))
        return results

    def _base_hits(self, fps: list[int], r: int) -> list[tuple[dict[int, int], int]]:
        """For each of `fps`: the rows of its base candidates within `r` (row -> distance), and the base candidates
        verified. A base fingerprint held again after its base row was emptied is found under its new row."""
        if self._direct is None:
            out = []
            for fp in fps:
                base = self._base_candidates(fp, r)
                distances = np.bitwise_count(self._fps[base] ^ np.uint64(fp))
                near = distances <= r
                out.append((dict(zip(base[near].tolist(), distances[near].tolist(), strict=True)), len(base)))
            return out
        starts_of, fps_in_order, _ = self._direct
        band_of, masks, first_slot = self._probe_slots(r)
        if not len(band_of):
            return [({}, 0) for _ in fps]
        queries = np.array(fps, dtype=np.uint64)
        values = ((queries[:, None] >> self._offsets) & self._width_masks).astype(np.int64)  # query x band
        slots = (first_slot + (values[:, band_of] ^ masks)).ravel()  # query x probe, a query's probes together
        starts, ends = starts_of[slots], starts_of[slots + 1]
        candidates = _gather(fps_in_order, starts, ends)
        per_query = (ends - starts).reshape(len(fps), -1).sum(axis=1)
        distances = np.bitwise_count(candidates ^ np.repeat(queries, per_query))  # a query's candidates together
        near = distances <= r
        # where each query's near candidates end: the near ones counted up to the end of its candidates
        near_before = np.concatenate(([0], np.cumsum(near)))
        bounds = [0, *near_before[np.cumsum(per_query)].tolist()]
        near_fps, near_distances = candidates[near].tolist(), distances[near].tolist()
        # A base fingerprint no incident holds any more has no row (its base row is empty, and skipped anyway); one
        # held again since has a row made after the base, which the search of those rows finds too.
        # No np.unique: sorting costs more than verifying the few rows that several bands reach twice.
        row_of = self._row_of
        found: list[tuple[dict[int, int], int]] = []
        for a, b, count in zip(bounds, bounds[1:], per_query.tolist(), strict=False):
            hits: dict[int, int] = {}
            for fp, distance in zip(near_fps[a:b], near_distances[a:b], strict=True):
                row = row_of.get(fp)
                if row is not None:
                    hits[row] = distance
            found.append((hits, count))
        return found

    def _overlay_scan(self, fps: list[int], r: int) -> list[dict[int, int]]:
        """For each of `fps`: the rows made since the base within `r` (row -> distance), by comparing with each.

        Exact whatever `r` (no bands involved). Rows freed since hold a stale fingerprint; `_result` skips them.
        """
        first = self._base_rows
        queries = np.array(fps, dtype=np.uint64)
        distances = np.bitwise_count(self._fps[first : len(self._members)][None, :] ^ queries[:, None])
        which, rows = np.nonzero(distances <= r)
        found: list[dict[int, int]] = [{} for _ in fps]
        for k, row, distance in zip(
            which.tolist(), (rows + first).tolist(), distances[which, rows].tolist(), strict=True
        ):
            found[k][row] = distance
        return found

    def _overlay_hits(self, fp: int, r: int, masks_of: Sequence[tuple[int, ...]] | None, hits: dict[int, int]) -> int:
        """Add the rows made since the base (in dicts) within `r` of `fp` to `hits`; returns the rows verified."""
        candidates: list[int] = []
        for band, (offset, width_mask, masks, table) in enumerate(self._bands):
            if masks_of is not None:
                masks = masks_of[band]
            if not masks or not table:
                continue
            value = (fp >> offset) & width_mask
            get = table.get
            for mask in masks:
                rows = get(value ^ mask)
                if rows:
                    candidates += rows
        if not candidates:
            return 0
        if len(candidates) < _NUMPY_FROM:
            # a row reached through several bands is verified once; Python's int.bit_count beats numpy's call
            # overhead on a few hundred candidates
            fps = self._fp_list
            unique = set(candidates)
            for row in unique:
                if (d := (fps[row] ^ fp).bit_count()) <= r:
                    hits[row] = d
            return len(unique)
        rows_array = np.asarray(candidates, dtype=np.intp)
        distances = np.bitwise_count(self._fps[rows_array] ^ np.uint64(fp))
        near = distances <= r
        hits.update(zip(rows_array[near].tolist(), distances[near].tolist(), strict=True))
        return len(rows_array)

    def _result(self, hits: dict[int, int], verified: int, exclude: str | None, limit: int) -> SearchResult:
        """The incidents of the rows `hits` (row -> distance), `exclude` left out, counted and the closest listed."""
        if not hits:
            return SearchResult(0, [], verified)
        count = 0
        groups: list[tuple[int, list[str]]] = []
        for row, distance in hits.items():
            members = self._members[row]
            if members is None:
                continue  # a base row whose fingerprint went, or a freed row the scan compared
            if isinstance(members, str):
                if members != exclude:
                    count += 1
                    groups.append((distance, [members]))
                continue
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
