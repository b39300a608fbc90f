"""The snapshot read path: a worker's own copy of the index, kept current from the change log.

`ChangeFollower` loads every fingerprint once (HSCAN, in bounded batches) and then applies `{N}:changes` in order,
so its `MemoryIndex` always equals the index as it stood at `index.position`, an entry ID of the change log. The
worker searches that copy and sends the position with what it found; the atomic step on the primary re-checks the
changes after it (docs/contract.md, "Snapshot reads"), so a copy that is behind is slower to validate, never wrong.

Loading is consistent without stopping anyone: the position is taken before the scan, and the scan is followed by
replaying every change from that position. An incident the scan read after a later change is set again by that
change's entry, which carries the fingerprint, so once the replay has passed the end of the log as it was when the
scan finished, the copy is exact at every position it reports.
"""

from __future__ import annotations

import gc
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import redis
from redis.client import Pipeline

from .bands import BandLayout
from .fingerprint import stored_fingerprint
from .keys import IndexKeys
from .library import SnapshotClaim
from .loadedrows import RowsBuilder, parse_stored_fingerprints
from .logs import error_message
from .metafields import changes_floor, floor_ahead, is_entry_id
from .replies import text as _text
from .snapshot import MemoryIndex
from .transport import Command, round_trip, sends_packed

__all__ = [
    "CHANGES_FLOOR_FIELD",
    "READ_PATHS",
    "SNAPSHOT_SEND",
    "ChangeFollower",
    "LogRead",
    "SnapshotLostError",
    "SnapshotReader",
]

CHANGES_FLOOR_FIELD = "changes_trimmed_to"
"""`{N}:meta` field: entries of `{N}:changes` below this ID may have been trimmed; a copy older than it reloads."""


class SnapshotLostError(Exception):
    """The change log no longer holds every change after the copy's position: load it again."""


def _fields(flat: Any) -> Any:
    """An entry's fields as XRANGE's reply callback gives them (a dict), from the protocol's flat list."""
    if isinstance(flat, dict):
        return flat
    pairs = iter(flat)
    return dict(zip(pairs, pairs, strict=False))


class LogRead(NamedTuple):
    """A read of the change log written behind another call (`ChangeFollower.log_read`): the copy's position and
    the fields of its entry when it was written, and its commands (XRANGE from that position, the floor, the live
    workers)."""

    position: str
    at_position: Any
    commands: list[Command]


