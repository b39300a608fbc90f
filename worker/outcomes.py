"""What became of each entry, counted in one place: the worker's stats, /metrics and the log line.

The processing chain (worker/processing.py) hands every entry's outcome to `Outcomes.record`, and nothing else
counts outcomes, so the summary line, `incident_worker_events_total{outcome}` and the logs cannot disagree. An
outcome is an apply status (`indexed`, `repeat`, `deleted`, `absent`: processed; `not_pending`: another consumer got
there first), `dead` (dead-lettered, processed) or `failed` (the call failed; the entry stays pending).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from .fingerprint import format_fingerprint
from .formats import MAX_INCIDENT_ID_LENGTH, IncidentEvent
from .library import ApplyResult
from .metrics import Metrics, observe_each
from .replies import entry_time_ms, text

__all__ = ["DEAD", "FAILED", "NOT_PENDING", "Outcomes", "WorkerStats"]

DEAD = "dead"
FAILED = "failed"
NOT_PENDING = "not_pending"

_CUT_LOG_S = 10.0
"""Seconds between two log lines about searches cut at the per-event budget."""

CLOSEST_LOGGED = 5
"""The closest matches an alert's log line names: all of its matches a stream worker reads from the apply call's
reply (`max_replied`), and only when that line is written (`Outcomes.replied`); the alert itself lists the cap
(MAX_MATCHES). A near storm's replies repeated 100 matches each, for the worker to parse and drop."""


@dataclass
class WorkerStats:
    """Counters since start, for the summary line, the heartbeat and tests."""

    processed: int = 0
    alerts: int = 0
    dead_letters: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    batches: int = 0
    reconnects: int = 0
    budget_exceeded: int = 0
    """Events whose search was cut at the per-event budget (their alerts say `incomplete`)."""


