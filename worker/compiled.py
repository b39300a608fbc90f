"""The copy's compiled loops (numba): a search's candidates read from the arena and verified in one pass; a near
storm's send compared with every row, counted and picked in two (`scan_counts`, `scan_picks`); each query's listing
sorted and written as the claim's arguments from the rows' IDs kept as bytes (`write_listings`, worker/copywritten.py).

numpy needs five passes over a send's candidates (positions, gather, the queries repeated, XOR, popcount), each an
array as long as the send: at 10M incidents ~280,000 candidates a send of 16, so each pass spills out of the cache,
even read a piece at a time. One compiled loop reads each candidate once and keeps only those within the distance:
0.62x of the pieces' time at 10M, 0.8x at 1M (benchmarks/candidates_ab.py, benchmarks/journal/pipeline.md).

Compiled once a process (`warm`), or read from numba's cache beside this file (or in its user cache) when one of
those is writable (~0.5 s instead of ~2.4 on a 2-core machine). numba is imported with this module (~0.3 s, ~100 MB):
it is imported by a worker whose read path may make a copy, in a thread of its own from the worker's start
(`copyarrays.compile_soon`; searches made meanwhile use the loops' numpy steps, `copyarrays.loops`, and list in
Python)."""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

__all__ = [
    "near_ranges",
    "probe_totals",
    "scan_counts",
    "scan_picks",
    "warm",
    "warm_listing",
    "warm_search",
    "write_listings",
]


@intrinsic
def _popcount(typingctx: Any, value: Any) -> Any:
    """The bits set in a uint64: LLVM's ctpop, one instruction on the machines numba targets."""

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        return builder.ctpop(args[0])

    return types.uint64(types.uint64), codegen


def _jit_inline(function: Any) -> Any:
    """`_jit` of a small function inlined where it is called (numba's own inlining: a call of one compiled function
    from another is otherwise a call, each array passed as its parts)."""
    try:
        return njit(cache=True, nogil=True, inline="always")(function)
    except RuntimeError:  # (as _jit's)
        return njit(nogil=True, inline="always")(function)


def _jit(function: Any) -> Any:
    """`function` compiled without the GIL, cached on disk where numba finds a writable place (else compiled in
    each process: numba refuses `cache=True` at decoration when it has none)."""
    try:
        return njit(cache=True, nogil=True)(function)
    except RuntimeError:  # (no writable cache directory: a read-only install without a home)
        return njit(nogil=True)(function)


@_jit
def _near(
    values: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    fps: np.ndarray,
    r: np.uint64,
    index: np.ndarray,
    apart: np.ndarray,
) -> int:  # pragma: no cover (compiled: its coverage is the tests of near_ranges)
    found = 0
    room = index.shape[0]
    first = 0
    for k in range(starts.shape[0]):
        query = fps[k]
        start = starts[k]
        length = lengths[k]
        for j in range(length):
            bits = values[start + j] ^ query
            if _popcount(bits) <= r:  # type: ignore[call-arg] # (an intrinsic: numba passes typingctx)
                if found < room:
                    index[found] = first + j
                    apart[found] = bits
                found += 1
        first += length
    return found


_ROOM = 4096
"""Near candidates `near_ranges` makes room for at first: an ordinary send of 16 has a few dozen; a near storm's more
(then the loop runs again with room for all it counted)."""


def near_ranges(
    values: np.ndarray, starts: np.ndarray, lengths: np.ndarray, fps: np.ndarray, r: int
) -> tuple[np.ndarray, np.ndarray]:
    """Of `values[starts[k] : starts[k] + lengths[k]]` for each k, one after the other (the candidates of a search's
    ranges), those within `r` bits of `fps[k]`: their places among all the candidates (int64, ascending) and their
    XOR with their query (uint64). The same as `apart = values.take(ranges(starts, starts + lengths)) ^
    fps.repeat(lengths); near = (np.bitwise_count(apart) <= r).nonzero()[0]; near, apart[near]`, in one pass.

    `values` and `fps` are uint64, `starts` and `lengths` int64, all contiguous; every range lies within `values`
    (the loop does not check it)."""
    room = min(int(lengths.sum()), _ROOM)
    within = np.uint64(r)  # (an int64 against the uint64 popcount would be compared as floats)
    while True:
        index = np.empty(room, dtype=np.int64)
        apart = np.empty(room, dtype=np.uint64)
        found = _near(values, starts, lengths, fps, within, index, apart)
        if found <= room:
            return index[:found], apart[:found]
        room = found


