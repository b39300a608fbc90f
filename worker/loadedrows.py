"""The incidents a worker's copy was loaded with (`MemoryIndex`'s base), in numpy arrays and one bytes blob.

A copy of ten million incidents held as Python objects (a dict of str -> int, a list of members) costs over 200
bytes an incident; here it is a few arrays: the IDs' UTF-8 bytes one after the other (and where each starts), a
sorted table of their hashes (each with its incident in its low bits), each incident's row, and each row's fingerprint
and members (a CSR), about 36 bytes an incident besides the fingerprints' bands. Lookups stay exact: an ID's hash only
says where to look, the bytes themselves are compared, so IDs that hash alike are told apart.

Built by sorts of the keys themselves, never an argsort: at 10M an argsort of 64-bit values took 1.7 s against 0.3 s
for a sort here (it reads the values it compares from all over memory), and the load sorted twice.

Nothing here changes after it is built: the copy keeps its own record of what changed since (which incidents went,
which rows were given other members) in front of it (worker/snapshot.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from .copyarrays import ranges

__all__ = ["LoadedRows", "RowsBuilder", "parse_stored_fingerprints"]

_id_hash = hash
"""The hash of an ID's UTF-8 bytes (Python's, salted per process: the table never leaves it). Tests put a poor one
here to make IDs collide."""


_ALL_BITS = (1 << 64) - 1

_PREFIX = 24
"""Bytes of each twin's ID compared in arrays (a multiple of 8); a row of longer IDs alike in these: one by one."""


def _index_bits(count: int) -> int:
    """Bits that number `count` incidents (at least one)."""
    return max(count - 1, 1).bit_length()


def _argsort_uint64(values: np.ndarray) -> np.ndarray:
    """The order that sorts `values` (equal ones in their order): the values with their position in the low bits,
    sorted themselves (several times faster than an argsort at 10M), then the few that share their other bits sorted
    again by the whole value."""
    count = len(values)
    shift = _index_bits(count)
    low = np.uint64((1 << shift) - 1)
    keys = (values & ~low) | np.arange(count, dtype=np.uint64)
    keys.sort()
    tops = keys >> np.uint64(shift)
    keys &= low
    order = keys.view(np.int64)
    del keys
    tie = tops[1:] == tops[:-1]
    del tops
    if tie.any():
        tied = np.zeros(count, dtype=bool)
        tied[:-1] = tie
        tied[1:] |= tie
        where = np.flatnonzero(tied)
        among = order[where]  # ascending by their top bits, and by position within: the whole value decides
        order[where] = among[np.argsort(values[among], kind="stable")]
    return order


def parse_stored_fingerprints(values: Sequence[bytes | str]) -> np.ndarray | None:
    """The fingerprints of `values` (16 hex digits each, as `{N}:fp` holds them) in one numpy step, or None when some
    value is not 16 hex digits (the caller then reads them one by one, `stored_fingerprint`)."""
    if not values:
        return np.zeros(0, dtype=np.uint64)
    text = not isinstance(values[0], bytes)
    joined = "".join(values).encode("utf-8", "replace") if text else b"".join(values)  # type: ignore[arg-type]
    if len(joined) != 16 * len(values):
        return None
    try:
        raw = bytes.fromhex(joined.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return None
    if len(raw) != 8 * len(values):  # whitespace, which fromhex skips, took the place of digits somewhere
        return None
    return np.frombuffer(raw, dtype=">u8").astype(np.uint64)


class RowsBuilder:
    """Collects (IDs, fingerprints) in chunks, then builds the `LoadedRows` of them; an ID given again: its last."""

    def __init__(self) -> None:
        self._blobs: list[bytes] = []
        self._lengths: list[np.ndarray] = []
        self._hashes: list[np.ndarray] = []
        self._fps: list[np.ndarray] = []

    def add(self, ids: Sequence[bytes], fps: np.ndarray) -> None:
        """`ids` as UTF-8 bytes, `fps` as uint64, in the same order."""
        if len(ids) != len(fps):
            raise ValueError(f"{len(ids)} IDs and {len(fps)} fingerprints")
        self._blobs.append(b"".join(ids))
        self._lengths.append(np.fromiter(map(len, ids), dtype=np.int64, count=len(ids)))
        self._hashes.append(np.fromiter(map(_id_hash, ids), dtype=np.int64, count=len(ids)))
        self._fps.append(np.asarray(fps, dtype=np.uint64))

    def add_pairs(self, pairs: Iterable[tuple[str, int]], chunk: int = 100_000) -> list[tuple[str, int]]:
        """Adds `pairs`; returns those whose ID has no bytes (a lone surrogate Redis could not have sent), in order,
        for the caller to hold elsewhere."""
        ids: list[bytes] = []
        fps: list[int] = []
        left: list[tuple[str, int]] = []
        for incident_id, fp in pairs:
            try:
                ids.append(incident_id.encode("utf-8", "surrogateescape"))
            except UnicodeEncodeError:
                left.append((incident_id, fp))
                continue
            fps.append(fp)
            if len(ids) >= chunk:
                self.add(ids, np.array(fps, dtype=np.uint64))
                ids, fps = [], []
        if ids:
            self.add(ids, np.array(fps, dtype=np.uint64))
        return left

    def build(self) -> LoadedRows | None:
        """The rows, or None when nothing was added."""
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, dtype=np.int64)
        if not len(lengths):
            return None
        blob = b"".join(self._blobs)
        self._blobs = []
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        del lengths
        hashes = np.concatenate(self._hashes)
        fps = np.concatenate(self._fps)
        self._lengths, self._hashes, self._fps = [], [], []
        return LoadedRows(blob, offsets, hashes, fps)


