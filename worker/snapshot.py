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

The rows sit in numpy *tiers*, and the newest few in a short tail. A tier holds a contiguous range of rows: per band,
their fingerprints sorted by band value, with where each value starts (a CSR of the postings), so a search reads its
candidates and verifies them in a few array operations, whatever their number. `load` (and `compact`) build one tier
of every row. Rows made after it (changes the copy follows) go to the tail, which a search compares one by one in one
numpy pass; at `_SEAL_AT` rows the tail becomes a tier of its own, and a tier no larger than the one after it is
merged with it (a binary counter: every row is rebuilt about log2(changes / _SEAL_AT) times, and a copy holds that
many tiers at most). So a copy that follows a million changes searches as fast as one just loaded, give or take a
few numpy calls a tier. A tier's row whose fingerprint went stays in it, marked empty, and is skipped; merges and
`compact` leave those out.

Until then its fingerprint stays in the tier's postings, read and verified (and counted as a candidate) by every
search that reaches it, and the loaded tier may never be merged. So a tier is also built anew alone, in its place
(its rows keep their numbers; only its postings shrink), once the rows that went since it was built reach half of
those it was built with (and _SEAL_AT: `_STALE_SHARE`), O(1) amortised a delete; or once searches have thrown away
as many of its candidates, found within their distance but of rows that went, as it holds rows (`_waste`): a storm
of near-duplicates retired is a small share of a big tier but shares its band values, so every query near it
verified all of it (185 ms a query near a 200,000-row storm deleted from a 1,200,000-row loaded tier; 9 us once
rebuilt, benchmarks/journal/pipeline.md). `compact`, numbering the rows anew, only gives the empty rows' memory back.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

import numpy as np

from . import copylisting
from .bands import BandLayout
from .copyarrays import BandReach, bounds, compile_soon, distance_table, loops, ranges, tile
from .copylisting import NO_HITS, Hits, SearchResult
from .copyrows import CopyRows
from .copytiers import Tier, span, tier_end, write_tier
from .loadedrows import RowsBuilder

__all__ = ["MemoryIndex", "SearchResult"]

_DIRECT_WIDTH = 20
"""Bands at most this wide get, in each tier, a table of every value's first position (2^width + 1 entries a band):
16-bit bands, the default's, cost 0.25 MB a band and tier (int32 positions while the arena is under 2^31 entries).
Wider bands get one in a tier large enough (`_DIRECT_SHARE`); other tiers are searched with two binary searches a
band."""

_WIDE_WIDTH = 24
"""The widest bands that may get a table (2^24 + 1 positions: 64 MB a band and tier)."""

_DIRECT_SHARE = 8
"""A tier of bands wider than _DIRECT_WIDTH (and at most _WIDE_WIDTH) gets tables once it holds at least
2^(widest band) / _DIRECT_SHARE rows. A table replaces the tier's sorted band keys (8 bytes a row and band) with 4
bytes a value: at that size it costs 4x the keys, from 2^width / 2 rows on less than them. 3 bands of 22/21/21 bits
(the layout `stats` advises for the primary path at 10M) take 34 MB a tier from 524,288 rows on, where the keys of
10M rows took 240 MB. Two gathers a probe instead of two binary searches over millions of keys: 537 -> 62 us a
query at 10M, 5 to 8x fewer at 1M and 3M (benchmarks/journal/ten-million.md). Smaller tiers (the newest, made from
the tail) keep binary searches: a table there costs more to build and hold than searching their few keys."""

_SEAL_AT = 2048
"""Rows in the tail (made after the last tier, compared one by one with each query) at which they become a tier."""

_FEW_HITS = 256
"""Matches found by a send's searches (rows, a row reached by several bands counted as often) up to which they are
counted and listed in plain Python, a query's rows in a dict (`MemoryIndex._few_results`), not in arrays: the arrays'
fixed cost, some twenty numpy calls a send, is most of an ordinary send's search (a match or none a query), and a
near storm's thousands of matches a query need the arrays (`MemoryIndex._results`)."""

_SCAN_SHARE = 4
"""A send none of whose queries was cut is compared with every row of the copy (`MemoryIndex._scan`) once its
probes' candidates are more than 1/_SCAN_SHARE of its queries times the tiers' rows: a candidate gathered through the
bands and listed costs many times a row compared in one pass (a near storm's query reads more candidates than the
copy holds rows), measured (benchmarks/journal/near-storms.md, section 9)."""

_SCAN_MAX_CELLS = 1 << 24
"""Most (query, row) pairs a send compares by `MemoryIndex._scan`: its distances take a byte each (16 MB)."""

_SCAN_STEP = 1 << 20
"""(query, row) pairs XORed at a time (8 MB)."""

