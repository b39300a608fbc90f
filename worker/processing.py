"""The processing chain: what the stream worker does with the entries it reads, one verb a stage.

    read -> prepare -> send -> settle -> record

* read: the group's next entries, through the `read_new` function (worker/entries.py: each entry sized on the
  server, a huge one sent only as a summary), after moving what producers appended to the inbox into the stream
  (worker/inbox.py's `InboxMover`: at the start of each round, but not within a moment of finding it empty, and
  before each read while the inbox has more); pending and
  claimed entries come in through `process` instead (worker/recovery.py);
* prepare: validate and fingerprint each entry into an item, or mark it for a dead letter (too large, deleted,
  poison, invalid);
* send: one atomic server-side call per item (check, index, alert, acknowledge; or dead-letter and acknowledge),
  pipelined; upserts and deletes first read what they replace, and a batch is cut where one incident changes twice;
* settle: act on each reply. A call refused for a lost state (functions, meta) or a layout change is sent again; one
  refused for want of memory is held and retried; a stale upsert or delete is read and applied again; a duplicate
  add is dead-lettered; a failed call leaves its entry pending, one delivery closer to poison;
* record: each entry's outcome goes to `Outcomes.record` (worker/outcomes.py: stats, /metrics and the log line), and
  each batch ends with its time. Each round of batches (at most about a second of them) ends with a call of
  `heartbeat`, which shows the count at once after a pause and otherwise within a second (worker/presence.py).

Nothing is acknowledged that was not done: every acknowledgement is part of the atomic call.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import redis as redis_lib
from pydantic import ValidationError
from redis.backoff import ExponentialBackoff
from redis.exceptions import ClusterDownError, OutOfMemoryError, ReadOnlyError, ResponseError, TryAgainError

from .connection import RedisClient
from .copyarrays import compile_soon
from .entries import Entry, parse_entries
from .errors import DamagedMetaError, DuplicateIncidentError
from .flight import Flight, batch_replies
from .formats import DeadLetter, IncidentEvent, decode_fields, event_error
from .inbox import InboxMover
from .index import FingerprintIndex, SnapshotAdd, retry_while_stale
from .keytypes import diagnose, incident_keys, is_wrong_type, search_keys
from .library import (
    FN_APPLY,
    FN_READ_NEW,
    SnapshotClaim,
    StreamTarget,
    apply_batch,
    dead_letter_command,
    pack_alert_extra,
    parse_apply,
)
from .outcomes import DEAD, FAILED, NOT_PENDING, Outcomes
from .readpath import SNAPSHOT_SEND, SnapshotLostError, SnapshotReader
from .replies import text
from .settings import ALERT_EVENT_FIELD_CHARS, Settings
from .stormwatch import StormWatch, tell
from .text import TOKENIZER_VERSION
from .transport import Command, Packed, Transport, reply_code
from .upkeep import Upkeep

__all__ = ["Processor", "read_sizes", "waits_out"]

_WAIT_OUT_CODES = frozenset({"BUSY", "LOADING", "READONLY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS"})
"""Replies of a server that cannot serve for now (a long script, loading, a replica, a failover, too few replicas):
waited out with backoff like a lost connection. None of them says anything about the entry that got it."""

_RESENDS = 3
"""Times a call refused for a lost state or a layout change is built again and resent before it counts as failed."""


def waits_out(error: BaseException) -> bool:
    """Whether an error reply means "not now" rather than "this call failed" (see _WAIT_OUT_CODES)."""
    if isinstance(error, ReadOnlyError | TryAgainError | ClusterDownError | redis_lib.BusyLoadingError):
        return True  # redis-py strips the code from these
    return isinstance(error, ResponseError) and reply_code(error) in _WAIT_OUT_CODES  # a pipeline's error too


def read_sizes(settings: Settings) -> list[int]:
    """The byte budget of one read, the largest entry sent whole, the bytes kept of a larger one's fields."""
    return [settings.max_batch_bytes, settings.max_entry_bytes, settings.dead_letter_prefix_bytes]


_SNAPSHOT_OFF_S = 60.0
"""How long the snapshot read path stays off after its copy could not be used: a damaged `{N}:meta` floor, or three
loads in a row that lost their position to a trim."""


