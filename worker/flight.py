"""A lone snapshot worker's sends written ahead of their replies (`Flight`): each send of adds is written before the
previous one's reply is read, on one connection, with a read of the change log riding behind it
(`SnapshotReader.ride`), so that the worker's search of the next send overlaps the primary's work on this one
(docs/contract.md, "Snapshot reads"). At most two are in the air: the reply of send k brings the copy up to send k
before send k + 2 is searched, so each send's window holds about the one send still in flight. Within a round of
`Processor.read_and_process` the flight goes on from one batch to the next, and each batch is settled as its last
reply lands, in the order the batches were read: neither the worker nor the primary waits at a batch's edge (a storm's
primary had stood idle a quarter of the time there: benchmarks/journal/near-storms.md, section 18).

It knows nothing of what a batch holds: the processor gives it how to search and pack a send (`pack`, None for a
send that cannot go ahead: not all adds, a migration's double writes) and how to settle a batch (`settle`)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .readpath import SNAPSHOT_SEND, LogRead, SnapshotReader
from .transport import Packed, Transport

__all__ = ["Flight", "Landing", "batch_replies"]


def batch_replies(send: list[Any], batch: Any) -> list[Any]:
    """The replies of an apply_batch call of `send`, one an item: its own, or the error the whole call got."""
    return [batch] * len(send) if isinstance(batch, Exception) else batch


@dataclass(slots=True)
class Landing:
    """A batch (or the rest of one) whose sends a `Flight` wrote: its replies as they land, in order."""

    items: list[Any]
    started: float | None  # when the batch started, for its record; None: the caller settles it itself
    replies: list[Any]
    in_air: int = 0  # its sends written whose reply is not read yet
    written: bool = False  # every send of it is written (or the rest went the usual way)


class Flight:
    """The sends in the air on `calls`, and the batches whose replies they bring (see the module's docstring)."""

    def __init__(
        self,
        calls: Transport,
        snapshot: SnapshotReader,
        depth: int,
        *,
        pack: Callable[[list[Any]], Packed | None],
        settle: Callable[[list[Any], float, list[Any]], None],
    ) -> None:
        self._calls = calls
        self._snapshot = snapshot  # (its reads land on this copy, even if the processor has turned it off since)
        self._depth = depth
        self._pack = pack
        self._settle = settle
        self._sends: deque[tuple[list[Any], LogRead | None, Landing]] = deque()
        self._landings: deque[Landing] = deque()
        self.in_row = 0
        """Sends written since the flight last landed (at most `depth`, `snapshot_sends_alone`)."""

    @property
    def in_air(self) -> bool:
        return bool(self._sends)

    def expect(self, items: list[Any], *, started: float | None) -> Landing:
        """A landing for `items`' replies, settled (and recorded, as started at `started`) by `settle_landed`."""
        landing = Landing(items, started, [])
        self._landings.append(landing)
        return landing

    def write(self, landing: Landing, items: list[Any], packed: Packed | None = None) -> int:
        """Search and write the sends of `items` (the first already `packed`, when given) while each can go ahead
        and the row is shorter than `depth`; returns how many items went. A copy with no position a riding read can
        prove (the next send refreshes it first), or a peer counted by a riding read, ends the row."""
        snapshot = self._snapshot
        went = 0
        while went < len(items) and self.in_row < self._depth:
            send = items[went : went + SNAPSHOT_SEND]
            written = packed if packed is not None and not went else self._pack(send)
            if written is None:
                break
            ride = snapshot.ride()
            self._calls.send([written, *ride.commands] if ride else [written])
            self._sends.append((send, ride, landing))
            landing.in_air += 1
            self.in_row += 1
            went += len(send)
            if len(self._sends) > 1:
                self._land_one()
            if ride is None or not snapshot.alone:
                break
        return went

    def land(self) -> None:
        """Read every reply still in the air, and settle the batches they complete."""
        while self._sends:
            self._land_one()
        self.in_row = 0
        self.settle_landed()

    def _land_one(self) -> None:
        """The oldest send's replies: its calls' own, and the log read that rode behind it, which brings the copy up
        to that send."""
        send, ride, landing = self._sends.popleft()
        batch, *log = self._calls.receive()
        if ride is not None:
            self._snapshot.ridden(ride, log)
        landing.replies += batch_replies(send, batch)
        landing.in_air -= 1
        self.settle_landed()

    def settle_landed(self) -> None:
        """Settle, in order, the batches whose every reply has landed."""
        while self._landings and self._landings[0].written and not self._landings[0].in_air:
            landing = self._landings.popleft()
            if landing.started is not None:
                self._settle(landing.items, landing.started, landing.replies)