_STALE_SHARE = 2
"""A tier is built anew, alone, once the rows that went since it was built reach 1/_STALE_SHARE of the rows it was
built with, and _SEAL_AT. A rebuild of n rows costs O(n) and follows at least n/2 deletes in the tier: O(1) a delete
(every delete of a copy's rows, spread evenly, rebuilds each row about twice in all). The floor keeps small tiers
from churning: a rebuild has a fixed cost (a direct table of every band's values, 2^16 + 1 entries a band), and
fewer than _SEAL_AT rows that went cost a search less than the tail's _SEAL_AT rows, compared one by one, already
do (a row of a tier is read only when a probe reaches it). Rows that went close together (a storm) cost far more
than their share: searches near them rebuild their tier sooner (`MemoryIndex._waste`)."""


_MAX_FP = (1 << 64) - 1

_APPLY_MANY = 4
"""Changes from which `MemoryIndex.apply` looks them all up in the loaded rows at once (fewer: one by one)."""


class MemoryIndex(CopyRows):
    """Incident ID -> fingerprint, with band postings over distinct fingerprints, searchable like the Redis index.

    `position` is the change-log entry ID the contents reflect (every change up to it applied, none after it).
    """

    def __init__(self, layout: BandLayout) -> None:
        compile_soon()
        self.layout = layout
        self.position = "0-0"
        super().__init__()
        self._free: list[int] = []  # rows of the tail whose fingerprint went, to be used again
        self._empty = 0  # rows of the tiers whose fingerprint went
        self._rebuilds = 0  # tiers built anew for the rows that went from them (`_rebuild`)
        self._scanning = False  # the last send that read the tiers was compared with every row (`_scan_counted`)
        self._offsets = np.array(layout.offsets, dtype=np.uint64)
        self._width_masks = np.array([(1 << width) - 1 for width in layout.widths], dtype=np.uint64)
        self._widest = max(layout.widths)
        self._reach = BandReach(layout)  # which bands reach a candidate (a near storm's rows kept once)
        # without it, a band's keys are its base | its value: the bands' keys sorted one after the other
        shift = max(layout.widths) if layout.bands > 1 else 0
        assert (layout.bands - 1) << shift < 1 << 64
        self._band_base = np.array([band << shift for band in range(layout.bands)], dtype=np.uint64)
        # where each band's table starts in a tier's `starts`
        self._first_slot = np.cumsum([0] + [(1 << w) + 1 for w in layout.widths[:-1]]).astype(np.int64)
        self._tiers: list[Tier] = []
        # the tiers' fingerprints, tier after tier (the oldest first): the candidates of all tiers in one gather
        self._arena = np.zeros(0, dtype=np.uint64)
        self._sealed = 0  # rows below are in the tiers; rows from here on are the tail
        self._mask_arrays: dict[int, list[np.ndarray]] = {}
        self._slots: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}

    def nbytes(self) -> int:
        """Bytes the copy holds: its arrays, and an estimate of its Python objects (the changes since the load)."""
        held: list[np.ndarray] = [self._fps, self._gone, self._dead, *self._tier_arrays()]
        arrays = sum(a.nbytes for a in held) + self._written.nbytes()
        # the arena's and the counts' reserves are not resident until written
        arrays += self._arena_end() * self._arena.itemsize + self._row_count() * self._sizes.itemsize
        objects = 0
        if self._fp_of or self._members or self._over or self._read:
            # a dict entry, its key and value; a list slot and its members (measured with tracemalloc: about these)
            objects = 150 * len(self._fp_of) + 100 * len(self._row_of) + 100 * (len(self._over) + len(self._read))
        return arrays + (self._base.nbytes() if self._base is not None else 0) + objects

    def _arena_end(self) -> int:
        """Where the arena's last tier ends: what of it is written."""
        return max((tier.at + tier.length for tier in self._tiers), default=0)

    def _tier_arrays(self) -> Iterable[np.ndarray]:
        for tier in self._tiers:
            if tier.starts is not None:
                yield tier.starts
            if tier.keys is not None:
                yield tier.keys
            if tier.rows is not None:
                yield tier.rows

    @property
    def base_rows(self) -> int:
        """Rows in the numpy tiers (the others are the tail)."""
        return self._sealed

    @property
    def overlay_rows(self) -> int:
        """Rows in the tail: made after the last tier, compared one by one with each query."""
        return self._row_count() - self._sealed

    @property
    def tiers(self) -> int:
        return len(self._tiers)

    @property
    def tier_rebuilds(self) -> int:
        """Tiers built anew, alone, since the copy was made, to leave out the rows that went from them (a new copy,
        after a reload or a new layout, starts again at 0)."""
        return self._rebuilds

    @property
    def empty_rows(self) -> int:
        """Rows of the tiers whose fingerprint no incident holds any more (memory that `compact` gives back)."""
        return self._empty

    def load(self, pairs: Iterable[tuple[str, int]] | dict[str, int]) -> None:
        """Set every (incident ID, fingerprint) of `pairs` into an empty copy, its rows in one numpy tier (an ID given
        twice: its last fingerprint)."""
        builder = RowsBuilder()
        left = builder.add_pairs(pairs.items() if isinstance(pairs, dict) else pairs)
        self.load_rows(builder)
        for incident_id, fp in left:
            self.set(incident_id, fp)

    def load_rows(self, builder: RowsBuilder) -> None:
        """Fill an empty copy with what `builder` collected, in arrays (no Python object an incident): ten million
        in a few seconds."""
        if self._row_count() or self._fp_of:
            # not only no incident: no row either (a copy emptied by deletes keeps rows and free ones)
            raise ValueError("load fills a new copy; use set for changes")
        base = builder.build()
        if base is None:
            return
        self._base = base
        self._base_rows = self._base_live_rows = base.rows
        self._base_live = len(base) - base.dropped
        self._gone = np.less(base.row_of, 0)  # the dropped repeats of an ID count as gone from the start
        self._dead = np.zeros(base.rows, dtype=bool)
        self._fps = np.zeros(1024, dtype=np.uint64)
        # room for as many rows again, in pages mapped on their first write (as the arena's: `_tier_of`), so that rows
        # made after the load do not copy the load's counts (40 MB at 10M) each time `_fps` doubles
        self._sizes = np.zeros(2 * base.rows + 1024, dtype=np.int32)
        self._sizes[: base.rows] = np.diff(base.row_start)
        self._arena = np.zeros(0, dtype=np.uint64)
        self._tiers = [self._build_tier(0, base.rows, at=0, every_row_live=True)]
        self._sealed = base.rows

    def compact(self) -> None:
        """Number the rows anew without the empty ones, in one tier (gives back the memory of rows that went)."""
        builder = RowsBuilder()
        base = self._base
        if base is not None:
            kept = np.flatnonzero(~self._gone)
            starts, ends = base.offsets[kept], base.offsets[kept + 1]
            blob = np.frombuffer(base.blob, dtype=np.uint8)[ranges(starts, ends)].tobytes()
            ids = [blob[start:end] for start, end in zip(*bounds(ends - starts), strict=True)]
            builder.add(ids, base.fps[base.row_of[kept]])
            del blob, ids
        left = builder.add_pairs(self._fp_of.items())
        position, rebuilds = self.position, self._rebuilds
        self.__init__(self.layout)  # type: ignore[misc]
        self.position, self._rebuilds = position, rebuilds
        self.load_rows(builder)
        for incident_id, fp in left:
            self.set(incident_id, fp)

    def _build_tier(self, first: int, end: int, *, at: int, every_row_live: bool = False) -> Tier:
        """A tier of the rows first..end that an incident holds, its fingerprints written to the arena from `at` on
        (over the tiers it replaces, if any: merges replace the newest tiers, which are the arena's end)."""
        fps = self._row_fps(first, end)
        rows = np.arange(first, end, dtype=np.int64)
        if not every_row_live:
            live = self._live(first, end)
            fps, rows = fps[live], rows[live]
        return self._tier_of(first, end, fps, rows, at=at)

    def _tier_of(self, first: int, end: int, fps: np.ndarray, rows: np.ndarray, *, at: int) -> Tier:
        """The tier of rows first..end holding `fps` (the fingerprints of those of its rows in use, in any order; not
        a view of the arena), each of row `rows[k]`, written to the arena from `at` on (`copytiers.write_tier`)."""
        tier, self._arena = write_tier(
            self._arena,
            self.layout,
            fps,
            rows,
            first=first,
            end=end,
            at=at,
            direct=self._direct(len(fps)),
            rows_beside=end > self._base_rows,
        )
        return tier

    def _direct(self, rows: int) -> bool:
        """Whether a tier of `rows` rows gets tables of its bands' values (or sorted keys, binary searched)."""
        if self._widest <= _DIRECT_WIDTH:
            return True
        return self._widest <= _WIDE_WIDTH and rows > 0 and rows * _DIRECT_SHARE >= 1 << self._widest

    def _seal(self) -> None:
        """Make the tail a tier, and merge every tier no larger than the one after it with that one."""
        assert not self._free
        end = self._row_count()
        last = self._tiers[-1] if self._tiers else None
        self._tiers.append(self._build_tier(self._sealed, end, at=last.at + last.length if last else 0))
        self._sealed = end
        # no row of the tail is free (a row is added only when none is): from here on, one that goes stays empty
        # by the rows they span, not the rows they hold: spans make an exact binary counter (sizes shrunk by deletes
        # could make a long chain of tiers each a row larger than the next)
        while len(self._tiers) > 1 and span(self._tiers[-2]) <= span(self._tiers[-1]):
            newest = self._tiers.pop()
            older = self._tiers[-1]
            self._tiers[-1] = self._build_tier(older.first, newest.end, at=older.at)

    def _rebuild(self, k: int) -> None:
        """Build the k-th tier anew without the rows that went since it was built, in its own place in the arena.

        Its span stays (the rows keep their numbers, so the binary counter's shape holds); only its postings shrink.
        It is read from the tier itself, not from its span's rows: its first band's run holds each of its fingerprints
        once, and those still held by one of its rows stay. O(its size), not of its span (which may hold many rows
        that went before an earlier rebuild)."""
        tier = self._tiers[k]
        first, end = tier.first, tier.end
        run = self._arena[tier.at : tier.at + tier.size]
        # a fingerprint held again after its row here went has a row after this tier's: it is not this tier's
        rows = self._rows_of(run)
        own = (first <= rows) & (rows < end)
        fps = run[own].copy()
        assert len(fps) == tier.size - tier.stale
        self._tiers[k] = self._tier_of(
            first, end, fps, rows[own], at=tier.at
        )  # shorter than the old: no other tier is touched
        self._rebuilds += 1

    def _masks_for(self, r: int) -> list[np.ndarray]:
        arrays = self._mask_arrays.get(r)
        if arrays is None:
            masks = self.layout.masks(r) if r != self.layout.max_distance else self.layout.probe_masks
            arrays = [np.array(band_masks, dtype=np.uint64) for band_masks in masks]
            self._mask_arrays[r] = arrays
        return arrays

    def _probes(self, r: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Each probe's band and its mask, with where its band starts: the first slot of its band's table (for the
        tiers with tables), and the base of its band's keys (for the others)."""
        cached = self._slots.get(r)
        if cached is None:
            masks = self._masks_for(r)
            band_of = np.concatenate([np.full(len(m), b, dtype=np.intp) for b, m in enumerate(masks)])
            mask = np.concatenate(masks)
            cached = (band_of, mask, self._first_slot[band_of], self._band_base[band_of])
            self._slots[r] = cached
        return cached

    # -- changes --------------------------------------------------------------------------------------------

    def set(self, incident_id: str, fp: int) -> None:
        """Index `incident_id` under `fp`, replacing whatever it had."""
        self._set(incident_id, fp, None, None)

    def apply(self, changes: Sequence[tuple[str, int | None]]) -> None:
        """`set` each (incident ID, fingerprint) of `changes` in order, or `delete` the ID (fingerprint None).

        The loaded rows' look-ups of them all (each ID's incident among them, each fingerprint's row) are made first,
        in one numpy step each (two binary searches a change one by one: about half of what following a change costs
        at a million). The loaded rows never change after the load (what went from them since is recorded beside
        them, and read change by change), so a look-up made before the batch's earlier changes is the one `set`
        would make after them."""
        base = self._base
        fps = [fp for _, fp in changes if fp is not None]
        if base is None or len(changes) < _APPLY_MANY or not all(type(fp) is int and 0 <= fp <= _MAX_FP for fp in fps):
            for incident_id, fp in changes:  # (and a fingerprint outside 64 bits raises as `set` raises it)
                if fp is None:
                    self.delete(incident_id)
                else:
                    self.set(incident_id, fp)
            return
        incidents = base.find_many([incident_id for incident_id, _ in changes])
        base_fps = base.fps
        values = np.array(fps, dtype=np.uint64)
        at = base_fps.searchsorted(values).clip(0, self._base_rows - 1)
        rows = iter(np.where(base_fps[at] == values, at, -1).tolist())
        for (incident_id, fp), incident in zip(changes, incidents, strict=True):
            if fp is None:
                self._delete(incident_id, incident)
            else:
                self._set(incident_id, fp, incident, next(rows))

    def _set(self, incident_id: str, fp: int, incident: int | None, at: int | None) -> None:
        """`set`, given (or None: looked up here) the ID's incident among the loaded rows (`LoadedRows.find`: -1 for
        none) and the loaded row of `fp` (-1 for none; whether an incident still holds it is read here)."""
        old = self._fp_of.get(incident_id)
        if old is None and self._base is not None:
            if incident is None:
                incident = self._base.find(incident_id)
            if incident >= 0 and not self._gone[incident]:
                old = self._base.fp_of(incident)
        if old == fp:
            return
        # unlinking `old` (another fingerprint) does not change the row of `fp`
        if at is None:
            row = self._row(fp)
        else:
            row = self._row_of.get(fp)
            if row is None and at >= 0 and not self._dead[at]:
                row = at
        # a new row's fingerprint as numpy holds it: one outside 64 bits raises OverflowError here, before any change
        # (a plain int within 64 bits goes in as it is: numpy's scalar costs more than the rest of the step)
        value = (fp if type(fp) is int and 0 <= fp <= _MAX_FP else np.uint64(fp)) if row is None else None
        if old is not None:
            self._forget(incident_id, incident)
            self._unlink(incident_id, old)
        self._fp_of[incident_id] = fp
        if value is not None:
            self._new_row(incident_id, fp, value)
            return
        assert row is not None
        members = self._held(row)
        if isinstance(members, str):
            self._hold(row, sorted((members, incident_id)))
        else:
            assert members is not None
            bisect.insort(members, incident_id)
            self._hold(row, members)

    def delete(self, incident_id: str) -> None:
        self._delete(incident_id, None)

    def _delete(self, incident_id: str, incident: int | None) -> None:
        """`delete`, given (or None: looked up here) the ID's incident among the loaded rows, as `_set` is."""
        old = self._forget(incident_id, incident)
        if old is not None:
            self._unlink(incident_id, old)

    def _forget(self, incident_id: str, incident: int | None = None) -> int | None:
        """Take `incident_id` out of the ID -> fingerprint records; its fingerprint, None when it had none.
        (`incident`: its incident among the loaded rows when known, -1 for none; None: looked up here.)"""
        old = self._fp_of.pop(incident_id, None)
        if old is None and self._base is not None:
            if incident is None:
                incident = self._base.find(incident_id)
            if incident >= 0 and not self._gone[incident]:
                self._gone[incident] = True
                self._base_live -= 1
                return self._base.fp_of(incident)
        return old

    def _new_row(self, incident_id: str, fp: int, value: int | np.uint64) -> None:
        """A row for `fp`, held by `incident_id` alone; `value` is `fp` as numpy's (converted first by the caller, so
        that a fingerprint outside 64 bits changes nothing)."""
        if self._free:
            row = self._free.pop()
        else:
            row = self._row_count()
            if row - self._base_rows == len(self._fps):
                self._fps = np.concatenate([self._fps, np.zeros(len(self._fps), dtype=np.uint64)])
                if len(self._sizes) < self._base_rows + len(self._fps):
                    grown = np.zeros(2 * (self._base_rows + len(self._fps)), dtype=np.int32)
                    grown[: len(self._sizes)] = self._sizes
                    self._sizes = grown
            self._members.append(None)
            self._fp_list.append(0)
        k = row - self._base_rows
        self._members[k] = incident_id
        self._sizes[row] = 1  # (a row used again was forgotten by `_hold(row, None)`; no search lists an empty one)
        self._fps[k] = value
        self._fp_list[k] = fp
        self._row_of[fp] = row
        if self._row_count() - self._sealed >= _SEAL_AT:
            self._seal()

    def _unlink(self, incident_id: str, fp: int) -> None:
        row = self._row(fp)
        assert row is not None
        members = self._held(row)
        if isinstance(members, list):
            del members[bisect.bisect_left(members, incident_id)]
            self._hold(row, members[0] if len(members) == 1 else members)
            return
        # the last incident of this fingerprint: the row goes (a tier's stays in it, empty: searches skip it)
        self._hold(row, None)
        if row >= self._base_rows:
            del self._row_of[fp]
        if row >= self._sealed:
            self._free.append(row)
            return
        self._empty += 1
        k = bisect.bisect_right(self._tiers, row, key=tier_end)  # the tier of this row: the first that ends after it
        tier = self._tiers[k]
        tier.stale += 1
        if tier.stale >= _SEAL_AT and tier.stale * _STALE_SHARE >= tier.size:
            self._rebuild(k)

    # -- search ---------------------------------------------------------------------------------------------

    def search(
        self,
        fp: int,
        *,
        max_distance: int | None = None,
        exclude: str | None = None,
        limit: int = 0,
        budget: int = 0,
        shown: int = 0,
    ) -> SearchResult:
        """Every incident within `max_distance` (default, and at most: the layout's) of `fp`, other than `exclude`.

        Counts them all; lists the closest `limit` (0: all), sorted by distance, then ID in code point order
        (which is the byte order of their UTF-8, as Redis sorts). With `budget` (> 0), the tiers' candidates read
        stop at that many (the tail, at most _SEAL_AT rows, is always compared whole): a search cut there says so.
        """
        return self.search_many([(fp, exclude)], max_distance=max_distance, limit=limit, budget=budget, shown=shown)[0]

    def search_many(
        self,
        queries: Sequence[tuple[int, str | None]],
        *,
        max_distance: int | None = None,
        limit: int = 0,
        budget: int = 0,
        shown: int = 0,
    ) -> list[SearchResult]:
        """`search` for each (fingerprint, excluded ID) of `queries`, each tier searched for all in one pass.
        `shown`: the alert's cap, where a listing written as its alert's JSON closes its array (0: after its last).

        A worker searches the events of one send together: a tier's gathers and popcounts then cost a few numpy
        calls for the send instead of a few for each event (at a million incidents about half of a search's time
        was those calls' own overhead, measured with benchmarks/snapshot_copy.py).
        """
        # the bands find everything within the layout's distance, not beyond: a larger one searches at the layout's
        r = self.layout.max_distance if max_distance is None else min(max_distance, self.layout.max_distance)
        verified = np.zeros(len(queries), dtype=np.int64)
        cut = np.zeros(len(queries), dtype=bool)
        found: list[Hits] = []
        unique = True  # each (query, row) found once (the tail's are; the tiers' when made so)
        if queries:
            queries_array = np.array([fp for fp, _ in queries], dtype=np.uint64)
            tiers = [tier for tier in self._tiers if tier.size]
            if tiers:
                hits, unique = self._tier_hits(tiers, queries_array, r, verified, budget, cut)
                if hits is None:  # (a near storm's send: see _scan)
                    blocks = self._scan(tiers, queries_array, r, verified)
                    return copylisting.scanned_results(
                        self, blocks, queries, queries_array, r, verified, cut, limit, loops(), shown=shown
                    )
                found.append(hits)
            if self._row_count() > self._sealed:
                found.append(self._tail_hits(queries_array, r, verified))
        return copylisting.results(
            self, found, queries, r, verified, cut, limit, few=_FEW_HITS, unique=unique, shown=shown
        )

    def _tier_hits(
        self,
        tiers: list[Tier],
        queries: np.ndarray,
        r: int,
        verified: np.ndarray,
        budget: int,
        cut: np.ndarray,
    ) -> tuple[Hits | None, bool]:
        """The rows of each query's candidates in `tiers` within `r` (query, row, distance; a row several bands reach
        as often), with the candidates verified added to `verified`: the probes found once, looked up in each tier,
        all tiers' candidates gathered from the arena and verified in one pass, their rows found in one binary search
        a tier. A fingerprint held again after its row in a tier went empty is found under its new row, where it is
        now. With `budget` (> 0), each query's candidate ranges are shortened so that it reads at most that many,
        before any is gathered (a flood sharing one band value then costs the budget, not the flood); `cut[k]` is set
        for each query that lost some. With more than _FEW_HITS matches (a near storm's), a row several bands reach is
        kept once (`BandReach.later`); the second value says whether every (query, row) is then found once (no query was
        cut). Ordinary sends of many candidates and few matches (a large index's) verify them as before, the cheapest
        way for candidates (2x faster at 1M than numbering every candidate's range, measured). None instead of the
        rows: the send is better compared with every row (`_scan`; its candidates were counted in `verified`)."""
        band_of, masks, first_slot, band_base = self._probes(r)
        if not len(band_of):
            return NO_HITS, True
        values = (queries[:, None] >> self._offsets) & self._width_masks  # query x band
        direct = [tier.starts for tier in tiers if tier.starts is not None]
        where = [(tier.keys, tier.at) for tier in tiers if tier.keys is not None]
        # each query's probes' slots in a table (query x probe, C order as the compiled loops are warmed with)
        grid = np.ascontiguousarray(first_slot + (values[:, band_of] ^ masks).astype(np.int64)) if direct else None
        if self._scanning and grid is not None and not where and self._scan_counted(direct, grid, verified, budget):
            return None, True
        # the tier of each range, ranges tier by tier (those with tables first)
        tier_order = [k for k, tier in enumerate(tiers) if tier.starts is not None]
        tier_order += [k for k, tier in enumerate(tiers) if tier.starts is None]
        starts_of, ends_of, query_of_ranges, probe_of_ranges = [], [], [], []
        if direct:
            # a query's probes together
            assert grid is not None
            slots = grid.ravel()
            after = slots + 1
            starts_of += [table[slots] for table in direct]
            ends_of += [table[after] for table in direct]
            query_of_ranges.append(tile(np.arange(len(queries)).repeat(len(band_of)), len(direct)))
            probe_of_ranges.append(tile(np.arange(len(band_of)), len(queries) * len(direct)))
        if where:
            # binary searches of sorted probes: 2.6x faster than of the same probes in query order (measured)
            probes = ((values[:, band_of] ^ masks) | band_base).ravel()
            order = probes.argsort()
            probes = probes[order]
            starts_of += [keys.searchsorted(probes, side="left") + at for keys, at in where]
            ends_of += [keys.searchsorted(probes, side="right") + at for keys, at in where]
            query_of_ranges.append(tile(order // len(band_of), len(where)))
            probe_of_ranges.append(tile(order % len(band_of), len(where)))
        # positions in the arena (int64 whatever a table's type), tier x probe
        starts = np.concatenate(starts_of).astype(np.int64, copy=False)
        ends = np.concatenate(ends_of).astype(np.int64, copy=False)
        range_query = np.concatenate(query_of_ranges)
        lengths = ends - starts
        if budget > 0:
            # each query's ranges in order, and what comes before each within its query: what is left of the budget
            order = range_query.argsort(kind="stable")
            ordered = lengths[order]
            before = ordered.cumsum() - ordered
            first_of = range_query[order].searchsorted(range_query[order], side="left")
            before = before - before[first_of]
            allowed = (budget - before).clip(0, ordered)
            cut[range_query[order][allowed < ordered]] = True
            lengths = lengths.copy()
            lengths[order] = allowed
            ends = starts + lengths
        total = int(lengths.sum())
        self._scanning = False
        if not total:
            return NO_HITS, True
        verified += np.bincount(range_query, weights=lengths, minlength=len(queries)).astype(np.int64)
        if self._scans(total, len(queries)) and not cut.any():
            self._scanning = True
            return None, True
        # each candidate against its query's fingerprint, in one compiled pass over the arena; the range of each near
        # one found from its place among them, and its position in the arena from that (they are few: cheaper than
        # the range and position of every candidate)
        near, apart = loops().near_ranges(self._arena, starts, lengths, queries[range_query], r)
        range_ends = lengths.cumsum()
        range_of = range_ends.searchsorted(near, side="right")
        once = len(near) > _FEW_HITS
        tier_of_near = None
        if once:
            # a near storm's thousands of matches a query: a row several bands reach is kept once a query, from the
            # first (`BandReach.later`), and the tier of each taken from its range, not searched for
            range_band = band_of[np.concatenate(probe_of_ranges)].astype(np.int8)
            if cut.any():
                range_band[cut[range_query]] = 0  # (a cut query's: all kept)
            first = ~self._reach.later(apart, range_band[range_of], r)
            near, apart, range_of = near[first], apart[first], range_of[first]
            per_tier = len(lengths) // len(tiers)
            tier_of_near = np.array(tier_order, dtype=np.int64)[range_of // per_tier]
        query_of_near = range_query[range_of]
        positions = starts[range_of] + (near - (range_ends - lengths)[range_of])  # in the arena
        rows = self._rows_at(tiers, positions, apart ^ queries[query_of_near], tier_of_near)
        # A row no incident holds any more is skipped: its fingerprint went (if it is held again, it is in a newer row)
        live = self._sizes[rows] > 0
        if not live.all():
            dead = ~live
            weight = None
            if once:  # counted as often as the search met it, as it was before it was kept once
                weight = self._reach.count(apart[dead], r)
                weight[cut[query_of_near[dead]]] = 1
            self._waste(positions[dead], weight)
        return (query_of_near[live], rows[live], np.bitwise_count(apart[live])), once and not cut.any()

    def _scans(self, total: int, n: int) -> bool:
        """Whether a send of `n` queries whose probes reach `total` candidates is compared with every row instead."""
        return total * _SCAN_SHARE > n * self._sealed and n * self._row_count() <= _SCAN_MAX_CELLS

    def _scan_counted(self, tables: list[np.ndarray], grid: np.ndarray, verified: np.ndarray, budget: int) -> bool:
        """For a send after one compared with every row (a near storm's next, most likely), its candidates counted
        without their ranges: each query's probes' in each tier's table, in one compiled pass a tier
        (`probe_totals`), added to `verified`, when the send is compared with every row too (True). False, nothing
        counted, when it is not (a query past `budget`, or too few candidates): its ranges are then made as any
        send's. Building the ranges, their budget and their counts only to learn that a storm's send scans took 155
        us a send of 14 queries, 70 with this (benchmarks/journal/near-storms.md, section 19)."""
        totals = np.zeros(len(grid), dtype=np.int64)
        probe_totals = loops().probe_totals
        for table in tables:
            probe_totals(table, grid, totals)
        if (budget > 0 and int(totals.max()) > budget) or not self._scans(int(totals.sum()), len(grid)):
            return False
        verified += totals
        return True

    def _scan(self, tiers: list[Tier], queries: np.ndarray, r: int, verified: np.ndarray) -> list[copylisting.Scanned]:
        """Every fingerprint of `tiers` and of the tail, to be compared with each query (a block each: the
        fingerprints, with each one's row and member count), for a send none of whose queries was cut
        (`_tier_hits` counted their candidates in `verified`; the tail's are added here). A near storm's query meets
        more candidates through its probes than the copy holds rows (each row within r reached through two bands or
        more, most candidates matches): one pass over the rows costs a fraction of gathering the candidates, and
        finds each row once, so that `copylisting.scanned_results` counts and lists them as the bands would have:
        the bands find every row within r, and only rows of the tiers and the tail. A tier's first band holds each
        of its fingerprints once, those of rows that went since it was built included: those within r count
        against it (`_waste`) as often as the bands would have met them."""
        blocks: list[copylisting.Scanned] = []
        wasted, wasted_weight = [], []
        for tier in tiers:
            fps = self._arena[tier.at : tier.at + tier.size]
            if tier.rows is not None:
                rows = tier.rows[: tier.size].astype(np.int64)
            else:  # (a tier of loaded rows: theirs found in the load's sorted fingerprints, as `_rows_at` does)
                assert self._base is not None
                rows = self._base.fps.searchsorted(fps)
            sizes = self._sizes.take(rows)
            if tier.stale:
                fps = fps.copy()  # (`_waste` below may build this tier anew in its place in the arena)
                distances = distance_table(fps, queries, _SCAN_STEP)
                which, at = ((distances <= r) & (sizes == 0)).nonzero()
                if len(at):
                    wasted.append(at + tier.at)
                    wasted_weight.append(self._reach.count(fps.take(at) ^ queries.take(which), r))
            blocks.append((fps, rows, sizes))
        first, end = self._sealed, self._row_count()
        if end > first:
            rows = np.arange(first, end, dtype=np.int64)
            blocks.append((np.ascontiguousarray(self._row_fps(first, end)), rows, self._sizes[first:end]))
            verified += end - first
        if wasted:
            self._waste(np.concatenate(wasted), np.concatenate(wasted_weight))
        return blocks

    def _rows_at(
        self, tiers: list[Tier], positions: np.ndarray, fps: np.ndarray, of: np.ndarray | None = None
    ) -> np.ndarray:
        """The row of each fingerprint `fps[k]` read at `positions[k]` of the arena (in one of `tiers`), the row it
        had when its tier was built: read beside it, or for a tier of loaded rows only, found by one binary search in
        the load's sorted fingerprints; instead of a look-up a match."""
        few = len(fps) <= _FEW_HITS  # (an ordinary send's: a numpy call each tier would be most of the cost)
        if len(tiers) == 1:
            mine = np.arange(len(fps))
            which: Iterable[tuple[int, np.ndarray]] = [(0, mine)]
        else:
            if of is None:  # (the tier of each, when the caller does not know it)
                ats = np.array([tier.at for tier in tiers], dtype=np.int64)
                of = ats.searchsorted(positions, side="right") - 1
            present = sorted(set(of.tolist())) if few else range(len(tiers))
            which = ((k, (of == k).nonzero()[0]) for k in present)
        rows = np.empty(len(fps), dtype=np.int64)
        for k, mine in which:
            if not len(mine):
                continue
            tier = tiers[k]
            if tier.rows is not None:
                rows[mine] = tier.rows[positions[mine] - tier.at]
                continue
            assert self._base is not None
            # sorted first: a binary search of sorted values reads memory in order (several times faster, measured)
            if not few:
                mine = mine[fps[mine].argsort()]
            rows[mine] = self._base.fps.searchsorted(fps[mine])
        return rows

    def _waste(self, positions: np.ndarray, weight: np.ndarray | None = None) -> None:
        """Count against their tiers the candidates a search found within its distance but of rows that went (the
        arena's `positions` of them; `weight`: how many times the search met each, once if not given), and build anew
        each tier whose count reaches its size and _SEAL_AT.

        Rows that went are counted on delete, too (`_unlink`), but how much they cost depends on where they are: a
        storm of near-duplicates shares its band values, so a query near it reads and verifies every row of it that
        went, all of them within its distance, however small a share of the tier they are. Once the searches have
        thrown away as many of a tier's candidates as it holds rows, they have spent about what building it anew
        costs (the rebuild then at most doubles what they spend on it), and the rows that went no longer cost them.
        The rebuild is a pause of the search that triggers it (about 0.7 s for a tier of a million rows, like a merge
        of that size); a few rows that went, near a query sent again and again, can trigger it too, once their
        thrown-away candidates add up to the tier's size.
        """
        ats = np.array([tier.at for tier in self._tiers], dtype=np.int64)
        counts = np.bincount(
            np.searchsorted(ats, positions, side="right") - 1, weights=weight, minlength=len(self._tiers)
        ).astype(np.int64)
        due = []
        for k in np.flatnonzero(counts).tolist():
            tier = self._tiers[k]
            tier.wasted += int(counts[k])
            if tier.wasted >= max(tier.size, _SEAL_AT):
                due.append(k)
        for k in due:
            self._rebuild(k)

    def _tail_hits(self, queries: np.ndarray, r: int, verified: np.ndarray) -> Hits:
        """The rows of the tail within `r` of each query (query, row, distance), by comparing with each (one numpy
        pass), with the rows compared added to `verified`. Exact whatever `r` (no bands involved); rows freed since
        hold a stale fingerprint and no member: skipped."""
        first, end = self._sealed, self._row_count()
        distances = np.bitwise_count(self._row_fps(first, end)[None, :] ^ queries[:, None])
        which, rows = (distances <= r).nonzero()
        near = distances[which, rows]
        rows = rows + first
        live = self._sizes[rows] > 0
        verified += end - first
        return which[live], rows[live], near[live]