def entry_id_tuple(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


class ChangeFollower:
    """Keeps a `MemoryIndex` equal to the index at a position of its change log."""

    def __init__(self, client: Any, keys: IndexKeys, layout: BandLayout, *, batch: int = 5000) -> None:
        self.client = client
        self.keys = keys
        self.layout = layout
        self.batch = batch
        self.index = MemoryIndex(layout)
        self.loaded = False
        self.load_seconds = 0.0
        # the fields of the entry at the copy's position (None when the position is no entry: '0-0' or the floor)
        self._at_position: Any = None
        self.live_workers: int | None = None
        """The workers of the namespace alive at the last read of the log (their heartbeat's expiry in
        `{N}:workers` not passed), this one included once it has beaten; None before a read, or when refused."""

    def load(self, *, attempts: int = 3) -> None:
        """Read every fingerprint and replay the changes made meanwhile.

        A log that lost the load's position while it scanned (trimmed past it by another worker's upkeep, when the
        index was idle longer than changes_keep; or reset) is no reason to fail: the load starts again, from the log
        as it is then, up to `attempts` times in all.
        """
        started = time.monotonic()
        for attempt in range(attempts):
            try:
                self._load_once()
                break
            except SnapshotLostError:
                self.loaded = False
                if attempt == attempts - 1:
                    raise
        self.load_seconds = time.monotonic() - started

    def _load_once(self) -> None:
        index = MemoryIndex(self.layout)
        # The position: the last change, or, when the log was trimmed empty, its floor (every change made so far is
        # below it, and trimming keeps what is not; a copy at "0-0" would be older than the floor, and never valid).
        floor = self._floor()
        last = self.client.xrevrange(self.keys.changes, "+", "-", count=1)
        index.position = _text(last[0][0]) if last else "0-0"
        at_position = last[0][1] if last else None
        if floor is not None and entry_id_tuple(index.position) < entry_id_tuple(floor):
            ahead = floor_ahead(self.client, self.keys, floor, index.position if last else None)
            if ahead is not None:
                raise ahead
            index.position, at_position = floor, None
        # HSCAN may return an incident twice (the copy keeps its last); each batch goes into arrays at once
        rows = RowsBuilder()
        _scan_into(rows, self.client, self.keys.fingerprints, self.batch)
        index.load_rows(rows)
        del rows
        self.index = index
        self._at_position = at_position
        self.loaded = True
        self.catch_up()

    def _floor(self) -> str | None:
        return changes_floor(self.client, self.keys, self.client.hget(self.keys.meta, CHANGES_FLOOR_FIELD))

    def catch_up(self, *, limit: int | None = None) -> int:
        """Apply the changes after the copy's position (at most `limit`); returns how many it applied.

        Raises `SnapshotLostError` when some of them were trimmed away or are of a format without fingerprints.
        """
        if not self.loaded:
            self.load()
            return 0
        index = self.index
        applied = 0
        while limit is None or applied < limit:
            count = self.batch if limit is None else min(self.batch, limit - applied)
            # One round trip: the entries, then the floor. Read after them, the floor proves they are whole: it is
            # written before a trim, and a trim removes only entries below it, so a floor at or below the position
            # means nothing after the position was gone when the entries were read.
            # The position's own entry comes first (the XRANGE starts at it): the proof that the log is still the
            # one this copy followed (see _check_position).
            position = index.position
            entries, floor, live = self._read_log(position, count + 1)
            self.live_workers = live if isinstance(live, int) else None
            floor = changes_floor(self.client, self.keys, floor)
            if floor is not None and entry_id_tuple(position) < entry_id_tuple(floor):
                raise SnapshotLostError(
                    f"{self.keys.changes} was trimmed to {floor}, past this copy's position {position}"
                )
            if entries and _text(entries[0][0]) == position and entries[0][1] == self._at_position:
                entries = entries[1:]
            else:
                self._check_position(position, floor)
            if not entries:
                break
            self._apply(entries)
            applied += len(entries)
            if len(entries) < count:
                break
        return applied

    def _apply(self, entries: Sequence[Any]) -> None:
        """Apply log entries that follow the copy's position, at once (`MemoryIndex.apply`); an entry the copy cannot
        follow ends them there and raises `SnapshotLostError`, the copy left at the entry before it."""
        index = self.index
        changes: list[tuple[str, int | None]] = []
        lost = None
        for _, fields in entries:
            try:
                changes.append(self._change(fields))
            except SnapshotLostError as error:
                lost = error
                break
        index.apply(changes)
        if changes:
            index.position = _text(entries[len(changes) - 1][0])
            self._at_position = entries[len(changes) - 1][1]
        if lost is not None:
            raise lost

    def log_read(self) -> LogRead | None:
        """A read of the log from the copy's position, for a caller to send behind a call of its own on its
        connection (`ride`): the log's changes up to that call come back with its reply, with no round trip of their
        own. None when the copy has no entry to prove its position with (not loaded, or at '0-0' or the floor): the
        copy's own `catch_up` reads the log then."""
        if not self.loaded or self._at_position is None:
            return None
        position = self.index.position
        return LogRead(position, self._at_position, self._log_commands(position, self.batch))

    def apply_ridden(self, read: LogRead, replies: Sequence[Any]) -> bool:
        """Apply the entries of a `log_read` sent behind a call (its three replies) past the copy's position, which
        may have moved since the read was written (an earlier one applied). Returns whether they were applied.

        The same proofs as `catch_up`'s: the read starts at the entry of the position it was written at, as the copy
        applied it, and the floor read after the entries is at or below that position. A read that proves nothing
        (its position's entry gone or changed, the floor past it, the copy's position not among its entries, an
        error) is left: the copy stays where it is, behind but exact, and its next `catch_up` reads the log and says
        what went wrong."""
        # (as sent behind a call, the entries come as the protocol has them: [ID, [name, value, ...]] each)
        entries, floor, live = replies
        if isinstance(entries, Exception) or isinstance(floor, Exception) or not entries:
            return False
        if _text(entries[0][0]) != read.position or _fields(entries[0][1]) != read.at_position:
            return False
        if floor is not None and not is_entry_id(_text(floor)):
            return False
        if floor is not None and entry_id_tuple(read.position) < entry_id_tuple(_text(floor)):
            return False
        at = 0
        position = self.index.position
        if position != read.position:  # an earlier read moved the copy: its position must be one of these entries
            ids = [_text(entry_id) for entry_id, _ in entries]
            if position not in ids:
                return entry_id_tuple(position) > entry_id_tuple(ids[-1])  # (nothing new here: no harm)
            at = ids.index(position)
            if _fields(entries[at][1]) != self._at_position:
                return False
        self.live_workers = live if isinstance(live, int) else None
        try:
            self._apply([(entry_id, _fields(flat)) for entry_id, flat in entries[at + 1 :]])
        except SnapshotLostError:
            return False  # (the copy stays at the entry before; its next catch_up meets it and loads again)
        return True

    def _log_commands(self, position: str, count: int) -> list[Command]:
        """`count` entries of the log from `position` on, its floor, and the live workers of the namespace (those
        whose heartbeat has not expired in `{N}:workers`)."""
        return [
            ("XRANGE", self.keys.changes, position, "+", "COUNT", count),
            ("HGET", self.keys.meta, CHANGES_FLOOR_FIELD),
            ("ZCOUNT", self.keys.workers, int(time.time() * 1000), "+inf"),
        ]

    def _read_log(self, position: str, count: int) -> list[Any]:
        """`_log_commands` (and so `live_workers`) in one round trip: for a standalone client on a connection of its
        own pool (`round_trip`: redis-py's pipeline without its steps, the same retries and errors), else (a cluster
        client) in a pipeline."""
        xrange, hget, zcount = self._log_commands(position, count)
        if sends_packed(self.client):
            replies = round_trip(self.client, [xrange, hget, zcount], raise_on_error=False)
        else:
            pipe = self.client.pipeline(transaction=False)
            pipe.xrange(self.keys.changes, position, "+", count=count)
            pipe.hget(self.keys.meta, CHANGES_FLOOR_FIELD)
            pipe.execute_command(*zcount)
            replies = list(pipe.execute(raise_on_error=False))
        # the count is only advice: a refusal of it (a users.acl older than the worker's) is no count
        for number, (command, reply) in enumerate(zip((xrange, hget), replies, strict=False), 1):
            if isinstance(reply, Exception):
                if not sends_packed(self.client):  # (round_trip named it already)
                    Pipeline.annotate_exception(None, reply, number, command)  # type: ignore[arg-type]
                raise reply
        return replies

    def _check_position(self, position: str, floor: str | None) -> None:
        """The log does not hold the entry at the copy's position, as the copy applied it: fine when there is none
        to hold ('0-0', or the trim floor the copy started from when the log was trimmed empty); otherwise the log
        was reset or went back.

        A position is an entry the copy applied, and trimming keeps every entry at or above the floor (which the
        caller checked), so a log without it is another log: the namespace's keys were deleted (FLUSHALL, a reset),
        or Redis went back in time (a restart from an older save, a failover to a replica that had not caught up).
        The copy may then hold incidents the index has lost, and its searches would name them. (The entry's fields
        are compared too: a log written again within the same millisecond can reuse an entry ID.)
        """
        if position in ("0-0", floor) and self._at_position is None:
            return
        raise SnapshotLostError(
            f"{self.keys.changes} no longer holds this copy's position {position}: the index was reset, or Redis went "
            "back to an older state (a restart from an older save, a failover to a replica that lagged)"
        )

    def _change(self, fields: Mapping[Any, Any]) -> tuple[str, int | None]:
        """The incident ID of a change-log entry and its new fingerprint (None: deleted)."""
        # names compared as read (bytes, or text from a decoding client): only the incident ID is decoded
        incident_id: Any = None
        fp: Any = None
        for name, value in fields.items():
            if name == b"fp" or name == "fp":
                fp = value
            elif incident_id is None and name != b"prev" and name != "prev":
                incident_id = value  # the op's field: <op> <incident ID>
        if incident_id is None or fp is None:
            raise SnapshotLostError("a change-log entry without its fingerprint (written by an older version)")
        if fp:
            value = stored_fingerprint(fp)
            if value is None:
                # not the functions' writing (by hand, or another program): the copy is loaded again, from {N}:fp
                raise SnapshotLostError("a change-log entry whose fingerprint is not 16 hex digits")
            return _text(incident_id), value
        return _text(incident_id), None


_SCAN_AHEAD = 8
"""HSCAN replies read ahead of their parsing, at most (a few MB at the load's batch of 5,000)."""

_SCAN_END = object()


def _scan_into(rows: RowsBuilder, client: Any, key: str, batch: int) -> None:
    """Every field and value of the hash `key` into `rows`, by HSCAN in batches of about `batch`.

    A thread of its own sends the HSCANs, each as soon as the previous reply is read, while this one parses the
    replies: Redis scans the next batch while the worker parses this one (one after the other, at 10M, the scan and
    the parsing took about 10 s and 4 s). The replies are read as Redis's flat list of field, value, ... (redis-py
    pairs them into a dict unless told, `no_values`, that the reply has no values: it then leaves the list as it is).
    An error of the scan is raised here; an error here stops the scan.
    """
    replies: queue.Queue[Any] = queue.Queue(maxsize=_SCAN_AHEAD)
    stop = threading.Event()

    def hand_over(item: Any) -> None:
        while not stop.is_set():
            try:
                replies.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def scan() -> None:
        cursor: Any = 0
        try:
            while not stop.is_set():
                cursor, reply = client.execute_command("HSCAN", key, cursor, "COUNT", batch, no_values=True)
                hand_over(reply)
                if int(cursor) == 0:
                    break
            hand_over(_SCAN_END)
        except BaseException as error:  # raised again by the parsing thread
            hand_over(error)

    reader = threading.Thread(target=scan, name=f"hscan {key}", daemon=True)
    reader.start()
    try:
        while (reply := replies.get()) is not _SCAN_END:
            if isinstance(reply, BaseException):
                raise reply
            _add_scanned(rows, reply)
    finally:
        stop.set()
        reader.join()


def _add_scanned(rows: RowsBuilder, reply: Sequence[Any] | Mapping[Any, Any]) -> None:
    """One HSCAN batch of `{N}:fp` (field, value, ... as Redis sends it; or a dict of them) into `rows`: IDs as UTF-8
    bytes; a value the search does not read (mangled by hand, not 16 hex digits) is left out. An ID given twice is
    added twice: the rows keep its last."""
    if isinstance(reply, Mapping):
        ids, values = list(reply), list(reply.values())
    else:
        ids, values = list(reply[0::2]), list(reply[1::2])
    fps = parse_stored_fingerprints(values)
    if fps is None:  # some value is not 16 hex digits: one by one
        read = [(incident_id, stored_fingerprint(value)) for incident_id, value in zip(ids, values, strict=True)]
        ids = [incident_id for incident_id, fp in read if fp is not None]
        fps = np.array([fp for _, fp in read if fp is not None], dtype=np.uint64)
    if ids and not isinstance(ids[0], bytes):  # a decoding client
        ids = [incident_id.encode("utf-8", "surrogateescape") for incident_id in ids]
    rows.add(ids, fps)


READ_PATHS = ("auto", "primary", "snapshot")
"""`primary`: every search runs inside the atomic step on the primary. `snapshot`: searches run on the worker's own
copy and the atomic step validates them. `auto`: the snapshot once the index holds `snapshot_min_incidents`."""

SNAPSHOT_SEND = 16
"""Calls sent at once on the snapshot path. The copy is brought up to date before each send (by a refresh, or by
the log read that rode behind an earlier send of a lone worker), and every call validates the changes after the
copy's position, the earlier calls of its send included: a few changes an event (BENCHMARKS.md's "changes
validated")."""

COMPACT_FROM = 50_000
"""Empty rows (fingerprints that went: upserts and deletes) the copy holds before it numbers its rows anew to give
their memory back (`MemoryIndex.compact`); and at least as many as it holds live rows, so the rebuilds (about 2 s at
a million rows, the worker's pause) amortize. This is for memory only: searches stop reading a tier's empty rows
when the copy builds that tier anew, alone, once half its rows went or searches near them (a storm deleted) have
thrown away as many of its candidates as it holds rows, and in either case at least 2,048 (`_SEAL_AT`; see
worker/snapshot.py, `_STALE_SHARE`). `snapshot_tier_rebuilds` in the summary counts those since the copy was made
(a new layout or a reload makes a new copy, and the count starts again at 0)."""

CLAIM_EXTRA = 16
"""Matches listed beyond the alert cap, so that a few of them deleted after the snapshot still leave the cap covered."""


REPLICA_LAG_S = 0.25
"""How often a copy fed from a replica compares its position with the primary's last change (one XREVRANGE COUNT 1
on the primary, whatever the rate): a change the primary held at the previous comparison and the copy still lacks
means the replica is that far behind, and the copy follows the primary instead. A replica keeps up within
milliseconds; a quarter of a second behind at 5,000 events/s is over a thousand changes for the primary to re-check
in every call (past 4,000 it refuses to: the full search)."""

FRESH_S = 0.05
"""How long a copy that a ride brought up to date stays fresh enough to search without a refresh (`SnapshotReader.
fresh`): a lone worker's next batch, read meanwhile, goes out at once; after a pause in the stream it refreshes."""

REPLICA_RETRY_S = 10.0
"""How long a copy that left its replica (failed, behind, or no longer the primary's) reads the primary before it
tries the replica again."""


class SnapshotReader:
    """The worker's side of the snapshot read path: keeps the copy current and turns searches into claims.

    With a `replica`, the copy is loaded from it and follows the change log there, so that those reads leave the
    primary: only the atomic step runs there, and it validates a copy that is behind as it validates any other
    (docs/contract.md, "Snapshot reads"; what this saves, and what it does not, the validation of other workers'
    concurrent changes: benchmarks/fleet.py). The replica is left for the
    primary (`source`), logged and counted (`replica_lost`), when it fails or does not answer within its timeout,
    when it lags (see REPLICA_LAG_S), and when the primary refuses the copy's claims (`fallbacks`: the copy is too far
    behind, or, when the primary's log lacks the copy's position, the replica's log went another way, a replica
    promoted and written to, and the copy is loaded again from the primary). It is tried again after
    REPLICA_RETRY_S, once it holds the copy's position as the copy applied it.
    """

    def __init__(
        self, client: Any, keys: IndexKeys, layout: BandLayout, *, log: Any = None, replica: Any = None
    ) -> None:
        self.primary = client
        self.replica = replica
        self.follower = ChangeFollower(replica if replica is not None else client, keys, layout)
        self.log = log
        self.reloads = 0
        self.fallbacks = 0
        self.replica_lost = 0
        self._frozen = 0
        self._fallbacks_seen = 0
        self._retry_replica_at = 0.0
        self._lag_check_at = 0.0
        self._primary_last: str | None = None  # the primary's last change at the previous comparison
        self._fed_at = float("-inf")  # when a ride last brought the copy up to date (see `fresh`)

    @property
    def alone(self) -> bool:
        """Whether this worker was the only live one of its namespace at the copy's last read of the log (a lone
        worker writes its sends ahead: `Processor._send_snapshot`)."""
        return self.follower.live_workers == 1

    @property
    def source(self) -> str:
        """Where the copy reads: replica or primary."""
        return "replica" if self.replica is not None and self.follower.client is self.replica else "primary"

    @property
    def index(self) -> MemoryIndex:
        return self.follower.index

    @property
    def layout(self) -> BandLayout:
        return self.follower.layout

    def relayout(self, layout: BandLayout) -> None:
        """Cut the copy's bands anew for `layout` (a migration switched the index to it), in memory: what the copy
        holds, incident IDs and fingerprints at a position of the change log, does not depend on the layout."""
        old = self.follower.index
        index = MemoryIndex(layout)
        index.load(old.items())  # one numpy tier in one go (set one by one: several times slower)
        index.position = old.position
        self.follower.layout = layout
        self.follower.index = index
        self._freeze()

    def ride(self) -> LogRead | None:
        """A read of the log for the caller to send behind its next call to the primary (`ChangeFollower.log_read`),
        then hand to `ridden` with its replies; None when the copy follows a replica, or has no position to prove."""
        return None if self.source == "replica" else self.follower.log_read()

    def ridden(self, read: LogRead, replies: Sequence[Any]) -> None:
        """Apply a `ride`'s replies: the copy then holds every change up to the call it rode behind."""
        if self.follower.apply_ridden(read, replies):
            self._fed_at = time.monotonic()
            self._tidy()

    @property
    def fresh(self) -> bool:
        """Whether a ride brought the copy up to the primary's log within the last FRESH_S: a lone worker's next
        send then goes without a `refresh` of its own (a round trip that would find at most the changes of the
        sends still in flight)."""
        return time.monotonic() - self._fed_at < FRESH_S

    def stale(self) -> None:
        """A send went without a ride (its changes are not in the copy): the next one refreshes first."""
        self._fed_at = float("-inf")

    def refresh(self) -> None:
        """Bring the copy up to the end of the change log (loading it the first time, again when it was lost)."""
        if self.replica is not None:
            self._choose_source()
            try:
                self._follow()
            except redis.RedisError as error:
                if self.source != "replica":
                    raise
                self._leave_replica("the replica failed", error=error_message(error))
                self._follow()
            if self.source == "replica":
                self._check_lag()
        else:
            self._follow()
        self._tidy()

    def _follow(self) -> None:
        if not self.follower.loaded:
            self._load("first use")
            return
        try:
            self.follower.catch_up()
        except SnapshotLostError as lost:
            self._load(str(lost))

    def _choose_source(self) -> None:
        """Leave the replica when the primary refused the copy's claims since the last refresh; go back to it when it
        is time and it holds the copy's position."""
        if self.source == "replica":
            if self.fallbacks > self._fallbacks_seen:
                self._fallbacks_seen = self.fallbacks
                held = self._holds_position(self.primary)
                self._leave_replica(
                    "the primary refused the copy's claims: it is too far behind"
                    if held
                    else "the primary's change log does not hold the copy's position: the replica's log went another "
                    "way (a replica promoted, or another primary's), so the copy is loaded again from the primary"
                )
            return
        self._fallbacks_seen = self.fallbacks
        now = time.monotonic()
        if now < self._retry_replica_at:
            return
        self._retry_replica_at = now + REPLICA_RETRY_S
        try:
            if not self.follower.loaded or self._holds_position(self.replica):
                self.follower.client = self.replica
        except redis.RedisError:
            return
        if self.source == "replica":
            self._primary_last, self._lag_check_at = None, 0.0
            if self.log is not None:
                self.log.info("snapshot reads its replica again", position=self.follower.index.position)

    def _holds_position(self, client: Any) -> bool:
        """Whether `client`'s change log holds the copy's position as the copy applied it (a copy at '0-0' or at a
        trim floor has no entry to compare: any log may go on from there, and catch_up checks the floor)."""
        follower = self.follower
        if follower._at_position is None:
            return True
        position = follower.index.position
        entries = client.xrange(follower.keys.changes, position, position, count=1)
        return bool(entries) and entries[0][1] == follower._at_position

    def _check_lag(self) -> None:
        """Leave the replica when the copy, just brought up to the replica's end of the log, still lacks a change the
        primary held REPLICA_LAG_S ago: one O(1) read of the primary each REPLICA_LAG_S, per worker."""
        now = time.monotonic()
        if now < self._lag_check_at:
            return
        self._lag_check_at = now + REPLICA_LAG_S
        earlier = self._primary_last
        last = self.primary.xrevrange(self.follower.keys.changes, "+", "-", count=1)
        self._primary_last = _text(last[0][0]) if last else None
        position = self.follower.index.position
        if earlier is not None and entry_id_tuple(position) < entry_id_tuple(earlier):
            self._leave_replica(f"the replica is over {REPLICA_LAG_S:g} s behind the primary", lacks=earlier)
            self._follow()

    def _leave_replica(self, why: str, **details: Any) -> None:
        self.follower.client = self.primary
        self.replica_lost += 1
        self._retry_replica_at = time.monotonic() + REPLICA_RETRY_S
        if self.log is not None:
            self.log.warning(
                "snapshot replica left; the copy reads the primary",
                why=why,
                retry_in_s=REPLICA_RETRY_S,
                position=self.follower.index.position,
                **details,
            )

    def _tidy(self) -> None:
        index = self.follower.index
        if index.empty_rows > max(index.distinct, COMPACT_FROM):
            started = time.monotonic()
            index.compact()
            self._freeze()
            if self.log is not None:
                self.log.info("snapshot compacted", rows=index.base_rows, seconds=round(time.monotonic() - started, 2))
        elif len(index) > self._frozen * 1.25 + 10_000:
            self._freeze()

    def _freeze(self) -> None:
        """Take the copy out of the garbage collector's full passes (gc.freeze), as it stands now.

        The copy is millions of small objects without cycles (freed by reference counting as ever). Left to the
        collector, a full pass over them, which Python starts each time the survivors grew by a quarter, stops the
        worker for 0.1 to 0.3 s at 100,000 incidents (measured): the tail of the snapshot path's latency. Frozen
        once loaded, and again (after one full pass over what is not frozen) each time it grew by a quarter.
        """
        gc.collect()
        gc.freeze()
        self._frozen = len(self.follower.index)

    def _load(self, why: str) -> None:
        self.follower.load()
        self.reloads += 1
        self._freeze()
        if self.log is not None:
            self.log.info(
                "snapshot loaded",
                why=why,
                incidents=len(self.follower.index),
                distinct=self.follower.index.distinct,
                seconds=round(self.follower.load_seconds, 2),
                position=self.follower.index.position,
            )

    def claims(self, wanted: Sequence[tuple[str, int]], cap: int, budget: int = 0) -> list[SnapshotClaim]:
        """Search the copy for each (incident ID, fingerprint) of `wanted` (its own ID excluded), the events of one
        send together, and say what was found, for the apply calls to validate. A search past `budget` candidates
        (0: none) stops there, and its claim says so (`cut`)."""
        index = self.follower.index
        queries = [(fp, incident_id) for incident_id, fp in wanted]
        results = index.search_many(queries, limit=cap + CLAIM_EXTRA if cap else 0, budget=budget, shown=cap)
        position = index.position
        return [
            SnapshotClaim(
                position,
                result.match_count,
                result.matches,
                len(result.matches) == result.match_count,
                result.cut,
                holder,
            )
            for result, holder in zip(results, index.holders(queries), strict=True)
        ]

    def describe(self) -> dict[str, Any]:
        index = self.follower.index
        return {
            "read_path": "snapshot",
            "snapshot_incidents": len(index),
            "snapshot_position": index.position,
            "snapshot_tiers": index.tiers,  # about log2 of the rows it gained since its load, in numpy
            "snapshot_empty_rows": index.empty_rows,  # given back at COMPACT_FROM
            "snapshot_tier_rebuilds": index.tier_rebuilds,  # tiers built anew without their rows that went
            "snapshot_load_seconds": round(self.follower.load_seconds, 2),
            "snapshot_reloads": self.reloads,
            "snapshot_fallbacks": self.fallbacks,
            "snapshot_alone": self.alone,  # the only live worker: it writes its sends ahead (Processor._send_snapshot)
            **(
                {"snapshot_source": self.source, "snapshot_replica_lost": self.replica_lost}
                if self.replica is not None
                else {}
            ),
        }
