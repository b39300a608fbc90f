"""Listing a search's matches in the worker's copy (worker/snapshot.py's `MemoryIndex`): each query's matches counted,
the closest `limit` listed by distance, then ID in code point order, its excluded ID left out of both.

A send's searches give the rows they found (query, row, distance). With few of them (an ordinary send), each query's
rows go in a dict and every member is listed and sorted in plain Python; with many (a near storm: thousands of
matches a query to list 100, benchmarks/journal/near-storms.md), in arrays: a query's count the sum of its rows'
member counts, the distance where its cap falls found from its counts by distance, and only the rows the cap reaches
sorted and read in Python. Both give the same answers (tests/test_snapshot.py runs the property tests through each).
In arrays, once the copy's loops are compiled, each query's listing is sorted and written as the claim's arguments by
a compiled loop from the rows' IDs kept as bytes (`_written`, worker/copywritten.py), no Python object a match; in
Python (`_listed`) while they compile, for a query whose rows hold an ID that is not ASCII, and for a listing of every
match or of KEPT or more.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from . import copyarrays
from .copywritten import KEPT, WrittenIds, WrittenListing

__all__ = ["NO_HITS", "Hits", "ListingRows", "Scanned", "SearchResult", "results", "scanned_results"]


@dataclass(frozen=True)
class SearchResult:
    """What a search found: every match counted, the closest listed (sorted by distance, then ID)."""

    match_count: int
    matches: Sequence[tuple[str, int]]
    """(ID, distance) pairs: a list, or a `WrittenListing` (a claim's arguments as a compiled loop wrote them)."""
    candidates: int
    cut: bool = False
    """The search stopped at its budget: `matches` are real matches, not necessarily the closest, and `match_count`
    a lower bound."""


Hits = tuple[np.ndarray, np.ndarray, np.ndarray]
"""What a search found in the tiers or the tail: the query, the row and the distance of each match found."""

Scanned = tuple[np.ndarray, np.ndarray, np.ndarray]
"""A block of rows a send is compared with whole (a near storm's: `MemoryIndex._scan`): each row's fingerprint
(uint64, contiguous), its number, and its member count (int32; 0: no incident holds it)."""

NO_HITS: Hits = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.uint8))


class ListingRows(Protocol):
    """What listing reads of the copy: each row's members and their count, an incident's fingerprint and row."""

    _sizes: np.ndarray
    _written: WrittenIds

    def get(self, incident_id: str) -> int | None: ...

    def _row(self, fp: int) -> int | None: ...

    def _row_count(self) -> int: ...

    def _held(self, row: int) -> str | list[str] | None: ...

    def _members_of(self, rows: np.ndarray) -> list[str | list[str] | None]: ...