class LoadedRows:
    """Incidents 0..n-1 (their IDs in `blob`), each in a row of a distinct fingerprint; rows sorted by fingerprint.

    An incident given twice (the same ID bytes) keeps its last fingerprint; the earlier one is `dropped` from the
    start, as if it had gone (in no row, not found by its ID).

    The IDs' table, `hashes`, is one sorted uint64 an incident: the top bits of its ID's hash, then in the low
    `_shift` bits the incident itself. Sorting those keys themselves is several times faster than an argsort of the
    hashes at 10M (an argsort reads the values it compares from all over memory), and the table needs no second array
    of whose each hash is; IDs whose hashes share their top bits are told apart by their bytes, as any that hash alike.
    The rows are sorted the same way: fingerprints with the incident in their low bits, then the few that share their
    other bits sorted again by the whole fingerprint.
    """

    def __init__(self, blob: bytes, offsets: np.ndarray, hashes: np.ndarray, fps: np.ndarray) -> None:
        count = len(hashes)
        self.blob = blob
        self.offsets = offsets
        self._shift = _index_bits(count)
        low = np.uint64((1 << self._shift) - 1)
        table = (np.asarray(hashes, dtype=np.int64).view(np.uint64) & ~low) | np.arange(count, dtype=np.uint64)
        table.sort()
        keep = np.ones(count, dtype=bool)
        tops = table >> np.uint64(self._shift)
        same = np.flatnonzero(tops[1:] == tops[:-1])
        del tops
        if len(same):
            self._drop_repeats((table & low).view(np.int64), same, keep)
        fps = np.asarray(fps, dtype=np.uint64)
        kept: np.ndarray | None = None  # the incidents kept, when some were dropped
        if keep.all():
            self.hashes = table
        else:
            self.hashes = table[keep[(table & low).astype(np.intp)]]
            kept = np.flatnonzero(keep)
            fps = fps[kept]
        del table
        self.dropped = count - len(fps)
        index_type = np.int32 if count < 2**31 else np.int64
        # the rows: distinct fingerprints, sorted; one sort gives them and their members, row after row
        order = _argsort_uint64(fps)
        ordered = fps[order]
        del fps
        first = np.empty(len(ordered), dtype=bool)
        first[:1] = True
        np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
        self.fps = ordered[first]
        starts = np.flatnonzero(first)
        del ordered
        self.row_start = np.append(starts, len(order)).astype(np.int64)
        self.members = (order if kept is None else kept[order]).astype(index_type)  # incidents, row after row
        self.row_of = np.full(count, -1, dtype=index_type)  # each incident's row (-1: dropped)
        row: np.ndarray = np.cumsum(first, dtype=index_type)
        np.subtract(row, 1, out=row)
        self.row_of[self.members] = row
        del row
        counts = np.diff(self.row_start)
        del first, starts, order, kept
        twins = np.flatnonzero(counts > 1)
        if len(twins):
            self._order_twins(twins)

    def _order_twins(self, twins: np.ndarray) -> None:
        """Each of the rows `twins` (of more than one incident) holds its IDs in code point (UTF-8 byte) order.

        In arrays: the IDs' first `_PREFIX` bytes (zero-padded) as big-endian words, then their lengths, sort them as
        their bytes sort (a prefix first); only rows where two IDs longer than that share it are sorted one by one.
        """
        starts, ends = self.row_start[twins], self.row_start[twins + 1]
        slots = ranges(starts, ends)
        incidents = self.members[slots].astype(np.int64)
        row = np.repeat(np.arange(len(twins)), ends - starts)
        begin = self.offsets[incidents]
        lengths = self.offsets[incidents + 1] - begin
        taken = np.minimum(lengths, _PREFIX)
        padded = np.zeros(len(incidents) * _PREFIX, dtype=np.uint8)
        at = np.arange(len(incidents), dtype=np.int64) * _PREFIX
        padded[ranges(at, at + taken)] = np.frombuffer(self.blob, dtype=np.uint8)[ranges(begin, begin + taken)]
        words = padded.view(">u8").reshape(len(incidents), _PREFIX // 8).astype(np.uint64)
        order = np.lexsort((lengths, *words.T[::-1], row))
        self.members[slots] = incidents[order]
        # two neighbours of a row both longer than the prefix, and alike in it: that row one by one
        words, lengths, row = words[order], lengths[order], row[order]
        alike = (row[1:] == row[:-1]) & (lengths[1:] > _PREFIX) & (lengths[:-1] > _PREFIX)
        alike &= (words[1:] == words[:-1]).all(axis=1)
        for k in np.unique(row[1:][alike]).tolist():
            start, end = int(starts[k]), int(ends[k])
            group = self.members[start:end].tolist()
            group.sort(key=self.id_bytes)
            self.members[start:end] = group

    def _drop_repeats(self, by_hash: np.ndarray, same: np.ndarray, keep: np.ndarray) -> None:
        """Among incidents of one hash (`same`: positions p of the sorted table where p and p + 1 share it), every
        occurrence of an ID but its last is dropped; IDs that only hash alike are all kept."""
        run: list[int] = []
        for p in [*same.tolist(), -2]:
            if run and p == run[-1]:
                run.append(p + 1)
                continue
            if run:
                seen: set[bytes] = set()
                for incident in sorted(by_hash[run].tolist(), reverse=True):  # the last occurrence first
                    key = self.id_bytes(incident)
                    if key in seen:
                        keep[incident] = False
                    seen.add(key)
            run = [p, p + 1]

    def __len__(self) -> int:
        return len(self.row_of)

    @property
    def rows(self) -> int:
        return len(self.fps)

    def id_bytes(self, incident: int) -> bytes:
        return self.blob[self.offsets[incident] : self.offsets[incident + 1]]

    def incident_id(self, incident: int) -> str:
        return self.blob[self.offsets[incident] : self.offsets[incident + 1]].decode("utf-8", "surrogateescape")

    def find(self, incident_id: str) -> int:
        """The incident of this ID, or -1 (dropped ones are never found)."""
        try:
            key = incident_id.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            return -1  # not an ID the rows can hold (`RowsBuilder.add_pairs`)
        shift = self._shift
        top = (_id_hash(key) & _ALL_BITS) >> shift
        table = self.hashes
        at = int(table.searchsorted(np.uint64(top << shift)))
        while at < len(table) and int(table[at]) >> shift == top:
            incident = int(table[at]) & ((1 << shift) - 1)
            if self.id_bytes(incident) == key:
                return incident
            at += 1
        return -1

    def find_many(self, incident_ids: Sequence[str]) -> list[int]:
        """`find` of each ID, the table searched for them all in one numpy step (an ID whose hash's top bits are
        shared, by another ID or a dropped repeat of its own, is found by `find` itself)."""
        shift, table = self._shift, self.hashes
        keys: list[bytes | None] = []
        tops: list[int] = []
        for incident_id in incident_ids:
            try:
                key: bytes | None = incident_id.encode("utf-8", "surrogateescape")
            except UnicodeEncodeError:
                key = None  # not an ID the rows can hold (`RowsBuilder.add_pairs`)
            keys.append(key)
            tops.append((_id_hash(key) & _ALL_BITS) >> shift if key is not None else 0)
        at = table.searchsorted(np.array([top << shift for top in tops], dtype=np.uint64))
        firsts = table[at.clip(0, len(table) - 1)].tolist()
        low = (1 << shift) - 1
        found = []
        for incident_id, key, top, place, first in zip(incident_ids, keys, tops, at.tolist(), firsts, strict=True):
            if key is None or place >= len(table) or first >> shift != top:
                found.append(-1)
            elif self.id_bytes(first & low) == key:
                found.append(first & low)
            else:
                found.append(self.find(incident_id))
        return found

    def fp_of(self, incident: int) -> int:
        return int(self.fps[self.row_of[incident]])

    def row_members(self, row: int) -> list[int]:
        """The incidents of a row, in ID order."""
        return self.members[self.row_start[row] : self.row_start[row + 1]].tolist()

    def nbytes(self) -> int:
        arrays = (self.offsets, self.hashes, self.fps, self.row_of, self.row_start, self.members)
        return len(self.blob) + sum(a.nbytes for a in arrays)