@_jit
def _scan_counts(
    fps: np.ndarray, sizes: np.ndarray, queries: np.ndarray, r: np.uint64, by_distance: np.ndarray
) -> None:  # pragma: no cover (compiled: its coverage is the tests of scan_counts)
    # every distance counted, without a branch (a storm's rows are within r or not at random: a branch on it was
    # mispredicted about half the time, 4x the loop's time at 20,000 rows), in two tables that alternate rows (a
    # row's count added before the previous row's is stored, when both lie at one distance)
    n = fps.shape[0]
    even = np.zeros(65, dtype=np.int64)
    odd = np.zeros(65, dtype=np.int64)
    for k in range(queries.shape[0]):
        query = queries[k]
        even[:] = 0
        odd[:] = 0
        j = 0
        while j + 1 < n:
            even[_popcount(fps[j] ^ query)] += sizes[j]  # type: ignore[call-arg]
            odd[_popcount(fps[j + 1] ^ query)] += sizes[j + 1]
            j += 2
        if j < n:
            even[_popcount(fps[j] ^ query)] += sizes[j]  # type: ignore[call-arg]
        for d in range(r + 1):
            by_distance[k, d] += even[d] + odd[d]


def scan_counts(fps: np.ndarray, sizes: np.ndarray, queries: np.ndarray, r: int, by_distance: np.ndarray) -> None:
    """Add to `by_distance[k, d]` (int64, query x (r + 1)) the member counts `sizes` (int32) of the fingerprints
    `fps` at distance d <= r of `queries[k]`: the same as `np.bincount(np.bitwise_count(fps ^ queries[k]),
    weights=sizes)[: r + 1]` for each k, in one pass without the query x fingerprint table of distances. A near
    storm's send is compared with every row of the copy (`MemoryIndex._scan`): the table and a bincount a query
    were most of such a send's search (benchmarks/journal/near-storms.md, section 15)."""
    _scan_counts(fps, sizes, queries, np.uint64(r), by_distance)


@_jit
def _probe_totals(table: np.ndarray, grid: np.ndarray, totals: np.ndarray) -> None:  # pragma: no cover (as _near)
    for k in range(grid.shape[0]):
        found = 0
        for p in range(grid.shape[1]):
            slot = grid[k, p]
            found += table[slot + 1] - table[slot]
        totals[k] += found


def probe_totals(table: np.ndarray, grid: np.ndarray, totals: np.ndarray) -> None:
    """Add to `totals[k]` (int64) the candidates of query k's probes in one tier's table (`grid[k]`: each probe's
    slot, int64; the tier's `starts`): the same as `totals += (table[grid + 1] - table[grid]).sum(axis=1)`, in one
    pass (`MemoryIndex._scan_counted`)."""
    _probe_totals(table, grid, totals)


@_jit
def _scan_picks(
    fps: np.ndarray,
    sizes: np.ndarray,
    queries: np.ndarray,
    bound: np.ndarray,
    which: np.ndarray,
    at: np.ndarray,
    distance: np.ndarray,
) -> int:  # pragma: no cover (compiled: its coverage is the tests of scan_picks)
    found = 0
    room = which.shape[0]
    for k in range(queries.shape[0]):
        query = queries[k]
        within = bound[k]
        for j in range(fps.shape[0]):
            d = _popcount(fps[j] ^ query)  # type: ignore[call-arg,var-annotated]
            if d <= within and sizes[j] > 0:
                if found < room:
                    which[found] = k
                    at[found] = j
                    distance[found] = d
                found += 1
    return found