@dataclass(slots=True)
class _Item:
    """One stream entry on its way through a batch."""

    entry_id: str
    fields: Mapping[Any, Any]  # for validation: a repeated field name counts with its last value
    deliveries: int = 1
    event: IncidentEvent | None = None
    dead: tuple[str, str] | None = None  # (reason, detail)
    full_search: bool = False  # the snapshot's claim was not validated: search inside the atomic step
    entry: Entry | None = None  # as read: every field in order, or an oversized entry's summary


class Processor:
    """Runs the chain for one consumer: `read_and_process` for new entries, `process` for entries read elsewhere.

    `stop` is the worker's stop request (a held batch gives up waiting on it); `heartbeat` is called after each
    round of batches and while entries are held."""

    def __init__(
        self,
        redis: RedisClient,
        settings: Settings,
        index: FingerprintIndex,
        target: StreamTarget,
        outcomes: Outcomes,
        *,
        upkeep: Upkeep,
        heartbeat: Callable[[], None],
        stop: threading.Event,
        log: Any,
        replica: RedisClient | None = None,
    ) -> None:
        self.redis = redis
        self.settings = settings
        self.index = index
        self.target = target
        self.outcomes = outcomes
        self.upkeep = upkeep
        self.heartbeat = heartbeat
        self.log = log
        self.limits = settings.event_limits
        self.snapshot: SnapshotReader | None = None
        self._stop = stop
        self._backoff = ExponentialBackoff(cap=settings.reconnect_max_backoff_s, base=0.05)
        self._reader = _reader()
        self._tokenizer = str(TOKENIZER_VERSION)
        self._snapshot_off_until = 0.0
        # whether the primary's searches met a storm (auto: choose_read_path moves to the copy; primary: said once)
        self.storm = StormWatch(settings.snapshot_storm_candidates if settings.read_path != "snapshot" else 0)
        self.replica = replica  # where the snapshot path reads its copy, when not the primary (readpath.py)
        self._layout_seen: tuple[str, str] | None = None
        self._inbox_due = True  # move the inbox before the next read
        self.inbox = InboxMover(redis, index.keys, target, settings, outcomes, log)

    def close(self) -> None:
        """Wait for a read ahead in flight; the processor can run again afterwards (tests run a worker twice)."""
        self._reader.shutdown(wait=True)
        self._reader = _reader()

    def choose_read_path(self) -> None:
        """Search a copy of the index in this worker once the settings (or, with auto, the index's size, or a storm
        met on the primary: `StormWatch`) ask for it.

        Auto never switches back: a copy that is loaded stays correct however small the index gets.
        """
        if self.snapshot is not None or self.settings.read_path == "primary":
            return
        compile_soon()  # (the copy's loops, in a thread of their own: ready before a storm needs them)
        if time.monotonic() < self._snapshot_off_until:
            return
        if self.settings.read_path == "auto" and not self.storm.seen:
            try:
                size = len(self.index)
            except ResponseError:  # a damaged fingerprint hash: the primary path reports it entry by entry
                return
            if size < self.settings.snapshot_min_incidents:
                return
        self.snapshot = SnapshotReader(
            self.redis, self.index.keys, self.index.layout, log=self.log, replica=self.replica
        )
        try:
            self.snapshot.refresh()
        except (DamagedMetaError, SnapshotLostError) as error:
            self._snapshot_off(error)

    def _storm_moves(self) -> bool:
        """Whether a storm met on the primary is to move this worker's search to its copy, which it has not yet (a
        worker told to search on the primary only says it met one: `stormwatch.tell`)."""
        return self.storm.seen and self.snapshot is None and self.settings.read_path != "primary"

    def _snapshot_off(self, error: DamagedMetaError | SnapshotLostError) -> None:
        """Search on the primary for a while: the copy cannot be validated (its change log's floor is damaged), or
        could not be loaded (each load lost its position to a trim: CHANGES_KEEP shorter than a load takes)."""
        self.snapshot = None
        self._snapshot_off_until = time.monotonic() + _SNAPSHOT_OFF_S
        hint = (
            "raise CHANGES_KEEP above the time a copy takes to load" if isinstance(error, SnapshotLostError) else None
        )
        self.log.error("snapshot read path off; searching on the primary", error=str(error), hint=hint)

    # -- the chain, for new entries ---------------------------------------------------------------------------

    def read_and_process(self) -> int:
        """Read new entries (blocking up to block_ms) and process them; returns how many were read.

        Two things keep both the client and the server busy. While one batch runs on the server, the next is read
        and prepared in a helper thread. And batches of adds are pipelined one ahead: batch k + 1 is sent before
        the replies of batch k are read (on one connection, so the server still applies them in stream order); on
        the snapshot path a lone worker's sends fly on from one batch to the next (worker/flight.py, `_write_batch`).
        It stops reading ahead when the stream has nothing more, after a second (to let the periodic work run), or
        when asked to stop; whatever it read is settled before it returns, so a stopping worker leaves nothing
        pending.
        """
        self._inbox_due = True
        if self._storm_moves():
            self.choose_read_path()
        entries = self._read()
        if not entries:
            return 0
        items = self.prepare(entries)
        total = 0
        until = time.monotonic() + 1.0
        sent: deque[tuple[list[_Item], float]] = deque()
        flight: Flight | None = None
        with self.index.transport() as calls:
            while items:
                if self._storm_moves():
                    # a storm met by a batch settled in this round: the batches in flight settle, and those read
                    # but not sent yet search the copy (choose_read_path), not the primary
                    while sent:
                        self._settle_batch(*sent.popleft(), calls.receive())
                    self.choose_read_path()
                ahead = None
                # (a storm met on the primary while the copy cannot be had ends the round: choose_read_path)
                if not self._stop.is_set() and time.monotonic() < until and not self._storm_moves():
                    ahead = self._reader.submit(self._read_ahead)
                # a snapshot is validated from the moment it is sent: no batch goes out with a copy one batch behind
                flies = self._flies(items)
                if flight is not None and not flies:
                    flight.land()  # (what follows shares its connection, or reads what it wrote)
                if self.snapshot is None and all(item.event is None or item.event.op == "add" for item in items):
                    calls.send([self._command(item, {}) for item in items])
                    sent.append((items, time.perf_counter()))
                    if len(sent) > 1:
                        self._settle_batch(*sent.popleft(), calls.receive())
                elif flies:  # a lone snapshot worker's adds: behind the sends still in flight
                    flight = flight or self._flight(calls)
                    self._write_batch(flight, items)
                else:  # upserts and deletes read what they replace first: no batch may be in flight
                    while sent:
                        self._settle_batch(*sent.popleft(), calls.receive())
                    self._process_batch(items)
                total += len(items)
                items = ahead.result() if ahead is not None else []
            while sent:
                self._settle_batch(*sent.popleft(), calls.receive())
            if flight is not None:
                flight.land()
        # the round's count shown by a beat, at most about one a second (presence.py `beat_after_work`): `check` and
        # `stats` show it without a round trip per batch, or per round when rounds are a few events each
        self.heartbeat()
        return total

    def process(self, entries: Sequence[Entry | tuple[Any, Any]]) -> None:
        """The chain from prepare on, for entries read elsewhere (pending, claimed; or XREADGROUP pairs)."""
        self._process_batch(self.prepare(entries))
        self.heartbeat()

    # -- read -------------------------------------------------------------------------------------------------

    def _read(self) -> list[Entry]:
        """Deliver and read the group's next entries: at most batch_size of them, and about max_batch_bytes."""
        group, consumer = self.target.group, self.settings.consumer
        if self._inbox_due:
            self._inbox_due = self.inbox.move()
        reply = self.redis.fcall(
            FN_READ_NEW,
            1,
            self.target.events_stream,
            group,
            consumer,
            self.settings.batch_size,
            *read_sizes(self.settings),
        )
        return parse_entries(reply)[1]

    def _read_ahead(self) -> list[_Item]:
        entries = self._read()
        return self.prepare(entries) if entries else []

    # -- prepare ----------------------------------------------------------------------------------------------

    def prepare(self, entries: Sequence[Entry | tuple[Any, Any]]) -> list[_Item]:
        """Validate and fingerprint entries; an oversized, deleted or poison one is marked for a dead letter."""
        items: list[_Item] = []
        for read in entries:
            entry = read if isinstance(read, Entry) else _entry_of(*read)
            item = _Item(entry.entry_id, dict(entry.fields), entry.deliveries, entry=entry)
            if entry.oversized is not None:
                size = entry.oversized
                item.dead = (
                    "too_large",
                    f"the entry is {size.total_bytes} bytes in {size.field_count} fields, over the limit of "
                    f"max_entry_bytes={self.settings.max_entry_bytes}; this dead letter keeps the first "
                    f"{self.settings.dead_letter_prefix_bytes} bytes of each field, original_sizes their full sizes",
                )
            elif entry.missing:  # deleted from the stream while pending (no entry can have zero fields)
                item.dead = ("missing_entry", "the entry was deleted from the stream before it was processed")
            elif item.deliveries > self.settings.max_deliveries:
                item.dead = (
                    "poison",
                    f"delivered {item.deliveries} times, more than max_deliveries={self.settings.max_deliveries}; "
                    "the workers' logs say why each attempt failed",
                )
            else:
                try:
                    item.event = IncidentEvent.from_fields(item.fields, self.limits)
                except ValidationError as error:
                    item.dead = event_error(error)
                except Exception as error:
                    item.dead = ("invalid", f"the entry could not be read: {type(error).__name__}: {error}"[:500])
            items.append(item)
        return items

    # -- send -------------------------------------------------------------------------------------------------

    def _process_batch(self, items: list[_Item]) -> None:
        """Send and settle a prepared batch, segment by segment (see _segments), then record it."""
        started = time.perf_counter()
        for segment in _segments(items):
            self._settle(segment, self._send(segment))
        self._record_batch(started)

    def _send(self, items: list[_Item]) -> list[Any]:
        """Run one call per item (upserts and deletes with what they replace, read first); returns the replies."""
        changing = [item.event.incident_id for item in items if item.event and item.event.op != "add"]
        expected = self.index.stored_values(changing)
        if self.snapshot is not None and self.snapshot.layout != self.index.layout:
            self.snapshot.relayout(self.index.layout)  # a migration switched the layout (the max distance, say)
        if self.snapshot is None:
            return self.index.execute([self._command(item, expected) for item in items])
        return self._send_snapshot(items, expected)

    def _send_snapshot(self, items: list[_Item], expected: Mapping[str, int | str | None]) -> list[Any]:
        """`_send` on the snapshot path. The calls of one send share their copy's position and go as one apply_batch
        call, which reads the changes after it once; each call is validated against those and the earlier calls of
        its send. Short sends, each on a copy brought up to date, keep that to a few changes an event.

        A worker alone in its namespace (by the count of live workers its copy's reads of the log find: `alone`)
        writes up to `snapshot_sends_alone` sends of adds in a row, each before it reads the previous one's reply
        (`_send_ahead`, and across a round's batches `_write_batch`): its search of the next send overlaps the
        primary's work on this one. No refresh of its own comes between them: a read of the log rides behind each
        send, on its connection, and its reply brings the copy up to that send, so each send's window holds about the
        one send still in flight (docs/contract.md, "Snapshot reads"); and a copy a ride brought up to date moments
        ago (`SnapshotReader.fresh`) starts the next batch without a refresh either. With peers, every window would
        also hold their changes of the longer cycle: one send at a time, each after a refresh."""
        assert self.snapshot is not None
        replies: list[Any] = []
        start = 0
        writes_ahead = self.settings.snapshot_sends_alone > 1
        while start < len(items):
            if not (writes_ahead and self.snapshot.fresh and self.snapshot.alone):
                try:
                    self.snapshot.refresh()
                except (DamagedMetaError, SnapshotLostError) as error:
                    self._snapshot_off(error)
                    return replies + self.index.execute([self._command(item, expected) for item in items[start:]])
            send = items[start : start + SNAPSHOT_SEND]
            claims = self._claims(send)
            packed = self._snapshot_adds(send, claims)
            if packed is None:  # upserts, deletes, dead letters, a migration's double writes: built call by call
                self.snapshot.stale()
                replies += self._send_batched(
                    [self._command(item, expected, claim) for item, claim in zip(send, claims, strict=True)]
                )
            elif not writes_ahead or not self.snapshot.alone:
                [batch] = self.index.execute([packed])  # the usual send: adds only, their call written at once
                replies += batch_replies(send, batch)
            else:
                sent, ahead = self._send_ahead(items[start:], packed)
                replies += ahead
                start += sent
                continue
            start += len(send)
        return replies

    def _send_ahead(self, items: list[_Item], packed: Packed) -> tuple[int, list[Any]]:
        """Write the first send of `items` (`packed`), then search and write more sends of adds behind it (a
        `Flight`) until the end of `items`, a send that is not all adds (the caller sends it after a refresh), or
        `snapshot_sends_alone` in a row. Returns how many items went, and their replies."""
        with self.index.transport() as calls:
            flight = self._flight(calls)
            landing = flight.expect(items, started=None)
            went = flight.write(landing, items, packed)
            landing.written = True
            flight.land()
        return went, landing.replies

    def _flight(self, calls: Transport) -> Flight:
        """A flight of this worker's sends on `calls`: each searched and packed (`_claims`, `_snapshot_adds`), each
        batch settled and recorded as its last reply lands (`_settle_batch`)."""
        assert self.snapshot is not None
        return Flight(
            calls,
            self.snapshot,
            self.settings.snapshot_sends_alone,
            pack=lambda send: self._snapshot_adds(send, self._claims(send)),
            settle=self._settle_batch,
        )

    def _flies(self, items: list[_Item]) -> bool:
        """Whether a batch read in a round goes behind the sends still in flight (`_write_batch`): adds only, each
        with its event, searched on a copy that follows the primary's log by the reads riding behind its sends, in a
        worker that is the only live one of its namespace."""
        snapshot = self.snapshot
        return (
            snapshot is not None
            and self.settings.snapshot_sends_alone > 1
            and snapshot.alone
            and snapshot.source == "primary"
            and snapshot.layout == self.index.layout
            and all(
                item.dead is None and item.event is not None and item.event.op == "add" and not item.full_search
                for item in items
            )
        )

    def _write_batch(self, flight: Flight, items: list[_Item]) -> None:
        """Search and write a batch of adds (`_flies`) behind the sends the round's flight still has in the air,
        without waiting for their replies: the batch's edge then costs neither side a wait (the last send of one
        batch is applied while the next batch's first is searched). The batch is settled and recorded once its last
        reply lands. Where the flight cannot go on (a send that is not all adds, `snapshot_sends_alone` sends in a
        row, a copy that needs a refresh), it lands and the rest of the batch goes the usual way (`_send`)."""
        assert self.snapshot is not None
        landing = flight.expect(items, started=time.perf_counter())
        went = 0
        if flight.in_air or self.snapshot.fresh:
            went = flight.write(landing, items)
        if went < len(items):
            flight.land()
            landing.replies += self._send(items[went:])
        landing.written = True
        flight.settle_landed()

    def _snapshot_adds(self, items: list[_Item], claims: list[SnapshotClaim | None]) -> Packed | None:
        """The apply_batch call of a send whose every item is an add with its claim, packed (the calls `_command`
        would build, `FingerprintIndex.snapshot_adds`); None for any other send."""
        adds: list[SnapshotAdd] = []
        settings = self.settings
        fields = bool(settings.alert_event_field_names)
        for item, claim in zip(items, claims, strict=True):
            event = item.event
            if claim is None or event is None or event.op != "add" or event.fingerprint is None:
                return None
            text = event.text
            adds.append(
                SnapshotAdd(
                    event.incident_id,
                    event.fingerprint,
                    item.entry_id,
                    claim,
                    text[: settings.alert_text_chars] if text else "",
                    self._tokenizer if text is not None else "",
                    pack_alert_extra(settings.group_open_alerts, self._alert_fields(item)) if fields else None,
                )
            )
        return self.index.snapshot_adds(
            adds,
            stream=self.target,
            max_matches=settings.max_matches,
            max_candidates=settings.max_candidates,
            alert_extra=pack_alert_extra(settings.group_open_alerts),
            max_replied=self.outcomes.replied(),  # (the alert lists max_matches; the worker reads only its log's)
        )

    def _claims(self, items: list[_Item]) -> list[SnapshotClaim | None]:
        """What the snapshot finds for each item that indexes a fingerprint (None for the others), searched together."""
        assert self.snapshot is not None
        wanted = {
            k: (item.event.incident_id, item.event.fingerprint)
            for k, item in enumerate(items)
            if item.dead is None
            and item.event is not None
            and item.event.fingerprint is not None
            and not item.full_search
        }
        found = (
            self.snapshot.claims(
                list(wanted.values()), self.settings.max_matches, self.settings.snapshot_max_candidates
            )
            if wanted
            else []
        )
        claims: list[SnapshotClaim | None] = [None] * len(items)
        for k, claim in zip(wanted, found, strict=True):
            claims[k] = claim
        return claims

    def _send_batched(self, commands: list[Command]) -> list[Any]:
        """Send the apply calls among `commands` as one apply_batch call (the others as they are); one reply each."""
        applies = [k for k, command in enumerate(commands) if command[1] == FN_APPLY]
        others = [k for k, command in enumerate(commands) if command[1] != FN_APPLY]
        sent = [apply_batch([commands[k] for k in applies])] if applies else []
        answers = self.index.execute(sent + [commands[k] for k in others])
        replies: list[Any] = [None] * len(commands)
        if applies:
            batch = answers[0]
            for n, k in enumerate(applies):
                replies[k] = batch if isinstance(batch, Exception) else batch[n]
        for k, reply in zip(others, answers[len(sent) :], strict=True):
            replies[k] = reply
        return replies

    def _command(
        self, item: _Item, expected: Mapping[str, int | str | None], claim: SnapshotClaim | None = None
    ) -> Command:
        """The call of one item: its dead letter, or its apply call (validating `claim` on the snapshot path)."""
        if item.dead is not None:
            return self._dead_command(item, *item.dead)
        event = item.event
        assert event is not None
        return self.index.apply_command(
            event.op,
            event.incident_id,
            event.fingerprint,
            expected="*" if event.op == "add" else expected.get(event.incident_id),
            stream=self.target,
            entry_id=item.entry_id,
            max_matches=self.settings.max_matches,
            max_candidates=self.settings.max_candidates,
            alert_text=event.text[: self.settings.alert_text_chars] if event.text else "",
            tokenizer=self._tokenizer if event.text is not None and event.op != "delete" else "",
            snapshot=claim,
            open_alerts=self.settings.group_open_alerts,
            alert_fields=self._alert_fields(item),
            max_replied=self.outcomes.replied(),
        )

    def _alert_fields(self, item: _Item) -> list[tuple[str, str]]:
        """The event fields ALERT_EVENT_FIELDS names that the entry carries, each cut to its bound."""
        names = self.settings.alert_event_field_names
        if not names:
            return []
        fields = decode_fields(item.fields)
        return [(name, fields[name][:ALERT_EVENT_FIELD_CHARS]) for name in names if name in fields]

    def _dead_command(self, item: _Item, reason: str, detail: str) -> Command:
        entry = item.entry
        oversized = entry.oversized if entry is not None else None
        letter = DeadLetter(
            reason=reason,
            detail=detail,
            source_entry=item.entry_id,
            source_stream=self.target.events_stream,
            consumer=self.settings.consumer,
            deliveries=item.deliveries,
            original_bytes=oversized.total_bytes if oversized else None,
            original_sizes=oversized.sizes if oversized else None,
        )
        dropped = oversized.field_count - len(oversized.sizes) if oversized else 0
        original = entry.fields if entry is not None else item.fields
        return dead_letter_command(self.target, item.entry_id, letter.to_pairs(original, dropped=dropped))

    # -- settle -----------------------------------------------------------------------------------------------

    def _settle_batch(self, items: list[_Item], started: float, replies: list[Any]) -> None:
        """Settle a batch sent ahead (the pipelined path), then record it."""
        self._settle(items, replies)
        self._record_batch(started)

    def _settle(self, items: list[_Item], replies: list[Any], *, attempt: int = 0) -> None:
        """Act on the replies of a batch's calls: resend what met a lost state, hold what met a full Redis."""
        # a call refused for a lost state (functions, meta) or a layout change (a migration's start, switch or
        # abort) changed nothing: it is sent again, built for the state just read, a few times at most
        self._note_layout()  # the layout these calls were built for (the first batch's sets where it started)
        held, again = self._settle_replies(items, replies, resend=attempt < _RESENDS)
        self._note_layout()  # and the one a refusal made it follow
        if again:
            self._settle(again, self._send(again), attempt=attempt + 1)
        if held:
            self._hold_until_memory(held)

    def _settle_replies(
        self, items: list[_Item], replies: list[Any], *, resend: bool
    ) -> tuple[list[_Item], list[_Item]]:
        """Settle each reply. Returns the items Redis refused for want of memory, and (when `resend`) those whose
        call met a lost state the index has just restored (functions or meta gone): nothing of either happened."""
        held: list[_Item] = []
        again: list[_Item] = []
        later: ResponseError | None = None
        try:
            for item, reply in zip(items, replies, strict=True):
                if isinstance(reply, OutOfMemoryError):
                    held.append(item)
                elif isinstance(reply, ResponseError) and (waits_out(reply) or reply_code(reply) == "UNFIT"):
                    # nothing of this call happened; the entry stays pending, uncounted (UNFIT: a right taken away
                    # or a key replaced, which the run loop names and waits for the repair of)
                    later = later or reply
                elif isinstance(reply, ResponseError):
                    if self.index.handle_error(reply) and resend:
                        again.append(item)
                    else:
                        self._failed(item, reply)
                elif isinstance(reply, Exception):
                    raise reply
                else:
                    self._settle_reply(item, reply)
        finally:
            self.outcomes.flush()
        if later is not None:
            raise later  # the run loop waits it out, then finishes the entries from the pending list
        return held, again

    def _settle_reply(self, item: _Item, reply: Any) -> None:
        """Settle the reply of a call that ran: record its outcome, or retry, or dead-letter a duplicate add."""
        if item.dead is not None:
            self._record_dead_letter(item, reply)
            return
        event = item.event
        assert event is not None
        result = parse_apply(reply)
        if result.status == "stale" or result.status == "unvalidated" or result.status == "deferred":
            # nothing happened: applied again, alone. Unvalidated, the copy's claim could not be validated; deferred, an
            # earlier call of its send is applied again just before it, in stream order. Both are searched in full:
            # fallbacks of the copy.
            if result.status != "stale" and self.snapshot is not None and event.op != "delete":
                self.snapshot.fallbacks += 1
                item.full_search = True
            self._apply_again(item)
            return
        if result.status == "duplicate":
            assert result.stored is not None and event.fingerprint is not None
            error = DuplicateIncidentError(event.incident_id, result.stored, event.fingerprint)
            item.dead = ("duplicate_id", str(error))
            [reply] = self.index.execute([self._dead_command(item, *item.dead)])
            if isinstance(reply, ResponseError):
                self._failed(item, reply)  # stays pending: retried, and dead-lettered as poison at worst
            else:
                self._record_dead_letter(item, reply)
            return
        self.outcomes.record(result.status, item.entry_id, event=event, result=result)
        if self.snapshot is None:
            self.storm.note(result)

    def _apply_again(self, item: _Item) -> None:
        """Apply an item again, alone, searched in full, with what `{N}:fp` holds now: its call changed nothing (an
        upsert or delete raced with another consumer changing the same incident, a claim not validated, or a call
        deferred behind one of those)."""
        event = item.event
        assert event is not None

        def attempt() -> Any:
            expected = self.index.stored_values([event.incident_id])
            [reply] = self.index.execute([self._command(item, expected)])
            if isinstance(reply, Exception):
                raise reply
            return reply

        reply = retry_while_stale(attempt, lambda reply: text(reply[0]))
        if reply is not None:
            self._settle_reply(item, reply)
            return
        self.log.error(
            "incident keeps changing under this entry; leaving it pending",
            entry_id=item.entry_id,
            incident_id=event.incident_id,
        )

    def _failed(self, item: _Item, error: ResponseError) -> None:
        """The call of an entry failed: it stays pending, and the failure counts as a delivery toward poison."""
        if waits_out(error) or reply_code(error) == "UNFIT":  # (the run loop waits it out, or for the repair)
            raise error
        item.deliveries += 1
        # XCLAIM JUSTID RETRYCOUNT sets the count without sending the entry; re-reading it later adds nothing
        self.redis.xclaim(
            self.target.events_stream,
            self.target.group,
            self.settings.consumer,
            0,
            [item.entry_id],
            retrycount=item.deliveries,
            justid=True,
        )
        self.outcomes.record(
            FAILED,
            item.entry_id,
            error=error,
            deliveries=item.deliveries,
            max_deliveries=self.settings.max_deliveries,
            hint=self._wrong_type_hint(item) if is_wrong_type(error) else None,
        )

    def _wrong_type_hint(self, item: _Item) -> str | None:
        """Which key of the namespace an entry's call met holding another type (Redis's WRONGTYPE names none), and
        what to do: the keys of fixed names, and those of the incident's fingerprint and of its search."""
        fp = item.event.fingerprint if item.event is not None else None
        try:
            extra = [] if fp is None else [*incident_keys(self.index, fp), *search_keys(self.index, fp)]
            streams = [self.target.events_stream, self.target.alerts_stream, self.target.dead_stream]
            return str(diagnose(self.redis, self.index.keys, streams=streams, extra=extra))
        except redis_lib.RedisError:
            return None

    def _hold_until_memory(self, items: list[_Item]) -> None:
        """Redis refuses writes (maxmemory with noeviction), so nothing of these calls happened: retry them.

        The worker reads nothing more meanwhile. It keeps the entries its own (XCLAIM JUSTID resets their idle time
        without counting a delivery, so no peer takes them over and none turns to poison) and its heartbeat alive,
        and retries with capped exponential backoff until the writes go through or it is asked to stop.
        """
        failures = 0
        while items and not self._stop.is_set():
            failures += 1
            delay = self._backoff.compute(failures)
            if failures == 1 or failures % 10 == 0:
                self.log.warning(
                    "redis is out of memory (maxmemory); holding the entries and retrying",
                    entries=len(items),
                    attempt=failures,
                    retry_in_s=round(delay, 2),
                    hint="raise maxmemory or free memory; nothing is lost while the worker waits",
                )
            self._stop.wait(delay)
            if self._stop.is_set():
                break
            self.upkeep.tick()  # expiry and trimming free memory, and run while Redis is full
            self.redis.xclaim(
                self.target.events_stream,
                self.target.group,
                self.settings.consumer,
                0,
                [item.entry_id for item in items],
                justid=True,
            )
            self.heartbeat()
            held, again = self._settle_replies(items, self._send(items), resend=True)
            left = {id(item) for item in held + again}
            items = [item for item in items if id(item) in left]  # in stream order
        if items:
            self.log.warning("stopping while redis is out of memory; the entries stay pending", entries=len(items))

    def _note_layout(self) -> None:
        """Log once each time the worker follows the index to another layout (a migration's start, switch or abort,
        met as a refused call mid-run), so that an operator sees every worker take the step."""
        building = self.index.building.tag if self.index.building else ""
        seen = (self.index.layout_tag, building)
        if self._layout_seen is not None and seen != self._layout_seen:
            self.log.info(
                "following the index's layout",
                layout=seen[0],
                building=building or None,
                layout_before=self._layout_seen[0],
                building_before=self._layout_seen[1] or None,
            )
        self._layout_seen = seen

    # -- record -----------------------------------------------------------------------------------------------

    def _record_dead_letter(self, item: _Item, reply: Any) -> None:
        """Record the outcome of a dead-letter call: an empty reply means another consumer acknowledged it first."""
        assert item.dead is not None
        incident_id = item.fields.get(b"incident_id", item.fields.get("incident_id"))  # a prefix, when oversized
        if not text(reply):
            self.outcomes.record(NOT_PENDING, item.entry_id, event=item.event, incident_id=incident_id)
            return
        self.outcomes.record(DEAD, item.entry_id, dead=item.dead, dead_entry=text(reply), incident_id=incident_id)

    def _record_batch(self, started: float) -> None:
        """A batch is settled: count it, and see whether its searches on the primary met a storm (`StormWatch`:
        with auto, the worker then searches its own copy from its next batch on, `choose_read_path`; told to search
        on the primary, it says once what that costs and what would not)."""
        self.outcomes.batch_done(time.perf_counter() - started)
        storm = self.storm.batch_done() if self.snapshot is None else None
        if storm is not None:
            tell(self.log, self.settings.read_path, storm)


def _entry_of(entry_id: Any, fields: Mapping[Any, Any] | None) -> Entry:
    """An entry as XREADGROUP or XRANGE gives it (fields as a mapping; None or empty once deleted)."""
    return Entry(text(entry_id), 1, [(k, v) for k, v in (fields or {}).items()])


def _reader() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="read-ahead")


def _segments(items: Iterable[_Item]) -> list[list[_Item]]:
    """Cut a batch where an incident ID comes back after an upsert or delete of it, or before one.

    Upserts and deletes carry the fingerprint they expect to replace, read before their segment is sent; two changes
    of one incident in one pipelined segment would both expect the old one. Adds need no expectation.
    """
    segments: list[list[_Item]] = [[]]
    ops: dict[str, str] = {}
    for item in items:
        event = item.event
        if event is not None:
            previous = ops.get(event.incident_id)
            if previous is not None and (previous != "add" or event.op != "add"):
                segments.append([])
                ops = {}
            ops[event.incident_id] = event.op
        segments[-1].append(item)
    return [segment for segment in segments if segment]