def results(
    copy: ListingRows,
    found: list[Hits],
    queries: Sequence[tuple[int, str | None]],
    r: int,
    verified: np.ndarray,
    cut: np.ndarray,
    limit: int,
    *,
    few: int,
    unique: bool = False,
    shown: int = 0,
) -> list[SearchResult]:
    """Each query's result from the rows it `found` (query, row, distance): every match counted, the closest
    `limit` (0: all) listed by distance, then ID; its excluded ID left out of both. `unique`: `found` holds each
    (query, row) once (else a row several bands reached is made unique here).

    In arrays: a query's count is the sum of its rows' member counts; the distance where its cap falls is found
    from its member counts by distance, and only the rows the cap reaches are read in Python and sorted: those of
    the distances before that one, and that one's, whose IDs are compared. A near storm's query meets thousands of
    matches to list 100 (benchmarks/journal/near-storms.md): a dict entry and a Python step for each had been most
    of its search, then a sort of them all."""
    n = len(queries)
    total = sum(len(q) for q, _, _ in found)
    if total <= few:
        return _few_results(copy, found, queries, verified, cut, limit)
    query_of = np.concatenate([q for q, _, _ in found]).astype(np.int64)
    distance_of = np.concatenate([d for _, _, d in found]).astype(np.int64)
    rows = np.concatenate([rows for _, rows, _ in found]).astype(np.int64)
    if not unique:
        # one key a (query, distance, row), sorted and each once (a row several bands reached has one distance)
        span = max(copy._row_count(), 1)
        keys = np.sort((query_of * (r + 1) + distance_of) * span + rows)
        if len(keys) > 1:  # (np.unique hashes first: several times slower than the sort)
            keys = keys[np.concatenate(([True], keys[1:] != keys[:-1]))]
        rows = keys % span
        query_of, distance_of = np.divmod(keys // span, r + 1)
    excluded = np.full(n, -1, dtype=np.int64)  # the row of each query's excluded ID, if it holds one
    for k, (_, exclude) in enumerate(queries):
        fp = copy.get(exclude) if exclude is not None else None
        if fp is not None:
            row = copy._row(fp)
            assert row is not None
            excluded[k] = row
    sizes = copy._sizes[rows].astype(np.int64) - (rows == excluded[query_of])
    cell = query_of * (r + 1) + distance_of  # (query, distance)
    # each query's members by distance, and how many lie within each distance
    within = np.cumsum(np.bincount(cell, weights=sizes, minlength=n * (r + 1)).reshape(n, r + 1), axis=1)
    counts, last, need = _caps(within, r, limit)
    if limit:
        read = np.flatnonzero(distance_of <= last[query_of])  # the rows the cap reaches
        cell, rows = cell[read], rows[read]
    return _listings(copy, queries, r, verified, cut, cell, rows, counts, last, need, limit, shown)


def scanned_results(
    copy: ListingRows,
    blocks: list[Scanned],
    queries: Sequence[tuple[int, str | None]],
    fps: np.ndarray,
    r: int,
    verified: np.ndarray,
    cut: np.ndarray,
    limit: int,
    loops: Any,
    *,
    shown: int = 0,
) -> list[SearchResult]:
    """`results` of a send compared with every row of the copy (`blocks`, `MemoryIndex._scan`; `fps`: the queries'
    fingerprints, uint64, as `search_many` holds them): the same answers, counted without gathering the matches (a
    near storm's thousands a query), in two compiled passes over each block (`loops`: worker/compiled.py, or its
    numpy steps while it compiles): a query's members by distance summed from the rows' member counts, its excluded
    ID taken off at its own distance; then only the rows its cap reaches, and that hold an incident, picked out and
    listed. (A table of every distance, and a bincount and a pick of it a query, had been most of a storm send's
    search: benchmarks/journal/near-storms.md, section 15.)"""
    scan_counts, scan_picks = loops.scan_counts, loops.scan_picks  # (`copyarrays.loops`)
    n = len(queries)
    by_distance = np.zeros((n, r + 1), dtype=np.int64)
    for block, _, sizes in blocks:
        scan_counts(block, sizes, fps, r, by_distance)
    for k, (fp, exclude) in enumerate(queries):
        own = copy.get(exclude) if exclude is not None else None
        if own is not None:
            # (the excluded ID's row is found, in one block, exactly when its fingerprint lies within r)
            distance = (int(own) ^ int(fp)).bit_count()
            if distance <= r:
                by_distance[k, distance] -= 1
    counts, last, need = _caps(np.cumsum(by_distance, axis=1), r, limit)
    bound = np.minimum(last, r).astype(np.uint64)
    cells, picked = [], []
    for block, rows, sizes in blocks:
        which, at, apart = scan_picks(block, sizes, fps, bound)  # the rows the cap reaches
        cells.append(which * (r + 1) + apart)
        picked.append(rows.take(at))
    cell = np.concatenate(cells) if cells else np.zeros(0, dtype=np.int64)
    rows = np.concatenate(picked).astype(np.int64) if picked else np.zeros(0, dtype=np.int64)
    return _listings(copy, queries, r, verified, cut, cell, rows, counts, last, need, limit, shown)


def _caps(within: np.ndarray, r: int, limit: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """From each query's members within each distance (query x distance, cumulative): its count, the distance where
    its cap falls (r + 1: its every match is listed), and how many of that distance are listed."""
    n = len(within)
    counts = within[:, r].astype(np.int64)
    last = np.full(n, r + 1, dtype=np.int64)
    need = np.zeros(n, dtype=np.int64)
    if limit:
        over = counts > limit
        last[over] = np.argmax(within[over] >= limit, axis=1)
        shifted = np.concatenate([np.zeros((n, 1)), within[:, :-1]], axis=1)
        need[over] = limit - shifted[over, last[over]].astype(np.int64)
    return counts, last, need


def _listings(
    copy: ListingRows,
    queries: Sequence[tuple[int, str | None]],
    r: int,
    verified: np.ndarray,
    cut: np.ndarray,
    cell: np.ndarray,
    rows: np.ndarray,
    counts: np.ndarray,
    last: np.ndarray,
    need: np.ndarray,
    limit: int,
    shown: int,
) -> list[SearchResult]:
    """Each query's result: the rows its cap reaches (`cell`: query x (r + 1) + distance, and `rows`), listed: by
    the compiled loop where it can (`_written`), else in Python (`_listed`)."""
    n = len(queries)
    # (a stable sort of 16-bit numbers is a radix sort: 3x faster than of the int64 cells a storm's send has)
    order = np.argsort(cell.astype(np.uint16) if n * (r + 1) <= 1 << 16 else cell, kind="stable")
    cell, rows = cell[order], rows[order]
    bounds = np.searchsorted(cell, np.arange(n + 1) * (r + 1)).tolist()
    distance_of = cell % (r + 1)
    written = _written(copy, queries, rows, distance_of, bounds, last, need, limit, shown)
    members, distances = [], []
    if written is None or None in written:
        members, distances = copy._members_of(rows), distance_of.tolist()
    results = []
    for k, (_, exclude), count, candidates, stopped in zip(
        range(n), queries, counts.tolist(), verified.tolist(), cut.tolist(), strict=True
    ):
        lo, hi = bounds[k], bounds[k + 1]
        listed: Sequence[tuple[str, int]] = []
        if written is not None and written[k] is not None:
            listed = written[k]  # type: ignore[assignment]
        elif hi > lo:
            listed = _listed(members[lo:hi], distances[lo:hi], int(last[k]), int(need[k]), exclude)
        results.append(SearchResult(count, listed, candidates, stopped))
    return results


def _written(
    copy: ListingRows,
    queries: Sequence[tuple[int, str | None]],
    rows: np.ndarray,
    distances: np.ndarray,
    bounds: list[int],
    last: np.ndarray,
    need: np.ndarray,
    limit: int,
    shown: int,
) -> list[WrittenListing | None] | None:
    """Each query's listing written by the compiled loop (`compiled.write_listings`) from the copy's IDs kept as
    bytes (`copywritten.WrittenIds`), or None for a query whose rows hold an ID that is not ASCII (listed in Python:
    code point order is not the order of every such ID's bytes); None for all while the loops are not compiled
    (`copyarrays.loops`), or for a listing of all matches or of KEPT or more (more than the rows' kept IDs)."""
    write = getattr(copyarrays.loops(), "write_listings", None)
    if write is None or not 0 < limit < KEPT or not len(rows):
        return None
    first, count = copy._written.ensure(rows, copy._members_of)
    spans = np.array(bounds, dtype=np.int64)
    unwritable = np.concatenate(([0], (first < 0).cumsum()))
    usable = unwritable[spans[1:]] == unwritable[spans[:-1]]
    n = len(queries)
    exclude_row = np.full(n, -1, dtype=np.int64)
    exclude_start = np.zeros(n, dtype=np.int64)
    exclude_length = np.zeros(n, dtype=np.int64)
    excluded: list[str] = []
    at = 0
    for k, (_, exclude) in enumerate(queries):
        if exclude is not None and exclude.isascii():  # (a row holding one that is not is not written)
            fp = copy.get(exclude)
            row = copy._row(fp) if fp is not None else None
            if row is not None:
                exclude_row[k], exclude_start[k], exclude_length[k] = row, at, len(exclude)
                excluded.append(exclude)
                at += len(exclude)
    arena, item_start, item_length = copy._written.arrays()
    text, out_bounds, listed, as_json = write(
        arena,
        item_start,
        item_length,
        first - 1,
        count,
        distances,
        rows,
        spans,
        last,
        need,
        exclude_row,
        "".join(excluded).encode("ascii"),
        exclude_start,
        exclude_length,
        usable,
        shown=shown,
    )
    return [
        WrittenListing(text[out_bounds[k] : out_bounds[k + 1]], listed[k], bool(as_json[k])) if usable[k] else None
        for k in range(n)
    ]


def _few_results(
    copy: ListingRows,
    found: list[Hits],
    queries: Sequence[tuple[int, str | None]],
    verified: np.ndarray,
    cut: np.ndarray,
    limit: int,
) -> list[SearchResult]:
    """`results` of a send whose searches found few matches (`few`), in plain Python: each query's rows in a
    dict (row -> distance: a row several bands reached once), each row's members read, all of them sorted.

    The same answers: the excluded ID's row is looked up only where a row of twins may hold it (a row of one
    holds it if its one member is it), as `results` takes it off its row."""
    hits: dict[int, dict[int, int]] = {}
    for query_of, rows, distances in found:
        if len(query_of):
            for k, row, distance in zip(query_of.tolist(), rows.tolist(), distances.tolist(), strict=True):
                hits.setdefault(k, {})[row] = distance
    verified_of, cut_of = verified.tolist(), cut.tolist()
    results = []
    for k, (_, exclude) in enumerate(queries):
        mine = hits.get(k)
        if not mine:
            results.append(SearchResult(0, [], verified_of[k], cut_of[k]))
            continue
        count = 0
        listed: list[tuple[int, str]] = []
        excluded: int | None = -1  # the excluded ID's row (None: it has none), looked up at the first row of twins
        for row, distance in mine.items():
            held = copy._held(row)
            if isinstance(held, str):
                if held != exclude:
                    count += 1
                    listed.append((distance, held))
                continue
            if held is None:
                continue
            count += len(held)
            if exclude is not None:
                if excluded == -1:
                    fp = copy.get(exclude)
                    excluded = copy._row(fp) if fp is not None else None
                if row == excluded:
                    count -= 1
            # a row's members are sorted: its first `limit` (and one more, for `exclude`) are all it can give
            listed.extend((distance, m) for m in (held[: limit + 1] if limit else held) if m != exclude)
        listed.sort()
        if limit:
            del listed[limit:]
        results.append(SearchResult(count, [(m, distance) for distance, m in listed], verified_of[k], cut_of[k]))
    return results


def _listed(
    members: list[str | list[str] | None], distances: list[int], last: int, need: int, exclude: str | None
) -> list[tuple[str, int]]:
    """A query's listing from the `members` of the rows its cap reaches, sorted by their `distances`: every member
    of the distances before `last` (the one its cap falls in; beyond r: none), sorted by distance, then ID in code
    point order; then of `last`'s, the `need` smallest IDs (a storm's hundreds of rows at one distance: only their
    IDs are compared). `exclude` is left out.

    The rows come sorted by distance, so each distance's IDs are sorted as strings, apart: no (distance, ID) pair is
    made to be sorted (a near storm's query lists ~100 of ~200 rows; sorting pairs cost it 1.4x as much, measured in
    benchmarks/journal/near-storms.md)."""
    whole = bisect.bisect_left(distances, last)
    out: list[tuple[str, int]] = []
    start = 0
    while start < whole:
        distance = distances[start]
        end = bisect.bisect_right(distances, distance, start, whole)
        ids = _ids(members[start:end], 0)
        ids.sort()
        out += [(incident_id, distance) for incident_id in ids if incident_id != exclude]
        start = end
    if need:
        # a row's members are sorted: its first `need` (and one more, for `exclude`) are all it can give
        ids = _ids(members[whole:], need + 1)
        ids.sort()
        if exclude is not None and exclude in ids[:need]:  # (then the one after them moves up)
            ids.remove(exclude)
        out += [(incident_id, last) for incident_id in ids[:need]]
    return out


def _ids(members: list[str | list[str] | None], most: int) -> list[str]:
    """The IDs the rows `members` hold (at most `most` of each row of twins; 0: all)."""
    ids: list[str] = []
    for held in members:
        if isinstance(held, str):
            ids.append(held)
        elif held is not None:
            ids += held[:most] if most else held
    return ids
