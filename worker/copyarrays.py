"""The array steps the worker's copy (worker/snapshot.py, worker/loadedrows.py) is built from: ranges of positions
in one array, a 1-d tile, where consecutive pieces start and end, a band's value type, which bands reach a
candidate (a near storm's search keeps a row once, from the first band that reaches it), and the search's loops:
worker/compiled.py's, compiled in a thread once a process (`compile_soon`), or their numpy steps until then
(`loops`).

Each is a few numpy calls without numpy's module-level wrappers: the copy's search calls them for every send, where
a module function's own dispatch costs microseconds (benchmarks/journal/pipeline.md)."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import numpy as np

from .bands import BandLayout, probe_radii
from .logs import error_message, get_logger

__all__ = [
    "PLAIN_LOOPS",
    "BandReach",
    "bounds",
    "compile_soon",
    "distance_table",
    "loops",
    "ranges",
    "tile",
    "value_dtype",
]


def tile(values: np.ndarray, times: int) -> np.ndarray:
    """`np.tile` of a 1-d array (times >= 1), without its Python-level steps."""
    return values if times == 1 else np.concatenate([values] * times)


def ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """starts[0]..ends[0], starts[1]..ends[1], ... (each end left out) as one array, without a Python loop."""
    counts = ends - starts
    offsets = counts.cumsum()
    if not len(offsets) or not offsets[-1]:
        return np.zeros(0, dtype=np.int64)
    # the k-th element of range i is starts[i] + k, at position offsets[i] - counts[i] + k of the result
    return (starts - offsets + counts).repeat(counts) + np.arange(int(offsets[-1]))


def bounds(lengths: np.ndarray) -> tuple[list[int], list[int]]:
    """Where each of consecutive pieces of `lengths` starts and ends."""
    ends = lengths.cumsum()
    return (ends - lengths).tolist(), ends.tolist()


def value_dtype(width: int) -> type[np.unsignedinteger]:
    """The narrowest unsigned type of a band's values: numpy sorts 8- and 16-bit keys by radix, in linear time."""
    return np.uint8 if width <= 8 else np.uint16 if width <= 16 else np.uint32 if width <= 32 else np.uint64


class BandReach:
    """Through which bands a query's probes reach a candidate, from the candidate's XOR with the query (`apart`).

    A band reaches a fingerprint when their values there differ in at most its probe radius at the query's distance:
    its probes are every mask of that many bits or fewer (`BandLayout.masks`). So whether two bands found the same row
    is a popcount a band, no look-up."""

    def __init__(self, layout: BandLayout) -> None:
        self._layout = layout
        self._offsets = [np.uint64(offset) for offset in layout.offsets]
        self._width_masks = [np.uint64((1 << width) - 1) for width in layout.widths]
        self._tests: dict[int, list[tuple[int, np.uint64, np.uint64, int]]] = {}

    def tests(self, r: int) -> list[tuple[int, np.uint64, np.uint64, int]]:
        """Each band a query within `r` probes (a prefix of the bands): its number, offset, mask and probe radius."""
        tests = self._tests.get(r)
        if tests is None:
            radii = probe_radii(self._layout.bands, r)
            tests = [
                (band, offset, width_mask, radius)
                for band, (offset, width_mask, radius) in enumerate(
                    zip(self._offsets, self._width_masks, radii, strict=True)
                )
                if radius >= 0
            ]
            self._tests[r] = tests
        return tests

    def later(self, apart: np.ndarray, band_of: np.ndarray, r: int) -> np.ndarray:
        """Which candidates (`apart`, read through the band `band_of[k]`) an earlier band reached too. For a query
        whose ranges were all read whole, that band's read found the same row: the later ones are the same match
        again (a storm's query reaches half of its rows through two bands or more: twice the arrays to read on, and
        a sort to make them unique)."""
        again = np.zeros(len(apart), dtype=bool)
        for band, offset, width_mask, radius in self.tests(r)[:-1]:
            reached = np.bitwise_count((apart >> offset) & width_mask) <= radius
            again |= reached & (band_of > band)
        return again

    def count(self, apart: np.ndarray, r: int) -> np.ndarray:
        """Through how many bands a query's probes reach each candidate."""
        weight = np.zeros(len(apart), dtype=np.int64)
        for _, offset, width_mask, radius in self.tests(r):
            weight += np.bitwise_count((apart >> offset) & width_mask) <= radius
        return weight


