"""How a tier of the worker's copy (worker/snapshot.py's `MemoryIndex`) lies in its arena: a contiguous range of rows,
their fingerprints written band after band, each band's in the order of its values, with a table of where each value
starts (or the sorted band keys, for binary searches). `MemoryIndex` decides which rows make a tier and when (the tail
sealed, merges of the binary counter, rebuilds without the rows that went); `write_tier` lays one out."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .bands import BandLayout
from .copyarrays import value_dtype

__all__ = ["Tier", "span", "tier_end", "write_tier"]


@dataclass(eq=False)
class Tier:
    """Rows first..end of the copy in numpy (those live when it was built: `size` of them).

    The copy's arena holds, from `at` on (`length` long), the tier's fingerprints themselves, band after band, per
    band in the order of their band value; a hit finds its row through the copy's `_row_of`. Where a value's
    fingerprints start there: with bands at most _DIRECT_WIDTH wide, or wider in a tier large enough
    (`MemoryIndex._direct`, worker/snapshot.py), `starts`, a table of every band's every value's first position
    (int32 while the arena is shorter than 2^31); otherwise `keys`, each of those fingerprints' band key (the band's
    base + its value), in the same order, for binary searches. A search may meet tiers of both kinds.

    `stale`: its rows that went since it was built (their fingerprints still in its postings, read and verified by
    the searches that reach them); `wasted`: the candidates searches found within their distance among those and
    threw away. Either one past its bound has the tier built anew (`MemoryIndex._rebuild`).

    `rows`: the row of each fingerprint of its run in the arena (`length` of them), so that a search reads the rows of
    its matches where it read their fingerprints (`MemoryIndex._rows_at`); None for a tier of the loaded rows only,
    whose rows are the positions of their fingerprints in the load's sorted ones (found by a binary search, no
    memory of their own: a copy of ten million loaded incidents would hold 160 MB more).
    """

    first: int
    end: int
    size: int
    at: int
    length: int
    starts: np.ndarray | None
    keys: np.ndarray | None
    rows: np.ndarray | None = None
    stale: int = 0
    wasted: int = 0


def span(tier: Tier) -> int:
    return tier.end - tier.first


def tier_end(tier: Tier) -> int:
    return tier.end


def write_tier(
    arena: np.ndarray,
    layout: BandLayout,
    fps: np.ndarray,
    rows: np.ndarray,
    *,
    first: int,
    end: int,
    at: int,
    direct: bool,
    rows_beside: bool,
) -> tuple[Tier, np.ndarray]:
    """The tier of rows first..end holding `fps` (the fingerprints of those of its rows in use, in any order; not a
    view of the arena), each of row `rows[k]`, written to `arena` from `at` on; with the arena (grown if it was too
    short). `direct`: tables of the bands' values, else sorted band keys; `rows_beside`: each fingerprint's row kept
    beside it (`Tier.rows`; not for a tier of loaded rows only)."""
    width_masks = [(1 << width) - 1 for width in layout.widths]
    shift = max(layout.widths) if layout.bands > 1 else 0
    band_bases = [band << shift for band in range(layout.bands)]
    # Every band's value -> its first position in one table (or a sorted list of band keys), so that all probes
    # of a query, over every band, are found with one gather (or one binary search). The arena holds the
    # fingerprints themselves in that order (not their rows): a probe's candidates are then read from one
    # contiguous run of memory, not gathered row by row across the whole copy (about 0.6 of the search's time at a
    # million); those within the distance find their row beside them (`Tier.rows`: a near storm's query has
    # thousands), or in a tier of loaded rows only, by a binary search of the load's fingerprints.
    length = len(fps) * layout.bands
    if len(arena) < at + length:
        # Twice what is needed, in memory the system has not handed over yet (np.zeros of a large array: pages
        # mapped on their first write), so the tiers sealed after a load are written behind the loaded one, not
        # into a copy of it: copying a 10M copy's 320 MB arena into fresh pages stopped the worker for 0.3 to 1.3
        # s at its first seal (the p99 of the snapshot path at 10M; benchmarks/journal/ten-million.md). What is
        # reserved and never written costs no resident memory; `nbytes` counts what is written.
        grown = np.zeros(2 * (at + length), dtype=np.uint64)
        grown[:at] = arena[:at]
        arena = grown
    starts, keys = [], []
    place = at
    # (the loaded rows are found in the load's own sorted fingerprints)
    run_rows = np.empty(length, dtype=np.int32 if end < 2**31 else np.int64) if rows_beside else None
    position_type = np.int32 if at + length < 2**31 else np.int64
    for offset, width_mask, width, base in zip(layout.offsets, width_masks, layout.widths, band_bases, strict=True):
        values = ((fps >> np.uint64(offset)) & np.uint64(width_mask)).astype(value_dtype(width))
        order = np.argsort(values, kind="stable")
        if direct:
            table: np.ndarray = np.empty((1 << width) + 1, dtype=position_type)
            table[0] = place
            np.cumsum(np.bincount(values, minlength=1 << width), out=table[1:])
            table[1:] += place
            starts.append(table)
        else:
            keys.append(values[order].astype(np.uint64) | np.uint64(base))
        arena[place : place + len(fps)] = fps[order]
        if run_rows is not None:
            run_rows[place - at : place - at + len(fps)] = rows[order]
        place += len(fps)
    if direct:
        return Tier(first, end, len(fps), at, length, np.concatenate(starts), None, run_rows), arena
    return Tier(first, end, len(fps), at, length, None, np.concatenate(keys), run_rows), arena
