"""`FingerprintIndex.bulk_load`: many incidents written at once, without looking for matches.

Two ways, the same keys written: into a namespace that holds no fingerprint yet, from a standalone client, the
commands are written as raw protocol (RESP) in large pipelined batches, posting sets grouped by key with numpy, and
each batch's replies read while the next one is built. redis-py's own packing cost about 70 us an incident (a 1M
pre-load took minutes, benchmarks/journal/ten-million.md); this way costs a few. Anything else (a cluster client, a
migration building another layout, a namespace that already holds fingerprints, whose representatives must be looked
up with SINTER) takes the general way: redis-py pipelines, one batch of `chunk` at a time.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from itertools import islice
from typing import Any, Protocol

import hiredis
import numpy as np
import redis

from . import library
from .fingerprint import format_fingerprint
from .keys import IndexKeys
from .replies import text

__all__ = ["BulkTarget", "batched", "bulk_load"]


def batched(items: Iterable[Any], size: int) -> Iterable[list[Any]]:
    """Lists of `size` items (the last one shorter); itertools.batched arrives only with Python 3.12."""
    iterator = iter(items)
    while part := list(islice(iterator, size)):
        yield part


class BulkTarget(Protocol):
    """What a bulk load needs of a `worker.index.FingerprintIndex` (named here, so that this module does not import
    the index module that calls it)."""

    redis: Any
    keys: IndexKeys
    building: Any  # the LayoutTarget a migration is building, or None
    _band_bits: list[tuple[Any, int, int]]

    def _ensure_open(self) -> None: ...

    def _check_fp(self, fp: Any) -> int: ...

    def posting_keys(self, fp: int) -> list[str]: ...


def bulk_load(index: BulkTarget, items: Iterable[tuple[str, int]], chunk: int) -> int:
    """See `FingerprintIndex.bulk_load`."""
    index._ensure_open()
    client = index.redis
    retention = int(text(client.hget(index.keys.meta, "retention_ms") or b"0") or 0) > 0
    touched: set[Any] = set()  # the posting keys written
    if type(client) is redis.Redis and index.building is None and not client.hlen(index.keys.fingerprints):
        total = _RawLoad(index, retention, touched).run(batched(items, chunk))
    else:
        total = _general(index, batched(items, chunk), retention, touched)
    _raise_bound(index, touched)
    return total


def _raise_bound(index: BulkTarget, touched: set[Any]) -> None:
    """Raise `{N}:meta`'s posting_bound (worker/lua/meta.lua) to the largest of the posting sets the load wrote,
    measured after it (SCARD, O(1) each), when the index has one: its searches on the primary skip measuring their
    sets only while no set is larger. Measured, not counted: the sets may have held members before the load."""
    client, largest = index.redis, 0
    keys = list(touched)
    for start in range(0, len(keys), 10_000):
        pipe = client.pipeline(transaction=False)
        for key in keys[start : start + 10_000]:
            pipe.scard(key)
        largest = max([largest, *map(int, pipe.execute())])
    if keys:
        client.fcall(library.FN_RAISE_POSTING_BOUND, 1, index.keys.meta, largest)


def _now_ms(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _general(
    index: BulkTarget, parts: Iterable[list[tuple[str, int]]], retention: bool, touched: set[Any] | None = None
) -> int:
    """Load in pipelines of redis-py commands (a cluster client, a migration under way, an index not empty); the
    posting keys written are added to `touched`."""
    client = index.redis
    touched = set() if touched is None else touched
    total = 0
    representatives: dict[int, str] = {}  # of the fingerprints this load has met
    for part in parts:
        fingerprints: dict[Any, str] = {}
        for incident_id, fp in part:
            fingerprints[incident_id] = format_fingerprint(index._check_fp(fp))
        unknown = list({fp for _, fp in part if fp not in representatives})
        # a fingerprint indexed before this load: its representative is the one ID in all of its posting sets
        pipe = client.pipeline(transaction=False)
        for fp in unknown:
            pipe.sinter(index.posting_keys(fp))
        for fp, found in zip(unknown, pipe.execute(), strict=True):
            if found:
                representatives[fp] = text(min(found))
        postings: dict[str, list[str]] = defaultdict(list)
        groups: dict[int, list[str]] = defaultdict(list)
        for incident_id, fp in part:
            representative = representatives.get(fp)
            if representative is None:
                representatives[fp] = incident_id
                for key in index.posting_keys(fp) + (index.building.posting_keys(fp) if index.building else []):
                    postings[key].append(incident_id)
            elif representative != incident_id:
                groups[fp].append(incident_id)
        pipe = client.pipeline(transaction=False)
        pipe.hset(index.keys.fingerprints, mapping=fingerprints)
        for key, members in postings.items():
            pipe.sadd(key, *members)
        touched.update(postings)
        for fp, members in groups.items():
            pipe.zadd(index.keys.twins(format_fingerprint(fp)), dict.fromkeys([representatives[fp], *members], 0))
        for incident_id, hex_fp in fingerprints.items():
            pipe.xadd(index.keys.changes, {"add": incident_id, "fp": hex_fp, "prev": ""})
        if retention:  # the retention window of a loaded incident starts with its load
            pipe.zadd(index.keys.expiry, dict.fromkeys(fingerprints, _now_ms(client)), nx=True)
        pipe.execute()
        total += len(fingerprints)
    return total


def _bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


class _RawLoad:
    """The fast way: every batch's commands as one RESP buffer; its replies read after the next batch is sent."""

    def __init__(self, index: BulkTarget, retention: bool, touched: set[Any]) -> None:
        self.index = index
        self.retention = retention
        self.touched = touched  # the posting keys written (bytes)
        self.representatives: dict[int, bytes] = {}
        self.fp_key = _bulk(index.keys.fingerprints.encode())
        self.xadd_head = b"*9\r\n$4\r\nXADD\r\n" + _bulk(index.keys.changes.encode()) + b"$1\r\n*\r\n$3\r\nadd\r\n"
        self.bands = [(band, np.uint64(offset), np.uint64(mask)) for band, offset, mask in index._band_bits]

    def run(self, parts: Iterable[list[tuple[str, int]]]) -> int:
        client = self.index.redis
        assert isinstance(client, redis.Redis)
        connection = client.connection_pool.get_connection()
        connection.connect()
        self._reader = hiredis.Reader() if getattr(connection, "_sock", None) else None
        total = 0
        owed = 0
        try:
            for part in parts:
                buffer, commands, ids = self._batch(part)
                connection.send_packed_command([buffer], check_health=False)
                self._read(connection, owed)  # the previous batch's: it ran while this one was built
                owed = commands
                if self.retention:  # the retention window of a loaded incident starts with its load
                    self._read(connection, owed)
                    owed = 0
                    client.zadd(self.index.keys.expiry, dict.fromkeys(ids, _now_ms(client)), nx=True)
                total += len(ids)
            self._read(connection, owed)
        except BaseException:
            connection.disconnect()  # replies may be left unread: the connection is not reusable
            raise
        finally:
            client.connection_pool.release(connection)
        return total

    def _read(self, connection: Any, count: int) -> None:
        """Read `count` replies; the first error reply raises (the load stops there).

        With hiredis, straight from the socket into a reader of its own: redis-py's `read_response` costs about 6 us
        a reply, as much as building the commands. Nothing else reads this connection while the load holds it."""
        reader = self._reader
        if reader is None:
            for _ in range(count):
                connection.read_response()
            return
        sock = connection._sock
        while count:
            reply = reader.gets()
            if reply is False:
                data = sock.recv(1 << 20)
                if not data:
                    raise redis.ConnectionError("Redis closed the connection during a bulk load")
                reader.feed(data)
                continue
            if isinstance(reply, hiredis.ReplyError):
                raise redis.ResponseError(str(reply))
            count -= 1

    def _batch(self, part: list[tuple[str, int]]) -> tuple[bytes, int, list[str]]:
        """One batch's RESP buffer: HSET of the fingerprints, SADD per posting key, ZADD per twin group, XADD per
        incident; with the number of commands and the batch's IDs (each once, its last fingerprint)."""
        index = self.index
        check = index._check_fp
        latest: dict[str, int] = {}
        for incident_id, fp in part:
            latest[incident_id] = check(fp)
        representatives = self.representatives
        bulk_of: dict[str, bytes] = {}
        new_ids: list[bytes] = []
        new_fps: list[int] = []
        groups: dict[int, list[bytes]] = defaultdict(list)
        for incident_id, fp in part:  # every pair, as `add` one by one would see them (a twin of itself is none)
            encoded = bulk_of.get(incident_id)
            if encoded is None:
                encoded = bulk_of[incident_id] = _bulk(incident_id.encode())
            representative = representatives.get(fp)
            if representative is None:
                representatives[fp] = encoded
                new_ids.append(encoded)
                new_fps.append(fp)
            elif representative != encoded:
                groups[fp].append(encoded)
        out: list[bytes] = [b"*%d\r\n$4\r\nHSET\r\n" % (2 + 2 * len(latest)), self.fp_key]
        hexes = {incident_id: format_fingerprint(fp).encode() for incident_id, fp in latest.items()}
        for incident_id, hex_fp in hexes.items():
            out.append(bulk_of[incident_id])
            out.append(b"$16\r\n%s\r\n" % hex_fp)
        commands = 1
        if new_fps:
            fps = np.array(new_fps, dtype=np.uint64)
            for band, offset, mask in self.bands:
                values = (fps >> offset) & mask
                order = np.argsort(values, kind="stable")
                ordered = values[order]
                starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
                ends = np.append(starts[1:], len(ordered))
                members = [new_ids[k] for k in order.tolist()]
                for value, start, end in zip(ordered[starts].tolist(), starts.tolist(), ends.tolist(), strict=True):
                    key = band.key(value).encode()
                    self.touched.add(key)
                    out.append(b"*%d\r\n$4\r\nSADD\r\n" % (2 + end - start))
                    out.append(_bulk(key))
                    out += members[start:end]
                commands += len(starts)
        for fp, members in groups.items():
            key = index.keys.twins(format_fingerprint(fp)).encode()
            everyone = [representatives[fp], *members]
            out.append(b"*%d\r\n$4\r\nZADD\r\n" % (2 + 2 * len(everyone)))
            out.append(_bulk(key))
            for member in everyone:
                out.append(b"$1\r\n0\r\n")
                out.append(member)
            commands += 1
        head = self.xadd_head
        for incident_id, hex_fp in hexes.items():
            out.append(head)
            out.append(bulk_of[incident_id])
            out.append(b"$2\r\nfp\r\n$16\r\n%s\r\n$4\r\nprev\r\n$0\r\n\r\n" % hex_fp)
        commands += len(hexes)
        return b"".join(out), commands, list(latest)