def distance_table(fps: np.ndarray, queries: np.ndarray, step: int) -> np.ndarray:
    """The bits each of `queries` differs in from each of `fps` (uint8, query x fingerprint), their XORs made about
    `step` (query, fingerprint) pairs at a time (an XOR of all at once would take 8 bytes a pair)."""
    if len(queries) * len(fps) <= step:
        return np.bitwise_count(fps ^ queries[:, None])
    distances = np.empty((len(queries), len(fps)), dtype=np.uint8)
    rows = max(1, step // max(len(fps), 1))
    for first in range(0, len(queries), rows):
        np.bitwise_count(fps ^ queries[first : first + rows, None], out=distances[first : first + rows])
    return distances


_PLAIN_STEP = 1 << 20
"""(query, fingerprint) pairs whose XORs `PLAIN_LOOPS` makes at a time (8 MB)."""


def _plain_near_ranges(
    values: np.ndarray, starts: np.ndarray, lengths: np.ndarray, fps: np.ndarray, r: int
) -> tuple[np.ndarray, np.ndarray]:
    apart = values.take(ranges(starts, starts + lengths)) ^ fps.repeat(lengths)
    near = (np.bitwise_count(apart) <= r).nonzero()[0]
    return near, apart[near]


def _plain_scan_counts(
    fps: np.ndarray, sizes: np.ndarray, queries: np.ndarray, r: int, by_distance: np.ndarray
) -> None:
    distances = distance_table(fps, queries, _PLAIN_STEP)
    for k in range(len(queries)):
        by_distance[k] += np.bincount(distances[k], weights=sizes, minlength=r + 1)[: r + 1].astype(np.int64)


def _plain_scan_picks(
    fps: np.ndarray, sizes: np.ndarray, queries: np.ndarray, bound: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    distances = distance_table(fps, queries, _PLAIN_STEP)
    which, at = ((distances <= bound[:, None]) & (sizes > 0)).nonzero()
    return which, at, distances[which, at].astype(np.int64)


def _plain_probe_totals(table: np.ndarray, grid: np.ndarray, totals: np.ndarray) -> None:
    totals += (table[grid + 1] - table[grid]).sum(axis=1)


PLAIN_LOOPS = SimpleNamespace(
    near_ranges=_plain_near_ranges,
    scan_counts=_plain_scan_counts,
    scan_picks=_plain_scan_picks,
    probe_totals=_plain_probe_totals,
)
"""worker/compiled.py's loops as the numpy steps their docstrings give (the same answers, slower): what a copy
searches with while its thread still compiles them (`loops`), so that a copy made in the middle of a storm
(`READ_PATH=auto`'s switch) searches at once rather than wait for numba (0.2 to 1.3 s)."""


_compiling = threading.Lock()
_compiler: threading.Thread | None = None
_compiled: Any = None
"""worker/compiled.py once `compile_soon`'s thread ran its loops; PLAIN_LOOPS for good when they could not be had
(numba or llvmlite missing or broken, or a host that refuses to run code a process made, as a hardened container
may): the worker searches on, slower, and says so once; None until then."""


def compile_soon() -> None:
    """Import and compile the copy's loops (worker/compiled.py: numba, ~2.4 s, or ~0.5 s from its cache) in a
    thread, once a process. A worker whose read path may make a copy (`snapshot`, or `auto`, which makes one at a
    storm) calls it as it starts (`Processor.choose_read_path`), so that a storm met later finds them ready: a copy
    made while they compile searches with their numpy steps and lists in Python (`loops`), at about half the storm's
    rate for those seconds, and numba's 100 MB are in the worker's memory from its start rather than arriving in
    the middle of a storm. A `primary` worker never imports numba."""
    global _compiler
    with _compiling:
        if _compiler is None:
            _compiler = threading.Thread(target=_compile, name="compile-search", daemon=True)
            _compiler.start()


def wait_compiled(timeout: float | None = None) -> None:
    """Start `compile_soon` if need be and wait for its thread (the benchmark's workers, before their clock starts;
    tests that hold the compiled loops to their answers)."""
    compile_soon()
    compiler = _compiler
    assert compiler is not None
    compiler.join(timeout)


_searching: Any = None
"""The search's loops alone, compiled (worker/compiled.py's `warm_search`), while the listing's still compiles:
`_compiled` is this object until then."""


def _compile() -> None:
    global _compiled, _searching
    try:
        from . import compiled

        compiled.warm_search()
    except Exception as error:  # (the numpy steps answer alike: a copy that cannot compile still searches)
        _compiled = PLAIN_LOOPS
        get_logger().error(
            "the copy's compiled search loops could not be loaded; searching with numpy's steps, slower",
            error=error_message(error),
            hint=_COMPILE_HINT,
        )
        return
    _searching = SimpleNamespace(
        near_ranges=compiled.near_ranges,
        scan_counts=compiled.scan_counts,
        scan_picks=compiled.scan_picks,
        probe_totals=compiled.probe_totals,
    )
    _compiled = _searching  # (searches use them now; listings in Python until the listing's loop is had too)
    try:
        compiled.warm_listing()
    except Exception as error:
        _compiled = SimpleNamespace(**vars(_searching))  # (for good: not `_searching`, which loops() would retry)
        get_logger().error(
            "the copy's compiled listing loop could not be loaded; listing matches in Python, slower",
            error=error_message(error),
            hint=_COMPILE_HINT,
        )
        return
    _compiled = compiled


_COMPILE_HINT = (
    "check the numba and llvmlite the worker runs with (`make install`), and that its host lets a process run code it"
    " compiled (a seccomp, W^X or SELinux execmem rule may not)"
)


def loops() -> Any:
    """The search's loops: worker/compiled.py once `compile_soon`'s thread is done, their numpy steps until then
    (`PLAIN_LOOPS`), and for good if the loops could not be had; the search's loops without the listing's while that
    one compiles (`_searching`: its listings are made in Python). A copy made as a storm begins, `READ_PATH=auto`'s,
    sent its first claims 0.2 s late waiting for the compiler (benchmarks/journal/near-storms.md, section 16), and
    the listing's loop alone takes about twice the others' compile."""
    now = _compiled
    if now is None or now is _searching:
        compiler = _compiler
        if compiler is None or compiler.is_alive():
            return PLAIN_LOOPS if now is None else now
        _compile()  # (its thread is gone before it finished: this process was forked while it ran)
    return _compiled