def scan_picks(
    fps: np.ndarray, sizes: np.ndarray, queries: np.ndarray, bound: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each (query k, fingerprint j) with `sizes[j] > 0` and distance d <= `bound[k]` (uint64): k, j and d (int64),
    in order of k, then j. The same as `((np.bitwise_count(fps ^ queries[:, None]) <= bound[:, None]) & (sizes >
    0)).nonzero()` and the distances there, in one pass (`scan_counts`)."""
    room = min(len(fps) * len(queries), _ROOM)
    while True:
        which = np.empty(room, dtype=np.int64)
        at = np.empty(room, dtype=np.int64)
        distance = np.empty(room, dtype=np.int64)
        found = _scan_picks(fps, sizes, queries, bound, which, at, distance)
        if found <= room:
            return which[:found], at[:found], distance[:found]
        room = found


@_jit_inline
def _before(arena: np.ndarray, a: int, a_length: int, b: int, b_length: int) -> bool:  # pragma: no cover
    # (compiled: its coverage is the tests of write_listings) byte order, a prefix before what it begins
    for i in range(min(a_length, b_length)):
        x = arena[a + i]
        y = arena[b + i]
        if x != y:
            return x < y
    return a_length < b_length


@_jit_inline
def _digits(out: np.ndarray, o: int, value: int) -> int:  # pragma: no cover (as _before)
    # `value` (0 to 99,999) in decimal at out[o:], returns where it ends
    width = 1 if value < 10 else 2 if value < 100 else 3 if value < 1000 else 4 if value < 10_000 else 5
    for i in range(width - 1, -1, -1):
        out[o + i] = 48 + value % 10
        value //= 10
    return o + width


@_jit_inline
def _put(out: np.ndarray, o: int, source: np.ndarray, start: int, length: int) -> int:  # pragma: no cover
    # (as _before) source[start : start + length] at out[o:], byte by byte (a slice assignment compiles to much more
    # code: the loop's compile took 3 s), returns where it ends
    for i in range(length):
        out[o + i] = source[start + i]
    return o + length


_ENTRY_TEXT = np.frombuffer(b'{"incident_id":"","distance":', dtype=np.uint8).copy()
"""An entry's fixed text: its head (16 bytes), then what comes between its ID and its distance (13)."""


@_jit
def _write_listings(
    arena: np.ndarray,
    item_start: np.ndarray,
    item_length: np.ndarray,
    first: np.ndarray,
    count: np.ndarray,
    distances: np.ndarray,
    rows: np.ndarray,
    bounds: np.ndarray,
    last: np.ndarray,
    need: np.ndarray,
    exclude_row: np.ndarray,
    exclude: np.ndarray,
    exclude_start: np.ndarray,
    exclude_length: np.ndarray,
    usable: np.ndarray,
    as_json: bool,
    shown: int,
) -> tuple[np.ndarray, int, np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover (as _before)
    n_queries = bounds.shape[0] - 1
    # the IDs each usable query takes at most (the sort's room) and the longest of them: a bound of the bytes written
    # (an entry writes its ID and at most 47 more: an offset, its JSON's text, digits and a comma; a query at most 31)
    room, total, longest = 1, 0, 0
    for k in range(n_queries):
        if not usable[k]:
            continue
        cap, wanted, reach = last[k], need[k], 0
        for j in range(bounds[k], bounds[k + 1]):
            d = distances[j]
            if d > cap:
                continue
            taken = count[j]
            if d == cap and taken > wanted + 1:
                taken = wanted + 1
            reach += taken
            for i in range(first[j], first[j] + taken):
                longest = max(longest, item_length[i])
        total += reach
        room = max(room, reach)
    out = np.empty(total * (48 + longest) + 32 * n_queries + 1, dtype=np.uint8)
    out_bounds = np.empty(n_queries + 1, dtype=np.int64)
    out_counts = np.empty(n_queries, dtype=np.int64)
    out_json = np.empty(n_queries, dtype=np.int64)
    item = np.empty(room, dtype=np.int64)
    distance = np.empty(room, dtype=np.int64)
    key = np.empty(room, dtype=np.uint64)
    order = np.empty(room, dtype=np.int64)
    spare = np.empty(room, dtype=np.int64)
    spare_key = np.empty(room, dtype=np.uint64)
    o = 0
    for k in range(n_queries):
        out_bounds[k] = o
        out_counts[k] = 0
        out_json[k] = 0
        if not usable[k]:
            continue
        # the IDs the query's cap reaches: each row's whole before its distance, its first need + 1 there
        cap, wanted = last[k], need[k]
        e = 0
        for j in range(bounds[k], bounds[k + 1]):
            d = distances[j]
            taken = count[j]
            if d > cap:
                continue
            if d == cap and taken > wanted + 1:
                taken = wanted + 1
            for i in range(first[j], first[j] + taken):
                start, length = item_start[i], item_length[i]
                if rows[j] == exclude_row[k] and length == exclude_length[k]:
                    same = True
                    for b in range(length):
                        if arena[start + b] != exclude[exclude_start[k] + b]:
                            same = False
                            break
                    if same:
                        continue
                # its distance, then its first 8 bytes (ASCII: 7 bits each; 0 past its end), as one number: the order
                # of these numbers is the listing's, but for IDs whose first 8 bytes are the same
                word = np.uint64(d)
                for b in range(8):
                    word = word << np.uint64(7)
                    if b < length:
                        word = word | np.uint64(arena[start + b])
                item[e] = i
                distance[e] = d
                key[e] = word
                order[e] = e
                e += 1
        # sorted by (distance, ID): the numbers with their places, by an insertion sort of each 16 and then a merge
        # sort, bottom up, between two pairs of buffers (a comparison is of two numbers read in order, not of two
        # distances and two first words read through their places: with the helpers inlined, the loop took 12.6 us
        # instead of 15.2 a storm query; benchmarks/journal/near-storms.md, section 19); then each run of equal
        # numbers by its IDs' bytes
        for lo in range(0, e, 16):
            for i in range(lo + 1, min(lo + 16, e)):
                word, x = key[i], order[i]
                j = i - 1
                while j >= lo and key[j] > word:
                    key[j + 1] = key[j]
                    order[j + 1] = order[j]
                    j -= 1
                key[j + 1] = word
                order[j + 1] = x
        key_from, source, key_to, target = key, order, spare_key, spare
        width = 16
        while width < e:
            for lo in range(0, e, 2 * width):
                mid = min(lo + width, e)
                end = min(lo + 2 * width, e)
                a, b, t = lo, mid, lo
                while a < mid and b < end:
                    if key_from[b] < key_from[a]:
                        key_to[t] = key_from[b]
                        target[t] = source[b]
                        b += 1
                    else:
                        key_to[t] = key_from[a]
                        target[t] = source[a]
                        a += 1
                    t += 1
                for c in range(a, mid):  # (what is left of either run)
                    key_to[t] = key_from[c]
                    target[t] = source[c]
                    t += 1
                for c in range(b, end):
                    key_to[t] = key_from[c]
                    target[t] = source[c]
                    t += 1
            key_from, source, key_to, target = key_to, target, key_from, source
            width *= 2
        t = 0
        while t < e:
            u = t + 1
            while u < e and key_from[u] == key_from[t]:
                u += 1
            for v in range(t + 1, u):  # (IDs alike in their first 8 bytes: rare, a few of them)
                x = source[v]
                j = v - 1
                while j >= t:
                    p, q = item[x], item[source[j]]
                    if not _before(arena, item_start[p], item_length[p], item_start[q], item_length[q]):
                        break
                    source[j + 1] = source[j]
                    j -= 1
                source[j + 1] = x
            t = u
        # listed: every ID before the cap's distance, then the first `need` of its
        n, at_cap, plain, entries = 0, 0, True, 0
        for t in range(e):
            x = source[t]
            d = distance[x]
            if d == cap:
                if at_cap >= wanted:
                    break
                at_cap += 1
            i = item[x]
            start, length = item_start[i], item_length[i]
            for b in range(start, start + length):
                c = arena[b]
                if c < 32 or c == 34 or c == 92 or c == 127:  # (JSON would escape it)
                    plain = False
            entries += length + (1 if d < 10 else 2) + 31  # (an entry and the comma after it)
            n += 1
        # (the listing is source[:n]: the sorted IDs up to the cap)
        out_counts[k] = n
        entries -= 1 if n else 0
        if plain and as_json and entries + 1 < 1 << 20:
            # one argument, the listing as its alert's JSON (worker/lua/claim_json.lua):
            # $<length>\r\n<n>/<m>:<offsets, 5 hex digits each, n + 1>[<entries joined by ','>\r\n, the ',' after
            # the m-th (the alert's last: the `shown`th, or the last) a ']': its JSON as the alert lists it
            m = n if shown <= 0 or shown >= n else shown
            width = 1 if n < 10 else 2 if n < 100 else 3 if n < 1000 else 4 if n < 10_000 else 5
            width_m = 1 if m < 10 else 2 if m < 100 else 3 if m < 1000 else 4 if m < 10_000 else 5
            out_json[k] = 1
            out[o] = 36
            o = _digits(out, o + 1, width + 1 + width_m + 1 + 5 * (n + 1) + 1 + entries + (1 if m == n else 0))
            out[o] = 13
            out[o + 1] = 10
            o = _digits(out, o + 2, n)
            out[o] = 47
            o = _digits(out, o + 1, m)
            out[o] = 58
            o += 1
            at = 0
            for t in range(n + 1):
                for h in range(5):
                    digit = (at >> (4 * (4 - h))) & 15
                    out[o + h] = 48 + digit if digit < 10 else 87 + digit
                o += 5
                if t < n:
                    x = source[t]
                    at += item_length[item[x]] + (1 if distance[x] < 10 else 2) + 31
            out[o] = 91
            o += 1
            for t in range(n):
                x = source[t]
                d = distance[x]
                start, length = item_start[item[x]], item_length[item[x]]
                if t:
                    out[o] = 93 if t == m else 44
                    o += 1
                o = _put(out, o, _ENTRY_TEXT, 0, 16)
                o = _put(out, o, arena, start, length)
                o = _put(out, o, _ENTRY_TEXT, 16, 13)
                o = _digits(out, o, d)
                out[o] = 125
                o += 1
            if m == n:
                out[o] = 93
                o += 1
            out[o] = 13
            out[o + 1] = 10
            o += 2
            continue
        for t in range(n):
            x = source[t]
            d = distance[x]
            i = item[x]
            start, length = item_start[i], item_length[i]
            # $<length>\r\n<ID>\r\n$<digits>\r\n<distance>\r\n
            out[o] = 36
            o = _digits(out, o + 1, length)
            out[o] = 13
            out[o + 1] = 10
            o = _put(out, o + 2, arena, start, length)
            out[o] = 13
            out[o + 1] = 10
            out[o + 2] = 36
            out[o + 3] = 49 if d < 10 else 50
            out[o + 4] = 13
            out[o + 5] = 10
            o = _digits(out, o + 6, d)
            out[o] = 13
            out[o + 1] = 10
            o += 2
    out_bounds[n_queries] = o
    return out, o, out_bounds, out_counts, out_json


def write_listings(
    arena: np.ndarray,
    item_start: np.ndarray,
    item_length: np.ndarray,
    first: np.ndarray,
    count: np.ndarray,
    distances: np.ndarray,
    rows: np.ndarray,
    bounds: np.ndarray,
    last: np.ndarray,
    need: np.ndarray,
    exclude_row: np.ndarray,
    exclude: bytes,
    exclude_start: np.ndarray,
    exclude_length: np.ndarray,
    usable: np.ndarray,
    as_json: bool = True,
    shown: int = 0,
) -> tuple[str, list[int], list[int], list[int]]:
    """Each usable query's listing written as a claim's arguments (`copywritten`): the same IDs, in the same order,
    as `copylisting._listed` lists, without a Python object a match (a near storm's claim lists 116 of them: about
    half of a storm worker's time).

    Query k's rows are `rows[bounds[k] : bounds[k + 1]]`, at `distances` (0 to 64), each with its IDs (its members, or
    its first ones: every one a listing can take) `arena[item_start[i] : item_start[i] + item_length[i]]` for i from
    `first[j]`, `count[j]` of them, ASCII and sorted. Listed: every ID before the distance `last[k]`, then the first
    `need[k]` of that distance, by distance then byte order (code point order, for ASCII), the ID
    `exclude[exclude_start[k] :][: exclude_length[k]]` of row `exclude_row[k]` (-1: none) left out.

    Written as one argument, the listing as its alert's JSON (`as_json`, and no ID that JSON escapes:
    worker/lua/claim_json.lua; its array closed after the alert's first `shown` matches, 0: after them all), else as
    two arguments a match (`$<length>\r\n<ID>\r\n` and the distance's likewise,
    as `snapshotadds._listing` writes them). Returns them all, where each query's start (n + 1), how many each listed,
    and whether each was written as JSON."""
    out, end, out_bounds, out_counts, out_json = _write_listings(
        arena,
        item_start,
        item_length,
        first,
        count,
        distances,
        rows,
        bounds,
        last,
        need,
        exclude_row,
        # (a copy, writable, as every array passed here: numba compiles the loop again, in the caller's thread, for
        # each new combination of read-only and writable arrays, and `warm` compiles the one used)
        np.frombuffer(exclude, dtype=np.uint8).copy() if exclude else np.zeros(1, dtype=np.uint8),
        exclude_start,
        exclude_length,
        usable,
        as_json,
        shown,
    )
    return out[:end].tobytes().decode("ascii"), out_bounds.tolist(), out_counts.tolist(), out_json.tolist()


def warm() -> None:
    """Compile (or load from the cache) the loops now rather than in the first search: a call on one candidate (numba
    compiles once a process, under its own lock; later calls only run it). `copyarrays.compile_soon` calls it once,
    the search's loops first (`warm_search`: about 0.8 s without a cache), then the listing's (`warm_listing`: 1.6 s
    more), so that a copy made in a storm searches compiled while the listing's compiles."""
    warm_search()
    warm_listing()


def warm_search() -> None:
    """`warm` of the search's loops: `near_ranges`, `scan_counts`, `scan_picks`, `probe_totals` (with a table of
    int32 positions: a copy's arena under 2^31 entries, `copytiers`)."""
    one = np.zeros(1, dtype=np.uint64)
    near_ranges(one, np.zeros(1, dtype=np.int64), np.ones(1, dtype=np.int64), one, 0)
    sizes = np.ones(1, dtype=np.int32)  # (a copy's member counts: MemoryIndex._sizes)
    scan_counts(one, sizes, one, 0, np.zeros((1, 1), dtype=np.int64))
    scan_picks(one, sizes, one, one)
    probe_totals(np.zeros(2, dtype=np.int32), np.zeros((1, 1), dtype=np.int64), np.zeros(1, dtype=np.int64))


def warm_listing() -> None:
    """`warm` of the listing's loop, `write_listings`, with the very argument types a copy's listing passes
    (copylisting._written): numba compiles again, in the caller's thread, for any other."""
    ints = np.array([0, 1], dtype=np.int64)
    write_listings(
        np.zeros(1, dtype=np.uint8),
        ints[:1],
        ints[1:],
        ints[:1],
        np.ones(1, dtype=np.int32),
        ints[:1],
        ints[:1],
        ints,
        ints[1:],
        ints[:1],
        ints[:1] - 1,
        b"a",
        ints[:1],
        ints[:1],
        np.ones(1, dtype=bool),
    )
