"""Listing a search's matches in the worker's copy (worker/snapshot.py's `MemoryIndex`): each query's matches counted,
the closest `limit` listed by distance, then ID in code point order, its excluded ID left out of both.

A send's searches give the rows they found (query, row, distance). With few of them (an ordinary send), each query's
rows go in a dict and every member is listed and sorted in plain Python; with many (a near storm: thousands of
matches a query to list 100, benchmarks/journal/near-storms.md), in arrays: a query's rows sorted by distance once,
its count the sum of its rows' member counts, and only the rows the cap reaches read in Python. Both give the same
answers (tests/test_snapshot.py runs the property tests through each).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

__all__ = ["NO_HITS", "Hits", "ListingRows", "SearchResult", "results"]


@dataclass(frozen=True)
class SearchResult:
    """What a search found: every match counted, the closest listed (sorted by distance, then ID)."""

    match_count: int
    matches: list[tuple[str, int]]
    candidates: int
    cut: bool = False
    """The search stopped at its budget: `matches` are real matches, not necessarily the closest, and `match_count`
    a lower bound."""


Hits = tuple[np.ndarray, np.ndarray, np.ndarray]
"""What a search found in the tiers or the tail: the query, the row and the distance of each match found."""

NO_HITS: Hits = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.uint8))


class ListingRows(Protocol):
    """What listing reads of the copy: each row's members and their count, an incident's fingerprint and row."""

    _sizes: np.ndarray

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
) -> list[SearchResult]:
    """Each query's result from the rows it `found` (query, row, distance): every match counted, the closest
    `limit` (0: all) listed by distance, then ID; its excluded ID left out of both.

    In arrays: a query's rows are sorted by distance once (a row found through several bands kept once), its
    count is the sum of its rows' member counts, and only the rows the cap reaches are read in Python: those of
    the distances before the one where the cap falls, and that one's, whose IDs are compared. A near storm's query
    meets thousands of matches to list 100 (benchmarks/journal/near-storms.md): a dict entry and a Python step
    for each had been most of its search."""
    n = len(queries)
    total = sum(len(q) for q, _, _ in found)
    if total <= few:
        return _few_results(copy, found, queries, verified, cut, limit)
    span = max(copy._row_count(), 1)
    query_of = np.concatenate([q for q, _, _ in found]).astype(np.int64)
    distance_of = np.concatenate([d for _, _, d in found]).astype(np.int64)
    row_of = np.concatenate([rows for _, rows, _ in found]).astype(np.int64)
    # one key a (query, distance, row), sorted and each once (a row several bands reached has one distance)
    keys = (query_of * (r + 1) + distance_of) * span + row_of
    keys.sort()
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
    counts = np.bincount(query_of, weights=sizes, minlength=n).astype(np.int64).tolist()
    bounds = query_of.searchsorted(np.arange(n + 1)).tolist()
    results = []
    for k, (_, exclude) in enumerate(queries):
        lo, hi = bounds[k], bounds[k + 1]
        listed = _listed(copy, rows[lo:hi], distance_of[lo:hi], sizes[lo:hi], exclude, limit) if hi > lo else []
        results.append(SearchResult(counts[k], listed, int(verified[k]), bool(cut[k])))
    return results


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
    copy: ListingRows, rows: np.ndarray, distances: np.ndarray, sizes: np.ndarray, exclude: str | None, limit: int
) -> list[tuple[str, int]]:
    """The closest `limit` (0: all) members of `rows` (sorted by distance; `sizes` their members other than
    `exclude`), sorted by distance, then ID in code point order. Every member of the distances before the one
    the cap falls in is listed; of that one, the smallest IDs the cap has room for (a storm's thousands of rows
    at one distance: only their IDs are compared)."""
    whole, last, need, end = len(rows), 0, 0, len(rows)
    if limit:
        reached = sizes.cumsum()
        if int(reached[-1]) > limit:
            last = int(distances[int(reached.searchsorted(limit))])  # the distance where the cap falls
            whole = int(distances.searchsorted(last, side="left"))
            need = limit - (int(reached[whole - 1]) if whole else 0)
            end = int(distances.searchsorted(last, side="right"))
    members = copy._members_of(rows[:end] if need else rows[:whole])
    listed: list[tuple[int, str]] = []
    twins: list[tuple[int, list[str]]] = []
    for distance, held in zip(distances[:whole].tolist(), members[:whole], strict=True):
        if isinstance(held, str):
            listed.append((distance, held))
        elif held is not None:
            twins.append((distance, held))
    for distance, group in twins:
        listed.extend((distance, m) for m in group)
    if exclude is not None:
        listed = [pair for pair in listed if pair[1] != exclude]
    listed.sort()
    out = [(incident_id, distance) for distance, incident_id in listed]
    if need:
        ids: list[str] = []
        for held in members[whole:]:
            if isinstance(held, str):
                ids.append(held)
            elif held is not None:
                # a row's members are sorted: its first `need` (and one more, for `exclude`) are all it can give
                ids.extend(held[: need + 1])
        if exclude is not None:
            ids = [m for m in ids if m != exclude]
        ids.sort()
        out.extend((incident_id, last) for incident_id in ids[:need])
    return out
