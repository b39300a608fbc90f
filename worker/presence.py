"""How a running worker shows itself: its heartbeat, its name in `{N}:workers`, and its summary line.

`incident-worker check` and `stats` find the workers through `{N}:workers` and read each one's heartbeat (a JSON
value with a TTL): who it is, when it started, how many entries it has processed, which read path it uses. The
worker beats after a round of batches it read, at once when it had not done so for `WORK_BEAT_S` (so the first
round after a pause shows at once), otherwise within `WORK_BEAT_S` (so the count they show is at most that old), and
at least every third of the TTL while it is idle. (Under a steady load a round is a few events, each worker reading
every few milliseconds: a beat a round cost the primary three commands a round, for every worker of the fleet.)
The summary line, now and then, logs what it did and sets the gauges of /metrics (group lag, pending entries, inbox
entries, index size).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from redis.exceptions import NoPermissionError, OutOfMemoryError, ResponseError

from .connection import RedisClient
from .errors import KeyTypeError
from .formats import Heartbeat
from .index import FingerprintIndex
from .keytypes import another_type, held_type, is_wrong_type
from .library import StreamTarget
from .logs import error_message
from .metrics import Metrics
from .outcomes import WorkerStats
from .readpath import SnapshotReader
from .replies import group_info
from .settings import Settings

__all__ = ["Presence"]

_FORGET_WORKER_MS = 3_600_000
"""A name in `{N}:workers` whose heartbeat expired an hour ago (a crashed worker's) is removed by the next beat of any
worker: the registry holds the workers of the last hour, and `check` reads a bounded number of them."""


WORK_BEAT_S = 1.0
"""The count of processed entries that `check` and `stats` show is at most this old while the worker works: a beat
after work goes at once when the previous one is older, else this long after it (by the worker's periodic work)."""


class Presence:
    """The heartbeat and the summary line of one consumer, from its `stats`."""

    def __init__(
        self,
        redis: RedisClient,
        settings: Settings,
        index: FingerprintIndex,
        target: StreamTarget,
        stats: WorkerStats,
        *,
        metrics: Metrics,
        log: Any,
    ) -> None:
        self.redis = redis
        self.settings = settings
        self.index = index
        self.target = target
        self.stats = stats
        self.metrics = metrics
        self.log = log
        self.started = time.time()
        self.key = settings.keys.heartbeat(settings.consumer)
        self.next_beat = 0.0
        """When (time.monotonic) the heartbeat is due again, however idle the worker."""
        self._work_beat_at = -WORK_BEAT_S  # when the last beat after work went at once

    def beat_after_work(self, snapshot: SnapshotReader | None) -> None:
        """Show the count of a round of batches: at once when the last beat after work is `WORK_BEAT_S` old (or a
        third of the TTL, when shorter: a worker holding its batch at maxmemory beats through this), else by bringing
        the next beat forward to then (at most two beats a second however short the rounds)."""
        now = time.monotonic()
        every = min(WORK_BEAT_S, self.settings.heartbeat_ttl_ms / 3000)
        if now >= self._work_beat_at + every:
            self._work_beat_at = now
            self.beat(snapshot)
        else:
            self.next_beat = min(self.next_beat, self._work_beat_at + every)

    def beat(self, snapshot: SnapshotReader | None) -> None:
        """Refresh the heartbeat key (a JSON value with a TTL) that `incident-worker check` reads, and this worker's
        entry in `{N}:workers`, by which `check` and `stats` find it without scanning the keyspace; forget the names
        of workers whose heartbeat expired over an hour ago. One round trip."""
        ttl = self.settings.heartbeat_ttl_ms
        value = Heartbeat(
            consumer=self.settings.consumer,
            at=round(time.time(), 3),
            started=round(self.started, 3),
            processed=self.stats.processed,
            cut=self.stats.budget_exceeded,
            read_path="primary" if snapshot is None else "snapshot",
            snapshot_position=None if snapshot is None else snapshot.index.position,
        ).to_value()
        now_ms = int(time.time() * 1000)
        workers = self.index.keys.workers
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(self.key, value, px=ttl)
        pipe.zadd(workers, {self.settings.consumer: now_ms + ttl})
        pipe.zremrangebyscore(workers, "-inf", now_ms - _FORGET_WORKER_MS)
        beat, *registered = pipe.execute(raise_on_error=False)  # (SET replaces a value of any type)
        for reply in (beat, *registered):
            if is_wrong_type(reply):
                raise self._stop_on_another_type(workers)
            if isinstance(reply, Exception) and not isinstance(reply, OutOfMemoryError):
                raise reply
        if isinstance(beat, OutOfMemoryError):
            # SET and ZADD are refused at maxmemory; extending a TTL is not (the registry keeps the name an hour)
            try:
                self.redis.pexpire(self.key, ttl)
            except NoPermissionError as error:
                # a user made from an older users.acl: the beat lapses, but the held batch must not be dropped for it
                self.log.warning(
                    "cannot keep the heartbeat alive while redis is out of memory",
                    error=error_message(error),
                    hint="grant the worker's Redis user +pexpire (deploy/redis/users.acl)",
                )
        self.next_beat = time.monotonic() + ttl / 3000

    def leave(self) -> None:
        """Delete the heartbeat and the name in `{N}:workers`: a clean stop."""
        self.redis.delete(self.key)
        self.redis.zrem(self.index.keys.workers, self.settings.consumer)

    def _stop_on_another_type(self, key: str) -> KeyTypeError:
        """A KeyTypeError naming `key`, what it holds and what to do: the worker stops (exit 2)."""
        keys = self.index.keys
        expected = keys.kind_of(key) or "string"
        message = another_type(keys, key, expected, held_type(self.redis, key)) + "; so the worker stops"
        return KeyTypeError(message, key, expected)

    def _group_lag(self) -> int:
        """Entries not yet delivered to the group (at least 1 when Redis cannot count them exactly)."""
        group = group_info(self.redis, self.target.events_stream, self.target.group)
        if group is None:
            return 0
        if group.get("lag") is not None:
            return int(group["lag"])
        # Redis 7 cannot count after deletions or trimming in the range: look past the last delivered
        return len(self.redis.xrange(self.target.events_stream, min=f"({group['last-delivered-id']}", count=1) or [])

    def summary(self, snapshot: SnapshotReader | None) -> None:
        """One log line with what this worker did and where the group stands."""
        try:
            lag = self._group_lag()
            pending = int(self.redis.xpending(self.target.events_stream, self.target.group)["pending"])
            size = len(self.index)
            merges = int(self.redis.hget(self.index.keys.meta, "group_merges") or 0)
        except ResponseError:
            return
        self.metrics.group_merges.read = lambda: merges
        self.metrics.group_lag.set(lag)
        self.metrics.group_pending.set(pending)
        # a user made from an older users.acl may not LLEN the inbox: the rest of the summary goes on
        with contextlib.suppress(ResponseError):
            self.metrics.inbox_entries.set(int(self.redis.llen(self.index.keys.inbox)))
        self.metrics.index_size.set(size)
        self.log.info(
            "summary",
            processed=self.stats.processed,
            alerts=self.stats.alerts,
            dead_letters=self.stats.dead_letters,
            searches_cut=self.stats.budget_exceeded,
            lag=lag,
            pending=pending,
            indexed=size,
            outcomes=dict(self.stats.outcomes),
            **(snapshot.describe() if snapshot is not None else {"read_path": "primary"}),
        )