class Outcomes:
    """Counts each entry's outcome in `stats` and `metrics` and writes its log line.

    /metrics is added to once a batch (`flush`), not once an event: the events counter once an outcome, the alerts
    and groups counters, and the histograms of candidates and end-to-end time (`metrics.observe_each`)."""

    def __init__(self, metrics: Metrics, log: Any) -> None:
        self.stats = WorkerStats()
        self.metrics = metrics
        self.log = log
        self._unflushed: dict[str, int] = {}
        self._cut_since_log = 0  # searches cut since the last "search cut" line (one line per _CUT_LOG_S at most)
        self._cut_logged_at = float("-inf")
        self._opened = 0
        self._joined = 0
        self._alerted = 0
        self._candidates: list[int] = []  # the histograms' values since the last flush, observed by it
        self._latencies: list[float] = []

    def record(
        self,
        outcome: str,
        entry_id: str,
        *,
        event: IncidentEvent | None = None,
        result: ApplyResult | None = None,
        incident_id: Any = None,
        dead: tuple[str, str] | None = None,
        dead_entry: str | None = None,
        error: Exception | None = None,
        deliveries: int = 0,
        max_deliveries: int = 0,
        hint: str | None = None,
    ) -> None:
        """Count one entry's `outcome` and log it.

        An applied event gives its `event` and the apply call's `result`; a dead letter its `dead` (reason, detail),
        the entry it became (`dead_entry`) and the entry's raw `incident_id` field, if any; a failed call its `error`
        and the deliveries counted so far (`hint`: which key held another type)."""
        stats = self.stats
        stats.outcomes[outcome] = stats.outcomes.get(outcome, 0) + 1
        self._unflushed[outcome] = self._unflushed.get(outcome, 0) + 1
        if outcome == NOT_PENDING:
            if self._logs(logging.DEBUG):
                shown = event.incident_id if event is not None else _incident_id(incident_id)
                self.log.debug("entry already processed by another consumer", entry_id=entry_id, incident_id=shown)
        elif outcome == FAILED:
            self.log.error(
                "entry failed; it stays pending and will be retried",
                entry_id=entry_id,
                error=str(error),
                deliveries=deliveries,
                max_deliveries=max_deliveries,
                **({"hint": hint} if hint else {}),
            )
        elif outcome == DEAD:
            assert dead is not None
            reason, detail = dead
            stats.processed += 1
            stats.dead_letters += 1
            self.metrics.dead_letters.labels(reason).inc()
            self.log.warning(
                "dead letter",
                entry_id=entry_id,
                incident_id=_incident_id(incident_id),
                reason=reason,
                detail=detail,
                dead_entry=dead_entry,
            )
        else:
            assert event is not None and result is not None
            self._applied(entry_id, event, result)

    def record_intake(self, inbox: str, dead: dict[str, int]) -> None:
        """Count the dead letters a move of the inbox made (reason -> how many): elements that were no event, or too
        large, never became stream entries, so they have no entry of their own to `record`."""
        for reason, count in dead.items():
            if count:
                self.stats.dead_letters += count
                self.metrics.dead_letters.labels(reason).inc(count)
                self.log.warning("inbox entries dead-lettered", reason=reason, count=count, inbox=inbox)

    def _applied(self, entry_id: str, event: IncidentEvent, result: ApplyResult) -> None:
        self.stats.processed += 1
        self._candidates.append(result.candidates)
        if result.incomplete:
            self._cut(entry_id, event, result)
        self._latencies.append(max(0.0, time.time() - entry_time_ms(entry_id) / 1000))
        if result.status == "indexed":  # (each indexed incident opens a group or joins its closest match's)
            if result.match_count:
                self._joined += 1
            else:
                self._opened += 1
        if result.alert_id:
            self.stats.alerts += 1
            self._alerted += 1
            if not self._logs(logging.INFO):  # the line's arguments are built only when it is written
                return
            self.log.info(
                "alert",
                entry_id=entry_id,
                incident_id=event.incident_id,
                op=event.op,
                fingerprint=format_fingerprint(event.fingerprint or 0),
                match_count=result.match_count,
                closest=[f"{i}@{d}" for i, d in result.matches[:CLOSEST_LOGGED]],
                alert_entry=result.alert_id,
                **({"incomplete": True} if result.incomplete else {}),
            )
        elif self._logs(logging.DEBUG):
            self.log.debug(
                result.status,
                entry_id=entry_id,
                incident_id=event.incident_id,
                op=event.op,
                candidates=result.candidates,
            )

    def _cut(self, entry_id: str, event: IncidentEvent, result: ApplyResult) -> None:
        """Count an event whose search stopped at the per-event budget, and say so in the log: a line at once, then
        at most one each _CUT_LOG_S with how many more (a storm or a crafted flood cuts every event; a line each
        would flood the log as well)."""
        self.stats.budget_exceeded += 1
        self.metrics.budget_exceeded.inc()
        self._cut_since_log += 1
        now = time.monotonic()
        if now - self._cut_logged_at < _CUT_LOG_S:
            return
        self.log.warning(
            "search cut at the per-event budget: its alert says incomplete, match_count is a lower bound "
            "(a near-duplicate storm or a flood of crafted incidents; see docs/operations.md)",
            entry_id=entry_id,
            incident_id=event.incident_id,
            candidates=result.candidates,
            match_count=result.match_count,
            cut_since_last_line=self._cut_since_log,
        )
        self._cut_since_log = 0
        self._cut_logged_at = now

    def flush(self) -> None:
        """Add the outcomes recorded since the last flush to /metrics."""
        observe_each(self.metrics.candidates, self._candidates)
        observe_each(self.metrics.end_to_end_seconds, self._latencies)
        self._candidates.clear()
        self._latencies.clear()
        for outcome, count in self._unflushed.items():
            self.metrics.events.labels(outcome).inc(count)
        self._unflushed.clear()
        if self._alerted:
            self.metrics.alerts.inc(self._alerted)
        if self._opened:
            self.metrics.groups_opened.inc(self._opened)
        if self._joined:
            self.metrics.groups_joined.inc(self._joined)
        self._opened = self._joined = self._alerted = 0

    def batch_done(self, seconds: float) -> None:
        """Count one batch and how long it took."""
        self.stats.batches += 1
        self.metrics.batch_seconds.observe(seconds)

    def replied(self) -> int:
        """Matches an apply call's reply should repeat: those the alert's log line names, none when INFO lines are
        not written (the alert lists its own; nothing else here reads them, and a near storm's reply would make and
        send them event after event for nobody)."""
        return CLOSEST_LOGGED if self._logs(logging.INFO) else 0

    def _logs(self, level: int) -> bool:
        """Whether the logger writes lines of `level` (structlog's filtering loggers say so; others: assume)."""
        enabled = getattr(self.log, "is_enabled_for", None)
        return enabled is None or bool(enabled(level))


def _incident_id(raw: Any) -> str | None:
    """An entry's raw incident_id field as logged (a prefix, when the entry was oversized)."""
    return text(raw)[:MAX_INCIDENT_ID_LENGTH] if raw is not None else None
