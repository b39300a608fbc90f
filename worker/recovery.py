"""Entries that were delivered and not acknowledged: this consumer's own, those of silent consumers, and the names
of consumers that have gone.

Every `claim_interval_ms` the worker re-reads its own pending entries (replies lost to a dropped connection end up
there; re-reading them counts no delivery), takes over entries idle longer than `claim_idle_ms` with any consumer,
and removes consumers that have had nothing pending and been silent for an hour. What it reads goes through the
processing chain (worker/processing.py), where an entry delivered more than `max_deliveries` times becomes a dead
letter as poison (a delivery: the first read, a takeover, a restart, a failed call).
"""

from __future__ import annotations

import threading
from typing import Any

from .connection import RedisClient
from .entries import next_id, parse_entries
from .index import FingerprintIndex
from .library import FN_CLAIM, FN_READ_PENDING, StreamTarget
from .metrics import Metrics
from .processing import Processor, read_sizes
from .replies import consumers_info
from .settings import Settings

__all__ = ["Recovery"]

DEAD_CONSUMER_IDLE_MS = 3_600_000
"""A consumer with nothing pending and silent for an hour has gone; its name is removed from the group."""


class Recovery:
    """Finds the entries of the group that were delivered and never acknowledged, and hands them to `processor`."""

    def __init__(
        self,
        redis: RedisClient,
        settings: Settings,
        index: FingerprintIndex,
        target: StreamTarget,
        processor: Processor,
        *,
        metrics: Metrics,
        stop: threading.Event,
        log: Any,
    ) -> None:
        self.redis = redis
        self.settings = settings
        self.index = index
        self.target = target
        self.processor = processor
        self.metrics = metrics
        self.log = log
        self._stop = stop
        self._restarted = True  # the first recovery finds what a previous run of this consumer left: deliveries

    def recover_own_pending(self) -> int:
        """Process this consumer's own pending entries (from a crash, a lost reply, a failed call).

        Reading them again counts no delivery, except on the first call of a run: what is pending then was left by a
        previous run of this consumer that crashed or was killed, perhaps by one of these entries.
        """
        total = 0
        start = "-"
        restarted, self._restarted = self._restarted, False
        while not self._stop.is_set():
            reply = self.redis.fcall(
                FN_READ_PENDING,
                1,
                self.target.events_stream,
                self.target.group,
                self.settings.consumer,
                start,
                self.settings.batch_size,
                *read_sizes(self.settings),
                "1" if restarted else "0",
            )
            entries = parse_entries(reply)[1]
            if not entries:
                break
            start = next_id(entries[-1].entry_id)
            self.processor.process(entries)
            total += len(entries)
        if total:
            self.log.info("recovered own pending entries", count=total, counted_as_delivery=restarted)
        return total

    def claim_stuck(self) -> int:
        """Take over entries pending longer than claim_idle_ms with any consumer (XAUTOCLAIM to 0-0)."""
        total = 0
        cursor = "0-0"
        while not self._stop.is_set():
            reply = self.redis.fcall(
                FN_CLAIM,
                1,
                self.target.events_stream,
                self.target.group,
                self.settings.consumer,
                self.settings.claim_idle_ms,
                cursor,
                self.settings.batch_size,
                *read_sizes(self.settings),
            )
            cursor, entries = parse_entries(reply)
            if entries:
                total += len(entries)
                self.metrics.claimed.inc(len(entries))
                self.processor.process(entries)
            if cursor == "0-0":
                break
        if total:
            self.log.info("claimed entries of silent consumers", count=total, idle_ms=self.settings.claim_idle_ms)
        return total

    def forget_gone_consumers(self) -> None:
        """Remove consumers that have nothing pending and have been silent for an hour (crashed workers' names)."""
        for consumer in consumers_info(self.redis, self.target.events_stream, self.target.group):
            name = consumer["name"]
            pending = int(consumer.get("pending", 0))
            idle = int(consumer.get("idle", 0))
            gone = name != self.settings.consumer and pending == 0 and idle > DEAD_CONSUMER_IDLE_MS
            if gone and self.index.forget_consumer(self.target, name):
                self.log.info("removed gone consumer", gone=name, idle_ms=idle)
